// Collectives of a data-parallel job (issue 17, docs/distributed.md): the ranks of one job meet
// at a rendezvous (a store that rank 0 hosts, offload/rendezvous_store.h), check that they run
// the same job (a fingerprint each rank publishes), and then all-reduce, broadcast and
// all-gather CPU tensors through c10d's ProcessGroupGloo. LibTorch ships c10d; this file only
// adds the job's rules: bounded waits everywhere, errors that name the rank and host at fault,
// byte counters.
//
// Security (issue 43): rank 0's store listens on the rendezvous address only (127.0.0.1:
// loopback only) and, with a token (`secret_file`), refuses every call without it; a
// rendezvous address that is not loopback needs the token and `allow_remote`. Gloo's own
// connections stay unauthenticated TCP on `bind_address`: keep it on loopback (the default) or
// a private network (docs/distributed.md).
// Thread-safety: one Collective is used by one thread at a time (the collectives of a rank are
// issued in the same order on every rank); counters may be read from any thread.
//
// Shapes: the tensors here are of any shape (the same on every rank); each function names the
// dtypes and devices it takes.
#ifndef LSPO_OFFLOAD_COLLECTIVE_H_
#define LSPO_OFFLOAD_COLLECTIVE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace lspo::offload {

// The largest group Join accepts (a bound on the rendezvous table, not on c10d).
inline constexpr int kMaxWorldSize = 4096;

// How one rank joins its job's group.
struct CollectiveOptions {
  int rank = 0;        // 0 .. world_size - 1
  int world_size = 1;  // ranks in the job; 1 = no group (every collective is the identity)
  // Rendezvous: rank 0 hosts the store on host:port, bound to the addresses `host` resolves to
  // and no others (0 = a free port, read back with Collective::port(); only for tests, since
  // the other ranks must be told it); every rank connects to host:port.
  std::string host = "127.0.0.1";
  int port = 0;
  // Path of the job's rendezvous token file (one word of printable ASCII, e.g. from `openssl
  // rand -hex 32`; not accessible to group or others, as runtime::ReadSecretFile requires),
  // holding the same token on every rank: rank 0's store refuses every call without it, so
  // only ranks that hold it can join, read the job's fingerprints or write keys. Empty: no
  // token, allowed only when `host` is loopback. Named in errors as
  // distributed.rendezvous_token_file (the job spec field that fills it).
  std::string secret_file;
  // Allows a rendezvous address that is not loopback (ranks on other hosts); needs
  // `secret_file` too. Named in errors as distributed.allow_remote.
  bool allow_remote = false;
  // This rank's address for Gloo's connections (an address of this host the other ranks can
  // reach; loopback keeps a one-host job off the network).
  std::string bind_address = "127.0.0.1";
  // Bound on joining (every rank present) and on each collective: a rank that never joins, dies
  // or stops answering fails the others within this time instead of hanging them.
  absl::Duration timeout = absl::Seconds(60);
  // What must be equal on every rank (the job spec without per-rank fields, the model's hash):
  // compared at the rendezvous. Shown shortened in errors unless `explain_mismatch` is given.
  std::string fingerprint;
  // Optional: what differs between two fingerprints in words (e.g. the job spec fields), called
  // with (rank 0's, the other rank's) on a mismatch; its text goes into the error.
  std::function<std::string(const std::string&, const std::string&)> explain_mismatch;
  // Optional: a resource that no two ranks may share (e.g. host name + output directory);
  // compared at the rendezvous, equal ones fail every rank naming both. Empty: none.
  std::string exclusive;
  // This rank's name in errors (default: host name and process id).
  std::string label;
};

// A collective that was started and not yet waited for (overlap of all-reduce with backward).
class PendingCollective {
 public:
  PendingCollective(const PendingCollective&) = delete;
  PendingCollective& operator=(const PendingCollective&) = delete;
  ~PendingCollective();
  // Blocks until the collective is done (at most the group's timeout). Errors: as
  // Collective::AllReduceSum.
  absl::Status Wait();

 private:
  friend class Collective;
  struct Impl;
  explicit PendingCollective(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The group of one rank. Collectives take contiguous CPU tensors of fp32, fp64 or int64 and
// work in place; every rank must issue the same collectives with tensors of the same shape and
// dtype in the same order. After any failure the group is broken: later calls fail at once.
class Collective {
 public:
  // Joins the job's group: connects to (rank 0: starts) the rendezvous store, publishes this
  // rank's fingerprint and label, waits for every rank's, compares them with rank 0's, then
  // builds the Gloo process group. Errors: kInvalidArgument (rank not in [0, world_size),
  // world_size < 1 or > kMaxWorldSize, empty host, a bind_address that is not an address of
  // this host, checked before the rendezvous; a token file that is empty or not one word),
  // kFailedPrecondition (a rendezvous host that is not loopback without allow_remote and a
  // token, naming the settings; a token file accessible to group/others), kNotFound (the token
  // file cannot be read), kPermissionDenied (the store refused this rank's token, or rank 0
  // has no token and this rank has one: naming the token file), kUnavailable (the store at
  // host:port cannot be reached or started, naming it, also when something else listens there
  // and does not answer within `timeout`; rank 0's store went away), kDeadlineExceeded
  // (ranks missing after `timeout`, naming them), kAlreadyExists (a second process joined
  // with a rank that is taken, or two ranks share `exclusive`), kFailedPrecondition (a rank's
  // fingerprint differs from rank 0's, naming both ranks, their labels and what differs; or
  // this build has no c10d Gloo and world_size > 1).
  static absl::StatusOr<std::unique_ptr<Collective>> Join(const CollectiveOptions& options);

  ~Collective();
  Collective(const Collective&) = delete;
  Collective& operator=(const Collective&) = delete;

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  // The rendezvous port (the one rank 0 picked when options.port was 0).
  int port() const { return port_; }
  // Labels of every rank, by rank (from the rendezvous).
  const std::vector<std::string>& labels() const { return labels_; }

  // tensor <- the element-wise sum of every rank's tensor (in place). Errors: kInvalidArgument
  // (not a contiguous CPU tensor of fp32/fp64/int64), kUnavailable (a rank failed, closed its
  // connections or did not answer within the timeout; the message names the operation, the
  // bytes, every rank's label and Gloo's reason), kFailedPrecondition (the group broke earlier).
  absl::Status AllReduceSum(at::Tensor& tensor);
  // tensor <- the mean over ranks (sum, then divided by world_size; floating tensors only).
  absl::Status AllReduceMean(at::Tensor& tensor);
  // Starts AllReduceSum and returns at once; `tensor` must stay alive and untouched until Wait.
  absl::StatusOr<std::unique_ptr<PendingCollective>> StartAllReduceSum(at::Tensor& tensor);
  // tensor <- rank `root`'s tensor. Errors: as AllReduceSum, kInvalidArgument (bad root).
  absl::Status Broadcast(at::Tensor& tensor, int root);
  // Every rank's `value`, by rank (e.g. checksums of the projectors at a refit):
  // world_size values, sent as (1) int64 CPU tensors.
  absl::StatusOr<std::vector<int64_t>> AllGather(int64_t value);

  // Bytes this rank contributed to all-reduces (tensor bytes per call, summed), and the wall
  // seconds spent in the calls and waits.
  int64_t all_reduce_bytes() const { return all_reduce_bytes_.load(); }
  double all_reduce_seconds() const { return all_reduce_micros_.load() * 1e-6; }

 private:
  friend class PendingCollective;
  struct Impl;
  explicit Collective(const CollectiveOptions& options);
  // OK when the group is not broken and `tensor` is a contiguous CPU fp32/fp64/int64 tensor.
  absl::Status Check(const at::Tensor& tensor, const char* what) const;
  // Marks the group broken; the error names `tensor`'s bytes (any shape; null: none).
  absl::Status Failure(const std::string& what, const at::Tensor* tensor,
                       const std::string& reason);

  CollectiveOptions options_;
  int port_ = 0;
  std::vector<std::string> labels_;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> broken_{false};
  std::atomic<int64_t> all_reduce_bytes_{0};
  std::atomic<int64_t> all_reduce_micros_{0};
};

// Whether this build can form groups of more than one rank (c10d with Gloo was found).
bool CollectivesAvailable();

// The newest checkpoint step every rank of `group` holds (issue 43: data-parallel ranks resume
// from one checkpoint, the newest that all of them committed and verified, not each its own
// newest). `held`: this rank's checkpoint steps (> 0, any order; duplicates ignored). Rounds
// of one all-gather each: every rank proposes its newest step not above the bound (the
// smallest proposal of the previous round; at first unbounded) until all propose the same
// one (each round lowers the bound: at most as many rounds as distinct steps held). Returns that
// step, or 0 when no rank holds any. Errors: kFailedPrecondition when some rank holds checkpoints
// but no step is held by all (naming every rank's newest and the fix), kInvalidArgument (a step <=
// 0), else as AllGather. Every rank must call it (it is a collective).
absl::StatusOr<int> AgreeOnNewestCommonStep(Collective& group, std::vector<int> held);

// Sums a list of tensors over the ranks in one fp32 all-reduce, the way DDP sums a bucket of
// gradients (PyTorch, torch/nn/parallel/distributed.py): every tensor is flattened into one
// fp32 host buffer of 1 + sum(numels) values, element 0 counting the undefined entries, so that
// every rank sends the same number of values even when it has no tensor for some entry.
// tensors[i]: any dtype and device, numels[i] elements, or undefined (this rank has none: it
// counts as zeros). On success every defined tensors[i] holds the sum (converted back to its
// dtype, on its device, in place) and every undefined one is set to a new fp32 CPU tensor of
// shape {numels[i]} holding the sum. Returns the number of undefined entries over all ranks
// (0 when every rank had every tensor). Errors: kInvalidArgument (sizes differ in length, or a
// defined tensor's numel is not numels[i]); otherwise as Collective::AllReduceSum (the
// tensors are then unchanged).
absl::StatusOr<int64_t> SumTensorsAcrossRanks(Collective& group, std::vector<at::Tensor>& tensors,
                                              const std::vector<int64_t>& numels);

// tensors[i] <- rank `root`'s tensors[i], in place, for every i: the tensors of each dtype
// packed into one host buffer and sent in one broadcast (so a list of many small tensors, e.g.
// the projectors of every matrix, costs one collective per dtype). tensors: fp32, fp64 or
// int64, any shape and device (copied through the host), the same shapes and dtypes in the
// same order on every rank. The ranks first compare the element count per dtype (one
// broadcast and one all-gather), so that a mismatch fails every rank at once instead of
// corrupting or hanging the transfer. Errors: kInvalidArgument (undefined tensor, another
// dtype, bad root), kFailedPrecondition (the ranks' tensors differ in size, naming the ranks),
// and Collective::Broadcast's.
absl::Status BroadcastTensors(Collective& group, std::vector<at::Tensor>& tensors, int root);

// CRC-32C (runtime::Crc32cExtend, RFC 3720's polynomial) of a tensor's bytes as stored (any
// dtype and device: copied to the host, made contiguous), continuing `crc`: what ranks
// all-gather to check they hold the same tensors. sample_bytes > 0 reads only the first,
// middle and last sample_bytes bytes (a cheap fingerprint of large weights); 0 reads all. An
// undefined tensor leaves `crc` unchanged.
uint32_t Crc32cExtendTensor(uint32_t crc, const at::Tensor& tensor, size_t sample_bytes = 0);

}  // namespace lspo::offload

#endif  // LSPO_OFFLOAD_COLLECTIVE_H_
