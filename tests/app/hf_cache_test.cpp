// --model-path ORG/NAME resolved offline in a Hugging Face cache laid out as huggingface_hub lays
// it out (blobs, snapshots of symlinks, refs), built here in a temporary directory.
#include "app/hf_cache.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <unistd.h>

namespace m3::app {
namespace {

namespace fs = std::filesystem;

const std::string kCommitA = "0123456789abcdef0123456789abcdef01234567";
const std::string kCommitB = "0123ffff89abcdef0123456789abcdef01234567";
const std::string kCommitC = "fedcba9876543210fedcba9876543210fedcba98";

class HubCache : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("m3_hf_cache_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    repo_ = root_ / "hub" / "models--MiniMaxAI--MiniMax-M3.1-Flash";
    snapshot(kCommitA, {{"config.json", "{\"a\":1}"}});
    snapshot(kCommitB, {{"config.json", "{\"b\":1}"}});
    snapshot(kCommitC, {{"config.json", "{\"c\":1}"}, {"dspark/config.json", "{}"}});
    ref("main", kCommitA);
    ref("pr/3", kCommitC);
    env_ = {{"HF_HUB_CACHE", (root_ / "hub").string()}};
  }
  void TearDown() override { fs::remove_all(root_); }

  // A snapshot whose files are symlinks into blobs/, as huggingface_hub writes them.
  void snapshot(const std::string& commit, const std::map<std::string, std::string>& files) {
    for (const auto& [name, content] : files) {
      const fs::path blob = repo_ / "blobs" / (commit.substr(0, 8) + std::to_string(name.size()));
      fs::create_directories(blob.parent_path());
      std::ofstream(blob) << content;
      const fs::path link = repo_ / "snapshots" / commit / name;
      fs::create_directories(link.parent_path());
      fs::create_symlink(fs::relative(blob, link.parent_path()), link);
    }
  }
  void ref(const std::string& name, const std::string& commit) {
    fs::create_directories((repo_ / "refs" / name).parent_path());
    std::ofstream(repo_ / "refs" / name) << commit;
  }
  EnvLookup env() const {
    return [env = env_](const std::string& k) -> std::optional<std::string> {
      auto it = env.find(k);
      if (it == env.end()) return std::nullopt;
      return it->second;
    };
  }
  Result<ResolvedModel> resolve(const std::string& rev, const std::string& id =
                                    "MiniMaxAI/MiniMax-M3.1-Flash") {
    return resolve_model_path(id, rev, env());
  }

  fs::path root_, repo_;
  std::map<std::string, std::string> env_;
};

TEST_F(HubCache, WithoutRevisionRefsMainIsUsed) {
  auto r = resolve("");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->revision, kCommitA);
  EXPECT_EQ(r->repo_id, "MiniMaxAI/MiniMax-M3.1-Flash");
  EXPECT_EQ(fs::path(r->dir), repo_ / "snapshots" / kCommitA);
  EXPECT_TRUE(fs::exists(fs::path(r->dir) / "config.json"));  // through the blob symlink
  EXPECT_FALSE(r->has_dspark);
}

TEST_F(HubCache, CommitHashPrefixAndRef) {
  auto full = resolve(kCommitC);
  ASSERT_TRUE(full.is_ok()) << full.status().message();
  EXPECT_EQ(full->revision, kCommitC);
  EXPECT_TRUE(full->has_dspark);
  auto prefix = resolve("fedc");
  ASSERT_TRUE(prefix.is_ok()) << prefix.status().message();
  EXPECT_EQ(prefix->revision, kCommitC);
  auto pr = resolve("pr/3");
  ASSERT_TRUE(pr.is_ok()) << pr.status().message();
  EXPECT_EQ(pr->revision, kCommitC);
  auto main_ref = resolve("main");
  ASSERT_TRUE(main_ref.is_ok());
  EXPECT_EQ(main_ref->revision, kCommitA);
  // "0123" is a prefix of two snapshots: ambiguous, and the error lists them.
  auto ambiguous = resolve("0123");
  ASSERT_FALSE(ambiguous.is_ok());
  EXPECT_NE(ambiguous.status().message().find(kCommitB), std::string::npos);
}

TEST_F(HubCache, MissingRevisionAndRepoGiveTheDownloadCommand) {
  auto rev = resolve("v9.9");
  ASSERT_FALSE(rev.is_ok());
  EXPECT_EQ(rev.status().code(), StatusCode::kNotFound);
  EXPECT_NE(rev.status().message().find("hf download MiniMaxAI/MiniMax-M3.1-Flash --revision v9.9"),
            std::string::npos) << rev.status().message();
  EXPECT_NE(rev.status().message().find("refs: main, pr/3"), std::string::npos)
      << rev.status().message();
  auto repo = resolve("", "MiniMaxAI/Nope");
  ASSERT_FALSE(repo.is_ok());
  EXPECT_NE(repo.status().message().find("hf download MiniMaxAI/Nope"), std::string::npos);
  EXPECT_NE(repo.status().message().find("HF_HUB_OFFLINE"), std::string::npos);
  // A ref naming a commit whose snapshot is gone.
  ref("stale", "abababababababababababababababababababab");
  auto stale = resolve("stale");
  ASSERT_FALSE(stale.is_ok());
  EXPECT_NE(stale.status().message().find("snapshot"), std::string::npos);
}

TEST_F(HubCache, BrokenSymlinkIsAClearError) {
  fs::remove_all(repo_ / "blobs");
  auto r = resolve("");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("broken symlink"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("config.json"), std::string::npos);
}

TEST_F(HubCache, LocalDirectoriesLoadAsTheyAre) {
  // An `hf download --local-dir` folder: plain files (and a .cache folder of metadata).
  const fs::path local = root_ / "local" / "MiniMax-M3.1-Flash";
  fs::create_directories(local / ".cache" / "huggingface");
  std::ofstream(local / "config.json") << "{}";
  auto r = resolve_model_path(local.string(), "", env());
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->dir, local.string());
  EXPECT_TRUE(r->repo_id.empty());
  // A revision cannot pin a local directory.
  EXPECT_FALSE(resolve_model_path(local.string(), "main", env()).is_ok());
}

TEST(HubCacheDir, FromTheEnvironment) {
  auto env = [](std::map<std::string, std::string> m) {
    return [m](const std::string& k) -> std::optional<std::string> {
      auto it = m.find(k);
      if (it == m.end()) return std::nullopt;
      return it->second;
    };
  };
  EXPECT_EQ(hub_cache_dir(env({{"HF_HUB_CACHE", "/c"}, {"HF_HOME", "/h"}})), "/c");
  EXPECT_EQ(hub_cache_dir(env({{"HF_HOME", "/h"}, {"HOME", "/home/u"}})), "/h/hub");
  EXPECT_EQ(hub_cache_dir(env({{"HOME", "/home/u"}})), "/home/u/.cache/huggingface/hub");
}

}  // namespace
}  // namespace m3::app
