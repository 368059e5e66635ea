// runtime/grpc_server: real servers on 127.0.0.1:0 with the security defaults — bearer token
// on every call, open health checks, reflection, loopback-only binding without TLS + token,
// secret file permissions, and TLS + token end to end (certificate made with the openssl CLI).
#include "runtime/grpc_server.h"

#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/unknown_field_set.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "proto/scheduler.pb.h"
#include "proto/scheduler.grpc.pb.h"

namespace lspo::runtime {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "0123456789abcdef-test-token";

// A Scheduler whose ListJobs answers one job; every other method is UNIMPLEMENTED.
class FakeScheduler : public lspo::v1::Scheduler::Service {
  grpc::Status ListJobs(grpc::ServerContext*, const lspo::v1::ListJobsRequest*,
                        lspo::v1::ListJobsReply* reply) override {
    reply->add_jobs()->set_job_id("job-1");
    return grpc::Status::OK;
  }
};

class GrpcServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = testing::TempDir() + "/grpc_server_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes `contents` to dir_/name with `mode`; returns the path.
  std::string WriteFile(const std::string& name, const std::string& contents,
                        mode_t mode = 0600) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << contents;
    chmod(path.c_str(), mode);
    return path;
  }

  ServerOptions Options(const std::string& listen = "127.0.0.1:0") {
    ServerOptions o;
    o.listen = listen;
    o.services = {{lspo::v1::Scheduler::service_full_name(), &service_}};
    return o;
  }

  // ListJobs over `channel`; the RPC status.
  static grpc::StatusCode ListJobs(const std::shared_ptr<grpc::Channel>& channel) {
    auto stub = lspo::v1::Scheduler::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    lspo::v1::ListJobsReply reply;
    return stub->ListJobs(&ctx, lspo::v1::ListJobsRequest(), &reply).error_code();
  }

  static std::string Address(const GrpcServer& server) {
    return absl::StrCat("127.0.0.1:", server.port());
  }

  std::string dir_;
  FakeScheduler service_;
};

std::string ToString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// The service names grpc.reflection.v1alpha.ServerReflection lists (messages by hand:
// request field 7 list_services; reply field 6 ListServiceResponse { repeated
// ServiceResponse service = 1 { string name = 1 } }), or the RPC's error code.
grpc::StatusCode ListServicesByReflection(const std::shared_ptr<grpc::Channel>& channel,
                                          std::vector<std::string>* names) {
  google::protobuf::UnknownFieldSet request;
  request.AddLengthDelimited(7, "*");
  std::string request_bytes;
  request.SerializeToString(&request_bytes);
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request_buffer(&slice, 1), response_buffer;

  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(
      &ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  auto wait = [&cq]() {
    void* tag;
    bool ok = false;
    return cq.Next(&tag, &ok) && ok;
  };
  call->StartCall(nullptr);
  wait();
  call->Write(request_buffer, nullptr);
  wait();
  call->Read(&response_buffer, nullptr);
  const bool got_reply = wait();
  call->WritesDone(nullptr);
  wait();
  grpc::Status status;
  call->Finish(&status, nullptr);
  wait();
  if (!status.ok() || !got_reply) return status.error_code();

  google::protobuf::UnknownFieldSet response;
  EXPECT_TRUE(response.ParseFromString(ToString(response_buffer)));
  for (int i = 0; i < response.field_count(); ++i) {
    if (response.field(i).number() != 6) continue;
    google::protobuf::UnknownFieldSet list;
    EXPECT_TRUE(list.ParseFromString(response.field(i).length_delimited()));
    for (int j = 0; j < list.field_count(); ++j) {
      google::protobuf::UnknownFieldSet service;
      EXPECT_TRUE(service.ParseFromString(list.field(j).length_delimited()));
      for (int k = 0; k < service.field_count(); ++k) {
        if (service.field(k).number() == 1) {
          names->push_back(service.field(k).length_delimited());
        }
      }
    }
  }
  return grpc::StatusCode::OK;
}

TEST_F(GrpcServerTest, TokenIsCheckedOnEveryCall) {
  ServerOptions options = Options();
  options.security.auth_token_file = WriteFile("token", std::string(kToken) + "\n");
  auto server = StartGrpcServer(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = Address(**server);

  // No token at all (a plaintext client).
  EXPECT_EQ(ListJobs(grpc::CreateChannel(address, grpc::InsecureChannelCredentials())),
            grpc::StatusCode::UNAUTHENTICATED);
  // A wrong token.
  ChannelSecurity wrong;
  wrong.auth_token_file = WriteFile("wrong", "0123456789abcdef-test-tokeN");
  auto wrong_channel = MakeChannel(address, wrong);
  ASSERT_TRUE(wrong_channel.ok()) << wrong_channel.status();
  EXPECT_EQ(ListJobs(*wrong_channel), grpc::StatusCode::UNAUTHENTICATED);
  // The right one.
  ChannelSecurity right;
  right.auth_token_file = options.security.auth_token_file;
  auto right_channel = MakeChannel(address, right);
  ASSERT_TRUE(right_channel.ok()) << right_channel.status();
  EXPECT_EQ(ListJobs(*right_channel), grpc::StatusCode::OK);

  // Reflection is protected like the services.
  std::vector<std::string> names;
  EXPECT_EQ(ListServicesByReflection(*wrong_channel, &names), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(ListServicesByReflection(*right_channel, &names), grpc::StatusCode::OK);
  EXPECT_THAT(names, ::testing::Contains("lspo.v1.Scheduler"));
}

TEST_F(GrpcServerTest, HealthIsServingAndOpenWithoutToken) {
  ServerOptions options = Options();
  options.security.auth_token_file = WriteFile("token", kToken);
  auto server = StartGrpcServer(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel(Address(**server), grpc::InsecureChannelCredentials());
  for (const std::string service : {"", "lspo.v1.Scheduler"}) {
    auto status = CheckHealth(channel, service, absl::Seconds(10));
    ASSERT_TRUE(status.ok()) << service << ": " << status.status();
    EXPECT_EQ(*status, HealthStatus::kServing) << service;
  }
  EXPECT_EQ(CheckHealth(channel, "no.such.Service", absl::Seconds(10)).status().code(),
            absl::StatusCode::kNotFound);
  (*server)->Shutdown(absl::ZeroDuration());
}

TEST_F(GrpcServerTest, HealthOfNothingListeningIsAnError) {
  auto server = StartGrpcServer(Options());
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = Address(**server);
  server->reset();
  auto status = CheckHealth(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()), "",
                            absl::Seconds(2));
  EXPECT_FALSE(status.ok());
}

TEST_F(GrpcServerTest, ReflectionListsTheServiceWithoutToken) {
  auto server = StartGrpcServer(Options());
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<std::string> names;
  ASSERT_EQ(ListServicesByReflection(
                grpc::CreateChannel(Address(**server), grpc::InsecureChannelCredentials()),
                &names),
            grpc::StatusCode::OK);
  EXPECT_THAT(names, ::testing::Contains("lspo.v1.Scheduler"));
}

TEST_F(GrpcServerTest, NonLoopbackNeedsTlsAndToken) {
  auto plain = StartGrpcServer(Options("0.0.0.0:0"));
  ASSERT_FALSE(plain.ok());
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(plain.status().message(), HasSubstr("--tls_cert"));
  EXPECT_THAT(plain.status().message(), HasSubstr("--auth_token_file"));
  EXPECT_THAT(plain.status().message(), HasSubstr("0.0.0.0:0"));

  ServerOptions token_only = Options("[::]:0");
  token_only.security.auth_token_file = WriteFile("token", kToken);
  auto st = CheckServerSecurity(token_only);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("--tls_cert"));
  EXPECT_THAT(st.message(), ::testing::Not(HasSubstr("--auth_token_file")));

  ServerOptions tls_only = Options("10.1.2.3:50060");
  tls_only.security.tls_cert_file = WriteFile("cert.pem", "x", 0644);
  tls_only.security.tls_key_file = WriteFile("key.pem", "x");
  st = CheckServerSecurity(tls_only);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("--auth_token_file"));
  EXPECT_THAT(st.message(), ::testing::Not(HasSubstr("--tls_cert")));

  ServerOptions half_tls = Options();
  half_tls.security.tls_cert_file = tls_only.security.tls_cert_file;
  EXPECT_THAT(CheckServerSecurity(half_tls).message(), HasSubstr("--tls_key"));
}

TEST_F(GrpcServerTest, GroupReadableSecretsAreRefused) {
  ServerOptions options = Options();
  const std::string token = WriteFile("token", kToken, 0640);
  options.security.auth_token_file = token;
  auto server = StartGrpcServer(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(server.status().message(), HasSubstr(token));
  EXPECT_THAT(server.status().message(), HasSubstr("chmod 600"));
  // The client side reads it by the same rule; a world-readable key is refused too.
  ChannelSecurity client;
  client.auth_token_file = token;
  EXPECT_THAT(MakeChannel("127.0.0.1:1", client).status().message(), HasSubstr("chmod 600"));
  ServerOptions tls = Options();
  tls.security.tls_cert_file = WriteFile("cert.pem", "x", 0644);
  tls.security.tls_key_file = WriteFile("key.pem", "x", 0644);
  EXPECT_THAT(CheckServerSecurity(tls).message(), HasSubstr("--tls_key="));
  // Missing or empty token files.
  options.security.auth_token_file = dir_ + "/missing";
  EXPECT_EQ(CheckServerSecurity(options).code(), absl::StatusCode::kNotFound);
  options.security.auth_token_file = WriteFile("empty", "\n");
  EXPECT_EQ(CheckServerSecurity(options).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(GrpcServerTest, ClientRefusesTokenInClearTextToRemoteHost) {
  ChannelSecurity client;
  client.auth_token_file = WriteFile("token", kToken);
  auto channel = MakeChannel("10.1.2.3:50060", client);
  ASSERT_FALSE(channel.ok());
  EXPECT_EQ(channel.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(channel.status().message(), HasSubstr("--tls_ca"));
  EXPECT_TRUE(MakeChannel("localhost:50060", client).ok());
}

TEST_F(GrpcServerTest, SecondServerOnTheSamePortFails) {
  auto first = StartGrpcServer(Options());
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = StartGrpcServer(Options(Address(**first)));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("pass --listen=127.0.0.1:<free port>"));
}

TEST_F(GrpcServerTest, TlsAndTokenEndToEnd) {
  if (std::system("command -v openssl >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "the openssl CLI is not installed";
  }
  const std::string cert = dir_ + "/cert.pem", key = dir_ + "/key.pem";
  const std::string cmd = absl::StrCat(
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
      "-subj /CN=localhost -addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout ",
      key, " -out ", cert, " >/dev/null 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  chmod(key.c_str(), 0600);

  ServerOptions options = Options();
  options.security = {cert, key, WriteFile("token", kToken)};
  // The same security would be accepted on all interfaces.
  ServerOptions anywhere = options;
  anywhere.listen = "0.0.0.0:50060";
  EXPECT_TRUE(CheckServerSecurity(anywhere).ok()) << CheckServerSecurity(anywhere);
  auto server = StartGrpcServer(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = Address(**server);

  auto secure = MakeChannel(address, {cert, options.security.auth_token_file});
  ASSERT_TRUE(secure.ok()) << secure.status();
  EXPECT_EQ(ListJobs(*secure), grpc::StatusCode::OK);
  auto health = CheckHealth(*secure, "lspo.v1.Scheduler", absl::Seconds(10));
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, HealthStatus::kServing);

  // TLS without the token, and the token without TLS, both fail.
  auto tls_only = MakeChannel(address, {cert, ""});
  ASSERT_TRUE(tls_only.ok()) << tls_only.status();
  EXPECT_EQ(ListJobs(*tls_only), grpc::StatusCode::UNAUTHENTICATED);
  auto token_only = MakeChannel(address, {"", options.security.auth_token_file});
  ASSERT_TRUE(token_only.ok()) << token_only.status();
  EXPECT_EQ(ListJobs(*token_only), grpc::StatusCode::UNAVAILABLE);
}

TEST(LoopbackTest, Addresses) {
  for (const char* a : {"127.0.0.1:50060", "127.3.2.1:1", "localhost:50060", "LOCALHOST:1",
                        "[::1]:50060", "::1", "ipv4:127.0.0.1:5", "unix:/tmp/lspo.sock",
                        "[::ffff:127.0.0.1]:1"}) {
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  }
  for (const char* a : {"0.0.0.0:50060", ":50060", "[::]:50060", "10.0.0.1:50060",
                        "example.com:443", "128.0.0.1:1", "localhost.example.com:1"}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
}

TEST(ConstantTimeEqualsTest, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_FALSE(ConstantTimeEquals("abcd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0b", 3), "a"));
}

}  // namespace
}  // namespace lspo::runtime
