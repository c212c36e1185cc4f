// `m3serve serve`: the OpenAI-compatible HTTP server (src/server/serve_command.h) over the real
// model (src/serving). Without --model-path it serves the bundled models/m3-tiny.
#include <filesystem>
#include <system_error>

#include "cli/commands.h"
#include "cli/device.h"
#include "server/serve_command.h"
#include "serving/engine_stack.h"

namespace m3::cli {

namespace {

namespace fs = std::filesystem;

// The bundled model: in the source tree this binary was built from, else next to the binary
// (build/bin/m3serve -> ../../models/m3-tiny).
std::string default_model_path() {
  const fs::path in_repo = fs::path(M3_REPO_ROOT) / "models" / "m3-tiny";
  if (fs::exists(in_repo / "config.json")) return in_repo.string();
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path near =
        (exe.parent_path() / ".." / ".." / "models" / "m3-tiny").lexically_normal();
    if (fs::exists(near / "config.json")) return near.string();
  }
  return in_repo.string();  // the error then names where we looked first
}

Result<server::ModelStack> make_model(const server::ServeFlags& flags) {
  const std::string path = flags.model_path.empty() ? default_model_path() : flags.model_path;
  M3_ASSIGN_OR_RETURN(serving::EngineStackOptions options, serving::options_from_flags(flags));
  options.make_backend = make_backend;  // --device cuda: CudaBackend when built in
  options.make_cuda_runner = make_cuda_model_runner;  // real-shape kernels when the config fits
  M3_ASSIGN_OR_RETURN(serving::EngineStack stack, serving::make_engine_stack(path, options));
  server::ModelStack out;
  out.backend = std::move(stack.backend);
  out.codec = std::move(stack.codec);
  out.renderer = std::move(stack.renderer);
  return out;
}

}  // namespace

int cmd_serve(const std::vector<std::string>& args) {
  return m3::server::run_serve_command(args, make_model);
}

}  // namespace m3::cli
