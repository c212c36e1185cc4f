#include "app/serve.h"

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <system_error>
#include <thread>

#include "app/devices.h"
#include "app/engine_stack.h"
#include "app/hf_cache.h"
#include "server/deferred_model.h"
#include "server/fake/fake_codec.h"
#include "server/fake/fake_renderer.h"
#include "server/server.h"

namespace m3::app {

namespace fs = std::filesystem;

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

namespace {

// The engine over the checkpoint, with its tokenizer and chat template.
Result<server::ModelStack> load_engine(const ServeConfig& config,
                                       std::function<void(const Status&)> on_failure) {
  const std::string path = config.model_path.empty() ? default_model_path() : config.model_path;
  M3_ASSIGN_OR_RETURN(EngineStackOptions options, options_from_config(config));
  options.on_failure = std::move(on_failure);
  M3_ASSIGN_OR_RETURN(ResolvedModel model, resolve_model_path(path, config.revision));
  if (!model.repo_id.empty()) {
    std::fprintf(stderr, "m3serve: model %s at revision %s (%s)\n", model.repo_id.c_str(),
                 model.revision.c_str(), model.dir.c_str());
  } else {
    std::fprintf(stderr, "m3serve: model %s\n", model.dir.c_str());
  }
  if (model.has_dspark) {
    std::fprintf(stderr, "m3serve: DSpark draft found in the target checkpoint's dspark/ "
                         "subfolder\n");
  }
  const char* draft = options.speculative
                          ? (options.dummy_weights ? "dummy weights (--load-format dummy)"
                             : config.speculative_draft_model_path.empty()
                                 ? "the checkpoint's dspark/ draft"
                                 : "the one of --speculative-draft-model-path")
                      : model.has_dspark ? "the checkpoint's dspark/ draft, unused without "
                                           "--speculative-algorithm DSPARK"
                                         : "none (no dspark/ subfolder in the checkpoint)";
  options.device = resolve_device(options.device);
  options.make_backend = make_backend;                // --device cuda: CudaBackend when built in
  options.make_cuda_runner = make_cuda_model_runner;  // real-shape kernels when the config fits
  options.cuda_memory_bytes = cuda_memory_bytes;      // the --mem-fraction-static base
  M3_ASSIGN_OR_RETURN(EngineStack stack, make_engine_stack(model.dir, options));
  for (const std::string& line : stack.report) std::fprintf(stderr, "m3serve: %s\n", line.c_str());
  std::fprintf(stderr, "m3serve: draft: %s\n", draft);
  server::ModelStack out;
  out.backend = std::move(stack.backend);
  out.codec = std::move(stack.codec);
  out.renderer = std::move(stack.renderer);
  return out;
}

// --node-rank K > 0: no HTTP server; this process's ranks follow node 0's steps.
int run_follower(const ServeConfig& config) {
  const std::string path = config.model_path.empty() ? default_model_path() : config.model_path;
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "m3serve serve: %s\n", s.message().c_str());
    return 1;
  };
  auto options = options_from_config(config);
  if (!options.is_ok()) return fail(options.status());
  auto model = resolve_model_path(path, config.revision);
  if (!model.is_ok()) return fail(model.status());
  options->device = resolve_device(options->device);
  options->make_cuda_runner = make_cuda_model_runner;  // GPU ranks (--device cuda)
  auto rc = run_follower_node(model->dir, *options);
  if (!rc.is_ok()) return fail(rc.status());
  return *rc;
}

// The scripted backend of --fake-backend, after its pretend load time.
server::ModelStack load_fake(const ServeConfig& config) {
  std::this_thread::sleep_for(config.fake.load_time);
  server::FakeBackendOptions fo = config.fake.backend;
  fo.context_length = config.server.context_length > 0 ? config.server.context_length : 8192;
  fo.max_waiting = config.max_queued_requests;
  server::ModelStack stack;
  stack.backend = std::make_unique<server::FakeBackend>(fo);
  stack.codec = std::make_unique<server::FakeCodec>();
  stack.renderer = std::make_unique<server::FakeRenderer>();
  return stack;
}

}  // namespace

int run_serve(const ServeConfig& config) {
  for (const std::string& n : config.notices) std::fprintf(stderr, "m3serve: note: %s\n", n.c_str());
  // Flags whose feature is not built yet are refused before anything starts.
  if (!config.fake.enabled) {
    if (auto options = options_from_config(config); !options.is_ok()) {
      std::fprintf(stderr, "m3serve serve: %s\n", options.status().message().c_str());
      return 2;
    }
  }
  if (config.node_rank > 0 && !config.fake.enabled) return run_follower(config);
  server::DeferredModel model;  // declared first: outlives the server
  server::Server server(config.server, model.backend(), model.codec(), model.renderer());
  Status s = server.start();
  if (!s.is_ok()) {
    std::fprintf(stderr, "m3serve serve: %s\n", s.message().c_str());
    return 1;
  }
  std::atomic<bool> load_failed{false};
  // The model failing for good (a rank of a parallel group died): every request has been failed
  // with 503, /health answers 503, and the process exits non-zero after the drain.
  std::atomic<bool> model_failed{false};
  auto on_failure = [&model_failed](const Status& why) {
    std::fprintf(stderr, "m3serve: fatal: %s; exiting\n", why.message().c_str());
    std::fflush(stderr);
    model_failed.store(true);
    std::raise(SIGTERM);  // ends wait_for_signal_and_drain()
  };
  auto load = [&] {
    Result<server::ModelStack> stack = config.fake.enabled
                                           ? Result<server::ModelStack>(load_fake(config))
                                           : load_engine(config, on_failure);
    if (!stack.is_ok()) {
      std::fprintf(stderr, "m3serve serve: %s\n", stack.status().message().c_str());
      load_failed.store(true);
      std::raise(SIGTERM);  // ends wait_for_signal_and_drain()
      return;
    }
    model.install(std::move(stack).value());
    std::fprintf(stderr, "m3serve: ready: serving '%s' on http://%s:%u\n",
                 config.server.served_model_names.front().c_str(), config.server.host.c_str(),
                 server.port());
    std::fflush(stderr);
  };
  // The fake backend without a load time has nothing to load: install it before announcing the
  // port, so a client that starts sending at once never races the background load (a 503).
  const bool load_now = config.fake.enabled && config.fake.load_time.count() == 0;
  if (load_now) load();
  std::fprintf(stderr, "m3serve: serving '%s' on http://%s:%u (%s backend)%s\n",
               config.server.served_model_names.front().c_str(), config.server.host.c_str(),
               server.port(), config.fake.enabled ? "fake" : "engine",
               load_now ? "" : "; loading the model");
  std::fflush(stderr);

  std::thread loader;
  if (!load_now) loader = std::thread(load);
  int rc = server.wait_for_signal_and_drain();
  if (loader.joinable()) loader.join();
  server.stop();
  if (model_failed.load()) {
    // Ranks of a broken group may still wait on peers that never answer: do not unwind them.
    std::fflush(nullptr);
    std::_Exit(1);
  }
  return load_failed.load() ? 1 : rc;
}

}  // namespace m3::app
