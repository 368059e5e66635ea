// absl::Status <-> grpc::Status, code for code (both use the canonical google.rpc codes).
#ifndef LSPO_RUNTIME_RPC_STATUS_H_
#define LSPO_RUNTIME_RPC_STATUS_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"

namespace lspo::rpc {

// Marks an error a service handler returned (grpc::Status::error_details), as opposed to one
// gRPC made because the call never reached a handler.
inline constexpr char kHandlerError[] = "lspo-handler";

// A handler's error as a gRPC status, marked kHandlerError.
inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()),
                      kHandlerError);
}

// `peer` names the service called, so a dead peer reads "optimizer at 127.0.0.1:50062: ...".
// An UNAVAILABLE that gRPC made (no handler answered) gains a hint to start the service; one a
// handler returned (e.g. a dead rank of a data-parallel job) is passed on as it is.
inline absl::Status FromGrpc(const grpc::Status& s, absl::string_view peer = "") {
  if (s.ok()) return absl::OkStatus();
  std::string msg = peer.empty() ? s.error_message() : absl::StrCat(peer, ": ", s.error_message());
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE && s.error_details() != kHandlerError) {
    absl::StrAppend(&msg, " (is the service running? start it or check its address)");
  }
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), msg);
}

// A handler's reply: moves the value of `r` into `*out` and returns OK, or returns the error
// (ToGrpc). For service methods whose core returns StatusOr<Reply>.
template <typename T, typename Out>
grpc::Status Reply(absl::StatusOr<T> r, Out* out) {
  if (!r.ok()) return ToGrpc(r.status());
  *out = std::move(*r);
  return grpc::Status::OK;
}

}  // namespace lspo::rpc

#endif  // LSPO_RUNTIME_RPC_STATUS_H_
