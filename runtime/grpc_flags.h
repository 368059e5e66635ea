// The security flags every service binary and lspctl share (defined once, here):
//   --tls_cert, --tls_key   the server's PEM certificate chain and private key (TLS);
//   --tls_ca                PEM CA certificate(s) to verify the servers this program calls
//                           (scheduler: worker and optimizer; lspctl: the scheduler);
//   --auth_token_file       file holding the bearer token (mode 0600): checked on every call
//                           this program serves and sent on every call it makes.
// One token serves a whole deployment. See runtime/grpc_server.h for the rules.
#ifndef LSPO_RUNTIME_GRPC_FLAGS_H_
#define LSPO_RUNTIME_GRPC_FLAGS_H_

#include "runtime/grpc_server.h"

namespace lspo::runtime {

// --tls_cert, --tls_key and --auth_token_file (parse the command line first).
ServerSecurity ServerSecurityFromFlags();

// --tls_ca and --auth_token_file (parse the command line first).
ChannelSecurity ChannelSecurityFromFlags();

// The body of a service binary's main() after the command line is parsed: serves `options`
// with its security taken from the flags (ServerSecurityFromFlags) until shut down
// (ServeUntilShutdown). Returns the process exit code: 0 after a shutdown, 1 when the server
// cannot start (the reason is logged, e.g. "cannot listen on ... pass --listen=...").
int ServeMain(ServerOptions options, absl::string_view program, absl::string_view detail = "");

}  // namespace lspo::runtime

#endif  // LSPO_RUNTIME_GRPC_FLAGS_H_
