// The rendezvous store of a data-parallel job (issue 43, docs/distributed.md "Rendezvous"): a
// key-value store with c10d::Store's operations that rank 0 serves over gRPC
// (proto/rendezvous.proto) on the rendezvous address only, and that every rank, rank 0
// included, uses through RendezvousStore (the store c10d's ProcessGroupGloo is built on).
// Replaces c10d's TCPStore, which listens on every interface and has no authentication.
//
// Security: with a token, every call must carry `authorization: Bearer <token>`; a call without
// the right one is refused (UNAUTHENTICATED) before it reads or writes a key, and never
// blocks. The token travels in clear text (the store speaks plaintext gRPC, as Gloo speaks
// plaintext TCP): it keeps strangers who reach the port out, not an eavesdropper on the path.
// Thread-safety: RendezvousServer and RendezvousStore may be used from any number of threads.
#ifndef LSPO_OFFLOAD_RENDEZVOUS_STORE_H_
#define LSPO_OFFLOAD_RENDEZVOUS_STORE_H_

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace lspo::offload {

// What RendezvousServer answers to Hello: tells the store from another gRPC server on the port.
inline constexpr char kRendezvousProtocol[] = "lspo-rendezvous-1";

// "host:port", with brackets around an IPv6 literal ("[::1]:29500").
std::string JoinHostPort(const std::string& host, int port);

// Whether every address `host` resolves to is a loopback address (127.0.0.0/8, ::1); false
// when it does not resolve. "localhost" and "127.0.0.1" are; "0.0.0.0" and "" are not.
bool ResolvesToLoopbackOnly(const std::string& host);

// Reads the rendezvous token file `path` (runtime::ReadSecretFile's rules: not accessible to
// group or others), stripped of surrounding whitespace. Errors: kNotFound (unreadable),
// kFailedPrecondition (mode allows group/others: says `chmod 600`), kInvalidArgument (empty,
// or not one word of printable ASCII); each names `setting` and the path.
absl::StatusOr<std::string> ReadRendezvousToken(const std::string& path,
                                                const std::string& setting);

// The server side: a key-value store served on host:port (rank 0 of a job).
class RendezvousServer {
 public:
  // Starts serving on `host`:`port` (port 0: a free port, see port()). `host` is resolved by
  // gRPC and only its addresses are bound (127.0.0.1: loopback only; SO_REUSEPORT off, so a
  // second store on the same port fails). `token` non-empty: every call must carry it.
  // Errors: kInvalidArgument (empty host, port outside [0, 65535]); kUnavailable (the address
  // cannot be bound, e.g. the port is in use or `host` is not an address of this host).
  static absl::StatusOr<std::unique_ptr<RendezvousServer>> Start(const std::string& host, int port,
                                                                 const std::string& token);
  // Wakes every waiting call (they fail with UNAVAILABLE) and shuts the server down.
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  // The port bound (the chosen one when Start was given port 0).
  int port() const;
  // Calls refused for a missing or wrong token so far.
  int64_t refused_calls() const;

  struct Impl;  // the service (rendezvous_store.cc)

 private:
  explicit RendezvousServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// An error of a RendezvousStore operation, as c10d expects stores to report them (an
// exception), carrying the absl::Status: kDeadlineExceeded (a get or wait ran past its
// timeout), kPermissionDenied (the store refused the token), kUnavailable (the store went
// away or did not answer), kInvalidArgument (add on a value that is not a number).
class RendezvousStoreError : public std::runtime_error {
 public:
  explicit RendezvousStoreError(absl::Status status);
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// How a rank reaches the store.
struct RendezvousClientOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  // The job's token ("" = none) and where it came from, for errors (e.g. the file's path).
  std::string token;
  std::string token_source;
  // Bound on Connect, and the store's default timeout (get, wait without a timeout, and every
  // other call's deadline).
  absl::Duration timeout = absl::Seconds(60);
};

// A c10d::Store backed by a RendezvousServer. Semantics are TCPStore's (LibTorch 1.13):
//   set            stores the value (replacing one), wakes waiters;
//   get            blocks until the key exists, at most the store's timeout, then returns it;
//   add            treats a missing key as 0, adds, stores the decimal text, returns the sum;
//   compareSet     key missing: stores `desired` and returns it if `expected` is empty, else
//                  returns `expected` (stores nothing); key present: stores `desired` if the
//                  value equals `expected`; returns the value stored after the call;
//   deleteKey      whether the key existed; check: whether every key exists;
//   getNumKeys     the number of keys held; wait: blocks until every key exists (kNoTimeout =
//                  no bound), throwing after the timeout.
// Every failure throws RendezvousStoreError.
class RendezvousStore : public c10d::Store {
 public:
  // Opens a channel to the store and says Hello, waiting for the server to come up (at most
  // options.timeout): the first contact of a rank. Errors: kUnavailable (nothing answered at
  // host:port within the timeout, or something answered that is not the store: the message
  // says which, naming host:port), kPermissionDenied (the store refused the token, or this
  // rank has a token and the store takes none: naming token_source).
  static absl::StatusOr<c10::intrusive_ptr<RendezvousStore>> Connect(
      const RendezvousClientOptions& options);
  ~RendezvousStore() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;
  // A second client of the same store. Recent LibTorch 2.x releases declare Store::clone
  // pure virtual and 1.13 has no such method: without `override`, this overrides it where it
  // exists and compiles where it does not.
  c10::intrusive_ptr<c10d::Store> clone();

  // host:port of the store.
  const std::string& where() const { return where_; }

  struct Impl;  // the channel and stub (rendezvous_store.cc)
  // For Connect and clone only (public because c10::make_intrusive constructs it).
  explicit RendezvousStore(std::shared_ptr<Impl> impl);

 private:
  std::shared_ptr<Impl> impl_;
  std::string where_;
};

}  // namespace lspo::offload

#endif  // LSPO_OFFLOAD_RENDEZVOUS_STORE_H_
