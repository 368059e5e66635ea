// A data-parallel job's group of ranks on the worker (rank_group.h).
#include "gpu_worker/rank_group.h"

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gpu_worker/step_runner.h"
#include "offload/arena_tensors.h"
#include "runtime/proto_json.h"
#include "runtime/status_macros.h"
#include "runtime/tfrecord.h"
#include "runtime/util.h"

namespace lspo::worker {

using lspo::v1::JobSpec;

namespace {

// What every rank of a data-parallel job must share: the spec without the fields a rank may
// set for itself (rank, bind address, timeout, output_dir and resume_from, threads, the device
// memory cap, the job's name), as JSON, so a mismatch can be told field by field. (That the
// ranks resume from the same step is checked at every step instead.)
JobSpec SharedSpec(const JobSpec& spec) {
  JobSpec shared = spec;
  shared.mutable_distributed()->clear_rank();
  shared.mutable_distributed()->clear_bind_address();
  shared.mutable_distributed()->clear_timeout_seconds();
  shared.mutable_distributed()->clear_rendezvous_token_file();  // a path on each rank's host
  shared.clear_output_dir();
  shared.clear_resume_from();
  shared.clear_num_threads();
  shared.clear_device_memory_limit_mb();
  shared.clear_name();
  return shared;
}

// "the job spec differs: modified: lsp.d: 64 -> 128" for two SharedSpec JSONs.
std::string ExplainSpecMismatch(const std::string& rank0, const std::string& other) {
  JobSpec a, b;
  if (!runtime::ProtoFromJson(rank0, &a, "rank 0's spec").ok() ||
      !runtime::ProtoFromJson(other, &b, "the rank's spec").ok()) {
    return "the job specs differ (one could not be read back)";
  }
  return absl::StrCat("the job spec differs (rank 0 -> this rank): ",
                      runtime::ProtoDifferences(a, b, 600));
}

// CRC-32C of the model's weights as loaded: every tensor's name, dtype, shape and its first,
// middle and last 4 KiB (a different model or checkpoint differs there; reading every byte of
// a 7B model would take seconds per rank).
uint32_t ModelChecksum(const model::LlamaModel& model) {
  uint32_t crc = 0;
  for (const auto& [name, tensor] : model.NamedTensors()) {
    const std::string meta = absl::StrCat(name, ":", c10::toString(tensor.scalar_type()), "(",
                                          absl::StrJoin(tensor.sizes(), ","), ")");
    crc = runtime::Crc32cExtend(crc, meta);
    crc = offload::Crc32cExtendTensor(crc, tensor, /*sample_bytes=*/4096);
  }
  return crc;
}

// CRC-32C of the tokenized training examples (ids and labels, in file order).
uint32_t TrainDataChecksum(const WorkerJob& job) {
  uint32_t crc = 0;
  for (const data::TokenizedExample& e : job.data.train) {
    crc = runtime::Crc32cExtend(crc,
                                absl::string_view(reinterpret_cast<const char*>(e.input_ids.data()),
                                                  e.input_ids.size() * sizeof(int32_t)));
    crc =
        runtime::Crc32cExtend(crc, absl::string_view(reinterpret_cast<const char*>(e.labels.data()),
                                                     e.labels.size() * sizeof(int32_t)));
  }
  return crc;
}

}  // namespace

int RankTimeoutSeconds(const lspo::v1::DistributedSpec& d) {
  return d.timeout_seconds() > 0 ? d.timeout_seconds() : 300;
}

absl::StatusOr<std::unique_ptr<offload::Collective>> JoinGroup(const JobSpec& spec) {
  const lspo::v1::DistributedSpec& d = spec.distributed();
  offload::CollectiveOptions o;
  o.rank = d.rank();
  o.world_size = d.world_size();
  ASSIGN_OR_RETURN(
      runtime::HostPort at,
      runtime::ParseHostPort(d.rendezvous().empty() ? "127.0.0.1:29500" : d.rendezvous(),
                             "job spec field distributed.rendezvous"));
  o.host = at.host;
  o.port = at.port;
  if (!d.bind_address().empty()) o.bind_address = d.bind_address();
  o.secret_file = d.rendezvous_token_file();
  o.allow_remote = d.allow_remote();
  o.timeout = absl::Seconds(RankTimeoutSeconds(d));
  o.fingerprint = runtime::ProtoToJson(SharedSpec(spec));
  o.explain_mismatch = ExplainSpecMismatch;
  if (!spec.output_dir().empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    std::error_code ec;
    o.exclusive =
        absl::StrCat("the output directory ", host, ":",
                     std::filesystem::absolute(spec.output_dir(), ec).lexically_normal().string());
  }
  return offload::Collective::Join(o);
}

absl::Status CheckRanksLoadedTheSame(const WorkerJob& job) {
  offload::Collective* group = job.ranks.collective.get();
  const struct {
    uint32_t crc;
    const char* what;
    std::string field;
  } checks[] = {
      {ModelChecksum(*job.model), "model weights",
       absl::StrCat("model.path '", job.spec.model().path(), "'")},
      {TrainDataChecksum(job), "tokenized training data",
       absl::StrCat("data.train_path '", job.spec.data().train_path(), "'")},
  };
  for (const auto& c : checks) {
    ASSIGN_OR_RETURN(std::vector<int64_t> all, group->AllGather(c.crc));
    for (size_t r = 1; r < all.size(); ++r) {
      if (all[r] != all[0]) {
        return absl::FailedPreconditionError(
            absl::StrCat("distributed: rank ", r, " (", group->labels()[r], ") loaded other ",
                         c.what, " than rank 0 (", group->labels()[0], ") from ", c.field,
                         ": give every rank the same files (compare them with sha256sum)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status AgreeOnStep(const WorkerJob& job, int step, bool overlap, int64_t* total) {
  offload::Collective* group = job.ranks.collective.get();
  // The overlapped schedule sums the gradients bucket by bucket inside the backward, the
  // serial one in one all-reduce: every rank must run the same.
  absl::StatusOr<std::vector<int64_t>> gathered =
      group->AllGather(2 * int64_t{step} + (overlap ? 1 : 0));
  // The step's first wait: after rank 0's evaluation it says so (step_runner.h).
  if (!gathered.ok()) return AfterRankZerosEvaluation(job, step, gathered.status());
  const std::vector<int64_t>& steps = *gathered;
  for (size_t r = 1; r < steps.size(); ++r) {
    if (steps[r] / 2 != steps[0] / 2) {
      return absl::FailedPreconditionError(absl::StrCat(
          "distributed: rank ", r, " (", group->labels()[r], ") trains step ", steps[r] / 2,
          " while rank 0 (", group->labels()[0], ") trains step ", steps[0] / 2,
          ": resume every rank from a checkpoint of the same step (each rank's "
          "output_dir/checkpoints/step-NNNNNNNN)"));
    }
    if (steps[r] != steps[0]) {
      auto name = [](int64_t v) { return v % 2 ? "overlap" : "serial"; };
      return absl::InternalError(
          absl::StrCat("distributed: at step ", step, " rank ", r, " (", group->labels()[r],
                       ") was planned the ", name(steps[r]), " schedule and rank 0 (",
                       group->labels()[0], ") the ", name(steps[0]),
                       " one; every rank must run one schedule (report this: the schedulers of a "
                       "job's ranks plan alike)"));
    }
  }
  at::Tensor t = at::full({1}, *total, at::kLong);  // (1) int64 CPU: loss tokens
  RETURN_IF_ERROR(group->AllReduceSum(t));
  *total = t.item<int64_t>();
  return absl::OkStatus();
}

absl::Status AgreeOnOutcome(offload::Collective* group, lspo::v1::TrainStepReply* reply) {
  at::Tensor agree = at::zeros({2}, at::kDouble);  // (2) fp64 CPU: nonfinite, loss
  agree[0] = reply->nonfinite() ? 1.0 : 0.0;
  agree[1] = reply->nonfinite() ? 0.0 : reply->metrics().loss();
  RETURN_IF_ERROR(group->AllReduceSum(agree));
  reply->set_nonfinite(agree[0].item<double>() > 0);
  reply->mutable_metrics()->set_loss(agree[1].item<double>());
  return absl::OkStatus();
}

}  // namespace lspo::worker
