// offload/spec_paths.h: the paths of a job spec and of the peers' folder requests, checked
// against --allowed_roots.
#include "offload/spec_paths.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "gtest/gtest.h"

namespace lspo::offload {
namespace {

namespace fs = std::filesystem;
namespace pb = google::protobuf;

// Whether a JobSpec field name says it holds a path.
bool NamesAPath(const std::string& name) {
  return absl::EndsWith(name, "path") || absl::EndsWith(name, "_dir") ||
         absl::EndsWith(name, "_file") || name == "resume_from" || name == "chat_template";
}

TEST(JobSpecPathsTest, EveryPathFieldOfTheSpecIsListed) {
  // Every singular string field of JobSpec and its messages set to "/p/<dotted name>": the
  // list holds exactly the fields whose name says they are paths, so a new path field cannot
  // be forgotten here (and so in the checks of all three services).
  lspo::v1::JobSpec spec;
  std::set<std::string> expected;
  std::function<void(pb::Message*, const std::string&)> fill = [&](pb::Message* m,
                                                                   const std::string& prefix) {
    const pb::Descriptor* d = m->GetDescriptor();
    const pb::Reflection* r = m->GetReflection();
    for (int i = 0; i < d->field_count(); ++i) {
      const pb::FieldDescriptor* f = d->field(i);
      if (f->is_repeated()) continue;
      const std::string name = prefix + f->name();
      if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING) {
        r->SetString(m, f, "/p/" + name);
        if (NamesAPath(f->name())) expected.insert(name);
      } else if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
        fill(r->MutableMessage(m, f), name + ".");
      }
    }
  };
  fill(&spec, "");
  std::set<std::string> listed;
  for (const runtime::PathField& f : JobSpecPaths(spec)) {
    EXPECT_EQ(f.path, "/p/" + f.field);
    listed.insert(f.field);
  }
  EXPECT_EQ(listed, expected);
  EXPECT_TRUE(listed.count("model.path") && listed.count("output_dir") &&
              listed.count("distributed.rendezvous_token_file"));
}

TEST(JobSpecPathsTest, JinjaTextLatestAndUnsetFieldsAreNotPaths) {
  lspo::v1::JobSpec spec;
  EXPECT_TRUE(JobSpecPaths(spec).empty());
  spec.mutable_data()->set_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}");
  spec.set_resume_from("latest");
  spec.set_output_dir("/runs/x");
  const auto paths = JobSpecPaths(spec);
  ASSERT_EQ(paths.size(), 1u);
  EXPECT_EQ(paths[0].field, "output_dir");
  spec.mutable_data()->set_chat_template("templates/chatml.jinja");
  spec.set_resume_from("/runs/x/checkpoints/step-00000002");
  EXPECT_EQ(JobSpecPaths(spec).size(), 3u);
}

class SpecPathsRootsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "lspo-spec-roots-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    base_ = fs::canonical(tmpl).string();
    fs::create_directories(base_ + "/allowed/model");
    fs::create_directories(base_ + "/outside");
    std::ofstream(base_ + "/allowed/model/config.json") << "{}";
    std::ofstream(base_ + "/outside/weights") << "w";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(base_, ec);
  }
  std::string base_;
};

TEST_F(SpecPathsRootsTest, FieldsAndTheLinksInTheFoldersTheyNameAreChecked) {
  const runtime::AllowedRoots roots({base_ + "/allowed"}, "worker", "lsp_gpu_worker");
  lspo::v1::JobSpec spec;
  spec.mutable_model()->set_path(base_ + "/allowed/model");
  spec.set_output_dir(base_ + "/allowed/runs/new");
  EXPECT_TRUE(CheckJobSpecPaths(spec, roots).ok());
  EXPECT_TRUE(CheckJobSpecPaths(spec, runtime::AllowedRoots()).ok());
  // A field outside, named with the spec's field name.
  lspo::v1::JobSpec out = spec;
  out.mutable_data()->set_eval_path(base_ + "/outside/weights");
  absl::Status st = CheckJobSpecPaths(out, roots);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_TRUE(absl::StartsWith(st.message(), "job spec field data.eval_path: ")) << st;
  // An HF model folder inside whose weights are a link to a file outside.
  fs::create_symlink(base_ + "/outside/weights", base_ + "/allowed/model/model.safetensors");
  st = CheckJobSpecPaths(spec, roots);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_NE(st.message().find("job spec field model.path, entry model.safetensors"),
            std::string::npos)
      << st;
}

TEST_F(SpecPathsRootsTest, RequestFoldersAreCheckedWithTheirEntries) {
  const runtime::AllowedRoots roots({base_ + "/allowed"}, "optimizer", "lsp_cpu_optimizer");
  EXPECT_TRUE(CheckRequestFolder(roots, "SaveModel", base_ + "/allowed/model").ok());
  EXPECT_TRUE(CheckRequestFolder(roots, "SaveModel", base_ + "/allowed/new").ok());
  absl::Status st = CheckRequestFolder(roots, "SaveModel", base_ + "/outside");
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_TRUE(absl::StartsWith(st.message(), "SaveModel request field dir: ")) << st;
  st = CheckRequestFolder(roots, "SaveState", "");
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_TRUE(CheckRequestFolder(runtime::AllowedRoots(), "SaveState", "").ok());
  fs::create_symlink(base_ + "/outside/weights",
                     base_ + "/allowed/model/optimizer_state.safetensors");
  st = CheckRequestFolder(roots, "LoadState", base_ + "/allowed/model");
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_NE(st.message().find("LoadState request field dir, entry optimizer_state.safetensors"),
            std::string::npos)
      << st;
}

}  // namespace
}  // namespace lspo::offload
