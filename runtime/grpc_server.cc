#include "runtime/grpc_server.h"

#include <arpa/inet.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "glog/logging.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "runtime/file_io.h"
#include "runtime/status_macros.h"

namespace lspo::runtime {
namespace {

constexpr absl::string_view kHealthPrefix = "/grpc.health.v1.Health/";

// Health checking and reflection are process-wide ServerBuilder settings: turn them on once,
// before the first server is built.
void EnableHealthAndReflection() {
  static std::once_flag once;
  std::call_once(once, [] {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  });
}

// Checks `authorization: Bearer <token>` on every call except health checks.
class BearerTokenProcessor : public grpc::AuthMetadataProcessor {
 public:
  explicit BearerTokenProcessor(std::string token) : token_(std::move(token)) {}

  // A string compare: cheap enough to run on gRPC's own thread.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* /*context*/,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* /*response_metadata*/) override {
    auto path = auth_metadata.find(":path");
    if (path != auth_metadata.end() &&
        absl::StartsWith(absl::string_view(path->second.data(), path->second.size()),
                         kHealthPrefix)) {
      return grpc::Status::OK;
    }
    auto it = auth_metadata.find("authorization");
    if (it == auth_metadata.end()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "this server requires `authorization: Bearer <token>`: pass "
                          "--auth_token_file=<file holding the server's token>");
    }
    const absl::string_view value(it->second.data(), it->second.size());
    constexpr absl::string_view kScheme = "Bearer ";
    if (!absl::StartsWithIgnoreCase(value, kScheme) ||
        !ConstantTimeEquals(value.substr(kScheme.size()), token_)) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "wrong bearer token: check --auth_token_file");
    }
    // Handlers never see the token.
    consumed_auth_metadata->insert(
        {std::string(it->first.data(), it->first.size()), std::string(value)});
    return grpc::Status::OK;
  }

 private:
  const std::string token_;
};

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view flag) {
  return ReadFileToString(path, flag);
}

// The host part of host:port, [v6]:port, or "ipv4:"/"ipv6:"/"dns:" prefixed forms.
std::string HostOf(absl::string_view address) {
  for (absl::string_view scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (absl::StartsWith(address, scheme)) {
      address.remove_prefix(scheme.size());
      break;
    }
  }
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    return std::string(
        address.substr(1, close == absl::string_view::npos ? address.npos : close - 1));
  }
  const size_t colon = address.rfind(':');
  // More than one colon without brackets: a bare IPv6 address without a port.
  if (colon != absl::string_view::npos && address.find(':') == colon) {
    address = address.substr(0, colon);
  }
  return std::string(address);
}

bool IsUnixAddress(absl::string_view address) {
  return absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:");
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerOptions& options) {
  const ServerSecurity& sec = options.security;
  const bool has_cert = !sec.tls_cert_file.empty();
  const bool has_key = !sec.tls_key_file.empty();
  if (has_cert != has_key) {
    return absl::InvalidArgumentError(
        has_cert ? "--tls_cert is set but --tls_key is not: TLS needs both (PEM files)"
                 : "--tls_key is set but --tls_cert is not: TLS needs both (PEM files)");
  }
  const bool tls = has_cert;
  const bool token = !sec.auth_token_file.empty();
  if (!IsLoopbackAddress(options.listen) && !(tls && token)) {
    std::vector<std::string> missing;
    if (!tls) missing.push_back("--tls_cert=CERT.pem --tls_key=KEY.pem");
    if (!token) missing.push_back("--auth_token_file=TOKEN_FILE (mode 0600)");
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to listen on ", options.listen,
        ": it is not a loopback address, and serving beyond this host needs TLS and a bearer "
        "token: pass ",
        absl::StrJoin(missing, " and "), ", or use --listen=127.0.0.1:<port>"));
  }
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (tls) {
    grpc::SslServerCredentialsOptions ssl;
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    ASSIGN_OR_RETURN(pair.cert_chain, ReadFile(sec.tls_cert_file, "--tls_cert"));
    ASSIGN_OR_RETURN(pair.private_key, ReadSecretFile(sec.tls_key_file, "--tls_key"));
    ssl.pem_key_cert_pairs.push_back(std::move(pair));
    creds = grpc::SslServerCredentials(ssl);
  } else if (token) {
    // Plaintext on loopback, but gRPC only runs auth processors for "secure" credentials:
    // local credentials are those (and refuse peers that are not on this host).
    creds =
        grpc::experimental::LocalServerCredentials(IsUnixAddress(options.listen) ? UDS : LOCAL_TCP);
  } else {
    creds = grpc::InsecureServerCredentials();
  }
  if (token) {
    ASSIGN_OR_RETURN(std::string value, ReadTokenFile(sec.auth_token_file));
    creds->SetAuthMetadataProcessor(std::make_shared<BearerTokenProcessor>(std::move(value)));
  }
  return creds;
}

}  // namespace

GrpcServer::GrpcServer(std::unique_ptr<grpc::Server> server, std::string listen, int port)
    : server_(std::move(server)), listen_(std::move(listen)), port_(port) {}

GrpcServer::~GrpcServer() { Shutdown(absl::ZeroDuration()); }

void GrpcServer::Wait() { server_->Wait(); }

void GrpcServer::Shutdown(absl::Duration grace) {
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
}

absl::Status CheckServerSecurity(const ServerOptions& options) {
  return MakeServerCredentials(options).status();
}

absl::StatusOr<std::unique_ptr<GrpcServer>> StartGrpcServer(const ServerOptions& options) {
  for (const NamedService& s : options.services) {
    if (s.name.empty() || s.service == nullptr) {
      return absl::InvalidArgumentError("every service needs a name and a non-null pointer");
    }
  }
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds, MakeServerCredentials(options));
  EnableHealthAndReflection();
  grpc::ServerBuilder builder;
  // A second instance on the same port must fail, not silently share it (SO_REUSEPORT).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Heartbeats: accept the clients' HTTP/2 keepalive pings (MakeChannel) every 5 s or more,
  // also between calls, without counting them as abuse.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  int port = 0;
  builder.AddListeningPort(options.listen, creds, &port);
  for (const NamedService& s : options.services) builder.RegisterService(s.service);
  if (options.max_receive_message_bytes > 0) {
    builder.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen,
                     ": is the port in use? pass --listen=127.0.0.1:<free port>"));
  }
  if (grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService()) {
    for (const NamedService& s : options.services) health->SetServingStatus(s.name, true);
    health->SetServingStatus(true);
  }
  return std::make_unique<GrpcServer>(std::move(server), options.listen, port);
}

absl::Status ServeUntilShutdown(const ServerOptions& options, absl::string_view program,
                                absl::string_view detail) {
  ASSIGN_OR_RETURN(std::unique_ptr<GrpcServer> server, StartGrpcServer(options));
  const ServerSecurity& sec = options.security;
  LOG(INFO) << program << " listening on " << options.listen << (detail.empty() ? "" : " ")
            << detail << (sec.tls_cert_file.empty() ? "" : " [TLS]")
            << (sec.auth_token_file.empty() ? "" : " [bearer token]");
  server->Wait();
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const ChannelSecurity& security,
                                                           int max_receive_message_bytes) {
  const bool tls = !security.tls_ca_file.empty();
  const bool token = !security.auth_token_file.empty();
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (tls) {
    grpc::SslCredentialsOptions ssl;
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFile(security.tls_ca_file, "--tls_ca"));
    creds = grpc::SslCredentials(ssl);
  } else if (token) {
    if (!IsLoopbackAddress(target)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--auth_token_file is set but --tls_ca is not: the token would travel in clear text "
          "to ",
          target, "; pass --tls_ca=CA.pem (the CA of the server's --tls_cert)"));
    }
    creds = grpc::experimental::LocalCredentials(IsUnixAddress(target) ? UDS : LOCAL_TCP);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  if (token) {
    ASSIGN_OR_RETURN(std::string value, ReadTokenFile(security.auth_token_file));
    creds = grpc::CompositeChannelCredentials(creds, grpc::AccessTokenCredentials(value));
  }
  grpc::ChannelArguments args;
  if (max_receive_message_bytes > 0) args.SetMaxReceiveMessageSize(max_receive_message_bytes);
  // Heartbeats: an HTTP/2 ping every kKeepaliveSeconds; a peer that does not answer within
  // kKeepaliveSeconds (frozen process, vanished host: no TCP reset) closes the connection and
  // fails the calls in flight with UNAVAILABLE long before their deadlines.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveSeconds * 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveSeconds * 1000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return grpc::CreateCustomChannel(target, creds, args);
}

const char* HealthStatusName(HealthStatus status) {
  switch (status) {
    case HealthStatus::kServing:
      return "SERVING";
    case HealthStatus::kNotServing:
      return "NOT_SERVING";
    case HealthStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
    case HealthStatus::kUnknown:
      break;
  }
  return "UNKNOWN";
}

absl::StatusOr<HealthStatus> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                         const std::string& service, absl::Duration timeout) {
  // grpc.health.v1 messages by hand (no generated code for them is installed):
  // HealthCheckRequest {string service = 1;}, HealthCheckResponse {ServingStatus status = 1;}.
  google::protobuf::UnknownFieldSet request;
  if (!service.empty()) request.AddLengthDelimited(1, service);
  std::string request_bytes;
  request.SerializeToString(&request_bytes);
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request_buffer(&slice, 1);
  grpc::ByteBuffer response_buffer;

  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  grpc::GenericStub stub(channel);
  grpc::Status rpc_status;
  absl::Notification done;
  stub.UnaryCall(&ctx, std::string(kHealthPrefix) + "Check", grpc::StubOptions(), &request_buffer,
                 &response_buffer, [&](grpc::Status s) {
                   rpc_status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!rpc_status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(rpc_status.error_code()),
                        rpc_status.error_message());
  }
  std::vector<grpc::Slice> slices;
  if (!response_buffer.Dump(&slices).ok()) return absl::InternalError("unreadable health reply");
  std::string response_bytes;
  for (const grpc::Slice& s : slices) {
    response_bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  google::protobuf::UnknownFieldSet response;
  if (!response.ParseFromString(response_bytes)) {
    return absl::InternalError("health reply is not a HealthCheckResponse");
  }
  int64_t status = 0;  // Absent field = proto3 default UNKNOWN.
  for (int i = 0; i < response.field_count(); ++i) {
    const google::protobuf::UnknownField& f = response.field(i);
    if (f.number() == 1 && f.type() == google::protobuf::UnknownField::TYPE_VARINT) {
      status = static_cast<int64_t>(f.varint());
    }
  }
  if (status < 0 || status > 3) return HealthStatus::kUnknown;
  return static_cast<HealthStatus>(status);
}

bool IsLoopbackAddress(absl::string_view address) {
  if (IsUnixAddress(address)) return true;
  const std::string host = absl::AsciiStrToLower(HostOf(address));
  if (host == "localhost" || host == "::1") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  }
  return false;
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view flag) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat(flag, "=", path, ": cannot read it: ", std::strerror(errno)));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s=%s is accessible to group/others (mode %04o); it holds a secret: run `chmod 600 %s`",
        flag, path, st.st_mode & 07777, path));
  }
  return ReadFile(path, flag);
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string contents, ReadSecretFile(path, "--auth_token_file"));
  const std::string token(absl::StripAsciiWhitespace(contents));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_token_file=", path, " is empty: write the token into it"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--auth_token_file=", path,
          ": the token must be one line of printable ASCII without spaces (e.g. the output of "
          "`openssl rand -hex 32`)"));
    }
  }
  if (token.size() < 16) {
    LOG(WARNING) << "--auth_token_file=" << path << " holds a short token (" << token.size()
                 << " characters); `openssl rand -hex 32` makes a strong one";
  }
  return token;
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Every byte of `b` is visited whatever the contents; only the lengths shape the timing.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < b.size(); ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ static_cast<unsigned char>(b[i]));
  }
  return diff == 0;
}

}  // namespace lspo::runtime
