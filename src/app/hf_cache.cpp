#include "app/hf_cache.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

namespace m3::app {

namespace fs = std::filesystem;

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  };
}

std::string hub_cache_dir(const EnvLookup& env) {
  if (auto v = env("HF_HUB_CACHE")) return *v;
  if (auto v = env("HF_HOME")) return (fs::path(*v) / "hub").string();
  const std::string home = env("HOME").value_or("/root");
  return (fs::path(home) / ".cache" / "huggingface" / "hub").string();
}

namespace {

bool is_hex(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
}

// "ORG/NAME": one slash, neither part empty, not a path that starts with . or /.
bool looks_like_repo_id(const std::string& p) {
  const size_t slash = p.find('/');
  return slash != std::string::npos && slash > 0 && slash + 1 < p.size() &&
         p.find('/', slash + 1) == std::string::npos && p[0] != '.' && p[0] != '/' &&
         p[0] != '~';
}

std::string download_hint(const std::string& repo, const std::string& revision,
                          const std::string& cache) {
  return " Download it first (m3serve never downloads): hf download " + repo +
         (revision.empty() ? "" : " --revision " + revision) + " (with HF_HUB_CACHE=" + cache +
         "; HF_HUB_OFFLINE is respected: nothing here goes online).";
}

std::vector<std::string> list_dir(const fs::path& dir, bool recursive) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  if (recursive) {
    for (auto it = fs::recursive_directory_iterator(dir, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (it->is_regular_file(ec)) out.push_back(fs::relative(it->path(), dir).string());
    }
  } else {
    for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path().filename());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string joined(const std::vector<std::string>& v) {
  if (v.empty()) return "none";
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// A snapshot whose files are symlinks into blobs/: every link must resolve.
Status check_links(const fs::path& dir) {
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_symlink(ec)) continue;
    if (!fs::exists(it->path(), ec)) {
      return Status(StatusCode::kNotFound,
                    it->path().string() + " is a broken symlink (to " +
                        fs::read_symlink(it->path(), ec).string() +
                        "): the download is incomplete; run the hf download command again");
    }
  }
  return Status::ok();
}

}  // namespace

Result<ResolvedModel> resolve_model_path(const std::string& model_path,
                                         const std::string& revision, const EnvLookup& env) {
  ResolvedModel r;
  std::error_code ec;
  if (fs::is_directory(model_path, ec) || !looks_like_repo_id(model_path)) {
    if (!revision.empty()) {
      return invalid_argument("--revision " + revision + ": '" + model_path +
                              "' is a local directory, which has no revisions; pass the repo id "
                              "(ORG/NAME) to pin a revision of the hub cache");
    }
    r.dir = model_path;
    r.has_dspark = fs::is_directory(fs::path(model_path) / "dspark", ec);
    return r;
  }
  const std::string cache = hub_cache_dir(env);
  const std::string org = model_path.substr(0, model_path.find('/'));
  const std::string name = model_path.substr(model_path.find('/') + 1);
  const fs::path repo = fs::path(cache) / ("models--" + org + "--" + name);
  if (!fs::is_directory(repo, ec)) {
    return Status(StatusCode::kNotFound,
                  "--model-path " + model_path + ": not a local directory, and not in the " +
                      "Hugging Face cache (" + repo.string() + " is missing)." +
                      download_hint(model_path, revision, cache));
  }
  const fs::path snapshots = repo / "snapshots";
  const std::vector<std::string> commits = list_dir(snapshots, false);
  std::string commit;
  if (is_hex(revision) && revision.size() >= 4) {
    std::vector<std::string> matches;
    for (const auto& c : commits)
      if (c.rfind(revision, 0) == 0) matches.push_back(c);
    if (matches.size() > 1) {
      return invalid_argument("--revision " + revision + " matches several snapshots of " +
                              model_path + ": " + joined(matches) + "; give more digits");
    }
    if (matches.size() == 1) commit = matches.front();
  }
  if (commit.empty()) {
    const std::string ref = revision.empty() ? "main" : revision;
    std::ifstream in(repo / "refs" / ref);
    if (in && std::getline(in, commit) && is_hex(commit)) {
      // The ref names a commit; its snapshot is checked below.
    } else {
      return Status(StatusCode::kNotFound,
                    "--model-path " + model_path + " --revision " + ref + ": no such commit or " +
                        "ref in " + repo.string() + " (refs: " +
                        joined(list_dir(repo / "refs", true)) + "; snapshots: " + joined(commits) +
                        ")." + download_hint(model_path, ref, cache));
    }
  }
  const fs::path dir = snapshots / commit;
  if (!fs::is_directory(dir, ec)) {
    return Status(StatusCode::kNotFound,
                  "--model-path " + model_path + ": the revision names commit " + commit +
                      ", whose snapshot " + dir.string() + " is missing." +
                      download_hint(model_path, commit, cache));
  }
  M3_RETURN_IF_ERROR(check_links(dir));
  r.dir = dir.string();
  r.repo_id = model_path;
  r.revision = commit;
  r.has_dspark = fs::is_directory(dir / "dspark", ec);
  return r;
}

}  // namespace m3::app
