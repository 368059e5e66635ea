// runtime/allowed_roots.h: path resolution as the kernel does it (symlinks, "..", tails that do
// not exist yet) and the roots check, which never looks outside the roots.
#include "runtime/allowed_roots.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace lspo::runtime {
namespace {

namespace fs = std::filesystem;

// A fresh folder, resolved (so that /tmp being a link does not matter), removed at the end.
class AllowedRootsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "lspo-roots-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    base_ = fs::canonical(tmpl).string();
    allowed_ = base_ + "/allowed";
    outside_ = base_ + "/outside";
    fs::create_directories(allowed_ + "/data");
    fs::create_directories(outside_ + "/secret");
    std::ofstream(allowed_ + "/data/train.txt") << "hello";
    std::ofstream(outside_ + "/secret/key") << "key";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(base_, ec);
  }
  AllowedRoots Roots() const { return AllowedRoots({allowed_}, "worker", "lsp_gpu_worker"); }

  std::string base_, allowed_, outside_;
};

TEST_F(AllowedRootsTest, ResolvesLinksDotDotAndTailsThatDoNotExist) {
  // Nothing to resolve.
  EXPECT_EQ(*ResolvePath(allowed_ + "/data/train.txt"), allowed_ + "/data/train.txt");
  EXPECT_EQ(*ResolvePath(allowed_ + "//data/./train.txt"), allowed_ + "/data/train.txt");
  EXPECT_EQ(*ResolvePath(allowed_ + "/data/"), allowed_ + "/data");
  EXPECT_EQ(*ResolvePath("/"), "/");
  EXPECT_EQ(*ResolvePath("/.."), "/");
  // A tail that does not exist is taken as written, ".." in it lexically.
  EXPECT_EQ(*ResolvePath(allowed_ + "/new/sub/../file"), allowed_ + "/new/file");
  // An absolute link, a relative one, a chain of links.
  fs::create_symlink(outside_ + "/secret", allowed_ + "/abs");
  fs::create_symlink("outside/secret", base_ + "/rel");
  fs::create_symlink("abs", allowed_ + "/chain");
  EXPECT_EQ(*ResolvePath(allowed_ + "/abs/key"), outside_ + "/secret/key");
  EXPECT_EQ(*ResolvePath(base_ + "/rel/key"), outside_ + "/secret/key");
  EXPECT_EQ(*ResolvePath(allowed_ + "/chain/key"), outside_ + "/secret/key");
  // ".." after a link is the parent of the link's target, as the kernel takes it, not a
  // lexical step back into the folder that holds the link.
  EXPECT_EQ(*ResolvePath(allowed_ + "/abs/../x"), outside_ + "/x");
  // A dangling link resolves to its target (where a create through it would land).
  fs::create_symlink(outside_ + "/new-file", allowed_ + "/dangling");
  EXPECT_EQ(*ResolvePath(allowed_ + "/dangling"), outside_ + "/new-file");
  // Relative paths: against the working directory.
  const fs::path cwd = fs::current_path();
  fs::current_path(allowed_);
  auto rel = ResolvePath("data/../abs/key");
  fs::current_path(cwd);
  ASSERT_TRUE(rel.ok()) << rel.status();
  EXPECT_EQ(*rel, outside_ + "/secret/key");
  // A loop ends after 40 links.
  fs::create_symlink(allowed_ + "/loop-b", allowed_ + "/loop-a");
  fs::create_symlink(allowed_ + "/loop-a", allowed_ + "/loop-b");
  auto loop = ResolvePath(allowed_ + "/loop-a/x");
  EXPECT_EQ(loop.status().code(), absl::StatusCode::kInvalidArgument) << loop.status();
  EXPECT_EQ(ResolvePath("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(AllowedRootsTest, PathsUnderARootPassAndOthersAreRefusedNamingTheFieldAndTheFix) {
  const AllowedRoots roots = Roots();
  EXPECT_TRUE(roots.restricted());
  EXPECT_TRUE(roots.Check("f", allowed_).ok());
  EXPECT_TRUE(roots.Check("f", allowed_ + "/").ok());
  EXPECT_TRUE(roots.Check("f", allowed_ + "/data/train.txt").ok());
  EXPECT_TRUE(roots.Check("f", allowed_ + "/runs/new/sub").ok());  // created later
  EXPECT_TRUE(roots.Check("f", allowed_ + "/data/../runs/x").ok());
  EXPECT_TRUE(roots.Check("f", "").ok());                      // an unset field
  EXPECT_TRUE(AllowedRoots().Check("f", "/etc/passwd").ok());  // no roots
  EXPECT_TRUE(AllowedRoots({""}, "worker", "lsp_gpu_worker").Check("f", "/etc").ok());
  // A sibling sharing the root's name as a prefix, the root's parent, "..", the file system.
  for (const std::string& p : {base_ + "/allowed2/x", base_, allowed_ + "/../outside/secret/key",
                               allowed_ + "/data/../../outside", std::string("/")}) {
    const absl::Status st = roots.Check("SaveState request field dir", p);
    EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << p << ": " << st;
  }
  const absl::Status st = roots.Check("job spec field model.path", outside_ + "/secret/key");
  ASSERT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  const std::string msg(st.message());
  EXPECT_EQ(msg, "job spec field model.path: '" + outside_ + "/secret/key' (" + outside_ +
                     "/secret/key) is outside the worker's allowed roots (" + allowed_ +
                     "): move the file or folder under one of them or start lsp_gpu_worker "
                     "with --allowed_roots naming a folder that holds it");
}

TEST_F(AllowedRootsTest, LinksInsideThatLeadOutAreRefusedWhetherOrNotTheTargetExists) {
  const AllowedRoots roots = Roots();
  fs::create_symlink(outside_ + "/secret", allowed_ + "/escape");
  fs::create_symlink(outside_ + "/secret/key", allowed_ + "/data/key-link");
  fs::create_symlink(outside_ + "/secret/missing", allowed_ + "/data/dangling");
  fs::create_symlink("train.txt", allowed_ + "/data/inside-link");
  fs::create_symlink(allowed_ + "/data", allowed_ + "/data-link");
  EXPECT_TRUE(roots.Check("f", allowed_ + "/data/inside-link").ok());
  EXPECT_TRUE(roots.Check("f", allowed_ + "/data-link/train.txt").ok());
  for (const std::string& p :
       {allowed_ + "/escape/key", allowed_ + "/escape", allowed_ + "/data/key-link",
        allowed_ + "/data/dangling", allowed_ + "/escape/new/folder"}) {
    const absl::Status st = roots.Check("f", p);
    EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << p << ": " << st;
    EXPECT_NE(st.message().find("'" + p + "'"), std::string::npos) << st;
  }
  // The same answer, word for word, whether the file the link leads to exists or not.
  const std::string link = allowed_ + "/data/key-link";
  const std::string with_file(roots.Check("f", link).message());
  fs::remove(outside_ + "/secret/key");
  EXPECT_EQ(std::string(roots.Check("f", link).message()), with_file);
  fs::remove_all(outside_);
  EXPECT_EQ(std::string(roots.Check("f", link).message()), with_file);
  // A loop inside the roots is refused, not followed forever.
  fs::create_symlink(allowed_ + "/loop-b", allowed_ + "/loop-a");
  fs::create_symlink(allowed_ + "/loop-a", allowed_ + "/loop-b");
  const absl::Status loop = roots.Check("f", allowed_ + "/loop-a");
  EXPECT_EQ(loop.code(), absl::StatusCode::kPermissionDenied) << loop;
  EXPECT_NE(loop.message().find("symbolic links"), std::string::npos) << loop;
}

TEST_F(AllowedRootsTest, NothingOutsideTheRootsIsLookedAt) {
  // A path that passes through a folder outside is refused there, even when a link in that
  // folder would lead back inside: finding that out would mean reading outside the roots. So
  // the answer cannot depend on what exists outside.
  fs::create_symlink(allowed_ + "/data", outside_ + "/back-inside");
  const AllowedRoots roots = Roots();
  const std::string p = outside_ + "/back-inside/train.txt";
  ASSERT_EQ(*ResolvePath(p), allowed_ + "/data/train.txt");  // where the kernel would go
  const absl::Status st = roots.Check("f", p);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  // Shown as written (the link outside was not read).
  EXPECT_NE(st.message().find("(" + p + ")"), std::string::npos) << st;
  // The same message for a path outside that does not exist and one that does.
  const std::string missing(roots.Check("f", outside_ + "/nothing/here").message());
  fs::create_directories(outside_ + "/nothing");
  std::ofstream(outside_ + "/nothing/here") << "x";
  EXPECT_EQ(std::string(roots.Check("f", outside_ + "/nothing/here").message()), missing);
  // A link inside that leads outside shows where it leaves the roots, and no further: the
  // link outside that its target passes through is not read.
  fs::create_symlink(base_ + "/elsewhere", outside_ + "/hop");
  fs::create_symlink(outside_ + "/hop/file", allowed_ + "/out");
  const absl::Status hop = roots.Check("f", allowed_ + "/out");
  EXPECT_NE(hop.message().find("(" + outside_ + "/hop/file)"), std::string::npos) << hop;
}

TEST_F(AllowedRootsTest, RootsMayBeRelativeOrReachedThroughALink) {
  // The root given through a link: paths written with either form pass.
  fs::create_symlink(allowed_, base_ + "/root-link");
  const AllowedRoots via_link({base_ + "/root-link"}, "optimizer", "lsp_cpu_optimizer");
  EXPECT_TRUE(via_link.Check("f", base_ + "/root-link/data/train.txt").ok());
  EXPECT_TRUE(via_link.Check("f", allowed_ + "/data/train.txt").ok());
  EXPECT_FALSE(via_link.Check("f", base_ + "/root-link/../outside").ok());
  const absl::Status st = via_link.Check("f", outside_);
  EXPECT_NE(st.message().find("optimizer's allowed roots (" + base_ + "/root-link)"),
            std::string::npos)
      << st;
  EXPECT_NE(st.message().find("lsp_cpu_optimizer with --allowed_roots"), std::string::npos) << st;
  // A relative root and a relative path, against the working directory.
  const fs::path cwd = fs::current_path();
  fs::current_path(base_);
  const AllowedRoots relative({"allowed"}, "scheduler", "lsp_scheduler");
  const bool inside = relative.Check("f", "allowed/data/train.txt").ok();
  const bool absolute_inside = relative.Check("f", allowed_ + "/data").ok();
  const bool outside = relative.Check("f", "outside/secret").ok();
  fs::current_path(cwd);
  EXPECT_TRUE(inside);
  EXPECT_TRUE(absolute_inside);
  EXPECT_FALSE(outside);
  // Several roots: under any of them.
  const AllowedRoots two({allowed_, outside_ + "/secret"}, "worker", "lsp_gpu_worker");
  EXPECT_TRUE(two.Check("f", outside_ + "/secret/key").ok());
  EXPECT_FALSE(two.Check("f", outside_).ok());
}

TEST_F(AllowedRootsTest, EntriesOfAFolderThatLeadOutAreRefused) {
  const AllowedRoots roots = Roots();
  const std::string ckpt = allowed_ + "/ckpt";
  fs::create_directories(ckpt);
  std::ofstream(ckpt + "/config.json") << "{}";
  fs::create_symlink("config.json", ckpt + "/alias.json");  // inside: fine
  EXPECT_TRUE(roots.CheckWithEntries("SaveState request field dir", ckpt).ok());
  EXPECT_TRUE(roots.CheckWithEntries("f", ckpt + "/config.json").ok());  // a file: no entries
  EXPECT_TRUE(roots.CheckWithEntries("f", allowed_ + "/not-yet").ok());
  fs::create_symlink(outside_ + "/secret/key", ckpt + "/worker_state.safetensors");
  const absl::Status st = roots.CheckWithEntries("SaveState request field dir", ckpt);
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied) << st;
  EXPECT_NE(st.message().find("SaveState request field dir, entry worker_state.safetensors"),
            std::string::npos)
      << st;
  // The folder itself outside: refused before it is listed.
  EXPECT_EQ(roots.CheckWithEntries("f", outside_).code(), absl::StatusCode::kPermissionDenied);
  // CheckAll: the first refusal, in order.
  const absl::Status all =
      roots.CheckAll({{"a", allowed_ + "/data"}, {"b", outside_ + "/b"}, {"c", outside_ + "/c"}});
  EXPECT_EQ(all.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(all.message().substr(0, 3), "b: ") << all;
  EXPECT_TRUE(roots.CheckAll({{"a", allowed_ + "/data"}, {"b", ""}}).ok());
}

}  // namespace
}  // namespace lspo::runtime
