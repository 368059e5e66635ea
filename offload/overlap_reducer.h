// The data-parallel sum inside the overlapped backward (issue 17, docs/distributed.md
// "Overlap"): the backward stages each trained matrix's gradient (lsp: its S = Pᵀ G Q; zero:
// the full gradient) as it forms, and a communication thread all-reduces them across the
// ranks one matrix at a time and hands each sum on (to the arena, for the optimizer) as soon
// as it is reduced, so the reduction and the optimizer's Adam overlap the rest of the
// backward, as DDP's buckets do.
//
// Gloo needs every rank to issue its collectives in the same order with the same shapes; the
// order a backward's hooks fire in is an implementation detail of the autograd engine, so the
// thread reduces in one fixed order, matrix n − 1 down to 0 (deepest first: the order a
// backward forms them), waiting for a matrix that is not staged yet.
//
// Matrices go in buckets, as DDP's do (PyTorch's DistributedDataParallel: bucket_cap_mb = 25,
// the first bucket 1 MB, so that the first all-reduce starts early): consecutive matrices of
// that order share one fp32 buffer, which is all-reduced once all of them are staged. One
// all-reduce per matrix costs a latency each: over loopback on this project's 2-core machine
// (Gloo, 2 ranks), 210 all-reduces of SmolLM2's 64 KB S matrices took 0.17-0.26 s against
// 0.008-0.012 s for one of all 13.8 MB, and zero's 210 gradients 0.58 s against 0.24-0.30 s.
//
// Shapes: shapes[i] is matrix i's gradient slot shape: S (d_p, d_q) for lsp (d_p, d_q the
// subspace dims), the full gradient (m, n) for zero (m out, n in features). The sums are fp32.
#ifndef LSPO_OFFLOAD_OVERLAP_REDUCER_H_
#define LSPO_OFFLOAD_OVERLAP_REDUCER_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "absl/status/status.h"
#include "offload/collective.h"

namespace lspo::offload {

// One step's sum of n matrices across the ranks of a group (see the file comment).
// Thread-safety: Stage may be called from any one thread while the communication thread
// runs; Finish and the destructor from the thread that constructed the reducer.
class OverlapReducer {
 public:
  // Called on the communication thread with matrix i's sum over the ranks: a contiguous fp32
  // CPU tensor of shapes[i], owned by the reducer (valid during the call). Returns false to
  // stop: no later matrix is handed on and no later bucket reduced (every rank receives the
  // same sums, so every rank stops at the same matrix; used when a sum is not finite and the
  // step is abandoned).
  using Publish = std::function<bool(int64_t i, const at::Tensor& sum)>;

  // Bucket caps in bytes of fp32: a bucket closes once it holds at least its cap (a matrix
  // larger than the cap has a bucket of its own). Defaults: DDP's.
  struct Buckets {
    int64_t first_bytes = int64_t{1} << 20;
    int64_t bytes = int64_t{25} << 20;
  };

  // Starts the communication thread. `group` must outlive the reducer; shapes[i] is matrix i's
  // shape (the same on every rank: the gradient slot's), and the caps the same on every rank.
  OverlapReducer(Collective* group, std::vector<std::vector<int64_t>> shapes, Publish publish,
                 Buckets caps);
  OverlapReducer(Collective* group, std::vector<std::vector<int64_t>> shapes, Publish publish)
      : OverlapReducer(group, std::move(shapes), std::move(publish), Buckets{}) {}
  // Abandons the step if Finish was not called: the thread stops waiting and starts no further
  // collective (the other ranks' then fail after the group's timeout), and is joined.
  ~OverlapReducer();
  OverlapReducer(const OverlapReducer&) = delete;
  OverlapReducer& operator=(const OverlapReducer&) = delete;

  // Stages matrix i's gradient: `grad` (any floating dtype, of shapes[i]; on the CPU or a CUDA
  // device) is copied into its bucket's fp32 host buffer at once (from CUDA: a synchronous copy
  // on the current stream), so the caller may change it afterwards.
  // Staging a matrix twice keeps the first (a backward forms each once); an i outside [0, n)
  // or a wrong shape is recorded and returned by Finish (kInvalidArgument), and the sum then
  // uses `fill`.
  void Stage(int64_t i, const at::Tensor& grad);

  // Stages `fill` (every element) for each matrix not staged yet, waits until the thread has
  // reduced and handed on every matrix (or was stopped by Publish), and joins it. Use NaN for
  // "this rank has no valid gradient": every rank's sum is then NaN and every rank skips the
  // step together. Errors: the first collective error (Collective::AllReduceSum's:
  // kUnavailable naming the ranks, kFailedPrecondition for a broken group), a bad Stage's
  // kInvalidArgument.
  absl::Status Finish(float fill);

  // Matrices handed on to Publish so far (after Finish: all n, or fewer if Publish stopped).
  int64_t published() const;
  // Wall seconds the thread spent in all-reduces (waiting for the other ranks included), after
  // Finish.
  double collective_seconds() const;
  // The buckets: matrix indices in reduction order, one list per all-reduce.
  const std::vector<std::vector<int64_t>>& buckets() const { return buckets_; }

 private:
  void Run();

  // Matrix i's view into its bucket's buffer: (shapes[i]) fp32 CPU.
  at::Tensor Slot(int64_t i) const;

  Collective* group_;
  const std::vector<std::vector<int64_t>> shapes_;
  const Publish publish_;
  std::vector<std::vector<int64_t>> buckets_;  // fixed after construction
  std::vector<int64_t> bucket_of_;             // matrix -> bucket
  std::vector<int64_t> offset_of_;             // matrix -> element offset in its bucket
  // Per bucket, (sum of its matrices' elements) fp32 CPU; written before it is due, freed once
  // handed on.
  std::vector<at::Tensor> buffers_;
  mutable std::mutex mu_;
  std::condition_variable staged_cv_;
  std::vector<char> claimed_;      // guarded by mu_: a Stage / Finish is writing matrix i
  std::vector<int64_t> ready_;     // guarded by mu_: per bucket, matrices written
  bool abandoned_ = false;         // guarded by mu_
  bool finished_ = false;          // guarded by mu_
  absl::Status stage_error_;       // guarded by mu_
  int64_t published_ = 0;          // guarded by mu_
  double collective_seconds_ = 0;  // guarded by mu_
  absl::Status status_;            // written by the thread, read after join
  std::thread thread_;
};

}  // namespace lspo::offload

#endif  // LSPO_OFFLOAD_OVERLAP_REDUCER_H_
