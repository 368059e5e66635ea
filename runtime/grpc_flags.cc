#include "runtime/grpc_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "glog/logging.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain to serve TLS with (with --tls_key); required, with "
          "--auth_token_file, to listen on a non-loopback address");
ABSL_FLAG(std::string, tls_key, "",
          "PEM private key of --tls_cert (must not be readable by group/others)");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate(s) to verify the servers this program calls over TLS (empty = "
          "plaintext; loopback only when a token is sent)");
ABSL_FLAG(std::string, auth_token_file, "",
          "file (mode 0600) holding the deployment's bearer token: required on every call "
          "served (health checks excepted) and sent on every call made (empty = none)");

namespace lspo::runtime {

ServerSecurity ServerSecurityFromFlags() {
  ServerSecurity s;
  s.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  s.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  s.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  return s;
}

ChannelSecurity ChannelSecurityFromFlags() {
  ChannelSecurity s;
  s.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  s.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  return s;
}

int ServeMain(ServerOptions options, absl::string_view program, absl::string_view detail) {
  options.security = ServerSecurityFromFlags();
  const absl::Status st = ServeUntilShutdown(options, program, detail);
  if (!st.ok()) {
    LOG(ERROR) << program << ": " << st.message();
    return 1;
  }
  return 0;
}

}  // namespace lspo::runtime
