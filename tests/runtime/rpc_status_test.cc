// runtime/rpc_status.h: codes and messages survive absl -> gRPC -> absl, and the "is the
// service running?" hint is added only to an UNAVAILABLE that gRPC made, not to one a handler
// returned (a dead rank of a data-parallel job reported by a running worker).
#include "runtime/rpc_status.h"

#include "gtest/gtest.h"

namespace lspo::rpc {
namespace {

TEST(RpcStatusTest, HandlerErrorsRoundTripWithoutTheStartHint) {
  for (const absl::Status& s :
       {absl::InvalidArgumentError("job spec field lsp.d = 0"),
        absl::UnavailableError("distributed: all-reduce on rank 0 of 2 failed"),
        absl::DeadlineExceededError("rank 1 did not join")}) {
    const absl::Status back = FromGrpc(ToGrpc(s), "worker at 127.0.0.1:50061");
    EXPECT_EQ(back.code(), s.code());
    EXPECT_EQ(back.message(), absl::StrCat("worker at 127.0.0.1:50061: ", s.message()));
  }
  EXPECT_TRUE(FromGrpc(ToGrpc(absl::OkStatus())).ok());
}

TEST(RpcStatusTest, AnUnavailableThatGrpcMadeGetsTheHint) {
  const grpc::Status refused(grpc::StatusCode::UNAVAILABLE, "failed to connect to all addresses");
  const absl::Status s = FromGrpc(refused, "optimizer at 127.0.0.1:50062");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(),
            "optimizer at 127.0.0.1:50062: failed to connect to all addresses (is the service "
            "running? start it or check its address)");
}

}  // namespace
}  // namespace lspo::rpc
