// Tests of runtime/hf_cache.h: model ids found in a Hugging Face hub cache laid out as
// huggingface_hub writes it (models--org--name/refs/main + snapshots/<commit>/), the cache
// folder from HF_HUB_CACHE / HF_HOME / XDG_CACHE_HOME, and every way a lookup fails.
#include "runtime/hf_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace lspo::runtime {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// Sets (or, with nullptr, unsets) an environment variable for the life of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// A cache folder `root` holding model `folder` (models--org--name) with snapshot `commit`,
// refs/main naming `ref` (none when empty).
void AddModel(const fs::path& root, const std::string& folder, const std::string& commit,
              const std::string& ref) {
  const fs::path repo = root / folder;
  fs::create_directories(repo / "snapshots" / commit);
  std::ofstream(repo / "snapshots" / commit / "config.json") << "{}";
  if (!ref.empty()) {
    fs::create_directories(repo / "refs");
    std::ofstream(repo / "refs" / "main") << ref << "\n";  // huggingface_hub writes no newline
  }
}

fs::path Fresh(const std::string& name) {
  const fs::path p = fs::path(::testing::TempDir()) / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

TEST(HfCacheTest, AModelIdIsOrgSlashName) {
  EXPECT_TRUE(LooksLikeModelId("HuggingFaceTB/SmolLM2-135M-Instruct"));
  EXPECT_TRUE(LooksLikeModelId("Qwen/Qwen2.5-0.5B"));
  EXPECT_TRUE(LooksLikeModelId("meta-llama/Llama-3.1-8B_x"));
  EXPECT_FALSE(LooksLikeModelId("SmolLM2"));              // no org
  EXPECT_FALSE(LooksLikeModelId("/abs/path"));            // absolute
  EXPECT_FALSE(LooksLikeModelId("./models/x"));           // relative with a dot part
  EXPECT_FALSE(LooksLikeModelId("a/b/c"));                // two slashes
  EXPECT_FALSE(LooksLikeModelId("../x"));                 // parent
  EXPECT_FALSE(LooksLikeModelId("org/.."));               // parent
  EXPECT_FALSE(LooksLikeModelId("org/na me"));            // space
  EXPECT_FALSE(LooksLikeModelId("org/"));                 // empty name
  EXPECT_FALSE(LooksLikeModelId("-org/name"));            // leading dash
  EXPECT_FALSE(LooksLikeModelId(std::string(200, 'a') + "/b"));  // too long
}

TEST(HfCacheTest, TheCacheFolderFollowsTheHubsVariables) {
  ScopedEnv hub("HF_HUB_CACHE", nullptr), legacy("HUGGINGFACE_HUB_CACHE", nullptr),
      home("HF_HOME", nullptr), xdg("XDG_CACHE_HOME", nullptr), user("HOME", "/home/u");
  EXPECT_EQ(HfHubCacheDir(), "/home/u/.cache/huggingface/hub");
  {
    ScopedEnv x("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(HfHubCacheDir(), "/xdg/huggingface/hub");
    ScopedEnv h("HF_HOME", "/hf");
    EXPECT_EQ(HfHubCacheDir(), "/hf/hub");
    ScopedEnv l("HUGGINGFACE_HUB_CACHE", "/legacy");
    EXPECT_EQ(HfHubCacheDir(), "/legacy");
    ScopedEnv c("HF_HUB_CACHE", "/cache");
    EXPECT_EQ(HfHubCacheDir(), "/cache");
  }
}

TEST(HfCacheTest, RefsMainNamesTheSnapshot) {
  const fs::path root = Fresh("hf_cache_main");
  AddModel(root, "models--org--tiny", "0123abcd", "0123abcd");
  AddModel(root, "models--org--tiny", "fedc9876", "");  // an older snapshot beside it
  ScopedEnv hub("HF_HUB_CACHE", root.c_str());
  auto dir = ResolveHfCacheModel("org/tiny");
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, (root / "models--org--tiny" / "snapshots" / "0123abcd").string());
  // HF_HOME/hub when HF_HUB_CACHE is unset.
  const fs::path home = Fresh("hf_cache_home");
  AddModel(home / "hub", "models--o--m", "c1", "c1");
  ScopedEnv no_hub("HF_HUB_CACHE", nullptr), no_legacy("HUGGINGFACE_HUB_CACHE", nullptr),
      hf_home("HF_HOME", home.c_str());
  auto via_home = ResolveHfCacheModel("o/m");
  ASSERT_TRUE(via_home.ok()) << via_home.status();
  EXPECT_EQ(*via_home, (home / "hub" / "models--o--m" / "snapshots" / "c1").string());
}

TEST(HfCacheTest, WithoutRefsMainTheOnlySnapshotIsTaken) {
  const fs::path root = Fresh("hf_cache_one");
  AddModel(root, "models--org--one", "aaaa", "");
  AddModel(root, "models--org--two", "aaaa", "");
  AddModel(root, "models--org--two", "bbbb", "");
  ScopedEnv hub("HF_HUB_CACHE", root.c_str());
  auto one = ResolveHfCacheModel("org/one");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, (root / "models--org--one" / "snapshots" / "aaaa").string());
  auto two = ResolveHfCacheModel("org/two");
  EXPECT_EQ(two.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(two.status().message(), HasSubstr("has no refs/main and several snapshots"));
  EXPECT_THAT(two.status().message(), HasSubstr("snapshots/bbbb"));
}

TEST(HfCacheTest, AMissingModelOrSnapshotNamesTheCacheAndTheFix) {
  const fs::path root = Fresh("hf_cache_missing");
  AddModel(root, "models--org--broken", "real", "gone");  // refs/main names an absent snapshot
  ScopedEnv hub("HF_HUB_CACHE", root.c_str());
  auto absent = ResolveHfCacheModel("org/absent");
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(absent.status().message(),
              HasSubstr("model 'org/absent' is not in the Hugging Face cache " + root.string() +
                        " (no models--org--absent/snapshots)"));
  EXPECT_THAT(absent.status().message(), HasSubstr("huggingface-cli download org/absent"));
  auto broken = ResolveHfCacheModel("org/broken");
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(broken.status().message(), HasSubstr("refs/main names snapshot 'gone'"));
  EXPECT_EQ(ResolveHfCacheModel("not-an-id").status().code(),
            absl::StatusCode::kInvalidArgument);
  // A ref that tries to leave the snapshots folder is not followed.
  AddModel(root, "models--org--escape", "x", "../../../etc");
  EXPECT_EQ(ResolveHfCacheModel("org/escape").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace lspo::runtime
