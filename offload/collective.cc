// Shapes as in offload/collective.h: any shape, the dtypes per function.
#include "offload/collective.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "offload/rendezvous_store.h"
#include "runtime/status_macros.h"
#include "runtime/tfrecord.h"

#if LSPO_HAS_GLOO
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif

namespace lspo::offload {
namespace {

std::string DefaultLabel() {
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return absl::StrCat(host[0] ? host : "localhost", ":", getpid());
}

// A fingerprint as shown in errors: the first 16 characters.
std::string Short(const std::string& fingerprint) {
  return fingerprint.size() <= 16 ? fingerprint : fingerprint.substr(0, 16) + "...";
}

// An exception's message without LibTorch's stack trace (c10::Error::what() appends one).
std::string Reason(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) return c10->what_without_backtrace();
  return e.what();
}

// At most 16 ranks, then how many more (a group of thousands would list them all).
std::string RankList(const std::vector<int>& ranks) {
  if (ranks.size() <= 16) return absl::StrJoin(ranks, ", ");
  return absl::StrCat(absl::StrJoin(ranks.begin(), ranks.begin() + 16, ", "), " and ",
                      ranks.size() - 16, " more");
}

// OK when `address` resolves to an address of this host that a socket can bind (port 0);
// otherwise the reason, so a bad bind_address fails before the rendezvous, not as a timeout of
// the other ranks.
absl::Status CheckBindAddress(const std::string& address) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distributed: bind_address '", address, "' ", why,
        ": give an address (no port) of this host that the other ranks can reach, e.g. "
        "127.0.0.1 for ranks on one host"));
  };
  if (address.empty()) return bad("is empty");
  if (address.find(':') != std::string::npos && address.find(':') == address.rfind(':')) {
    return bad("has a port; Gloo picks its own ports");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(address.c_str(), nullptr, &hints, &found); rc != 0) {
    return bad(absl::StrCat("does not resolve (", gai_strerror(rc), ")"));
  }
  bool bound = false;
  for (addrinfo* a = found; a != nullptr && !bound; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    bound = bind(fd, a->ai_addr, a->ai_addrlen) == 0;  // the port in ai_addr is 0
    close(fd);
  }
  freeaddrinfo(found);
  if (!bound) return bad("is not an address of this host (cannot bind it)");
  return absl::OkStatus();
}

std::string Seconds(absl::Duration d) { return absl::StrCat(absl::ToDoubleSeconds(d), " s"); }

int64_t MicrosSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               t0)
      .count();
}

}  // namespace

#if LSPO_HAS_GLOO
struct Collective::Impl {
  std::unique_ptr<RendezvousServer> server;  // rank 0 only; destroyed after its users
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
};

struct PendingCollective::Impl {
  Collective* owner = nullptr;
  c10::intrusive_ptr<c10d::Work> work;  // null: nothing to wait for (world size 1)
  at::Tensor tensor;                    // the all-reduced tensor, any shape, fp32/fp64/int64 CPU
  std::string what;
};
#else
struct Collective::Impl {};
struct PendingCollective::Impl {
  Collective* owner = nullptr;
  at::Tensor tensor;  // the all-reduced tensor, any shape, fp32/fp64/int64 CPU
  std::string what;
};
#endif

bool CollectivesAvailable() { return LSPO_HAS_GLOO != 0; }

absl::StatusOr<int64_t> SumTensorsAcrossRanks(Collective& group, std::vector<at::Tensor>& tensors,
                                              const std::vector<int64_t>& numels) {
  if (tensors.size() != numels.size()) {
    return absl::InvalidArgumentError(absl::StrCat("SumTensorsAcrossRanks: ", tensors.size(),
                                                   " tensors but ", numels.size(), " sizes"));
  }
  int64_t total = 1;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].defined() && tensors[i].numel() != numels[i]) {
      return absl::InvalidArgumentError(absl::StrCat("SumTensorsAcrossRanks: tensor ", i, " has ",
                                                     tensors[i].numel(), " elements, expected ",
                                                     numels[i]));
    }
    total += numels[i];
  }
  // (1 + sum(numels)) fp32 CPU; element 0 counts the undefined entries.
  at::Tensor flat = at::zeros({total}, at::kFloat);
  int64_t offset = 1;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].defined()) {
      flat.narrow(0, offset, numels[i]).copy_(tensors[i].reshape({-1}));
    } else {
      flat[0] += 1.0f;
    }
    offset += numels[i];
  }
  if (absl::Status status = group.AllReduceSum(flat); !status.ok()) return status;
  offset = 1;
  for (size_t i = 0; i < tensors.size(); ++i) {
    at::Tensor sum = flat.narrow(0, offset, numels[i]);  // (numels[i]) fp32, a view of flat
    if (tensors[i].defined()) {
      tensors[i].copy_(sum.view(tensors[i].sizes()));  // to its dtype and device
    } else {
      tensors[i] = sum;
    }
    offset += numels[i];
  }
  return static_cast<int64_t>(flat[0].item<float>());
}

absl::Status BroadcastTensors(Collective& group, std::vector<at::Tensor>& tensors, int root) {
  const at::ScalarType kinds[] = {at::kFloat, at::kDouble, at::kLong};
  at::Tensor counts = at::zeros({3}, at::kLong);  // (3) int64: elements per fp32/fp64/int64
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];  // any shape; fp32, fp64 or int64 (checked)
    int k = 0;
    while (k < 3 && (!t.defined() || t.scalar_type() != kinds[k])) ++k;
    if (k == 3) {
      return absl::InvalidArgumentError(
          absl::StrCat("BroadcastTensors: tensor ", i, " is ",
                       t.defined() ? c10::toString(t.scalar_type()) : "undefined",
                       "; fp32, fp64 or int64 tensors only"));
    }
    counts[k] += t.numel();
  }
  if (group.world_size() <= 1) return absl::OkStatus();
  at::Tensor root_counts = counts.clone();  // (3) int64, root's counts after the broadcast
  if (absl::Status st = group.Broadcast(root_counts, root); !st.ok()) return st;
  const bool same = at::equal(root_counts, counts);
  auto agree = group.AllGather(same ? 1 : 0);
  if (!agree.ok()) return agree.status();
  std::vector<std::string> differ;
  for (size_t r = 0; r < agree->size(); ++r) {
    if ((*agree)[r] == 0) differ.push_back(absl::StrCat("rank ", r, " (", group.labels()[r], ")"));
  }
  if (!differ.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "distributed: broadcast from rank ", root, ": the tensors of ", absl::StrJoin(differ, ", "),
        " differ in size from rank ", root, "'s (elements per fp32/fp64/int64: ",
        absl::StrJoin(root_counts.data_ptr<int64_t>(), root_counts.data_ptr<int64_t>() + 3, "/"),
        ")"));
  }
  for (int k = 0; k < 3; ++k) {
    const int64_t n = counts[k].item<int64_t>();
    if (n == 0) continue;
    at::Tensor flat = at::empty({n}, kinds[k]);  // (n) kinds[k] CPU: that dtype's tensors packed
    int64_t offset = 0;
    for (at::Tensor& t : tensors) {  // any shape; only kinds[k]'s are packed
      if (t.scalar_type() != kinds[k]) continue;
      if (group.rank() == root) flat.narrow(0, offset, t.numel()).copy_(t.reshape({-1}));
      offset += t.numel();
    }
    if (absl::Status st = group.Broadcast(flat, root); !st.ok()) return st;
    if (group.rank() == root) continue;
    offset = 0;
    for (at::Tensor& t : tensors) {  // any shape; only kinds[k]'s are unpacked
      if (t.scalar_type() != kinds[k]) continue;
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
  return absl::OkStatus();
}

uint32_t Crc32cExtendTensor(uint32_t crc, const at::Tensor& tensor, size_t sample_bytes) {
  if (!tensor.defined()) return crc;
  const at::Tensor t = tensor.detach().to(at::kCPU).contiguous();  // tensor's shape and dtype, CPU
  const char* bytes = static_cast<const char*>(t.data_ptr());
  const size_t n = t.nbytes();
  if (sample_bytes == 0 || n <= 3 * sample_bytes) {
    return runtime::Crc32cExtend(crc, absl::string_view(bytes, n));
  }
  for (size_t start : {size_t{0}, (n - sample_bytes) / 2, n - sample_bytes}) {
    crc = runtime::Crc32cExtend(crc, absl::string_view(bytes + start, sample_bytes));
  }
  return crc;
}

PendingCollective::PendingCollective(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PendingCollective::~PendingCollective() {
#if LSPO_HAS_GLOO
  // Never leave Gloo writing into a tensor that is about to be freed.
  if (impl_ != nullptr && impl_->work) {
    try {
      impl_->work->wait();
    } catch (const std::exception&) {
    }
  }
#endif
}

absl::Status PendingCollective::Wait() {
#if LSPO_HAS_GLOO
  if (impl_ == nullptr || !impl_->work) return absl::OkStatus();
  const auto t0 = std::chrono::steady_clock::now();
  auto work = std::move(impl_->work);
  impl_->work.reset();
  try {
    work->wait(
        std::chrono::milliseconds(absl::ToInt64Milliseconds(impl_->owner->options_.timeout)));
  } catch (const std::exception& e) {
    impl_->owner->all_reduce_micros_ += MicrosSince(t0);
    return impl_->owner->Failure(impl_->what, &impl_->tensor, Reason(e));
  }
  impl_->owner->all_reduce_micros_ += MicrosSince(t0);
#endif
  return absl::OkStatus();
}

#if LSPO_HAS_GLOO
namespace {

// Issue 43: a store that other hosts can reach must be asked for explicitly, with a token.
// Errors: kFailedPrecondition naming what is missing (`token_setting` the token's spec field).
absl::Status CheckRendezvousReach(const CollectiveOptions& options, const char* token_setting) {
  const char* kTokenSetting = token_setting;
  if (!ResolvesToLoopbackOnly(options.host) &&
      !(options.allow_remote && !options.secret_file.empty())) {
    std::vector<std::string> missing;
    if (!options.allow_remote) missing.push_back("distributed.allow_remote: true");
    if (options.secret_file.empty()) {
      missing.push_back(absl::StrCat(kTokenSetting,
                                     " (a file holding the job's token, mode 0600, on every "
                                     "rank; e.g. from `openssl rand -hex 32`)"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "distributed: the rendezvous host '", options.host,
        "' is not a loopback address (or does not resolve): rank 0's store would be reachable "
        "from other hosts, which needs ",
        absl::StrJoin(missing, " and "), "; or use 127.0.0.1 when every rank runs on this host"));
  }
  return absl::OkStatus();
}

// Every rank's join entry through `store` (reached at `at`): this rank claims its rank and
// publishes its fingerprint, label and exclusive resource, waits for all ranks, and reads
// theirs into *fingerprints, *labels, *exclusive (world_size each); rank 0, which hosts the
// store, waits until every rank has read the table.
// Errors: kAlreadyExists (the rank is taken), kDeadlineExceeded naming the ranks that did not
// join, kPermissionDenied (a wrong token), kUnavailable (the store was lost).
absl::Status ExchangeJoinTable(c10d::Store& store, const CollectiveOptions& options,
                               const std::string& at, std::vector<std::string>* fingerprints,
                               std::vector<std::string>* labels,
                               std::vector<std::string>* exclusive) {
  const auto timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(options.timeout));
  auto key = [](const char* kind, int r) { return absl::StrCat("lspo/", kind, "/", r); };
  auto text = [](const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  try {
    // One process per rank: the first to claim a rank keeps it.
    if (store.add(key("claim", options.rank), 1) > 1) {
      return absl::AlreadyExistsError(absl::StrCat(
          "distributed: rank ", options.rank, " (", options.label,
          ") is already taken in the group at ", at,
          ": another process joined with the same rank; give every process its own rank "
          "(lspctl run --rank=R, R in 0 .. ",
          options.world_size - 1, ")"));
    }
    store.set(key("exclusive", options.rank), text(options.exclusive));
    store.set(key("join", options.rank), text(options.fingerprint + '\n' + options.label));
    std::vector<std::string> keys;
    for (int r = 0; r < options.world_size; ++r) keys.push_back(key("join", r));
    try {
      store.wait(keys, timeout);
    } catch (const std::exception&) {
      std::vector<int> missing;
      for (int r = 0; r < options.world_size; ++r) {
        if (!store.check({keys[r]})) missing.push_back(r);
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "distributed: rank", missing.size() == 1 ? " " : "s ", RankList(missing), " of ",
          options.world_size, " did not join the rendezvous at ", at, " within ",
          Seconds(options.timeout),
          ": start every rank with the same rendezvous address, or raise the timeout"));
    }
    for (int r = 0; r < options.world_size; ++r) {
      const std::vector<uint8_t> v = store.get(keys[r]);
      const std::string s(v.begin(), v.end());
      const size_t nl = s.rfind('\n');
      (*fingerprints)[r] = s.substr(0, nl);
      (*labels)[r] = nl == std::string::npos ? "" : s.substr(nl + 1);
      const std::vector<uint8_t> x = store.get(key("exclusive", r));
      (*exclusive)[r].assign(x.begin(), x.end());
    }
    // Rank 0 hosts the store: it stays until every rank has read the table.
    store.set(key("seen", options.rank), std::vector<uint8_t>{1});
    if (options.rank == 0) {
      std::vector<std::string> seen;
      for (int r = 0; r < options.world_size; ++r) seen.push_back(key("seen", r));
      store.wait(seen, timeout);
    }
  } catch (const std::exception& e) {
    const auto* store_error = dynamic_cast<const RendezvousStoreError*>(&e);
    if (store_error != nullptr &&
        store_error->status().code() == absl::StatusCode::kPermissionDenied) {
      return absl::PermissionDeniedError(
          absl::StrCat("distributed: rank ", options.rank, ": ", store_error->status().message()));
    }
    return absl::UnavailableError(absl::StrCat(
        "distributed: rank ", options.rank, " lost the rendezvous store at ", at, ": ",
        store_error != nullptr ? std::string(store_error->status().message()) : Reason(e),
        options.rank == 0 ? ""
                          : " (rank 0 hosts the store and exits when it gives up, e.g. when a "
                            "rank does not join within the timeout or runs a different job: "
                            "see rank 0's error)"));
  }
  return absl::OkStatus();
}

// The ranks run one job (the same fingerprint) and claim distinct exclusive resources.
// Errors: kFailedPrecondition naming the rank that differs and how; kAlreadyExists naming
// the two ranks that share a resource.
absl::Status CheckRanksAgree(const CollectiveOptions& options,
                             const std::vector<std::string>& fingerprints,
                             const std::vector<std::string>& labels,
                             const std::vector<std::string>& exclusive) {
  for (int r = 1; r < options.world_size; ++r) {
    if (fingerprints[r] != fingerprints[0]) {
      const std::string what = options.explain_mismatch
                                   ? options.explain_mismatch(fingerprints[0], fingerprints[r])
                                   : absl::StrCat("fingerprint ", Short(fingerprints[r]), " vs ",
                                                  Short(fingerprints[0]));
      return absl::FailedPreconditionError(absl::StrCat(
          "distributed: rank ", r, " (", labels[r], ") runs a different job than rank 0 (",
          labels[0], "): ", what, "; start every rank with the same job spec and model files"));
    }
  }
  for (int r = 0; r < options.world_size; ++r) {
    for (int q = r + 1; q < options.world_size && !exclusive[r].empty(); ++q) {
      if (exclusive[q] == exclusive[r]) {
        return absl::AlreadyExistsError(absl::StrCat("distributed: ranks ", r, " (", labels[r],
                                                     ") and ", q, " (", labels[q], ") share ",
                                                     exclusive[r], ": give every rank its own"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace
#endif

Collective::Collective(const CollectiveOptions& options) : options_(options) {}

Collective::~Collective() = default;

absl::StatusOr<std::unique_ptr<Collective>> Collective::Join(const CollectiveOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("distributed: rank ", options.rank,
                                                   " with world_size ", options.world_size,
                                                   ": the rank must be in [0, world_size)"));
  }
  if (options.world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(absl::StrCat("distributed: world_size ", options.world_size,
                                                   " is above the ", kMaxWorldSize,
                                                   " ranks a job may have"));
  }
  if (options.world_size > 1 && options.host.empty()) {
    return absl::InvalidArgumentError(
        "distributed: the rendezvous host is empty: give rank 0's address (host:port)");
  }
  std::unique_ptr<Collective> c(new Collective(options));
  if (c->options_.label.empty()) c->options_.label = DefaultLabel();
  c->labels_ = {c->options_.label};
  if (options.world_size == 1) return c;
#if !LSPO_HAS_GLOO
  return absl::FailedPreconditionError(absl::StrCat(
      "distributed: world_size ", options.world_size,
      " needs c10d with Gloo, and this build has none: install libgloo-dev (scripts/setup) "
      "and rebuild"));
#else
  if (absl::Status st = CheckBindAddress(options.bind_address); !st.ok()) return st;
  constexpr char kTokenSetting[] = "distributed.rendezvous_token_file";
  RETURN_IF_ERROR(CheckRendezvousReach(options, kTokenSetting));
  std::string token;
  if (!options.secret_file.empty()) {
    absl::StatusOr<std::string> t = ReadRendezvousToken(options.secret_file, kTokenSetting);
    if (!t.ok()) {
      return absl::Status(t.status().code(), absl::StrCat("distributed: rank ", options.rank, ": ",
                                                          t.status().message()));
    }
    token = *std::move(t);
  }
  const std::string where = JoinHostPort(options.host, options.port);
  const auto timeout = std::chrono::milliseconds(absl::ToInt64Milliseconds(options.timeout));
  auto impl = std::make_unique<Impl>();
  c->port_ = options.port;
  if (options.rank == 0) {
    auto server = RendezvousServer::Start(options.host, options.port, token);
    if (!server.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "distributed: rank 0 cannot start the rendezvous store on ", where, ": ",
          server.status().message(),
          " (is the port in use, e.g. by another rank started without its rank? is the "
          "rendezvous host an address of this host?)"));
    }
    impl->server = *std::move(server);
    c->port_ = impl->server->port();
  }
  RendezvousClientOptions client;
  client.host = options.host;
  client.port = c->port_;
  client.token = token;
  client.token_source = absl::StrCat(kTokenSetting, "=", options.secret_file);
  client.timeout = options.timeout;
  auto store = RendezvousStore::Connect(client);
  if (!store.ok()) {
    if (store.status().code() == absl::StatusCode::kPermissionDenied) {
      return absl::PermissionDeniedError(absl::StrCat("distributed: rank ", options.rank,
                                                      " cannot join: ", store.status().message()));
    }
    return absl::UnavailableError(
        absl::StrCat("distributed: rank ", options.rank, " cannot reach the rendezvous store at ",
                     JoinHostPort(options.host, c->port_), " within ", Seconds(options.timeout),
                     ": ", store.status().message()));
  }
  impl->store = *std::move(store);
  const std::string at = JoinHostPort(options.host, c->port_);
  std::vector<std::string> fingerprints(options.world_size), labels(options.world_size),
      exclusive(options.world_size);
  RETURN_IF_ERROR(
      ExchangeJoinTable(*impl->store, c->options_, at, &fingerprints, &labels, &exclusive));
  c->labels_ = labels;
  RETURN_IF_ERROR(CheckRanksAgree(c->options_, fingerprints, labels, exclusive));
  try {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
    gloo_options->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname(options.bind_address));
    gloo_options->threads = 2;
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("lspo/gloo", impl->store);
    impl->group = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, options.rank,
                                                              options.world_size, gloo_options);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "distributed: rank ", options.rank, " (", c->options_.label,
        ") cannot connect to the other ranks from ", options.bind_address, " within ",
        Seconds(options.timeout), ": ", Reason(e),
        " (every rank's bind address must be an address of its host that the other ranks "
        "reach; a rank that failed to connect says why in its own error)"));
  }
  c->impl_ = std::move(impl);
  LOG(INFO) << "distributed: rank " << options.rank << " of " << options.world_size << " joined at "
            << at << " (" << absl::StrJoin(labels, ", ") << ")";
  return c;
#endif
}

absl::Status Collective::Check(const at::Tensor& tensor, const char* what) const {
  if (broken_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat("distributed: ", what, " on rank ", options_.rank,
                     " after an earlier collective failed: the group is broken; restart the job"));
  }
  if (!tensor.defined() || !tensor.device().is_cpu() || !tensor.is_contiguous() ||
      (tensor.scalar_type() != at::kFloat && tensor.scalar_type() != at::kDouble &&
       tensor.scalar_type() != at::kLong)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distributed: ", what, " takes a contiguous CPU tensor of fp32, fp64 or int64, got ",
        tensor.defined() ? tensor.toString() : "an undefined tensor",
        tensor.defined() && !tensor.is_contiguous() ? " (not contiguous)" : ""));
  }
  return absl::OkStatus();
}

absl::Status Collective::Failure(const std::string& what, const at::Tensor* tensor,
                                 const std::string& reason) {
  broken_ = true;
  std::vector<std::string> ranks;
  for (size_t r = 0; r < labels_.size(); ++r) ranks.push_back(absl::StrCat(r, " = ", labels_[r]));
  return absl::UnavailableError(absl::StrCat(
      "distributed: ", what,
      tensor != nullptr ? absl::StrCat(" of ", tensor->nbytes(), " bytes") : "", " on rank ",
      options_.rank, " of ", options_.world_size, " failed: ", reason, ". Ranks: ",
      absl::StrJoin(ranks, ", "), ". A rank died, closed its connections or did not answer within ",
      Seconds(options_.timeout), "; the job cannot go on with this group"));
}

absl::StatusOr<std::unique_ptr<PendingCollective>> Collective::StartAllReduceSum(
    at::Tensor& tensor) {
  if (absl::Status st = Check(tensor, "all-reduce"); !st.ok()) return st;
  auto p = std::make_unique<PendingCollective::Impl>();
  p->owner = this;
  p->tensor = tensor;
  p->what = "all-reduce";
  all_reduce_bytes_ += static_cast<int64_t>(tensor.nbytes());
#if LSPO_HAS_GLOO
  if (impl_ != nullptr) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      std::vector<at::Tensor> v = {tensor};  // tensor: any shape, fp32/fp64/int64 CPU
      c10d::AllreduceOptions o;
      o.reduceOp = c10d::ReduceOp::SUM;
      p->work = impl_->group->allreduce(v, o);
    } catch (const std::exception& e) {
      all_reduce_micros_ += MicrosSince(t0);
      return Failure("all-reduce", &tensor, Reason(e));
    }
    all_reduce_micros_ += MicrosSince(t0);
  }
#endif
  return std::unique_ptr<PendingCollective>(new PendingCollective(std::move(p)));
}

absl::Status Collective::AllReduceSum(at::Tensor& tensor) {
  auto pending = StartAllReduceSum(tensor);
  if (!pending.ok()) return pending.status();
  return (*pending)->Wait();
}

absl::Status Collective::AllReduceMean(at::Tensor& tensor) {
  if (tensor.defined() && !at::isFloatingType(tensor.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "distributed: all-reduce mean takes a floating tensor, got ", tensor.toString()));
  }
  if (absl::Status st = AllReduceSum(tensor); !st.ok()) return st;
  if (options_.world_size > 1) tensor.div_(static_cast<double>(options_.world_size));
  return absl::OkStatus();
}

absl::Status Collective::Broadcast(at::Tensor& tensor, int root) {
  if (root < 0 || root >= options_.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("distributed: broadcast from rank ", root, " of ", options_.world_size));
  }
  if (absl::Status st = Check(tensor, "broadcast"); !st.ok()) return st;
#if LSPO_HAS_GLOO
  if (impl_ == nullptr) return absl::OkStatus();
  try {
    std::vector<at::Tensor> v = {tensor};  // tensor: any shape, fp32/fp64/int64 CPU
    c10d::BroadcastOptions o;
    o.rootRank = root;
    impl_->group->broadcast(v, o)->wait(
        std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.timeout)));
  } catch (const std::exception& e) {
    return Failure("broadcast", &tensor, Reason(e));
  }
#endif
  return absl::OkStatus();
}

absl::StatusOr<int> AgreeOnNewestCommonStep(Collective& group, std::vector<int> held) {
  for (int s : held) {
    if (s <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("resume agreement: checkpoint step ", s, " is not positive"));
    }
  }
  std::sort(held.begin(), held.end(), std::greater<int>());
  held.erase(std::unique(held.begin(), held.end()), held.end());
  // This rank's newest step <= bound, or 0 (none).
  auto propose = [&](int64_t bound) -> int64_t {
    for (int s : held) {
      if (s <= bound) return s;
    }
    return 0;
  };
  int64_t bound = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> first;
  // Every rank sees the same proposals, so all take the same decisions; each round that does
  // not end lowers the bound strictly (to a positive step), so the rounds end.
  while (true) {
    absl::StatusOr<std::vector<int64_t>> proposals = group.AllGather(propose(bound));
    if (!proposals.ok()) return proposals.status();
    if (first.empty()) first = *proposals;
    const auto [lo, hi] = std::minmax_element(proposals->begin(), proposals->end());
    if (*lo == *hi) {
      if (*lo > 0 || *std::max_element(first.begin(), first.end()) == 0) {
        return static_cast<int>(*lo);
      }
      break;
    }
    if (*lo == 0) break;  // a rank holds nothing at or below the others' proposals
    bound = *lo;
  }
  std::vector<std::string> newest;
  for (size_t r = 0; r < first.size(); ++r) {
    newest.push_back(absl::StrCat("rank ", r, " (", group.labels()[r],
                                  "): ", first[r] > 0 ? absl::StrCat("step ", first[r]) : "none"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "distributed: the ranks hold no checkpoint of one step in common (newest verified "
      "checkpoint per rank: ",
      absl::StrJoin(newest, "; "),
      "): resume every rank from a "
      "checkpoint of the same step (resume_from: <output_dir>/checkpoints/step-NNNNNNNN), or "
      "start afresh with overwrite_output_dir: true"));
}

absl::StatusOr<std::vector<int64_t>> Collective::AllGather(int64_t value) {
  at::Tensor mine = at::full({1}, value, at::kLong);  // (1) int64 CPU, this rank's value
  if (absl::Status st = Check(mine, "all-gather"); !st.ok()) return st;
  std::vector<int64_t> out(options_.world_size, value);
#if LSPO_HAS_GLOO
  if (impl_ == nullptr) return out;
  try {
    std::vector<at::Tensor> in = {mine};
    std::vector<std::vector<at::Tensor>> gathered(1);  // [0][rank]: (1) int64 CPU
    for (int r = 0; r < options_.world_size; ++r) gathered[0].push_back(at::zeros({1}, at::kLong));
    impl_->group->allgather(gathered, in)
        ->wait(std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.timeout)));
    for (int r = 0; r < options_.world_size; ++r) out[r] = gathered[0][r].item<int64_t>();
  } catch (const std::exception& e) {
    return Failure("all-gather", &mine, Reason(e));
  }
#endif
  return out;
}

}  // namespace lspo::offload
