// --allowed_roots in the worker and the optimizer (issue 43): every path of their RPCs (the spec
// of LoadJob, the folder of SaveArtifacts, SaveModel, SaveState, LoadState) is checked against
// the roots, symlinks resolved, before anything is opened or looked for; paths inside work as
// before, and the embedded runtime gives the scheduler's roots to both.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cpu_optimizer_service/optimizer_core.h"
#include "gpu_worker/worker_core.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "tests/integration/start_embedded.h"
#include "tests/integration/test_jobs.h"

namespace lspo {
namespace {

namespace fs = std::filesystem;

// base/allowed (the root), base/outside with a model file and a checkpoint folder, and links
// inside the root that lead out: base/allowed/escape -> base/outside, base/allowed/model.gguf
// -> base/outside/model.gguf.
class ServiceRootsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::canonical(testing_jobs::TempDir("service-roots")).string();
    allowed_ = base_ + "/allowed";
    outside_ = base_ + "/outside";
    fs::create_directories(allowed_ + "/ckpt");
    fs::create_directories(outside_ + "/ckpt");
    std::ofstream(outside_ + "/model.gguf") << "not a model";
    fs::create_symlink(outside_, allowed_ + "/escape");
    fs::create_symlink(outside_ + "/model.gguf", allowed_ + "/model.gguf");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(base_, ec);
  }

  // A GGUF job whose model file is `model_path` (everything else unset).
  static v1::JobSpec GgufSpec(const std::string& model_path) {
    v1::JobSpec spec;
    spec.mutable_model()->set_format(v1::MODEL_FORMAT_GGUF);
    spec.mutable_model()->set_path(model_path);
    spec.set_mode(v1::MODE_ZERO);
    spec.set_num_threads(1);
    spec.set_device(v1::DEVICE_CPU);
    return spec;
  }

  static void ExpectRefused(const absl::Status& st, const std::string& field,
                            const std::string& path, const std::string& binary) {
    EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
    const std::string msg(st.message());
    EXPECT_NE(msg.find(field), std::string::npos) << msg;
    EXPECT_NE(msg.find("'" + path + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(binary + " with --allowed_roots"), std::string::npos) << msg;
  }

  std::string base_, allowed_, outside_;
};

TEST_F(ServiceRootsTest, TheWorkerRefusesPathsOutsideItsRootsBeforeLookingForThem) {
  worker::WorkerCore worker(worker::WorkerOptions{{allowed_}});
  // The same refusal whether the file outside exists or not.
  const std::string existing = outside_ + "/model.gguf", missing = outside_ + "/missing.gguf";
  auto a = worker.LoadJob("job-a", GgufSpec(existing));
  auto b = worker.LoadJob("job-a", GgufSpec(missing));
  ExpectRefused(a.status(), "job spec field model.path", existing, "lsp_gpu_worker");
  ExpectRefused(b.status(), "job spec field model.path", missing, "lsp_gpu_worker");
  std::string a_msg(a.status().message()), b_msg(b.status().message());
  a_msg.replace(a_msg.find(existing), existing.size(), "X");
  a_msg.replace(a_msg.find(existing), existing.size(), "X");
  b_msg.replace(b_msg.find(missing), missing.size(), "X");
  b_msg.replace(b_msg.find(missing), missing.size(), "X");
  EXPECT_EQ(a_msg, b_msg);
  // Through links inside the root: a link to the file, a link to the folder, a dangling one.
  ExpectRefused(worker.LoadJob("job-a", GgufSpec(allowed_ + "/model.gguf")).status(),
                "job spec field model.path", allowed_ + "/model.gguf", "lsp_gpu_worker");
  ExpectRefused(worker.LoadJob("job-a", GgufSpec(allowed_ + "/escape/missing.gguf")).status(),
                "job spec field model.path", allowed_ + "/escape/missing.gguf", "lsp_gpu_worker");
  // Any path field: data, output folder, the rendezvous token.
  v1::JobSpec spec = GgufSpec(allowed_ + "/none.gguf");
  spec.mutable_data()->set_train_path(allowed_ + "/../outside/train.txt");
  ExpectRefused(worker.LoadJob("job-a", spec).status(), "job spec field data.train_path",
                allowed_ + "/../outside/train.txt", "lsp_gpu_worker");
  spec = GgufSpec(allowed_ + "/none.gguf");
  spec.set_output_dir(allowed_ + "/escape/run");
  ExpectRefused(worker.LoadJob("job-a", spec).status(), "job spec field output_dir",
                allowed_ + "/escape/run", "lsp_gpu_worker");
  spec = GgufSpec(allowed_ + "/none.gguf");
  spec.mutable_distributed()->set_rendezvous_token_file("/etc/hostname");
  ExpectRefused(worker.LoadJob("job-a", spec).status(),
                "job spec field distributed.rendezvous_token_file", "/etc/hostname",
                "lsp_gpu_worker");
  // Inside the root, the check passes and the load itself fails (no such file).
  auto inside = worker.LoadJob("job-a", GgufSpec(allowed_ + "/none.gguf"));
  EXPECT_NE(inside.status().code(), absl::StatusCode::kPermissionDenied) << inside.status();
  // The folders of SaveArtifacts, SaveState and LoadState: refused before the job is looked
  // up (no job is loaded here: a folder inside gets kFailedPrecondition).
  for (const std::string& dir :
       {outside_ + "/ckpt", allowed_ + "/escape/ckpt", outside_ + "/new"}) {
    ExpectRefused(worker.SaveArtifacts("job-a", dir).status(), "SaveArtifacts request field dir",
                  dir, "lsp_gpu_worker");
    ExpectRefused(worker.SaveState("job-a", dir, 1).status(), "SaveState request field dir", dir,
                  "lsp_gpu_worker");
    ExpectRefused(worker.LoadState("job-a", dir, 1).status(), "LoadState request field dir", dir,
                  "lsp_gpu_worker");
  }
  EXPECT_EQ(worker.SaveState("job-a", allowed_ + "/ckpt", 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A state file inside the folder that is a link out.
  fs::create_symlink(outside_ + "/model.gguf", allowed_ + "/ckpt/worker_state.safetensors");
  ExpectRefused(worker.LoadState("job-a", allowed_ + "/ckpt", 1).status(),
                "LoadState request field dir, entry worker_state.safetensors",
                allowed_ + "/ckpt/worker_state.safetensors", "lsp_gpu_worker");
}

TEST_F(ServiceRootsTest, TheOptimizerRefusesPathsOutsideItsRootsBeforeLookingForThem) {
  optimizer::OptimizerCore core(optimizer::OptimizerOptions{{allowed_}});
  v1::ArenaLayout layout;
  layout.set_name("/lspo-not-created");
  layout.set_mode(v1::MODE_ZERO);
  const std::string existing = outside_ + "/model.gguf", missing = outside_ + "/missing.gguf";
  auto a = core.LoadJob("job-o", GgufSpec(existing), layout);
  auto b = core.LoadJob("job-o", GgufSpec(missing), layout);
  ExpectRefused(a.status(), "job spec field model.path", existing, "lsp_cpu_optimizer");
  ExpectRefused(b.status(), "job spec field model.path", missing, "lsp_cpu_optimizer");
  ExpectRefused(core.LoadJob("job-o", GgufSpec(allowed_ + "/model.gguf"), layout).status(),
                "job spec field model.path", allowed_ + "/model.gguf", "lsp_cpu_optimizer");
  // Inside: the check passes, the arena (never created) is what fails.
  auto inside = core.LoadJob("job-o", GgufSpec(allowed_ + "/none.gguf"), layout);
  EXPECT_NE(inside.status().code(), absl::StatusCode::kPermissionDenied) << inside.status();
  for (const std::string& dir :
       {outside_ + "/ckpt", allowed_ + "/escape/ckpt", outside_ + "/new"}) {
    ExpectRefused(core.SaveModel("job-o", dir).status(), "SaveModel request field dir", dir,
                  "lsp_cpu_optimizer");
    ExpectRefused(core.SaveState("job-o", dir, 1).status(), "SaveState request field dir", dir,
                  "lsp_cpu_optimizer");
    ExpectRefused(core.LoadState("job-o", dir, 1).status(), "LoadState request field dir", dir,
                  "lsp_cpu_optimizer");
  }
  EXPECT_EQ(core.SaveModel("job-o", allowed_ + "/ckpt").status().code(),
            absl::StatusCode::kFailedPrecondition);
  fs::create_symlink(outside_ + "/model.gguf", allowed_ + "/ckpt/model.safetensors");
  ExpectRefused(core.SaveModel("job-o", allowed_ + "/ckpt").status(),
                "SaveModel request field dir, entry model.safetensors",
                allowed_ + "/ckpt/model.safetensors", "lsp_cpu_optimizer");
}

// With the roots {base/allowed, the repository} (the tiny job's tokenizer and text are the
// repository's), a job inside loads, saves and restores as without roots; a refused LoadJob
// leaves the loaded job alone.
TEST_F(ServiceRootsTest, PathsInsideTheRootsWorkAsBefore) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  const std::vector<std::string> roots = {allowed_, fs::current_path().string()};
  v1::JobSpec spec = testing_jobs::TinyMobyDickSpec(allowed_ + "/out", v1::MODE_ZERO, 2);
  spec::ResolveDefaults(&spec);
  worker::WorkerCore worker(worker::WorkerOptions{roots});
  auto wload = worker.LoadJob("job-in", spec);
  ASSERT_TRUE(wload.ok()) << wload.status();
  optimizer::OptimizerCore core(optimizer::OptimizerOptions{roots});
  auto oload = core.LoadJob("job-in", spec, wload->arena());
  ASSERT_TRUE(oload.ok()) << oload.status();
  // A refused LoadJob of another job does not replace the loaded one.
  EXPECT_EQ(worker.LoadJob("job-x", GgufSpec(outside_ + "/model.gguf")).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(
      core.LoadJob("job-x", GgufSpec(outside_ + "/model.gguf"), wload->arena()).status().code(),
      absl::StatusCode::kPermissionDenied);
  auto art = worker.SaveArtifacts("job-in", allowed_ + "/out");
  EXPECT_TRUE(art.ok()) << art.status();
  auto model = core.SaveModel("job-in", allowed_ + "/out");
  EXPECT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE(fs::exists(allowed_ + "/out/config.json"));
  EXPECT_TRUE(fs::exists(allowed_ + "/out/model.safetensors"));
  // A checkpoint folder reached through a link inside the root is fine.
  fs::create_symlink("ckpt", allowed_ + "/ckpt-link");
  const std::string ckpt = allowed_ + "/ckpt-link";
  auto ws = worker.SaveState("job-in", ckpt, 0);
  EXPECT_TRUE(ws.ok()) << ws.status();
  auto os = core.SaveState("job-in", ckpt, 0);
  EXPECT_TRUE(os.ok()) << os.status();
  auto wl = worker.LoadState("job-in", ckpt, 0);
  EXPECT_TRUE(wl.ok()) << wl.status();
  auto ol = core.LoadState("job-in", ckpt, 0);
  EXPECT_TRUE(ol.ok()) << ol.status();
  EXPECT_TRUE(fs::exists(allowed_ + "/ckpt/worker_state.safetensors"));
  EXPECT_TRUE(fs::exists(allowed_ + "/ckpt/optimizer_state.safetensors"));
  EXPECT_TRUE(core.UnloadJob("job-in").ok());
  EXPECT_TRUE(worker.UnloadJob("job-in").ok());
}

// The embedded runtime passes the scheduler's roots to the worker and the optimizer: a job
// inside them trains and checkpoints through every checked RPC.
TEST_F(ServiceRootsTest, AnEmbeddedJobInsideTheRootsRunsWithTheRootsInEveryService) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  scheduler::SchedulerOptions options;
  options.allowed_roots = {allowed_, fs::current_path().string()};
  auto runtime = testing_jobs::StartEmbedded(options);
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  v1::JobSpec spec = testing_jobs::TinyMobyDickSpec(allowed_ + "/run", v1::MODE_LSP, 2);
  spec.set_checkpoint_every(1);
  testing_jobs::WatchResult w = testing_jobs::SubmitAndWatch(stub.get(), spec);
  ASSERT_EQ(w.last.state(), v1::SUCCEEDED) << w.last.error();
  EXPECT_TRUE(fs::exists(allowed_ + "/run/model.safetensors"));
  // Outside: refused at submission (the scheduler checks first).
  spec.set_output_dir(allowed_ + "/escape/run");
  testing_jobs::ExpectRefusedAtSubmit(stub.get(), spec, grpc::StatusCode::PERMISSION_DENIED,
                                      "job spec field output_dir", "output_dir via a link");
}

}  // namespace
}  // namespace lspo
