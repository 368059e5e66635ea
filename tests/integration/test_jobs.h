// Shared job specs for the integration tests (run from the repository root).
#ifndef LSPO_TESTS_INTEGRATION_TEST_JOBS_H_
#define LSPO_TESTS_INTEGRATION_TEST_JOBS_H_

#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/job_spec.pb.h"
#include "proto/scheduler.grpc.pb.h"
#include "proto/scheduler.pb.h"

namespace lspo::testing_jobs {

inline constexpr char kModel[] = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
inline constexpr char kNoModel[] =
    "models/SmolLM2-135M-Instruct.Q4_1.gguf is missing: run scripts/setup";

inline bool HaveModel() { return access(kModel, R_OK) == 0; }

// The tiny jobs need only SmolLM2's tokenizer and Moby-Dick. On a GPU machine reached through
// scripts/device-check models/ does not travel (datasets/ does, being tracked);
// `scripts/device-check download` puts a tensor-free copy of the GGUF (tokenizer + metadata) and
// the text in .devdata/.
inline std::string TinyTokenizerPath() {
  if (HaveModel()) return kModel;
  return access(".devdata/smollm2-tokenizer.gguf", R_OK) == 0 ? ".devdata/smollm2-tokenizer.gguf"
                                                              : kModel;
}
inline std::string MobyDickPath() {
  const char* shared = "datasets/moby-dick/moby-dick.txt";
  if (access(shared, R_OK) == 0) return shared;
  return access(".devdata/moby-dick.txt", R_OK) == 0 ? ".devdata/moby-dick.txt" : shared;
}
inline bool HaveTinyAssets() {
  return access(TinyTokenizerPath().c_str(), R_OK) == 0 &&
         access(MobyDickPath().c_str(), R_OK) == 0;
}

// The folders TempDir made in this process, removed when it exits (each CTest case is a
// process of its own), so that test runs do not fill /tmp (a full run left ~10 GB before).
// LSPO_KEEP_TEST_DIRS=1 keeps them for a look after a failure.
struct CreatedTempDirs {
  std::mutex mu;
  std::vector<std::string> dirs;
  ~CreatedTempDirs() {
    const char* keep = std::getenv("LSPO_KEEP_TEST_DIRS");
    if (keep != nullptr && std::string(keep) == "1") return;
    for (const std::string& d : dirs) {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  }
};
inline CreatedTempDirs& TempDirsOfThisProcess() {
  static CreatedTempDirs dirs;
  return dirs;
}

inline std::string TempDir(const std::string& tag) {
  std::string tmpl = "/tmp/lspo-" + tag + "-XXXXXX";
  char* dir = mkdtemp(tmpl.data());
  const std::string made = dir ? std::string(dir) : "/tmp/lspo-" + tag;
  CreatedTempDirs& all = TempDirsOfThisProcess();
  std::lock_guard<std::mutex> lock(all.mu);
  all.dirs.push_back(made);
  return made;
}

// A seeded tiny random Llama (hidden 64, 2 layers; vocabulary and tokenizer of SmolLM2) on
// Moby-Dick blocks of 32 tokens, d = 16, r = 4.
inline v1::JobSpec TinyMobyDickSpec(const std::string& out_dir, v1::TrainingMode mode, int steps) {
  v1::JobSpec spec;
  spec.set_name("tiny-moby");
  spec.mutable_model()->set_format(v1::MODEL_FORMAT_TINY_RANDOM);
  spec.mutable_model()->set_tokenizer_path(TinyTokenizerPath());
  spec.mutable_model()->set_init_seed(1234);
  spec.mutable_data()->set_format(v1::DATA_FORMAT_TEXT);
  spec.mutable_data()->set_train_path(MobyDickPath());
  spec.mutable_data()->set_eval_path(MobyDickPath());
  spec.mutable_data()->set_max_blocks(64);
  spec.mutable_data()->set_max_eval_examples(8);
  spec.set_mode(mode);
  spec.mutable_lsp()->set_d(16);
  spec.mutable_lsp()->set_r(4);
  spec.mutable_lsp()->set_fit_iters(10);
  spec.mutable_lsp()->set_calibration_examples(8);
  spec.mutable_optim()->set_lr(mode == v1::MODE_NATIVE ? 3e-3 : 1e-2);
  spec.set_steps(steps);
  spec.set_micro_batch_size(4);
  spec.set_seq_len(32);
  spec.set_seed(7);
  spec.set_num_threads(2);
  spec.set_device(v1::DEVICE_CPU);  // The CPU reference values hold on GPU hosts too.
  spec.set_output_dir(out_dir);
  return spec;
}

// Every status update of one job, submitted through `stub` and watched to its end.
struct WatchResult {
  std::vector<v1::JobStatus> updates;
  v1::JobStatus last;
};

inline WatchResult SubmitAndWatch(v1::Scheduler::Stub* stub, const v1::JobSpec& spec) {
  WatchResult out;
  grpc::ClientContext ctx;
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  v1::SubmitJobReply rep;
  grpc::Status st = stub->SubmitJob(&ctx, req, &rep);
  EXPECT_TRUE(st.ok()) << st.error_message();
  if (!st.ok()) return out;
  grpc::ClientContext wctx;
  v1::WatchJobRequest wreq;
  wreq.set_job_id(rep.job_id());
  auto reader = stub->WatchJob(&wctx, wreq);
  v1::JobStatus s;
  while (reader->Read(&s)) out.updates.push_back(s);
  EXPECT_TRUE(reader->Finish().ok());
  if (!out.updates.empty()) out.last = out.updates.back();
  return out;
}

// Cancels job `job_id` through `stub` and watches it to its end; returns its last status (a
// failed RPC fails the calling test and returns the default status).
inline v1::JobStatus CancelAndWatch(v1::Scheduler::Stub* stub, const std::string& job_id) {
  grpc::ClientContext cctx;
  v1::CancelJobRequest c;
  c.set_job_id(job_id);
  v1::CancelJobReply crep;
  grpc::Status cst = stub->CancelJob(&cctx, c, &crep);
  EXPECT_TRUE(cst.ok()) << cst.error_message();
  grpc::ClientContext wctx;
  v1::WatchJobRequest wreq;
  wreq.set_job_id(job_id);
  auto reader = stub->WatchJob(&wctx, wreq);
  v1::JobStatus s, last;
  while (reader->Read(&s)) last = s;
  grpc::Status wst = reader->Finish();
  EXPECT_TRUE(wst.ok()) << wst.error_message();
  return last;
}

// The loss of every finished step of a watched job, by step number (1-based).
inline std::map<int, double> StepLosses(const WatchResult& w) {
  std::map<int, double> loss;
  for (const auto& s : w.updates) {
    if (s.has_last_step()) loss[s.last_step().step()] = s.last_step().loss();
  }
  return loss;
}

// The bytes of `path` (empty when it cannot be read).
inline std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Submits `spec` and expects a refusal at submission with gRPC `code` and a message that
// contains `needle`; `what` names the case in failures.
inline void ExpectRefusedAtSubmit(v1::Scheduler::Stub* stub, const v1::JobSpec& spec,
                                  grpc::StatusCode code, const std::string& needle,
                                  const std::string& what) {
  grpc::ClientContext ctx;
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  v1::SubmitJobReply rep;
  grpc::Status st = stub->SubmitJob(&ctx, req, &rep);
  EXPECT_EQ(st.error_code(), code) << what << ": " << st.error_message();
  EXPECT_NE(st.error_message().find(needle), std::string::npos)
      << what << ": " << st.error_message();
}

// A job resumed from a checkpoint of step `from` (watched as `resumed`, output `b_dir`) went on
// bitwise as the uninterrupted one (`full`, `a_dir`): it says it resumed at `from`, its losses
// of steps from + 1 .. `to` are equal, and so are the two model.safetensors.
inline void ExpectResumedBitwise(const WatchResult& full, const std::string& a_dir,
                                 const WatchResult& resumed, const std::string& b_dir, int from,
                                 int to) {
  ASSERT_EQ(resumed.last.state(), v1::SUCCEEDED) << resumed.last.error();
  EXPECT_EQ(resumed.last.resumed_from_step(), from);
  std::map<int, double> la = StepLosses(full), lb = StepLosses(resumed);
  ASSERT_EQ(lb.size(), static_cast<size_t>(to - from));
  for (int step = from + 1; step <= to; ++step) EXPECT_EQ(lb[step], la[step]) << "step " << step;
  const std::string wa = FileBytes(a_dir + "/model.safetensors");
  EXPECT_GT(wa.size(), 1000u);
  EXPECT_TRUE(wa == FileBytes(b_dir + "/model.safetensors")) << "final models differ";
}

// Submits `spec` (resuming a checkpoint written by another training) and expects the job to
// fail as "different training spec".
inline void ExpectRefusedAsOtherTraining(v1::Scheduler::Stub* stub, const v1::JobSpec& spec) {
  WatchResult other = SubmitAndWatch(stub, spec);
  EXPECT_EQ(other.last.state(), v1::FAILED);
  EXPECT_NE(other.last.error().find("different training spec"), std::string::npos)
      << other.last.error();
}

}  // namespace lspo::testing_jobs

#endif  // LSPO_TESTS_INTEGRATION_TEST_JOBS_H_
