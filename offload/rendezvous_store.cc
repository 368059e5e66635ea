#include "offload/rendezvous_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "proto/rendezvous.grpc.pb.h"
#include "runtime/grpc_server.h"

namespace lspo::offload {
namespace {

using Clock = std::chrono::steady_clock;

// Largest message either side accepts: keys and values are small (fingerprints, Gloo's
// addresses), but a job spec with a long chat template travels in the fingerprint.
constexpr int kMaxMessageBytes = 64 << 20;
// How often a blocked get / wait looks whether its caller went away or the server stops.
constexpr auto kWaitSlice = std::chrono::milliseconds(100);
// Extra time a client gives a call beyond the wait it asks the server for, so that the
// server's own DEADLINE_EXCEEDED (which names the keys) arrives before gRPC's.
constexpr auto kDeadlineSlack = std::chrono::seconds(2);

std::string Seconds(std::chrono::milliseconds ms) {
  return absl::StrCat(static_cast<double>(ms.count()) / 1000.0, " s");
}

// At most 8 keys, then how many more.
std::string KeyList(const std::vector<std::string>& keys) {
  if (keys.size() <= 8) return absl::StrJoin(keys, ", ");
  return absl::StrCat(absl::StrJoin(keys.begin(), keys.begin() + 8, ", "), " and ", keys.size() - 8,
                      " more");
}

bool IsLoopback(const sockaddr* a) {
  if (a->sa_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(a);
    return (ntohl(v4->sin_addr.s_addr) >> 24) == 127;
  }
  if (a->sa_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(a);
    return IN6_IS_ADDR_LOOPBACK(&v6->sin6_addr) ||
           (IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr) && v6->sin6_addr.s6_addr[12] == 127);
  }
  return false;
}

// Whether a TCP connection to host:port opens within `bound` (something listens there).
bool SomethingListens(const std::string& host, int port, std::chrono::milliseconds bound) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool open = false;
  for (addrinfo* a = found; a != nullptr && !open; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      open = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof(err);
      open = poll(&p, 1, static_cast<int>(bound.count())) == 1 &&
             getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
    close(fd);
  }
  freeaddrinfo(found);
  return open;
}

std::string Bytes(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> Vec(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

}  // namespace

std::string JoinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

bool ResolvesToLoopbackOnly(const std::string& host) {
  if (host.empty()) return false;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  bool all = found != nullptr;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) all = all && IsLoopback(a->ai_addr);
  freeaddrinfo(found);
  return all;
}

absl::StatusOr<std::string> ReadRendezvousToken(const std::string& path,
                                                const std::string& setting) {
  absl::StatusOr<std::string> contents = runtime::ReadSecretFile(path, setting);
  if (!contents.ok()) return contents.status();
  const std::string token(absl::StripAsciiWhitespace(*contents));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(setting, "=", path, " is empty: write the job's token into it"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          setting, "=", path,
          ": the token must be one line of printable ASCII without spaces (e.g. the output of "
          "`openssl rand -hex 32`)"));
    }
  }
  return token;
}

// ---------------------------------------------------------------------------------------------
// Server.

struct RendezvousServer::Impl final : public lspo::v1::Rendezvous::Service {
  std::string token;
  std::mutex mu;
  std::condition_variable changed;
  std::map<std::string, std::string> data;  // guarded by mu
  bool stopping = false;                    // guarded by mu
  std::atomic<int64_t> refused{0};
  int port = 0;
  // Declared last: destroyed first, while the service it calls is still alive.
  std::unique_ptr<grpc::Server> server;

  // OK when the call carries the token (or the store has none); UNAUTHENTICATED otherwise,
  // before anything is read or written.
  grpc::Status Authorize(grpc::ServerContext* context) {
    if (token.empty()) return grpc::Status::OK;
    const auto& md = context->client_metadata();
    auto it = md.find("authorization");
    constexpr absl::string_view kScheme = "Bearer ";
    bool ok = false;
    if (it != md.end()) {
      const absl::string_view value(it->second.data(), it->second.size());
      ok = absl::StartsWithIgnoreCase(value, kScheme) &&
           runtime::ConstantTimeEquals(value.substr(kScheme.size()), token);
    }
    if (ok) return grpc::Status::OK;
    refused++;
    LOG_FIRST_N(WARNING, 10) << "rendezvous store: refused a call from " << context->peer()
                             << (it == md.end() ? " without a token" : " with a wrong token");
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        it == md.end() ? "this rendezvous store requires the job's token"
                                       : "wrong rendezvous token");
  }

  // Blocks until every key exists (OK), the wait passes `timeout_ms` (> 0; DEADLINE_EXCEEDED
  // naming the missing keys), the caller goes away (CANCELLED) or the server stops.
  grpc::Status WaitForKeys(grpc::ServerContext* context, const std::vector<std::string>& keys,
                           int64_t timeout_ms) {
    const auto until = timeout_ms > 0 ? Clock::now() + std::chrono::milliseconds(timeout_ms)
                                      : Clock::time_point::max();
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      std::vector<std::string> missing;
      for (const std::string& k : keys) {
        if (data.find(k) == data.end()) missing.push_back(k);
      }
      if (missing.empty()) return grpc::Status::OK;
      if (stopping) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "the rendezvous store is shutting down (rank 0 left the job)");
      }
      if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
      const auto now = Clock::now();
      if (now >= until) {
        return grpc::Status(
            grpc::StatusCode::DEADLINE_EXCEEDED,
            absl::StrCat("keys not set within ", Seconds(std::chrono::milliseconds(timeout_ms)),
                         ": ", KeyList(missing)));
      }
      changed.wait_until(lock, std::min(until, now + kWaitSlice));
    }
  }

  grpc::Status Hello(grpc::ServerContext* context, const v1::RendezvousHelloRequest*,
                     v1::RendezvousHelloReply* reply) override {
    if (grpc::Status st = Authorize(context); !st.ok()) return st;
    reply->set_protocol(kRendezvousProtocol);
    reply->set_token_required(!token.empty());
    return grpc::Status::OK;
  }

  grpc::Status Set(grpc::ServerContext* context, const v1::RendezvousKeyRequest* request,
                   v1::RendezvousValueReply*) override {
    if (grpc::Status st = Authorize(context); !st.ok()) return st;
    {
      std::lock_guard<std::mutex> lock(mu);
      data[request->key()] = request->value();
    }
    changed.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext* context, const v1::RendezvousKeyRequest* request,
                   v1::RendezvousValueReply* reply) override {
    if (grpc::Status st = Authorize(context); !st.ok()) return st;
    if (grpc::Status st = WaitForKeys(context, {request->key()}, request->timeout_ms()); !st.ok()) {
      return st;
    }
    std::lock_guard<std::mutex> lock(mu);
    auto it = data.find(request->key());
    if (it == data.end()) {  // deleted between the wait and now
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "the key was deleted");
    }
    reply->set_value(it->second);
    return grpc::Status::OK;
  }

  grpc::Status CompareSet(grpc::ServerContext* context,
                          const v1::RendezvousCompareSetRequest* request,
                          v1::RendezvousValueReply* reply) override {
    if (grpc::Status st = Authorize(context); !st.ok()) return st;
    bool wrote = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = data.find(request->key());
      if (it == data.end()) {
        if (request->expected().empty()) {
          data[request->key()] = request->desired();
          reply->set_value(request->desired());
          wrote = true;
        } else {
          reply->set_value(request->expected());
        }
      } else {
        if (it->second == request->expected()) {
          it->second = request->desired();
          wrote = true;
        }
        reply->set_value(it->second);
      }
    }
    if (wrote) changed.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status Add(grpc::ServerContext* context, const v1::RendezvousAddRequest* request,
                   v1::RendezvousAddReply* reply) override {
    if (grpc::Status st = Authorize(context); !st.ok()) return st;
    {
      std::lock_guard<std::mutex> lock(mu);
      int64_t value = 0;
      auto it = data.find(request->key());
      if (it != data.end() && !absl::SimpleAtoi(it->second, &value)) {
        return grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("add: the value of key ", request->key(), " is not a number"));
      }
      value += request->delta();
      data[request->key()] = std::to_string(value);
      reply->set_value(value);
    }
    changed.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status DeleteKey(grpc::ServerContext* context, const v1::RendezvousKeyRequest* request,
                         v1::RendezvousBoolReply* reply) override {
    if (grpc::Status st = Authorize(context); !st.ok()) return st;
    std::lock_guard<std::mutex> lock(mu);
    reply->set_value(data.erase(request->key()) == 1);
    return grpc::Status::OK;
  }

  grpc::Status Check(grpc::ServerContext* context, const v1::RendezvousKeysRequest* request,
                     v1::RendezvousBoolReply* reply) override {
    if (grpc::Status st = Authorize(context); !st.ok()) return st;
    std::lock_guard<std::mutex> lock(mu);
    bool all = true;
    for (const std::string& k : request->keys()) all = all && data.count(k) == 1;
    reply->set_value(all);
    return grpc::Status::OK;
  }

  grpc::Status NumKeys(grpc::ServerContext* context, const v1::RendezvousNumKeysRequest*,
                       v1::RendezvousNumKeysReply* reply) override {
    if (grpc::Status st = Authorize(context); !st.ok()) return st;
    std::lock_guard<std::mutex> lock(mu);
    reply->set_count(static_cast<int64_t>(data.size()));
    return grpc::Status::OK;
  }

  grpc::Status Wait(grpc::ServerContext* context, const v1::RendezvousKeysRequest* request,
                    v1::RendezvousBoolReply* reply) override {
    if (grpc::Status st = Authorize(context); !st.ok()) return st;
    const std::vector<std::string> keys(request->keys().begin(), request->keys().end());
    if (grpc::Status st = WaitForKeys(context, keys, request->timeout_ms()); !st.ok()) return st;
    reply->set_value(true);
    return grpc::Status::OK;
  }
};

RendezvousServer::RendezvousServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RendezvousServer::~RendezvousServer() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->changed.notify_all();
  impl_->server->Shutdown(std::chrono::system_clock::now());
  impl_->server->Wait();
}

int RendezvousServer::port() const { return impl_->port; }

int64_t RendezvousServer::refused_calls() const { return impl_->refused.load(); }

absl::StatusOr<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(
    const std::string& host, int port, const std::string& token) {
  if (host.empty()) {
    return absl::InvalidArgumentError("rendezvous store: the host to listen on is empty");
  }
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous store: port ", port, " is outside [0, 65535]"));
  }
  auto impl = std::make_unique<Impl>();
  impl->token = token;
  const std::string listen = JoinHostPort(host, port);
  grpc::ServerBuilder builder;
  // Only the addresses `host` resolves to are bound (never the wildcard address).
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &impl->port);
  // A second store on the same port must fail, not silently share it.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.RegisterService(impl.get());
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || impl->port == 0) {
    if (impl->server != nullptr) impl->server->Shutdown();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen,
                     ": the port is in use or the host is not an address of this host"));
  }
  return std::unique_ptr<RendezvousServer>(new RendezvousServer(std::move(impl)));
}

// ---------------------------------------------------------------------------------------------
// Client.

RendezvousStoreError::RendezvousStoreError(absl::Status status)
    : std::runtime_error(status.ToString()), status_(std::move(status)) {}

struct RendezvousStore::Impl {
  RendezvousClientOptions options;
  std::string where;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Rendezvous::Stub> stub;

  // A context with the token and a deadline `after` from now (zero: none).
  void Prepare(grpc::ClientContext* context, std::chrono::milliseconds after) const {
    if (!options.token.empty()) {
      context->AddMetadata("authorization", absl::StrCat("Bearer ", options.token));
    }
    if (after.count() > 0) context->set_deadline(std::chrono::system_clock::now() + after);
  }

  // The status of a failed call as this rank reports it.
  absl::Status Error(const grpc::Status& st, absl::string_view what) const {
    const std::string msg = st.error_message();
    switch (st.error_code()) {
      case grpc::StatusCode::UNAUTHENTICATED:
        return absl::PermissionDeniedError(
            options.token.empty()
                ? absl::StrCat("the rendezvous store at ", where,
                               " requires the job's token and this rank has none: give every "
                               "rank the same distributed.rendezvous_token_file")
                : absl::StrCat("the rendezvous store at ", where, " refused this rank's token (",
                               options.token_source,
                               "): give every rank a file holding the same token as rank 0's"));
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        return absl::DeadlineExceededError(
            absl::StrCat("rendezvous store at ", where, ": ", what, " timed out: ", msg));
      case grpc::StatusCode::INVALID_ARGUMENT:
        return absl::InvalidArgumentError(
            absl::StrCat("rendezvous store at ", where, ": ", what, ": ", msg));
      default:
        return absl::UnavailableError(absl::StrCat("rendezvous store at ", where, ": ", what,
                                                   " failed (", st.error_code(), "): ", msg));
    }
  }
};

RendezvousStore::RendezvousStore(std::shared_ptr<Impl> impl)
    : c10d::Store(std::chrono::milliseconds(absl::ToInt64Milliseconds(impl->options.timeout))),
      impl_(std::move(impl)),
      where_(impl_->where) {}

RendezvousStore::~RendezvousStore() = default;

absl::StatusOr<c10::intrusive_ptr<RendezvousStore>> RendezvousStore::Connect(
    const RendezvousClientOptions& options) {
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  impl->where = JoinHostPort(options.host, options.port);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // Retry a connection that is refused (rank 0 not up yet) quickly, like TCPStore's client.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Every store has its own connection, as every rank of a job in its own process has.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  impl->channel = grpc::CreateCustomChannel(impl->where, grpc::InsecureChannelCredentials(), args);
  impl->stub = v1::Rendezvous::NewStub(impl->channel);

  const auto timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(options.timeout));
  grpc::ClientContext context;
  impl->Prepare(&context, std::max(timeout, std::chrono::milliseconds(1)));
  context.set_wait_for_ready(true);  // rank 0 may start after this rank
  v1::RendezvousHelloReply reply;
  const grpc::Status st = impl->stub->Hello(&context, v1::RendezvousHelloRequest(), &reply);
  if (st.error_code() == grpc::StatusCode::UNAUTHENTICATED) return impl->Error(st, "hello");
  if (st.error_code() == grpc::StatusCode::UNIMPLEMENTED ||
      (st.ok() && reply.protocol() != kRendezvousProtocol)) {
    return absl::UnavailableError(absl::StrCat(
        impl->where, " answers gRPC but is not a rendezvous store of this version (",
        st.ok() ? absl::StrCat("protocol '", reply.protocol(), "'") : st.error_message(),
        "): another service on the port, or ranks of different versions"));
  }
  if (!st.ok()) {
    if (SomethingListens(options.host, options.port, std::chrono::milliseconds(1000))) {
      return absl::UnavailableError(absl::StrCat("something at ", impl->where,
                                                 " accepts connections but did not answer as a "
                                                 "rendezvous store within ",
                                                 Seconds(timeout),
                                                 " (another program on the port, or a "
                                                 "stale or stopped process?): ",
                                                 st.error_message()));
    }
    return absl::UnavailableError(absl::StrCat("nothing answered at ", impl->where, " within ",
                                               Seconds(timeout), ": ", st.error_message(),
                                               " (is rank 0 running, is the address right?)"));
  }
  if (!reply.token_required() && !options.token.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the rendezvous store at ", impl->where, " takes no token but this rank has one (",
        options.token_source,
        "): rank 0 was started without distributed.rendezvous_token_file; give every rank the "
        "same token file"));
  }
  return c10::make_intrusive<RendezvousStore>(std::move(impl));
}

void RendezvousStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  grpc::ClientContext context;
  impl_->Prepare(&context, timeout_);
  v1::RendezvousKeyRequest request;
  request.set_key(key);
  request.set_value(Bytes(value));
  v1::RendezvousValueReply reply;
  const grpc::Status st = impl_->stub->Set(&context, request, &reply);
  if (!st.ok()) throw RendezvousStoreError(impl_->Error(st, absl::StrCat("set ", key)));
}

std::vector<uint8_t> RendezvousStore::compareSet(const std::string& key,
                                                 const std::vector<uint8_t>& expected,
                                                 const std::vector<uint8_t>& desired) {
  grpc::ClientContext context;
  impl_->Prepare(&context, timeout_);
  v1::RendezvousCompareSetRequest request;
  request.set_key(key);
  request.set_expected(Bytes(expected));
  request.set_desired(Bytes(desired));
  v1::RendezvousValueReply reply;
  const grpc::Status st = impl_->stub->CompareSet(&context, request, &reply);
  if (!st.ok()) throw RendezvousStoreError(impl_->Error(st, absl::StrCat("compareSet ", key)));
  return Vec(reply.value());
}

std::vector<uint8_t> RendezvousStore::get(const std::string& key) {
  grpc::ClientContext context;
  const std::chrono::milliseconds timeout = timeout_;
  impl_->Prepare(
      &context, timeout.count() > 0 ? timeout + kDeadlineSlack : std::chrono::milliseconds::zero());
  v1::RendezvousKeyRequest request;
  request.set_key(key);
  request.set_timeout_ms(timeout.count());
  v1::RendezvousValueReply reply;
  const grpc::Status st = impl_->stub->Get(&context, request, &reply);
  if (!st.ok()) throw RendezvousStoreError(impl_->Error(st, absl::StrCat("get ", key)));
  return Vec(reply.value());
}

int64_t RendezvousStore::add(const std::string& key, int64_t value) {
  grpc::ClientContext context;
  impl_->Prepare(&context, timeout_);
  v1::RendezvousAddRequest request;
  request.set_key(key);
  request.set_delta(value);
  v1::RendezvousAddReply reply;
  const grpc::Status st = impl_->stub->Add(&context, request, &reply);
  if (!st.ok()) throw RendezvousStoreError(impl_->Error(st, absl::StrCat("add ", key)));
  return reply.value();
}

bool RendezvousStore::deleteKey(const std::string& key) {
  grpc::ClientContext context;
  impl_->Prepare(&context, timeout_);
  v1::RendezvousKeyRequest request;
  request.set_key(key);
  v1::RendezvousBoolReply reply;
  const grpc::Status st = impl_->stub->DeleteKey(&context, request, &reply);
  if (!st.ok()) throw RendezvousStoreError(impl_->Error(st, absl::StrCat("deleteKey ", key)));
  return reply.value();
}

bool RendezvousStore::check(const std::vector<std::string>& keys) {
  grpc::ClientContext context;
  impl_->Prepare(&context, timeout_);
  v1::RendezvousKeysRequest request;
  for (const std::string& k : keys) request.add_keys(k);
  v1::RendezvousBoolReply reply;
  const grpc::Status st = impl_->stub->Check(&context, request, &reply);
  if (!st.ok()) throw RendezvousStoreError(impl_->Error(st, "check"));
  return reply.value();
}

int64_t RendezvousStore::getNumKeys() {
  grpc::ClientContext context;
  impl_->Prepare(&context, timeout_);
  v1::RendezvousNumKeysReply reply;
  const grpc::Status st = impl_->stub->NumKeys(&context, v1::RendezvousNumKeysRequest(), &reply);
  if (!st.ok()) throw RendezvousStoreError(impl_->Error(st, "getNumKeys"));
  return reply.count();
}

void RendezvousStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void RendezvousStore::wait(const std::vector<std::string>& keys,
                           const std::chrono::milliseconds& timeout) {
  grpc::ClientContext context;
  impl_->Prepare(
      &context, timeout.count() > 0 ? timeout + kDeadlineSlack : std::chrono::milliseconds::zero());
  v1::RendezvousKeysRequest request;
  for (const std::string& k : keys) request.add_keys(k);
  request.set_timeout_ms(timeout.count());
  v1::RendezvousBoolReply reply;
  const grpc::Status st = impl_->stub->Wait(&context, request, &reply);
  if (!st.ok()) {
    throw RendezvousStoreError(impl_->Error(st, absl::StrCat("wait for ", KeyList(keys))));
  }
}

c10::intrusive_ptr<c10d::Store> RendezvousStore::clone() {
  auto copy = c10::make_intrusive<RendezvousStore>(impl_);
  copy->setTimeout(timeout_);
  return copy;
}

}  // namespace lspo::offload
