// One way for every binary to serve gRPC and to open channels, with the project's security
// defaults (issue 5):
//   - servers bind 127.0.0.1 unless told otherwise, and a non-loopback listen address is
//     refused unless TLS (--tls_cert/--tls_key) AND a bearer token (--auth_token_file) are set;
//   - with a token, every call must carry `authorization: Bearer <token>` (UNAUTHENTICATED
//     otherwise), except grpc.health.v1.Health, which stays open so that container health
//     checks need no secret (it reveals only SERVING / NOT_SERVING);
//   - every server has standard health checking (SERVING for "" and each service name) and
//     server reflection (grpc.reflection.v1alpha; token-protected like the services).
// Error messages name the command-line flags of runtime/grpc_flags.h (--listen, --tls_cert,
// --tls_key, --tls_ca, --auth_token_file), which all binaries share, and say how to fix them.
#ifndef LSPO_RUNTIME_GRPC_SERVER_H_
#define LSPO_RUNTIME_GRPC_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace lspo::runtime {

// A server's transport security. All fields are file paths; empty = not configured.
struct ServerSecurity {
  std::string tls_cert_file;    // PEM certificate chain (--tls_cert).
  std::string tls_key_file;     // PEM private key (--tls_key); must not be group/world-accessible.
  std::string auth_token_file;  // Bearer token (--auth_token_file); same permission rule.
};

// A client's transport security. All fields are file paths; empty = not configured.
struct ChannelSecurity {
  std::string tls_ca_file;      // PEM root certificate(s) to verify the server (--tls_ca).
  std::string auth_token_file;  // Bearer token sent on every call (--auth_token_file).
};

// A service to serve and its full name ("lspo.v1.Scheduler", i.e. the generated
// `Service::service_full_name()`), under which its health status is reported.
struct NamedService {
  std::string name;
  grpc::Service* service = nullptr;  // Not owned; must outlive the server.
};

struct ServerOptions {
  // host:port to listen on ("127.0.0.1:0" picks a free port; see GrpcServer::port()).
  std::string listen = "127.0.0.1:0";
  std::vector<NamedService> services;
  // Largest request accepted, bytes (0 = gRPC's default, 4 MiB).
  int max_receive_message_bytes = 0;
  ServerSecurity security;
};

// A started server. Destroying it shuts it down (in-flight calls are cancelled).
class GrpcServer {
 public:
  // Wraps an already started `server` bound to `port` for `listen`; use StartGrpcServer.
  GrpcServer(std::unique_ptr<grpc::Server> server, std::string listen, int port);
  // Shuts the server down at once (in-flight calls are cancelled).
  ~GrpcServer();
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  // The TCP port bound (the chosen one when the listen address had port 0).
  int port() const { return port_; }
  // The listen address as given (port 0 not substituted).
  const std::string& listen() const { return listen_; }
  grpc::Server* server() const { return server_.get(); }
  // Blocks until Shutdown() is called from another thread.
  void Wait();
  // Stops accepting calls and cancels in-flight ones after `grace` (health turns NOT_SERVING).
  void Shutdown(absl::Duration grace = absl::Seconds(1));

 private:
  std::unique_ptr<grpc::Server> server_;
  std::string listen_;
  int port_;
};

// Builds and starts a server for `options`. Errors:
//   InvalidArgument    a service with no name or null pointer; only one of --tls_cert/--tls_key;
//   FailedPrecondition a non-loopback listen address without TLS and token (names the missing
//                      flags); a key or token file readable by group/others (says `chmod 600`);
//   NotFound           an unreadable certificate, key or token file;
//   Unavailable        the address cannot be bound ("cannot listen on ... pass
//                      --listen=127.0.0.1:<free port>"), e.g. the port is in use (SO_REUSEPORT
//                      is off, so a second instance on the same port fails).
absl::StatusOr<std::unique_ptr<GrpcServer>> StartGrpcServer(const ServerOptions& options);

// The security checks of StartGrpcServer alone (listen address vs TLS/token, readable files
// with safe permissions), without binding anything: lets a binary refuse a bad configuration
// before it starts work (e.g. the scheduler resuming persisted jobs). Same errors.
absl::Status CheckServerSecurity(const ServerOptions& options);

// Starts a server for `options`, logs "<program> listening on <address> <detail>", and blocks
// until the server is shut down; returns the start-up error otherwise (see StartGrpcServer).
// The body of the service binaries' main().
absl::Status ServeUntilShutdown(const ServerOptions& options, absl::string_view program,
                                absl::string_view detail = "");

// Heartbeat period and timeout of MakeChannel's channels, seconds (HTTP/2 keepalive pings).
inline constexpr int kKeepaliveSeconds = 10;

// Opens a channel to `target` (host:port) with `security`:
//   --tls_ca set: TLS verifying the server against that CA (the target host must match the
//   certificate's subjectAltName); --auth_token_file set: `authorization: Bearer <token>` on
//   every call (over TLS, or over gRPC local credentials to a loopback target);
//   neither: plaintext. `max_receive_message_bytes` > 0 raises the reply size limit (bytes).
// Errors: FailedPrecondition when a token would travel in clear text to a non-loopback target
// (names --tls_ca); NotFound / FailedPrecondition for unreadable or group/world-accessible
// files, as for servers. Connecting is lazy: an unreachable server shows up on the first call.
// The channel pings the server every kKeepaliveSeconds (heartbeat) and drops a connection whose
// peer does not answer within kKeepaliveSeconds, failing calls in flight with UNAVAILABLE.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const ChannelSecurity& security,
                                                           int max_receive_message_bytes = 0);

// grpc.health.v1.HealthCheckResponse.ServingStatus, same numbers.
enum class HealthStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

// "SERVING", "NOT_SERVING", "UNKNOWN" or "SERVICE_UNKNOWN" (the proto enum names).
const char* HealthStatusName(HealthStatus status);

// Calls grpc.health.v1.Health/Check for `service` ("" = the whole server) with a deadline of
// `timeout`. The RPC's own error otherwise (e.g. DeadlineExceeded or Unavailable when nothing
// listens; NotFound when the server does not know `service`).
absl::StatusOr<HealthStatus> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                         const std::string& service, absl::Duration timeout);

// True when the host of `address` (host:port, [v6]:port, or unix:PATH) is a loopback address:
// 127.0.0.0/8, ::1, "localhost", or a unix-domain socket. An empty host ("":port, 0.0.0.0,
// [::]) means all interfaces and is not loopback.
bool IsLoopbackAddress(absl::string_view address);

// Reads a secret file (`flag` names its flag in errors, e.g. "--auth_token_file"): NotFound if
// it cannot be read; FailedPrecondition if group or others have any permission on it (the fix,
// `chmod 600 <path>`, is in the message). Returns the contents.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view flag);

// Reads a bearer token file (ReadSecretFile rules), strips surrounding whitespace, and checks
// the token is non-empty printable ASCII without spaces (InvalidArgument otherwise).
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// Compares two strings in time that depends only on their lengths (not on where they differ).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace lspo::runtime

#endif  // LSPO_RUNTIME_GRPC_SERVER_H_
