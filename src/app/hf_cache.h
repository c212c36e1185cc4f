// `--model-path ORG/NAME [--revision R]` resolved offline in the Hugging Face hub cache, laid out
// as huggingface_hub lays it out:
//   <cache>/models--ORG--NAME/refs/<ref>            a commit hash
//   <cache>/models--ORG--NAME/snapshots/<commit>/   the files (symlinks into ../../blobs)
// where <cache> is $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub. m3serve never
// downloads: a repo or revision missing from the cache is an error that gives the `hf download`
// command to run (which also respects HF_HUB_OFFLINE). A path that is a directory (a checkout, or
// an `hf download --local-dir` folder) is used as it is.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "core/status.h"

namespace m3::app {

struct ResolvedModel {
  std::string dir;       // the directory to load
  std::string repo_id;   // "ORG/NAME" when it came from the hub cache, else empty
  std::string revision;  // the commit of the snapshot (hub cache), else empty
  bool has_dspark = false;  // the checkpoint carries a DSpark draft in dspark/
};

// Environment lookup (getenv by default), so tests can supply their own.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_env();

// The hub cache directory the environment names.
std::string hub_cache_dir(const EnvLookup& env);

// `revision`: a commit hash, a unique prefix of one (4 hex digits or more), or a ref name under
// refs/ ("main", "pr/3"); empty: refs/main. With a local directory a revision is an error (there
// is nothing to pin).
Result<ResolvedModel> resolve_model_path(const std::string& model_path,
                                         const std::string& revision,
                                         const EnvLookup& env = process_env());

}  // namespace m3::app
