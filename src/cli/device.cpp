#include "cli/device.h"

#include <algorithm>
#include <cstdio>

#include "backend/cpu/cpu_backend.h"
#include "loader/checkpoint.h"
#include "model/minimax_m3/dummy_weights.h"
#include "model/minimax_m3_cuda/fit_check.h"
#if defined(M3_HAVE_CUDA)
#include "backend/cuda/cuda_backend.h"
#include "model/minimax_m3_cuda/cuda_m3_generate.h"
#include "model/minimax_m3_cuda/cuda_m3_runner.h"
#endif

namespace m3::cli {

bool cuda_built_in() {
#if defined(M3_HAVE_CUDA)
  return true;
#else
  return false;
#endif
}

Result<std::unique_ptr<Backend>> make_backend(const std::string& device, int threads) {
  if (device == "cpu") return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(threads));
  if (device != "cuda")
    return invalid_argument("--device must be cpu or cuda, got '" + device + "'");
#if defined(M3_HAVE_CUDA)
  auto be = CudaBackend::create(0);
  if (!be.is_ok())
    return Status(StatusCode::kNotFound, "--device cuda: no usable GPU: " + be.status().message());
  return std::unique_ptr<Backend>(std::move(be).value());
#else
  return Status(StatusCode::kUnimplemented,
                "--device cuda: this m3serve was not built with the CUDA backend (configure with "
                "-DM3_CUDA=ON where nvcc is installed; 'm3serve version' says 'cuda: no')");
#endif
}

Result<std::unique_ptr<ModelRunner>> make_cuda_model_runner(const MiniMaxM3Config& cfg,
                                                            const WeightSource& src,
                                                            int64_t kv_cache_bytes) {
#if defined(M3_HAVE_CUDA)
  minimax_m3::CudaM3Options o;
  // --load-format dummy: the weights are generated on the GPU in the same formats.
  o.gpu_dummy_weights = dynamic_cast<const minimax_m3::DummyWeightSource*>(&src) != nullptr;
  M3_ASSIGN_OR_RETURN(std::unique_ptr<CudaM3ModelRunner> r,
                      CudaM3ModelRunner::create(cfg, src, kv_cache_bytes, o));
  return std::unique_ptr<ModelRunner>(std::move(r));
#else
  return Status(StatusCode::kUnimplemented,
                "--device cuda: this m3serve was not built with the CUDA backend");
#endif
}

#if defined(M3_HAVE_CUDA)
namespace {

// The config, weights and stop tokens for the real-shape path (no float32 model is built);
// `fits` false (and one stderr line) when the config does not fit the real-shape kernels.
struct RealShapeSource {
  MiniMaxM3Config config;
  std::unique_ptr<WeightSource> weights;
  std::vector<int64_t> eos_token_ids;
  bool fits = false;
};

Result<RealShapeSource> open_real_shape(const std::string& model_path,
                                        const std::string& load_format, int64_t num_layers) {
  RealShapeSource r;
  if (load_format == "dummy") {
    if (model_path.empty()) {
      r.config = minimax_m3::builtin_m3_flash_config(num_layers);
    } else {
      M3_ASSIGN_OR_RETURN(r.config, load_minimax_m3_config(model_path));
      if (num_layers > 0 && num_layers < r.config.num_hidden_layers) {
        r.config.num_hidden_layers = num_layers;
        r.config.layer_types.resize(static_cast<size_t>(num_layers));
        r.config.mlp_layer_types.resize(static_cast<size_t>(num_layers));
      }
    }
  } else {
    if (load_format != "auto" && load_format != "safetensors")
      return invalid_argument("--load-format must be auto, safetensors or dummy, got '" +
                              load_format + "'");
    if (num_layers > 0) return invalid_argument("--num-layers needs --load-format dummy");
    M3_ASSIGN_OR_RETURN(r.config, load_minimax_m3_config(model_path));
  }
  const Status fit = minimax_m3::check_real_shape_fit(r.config);
  if (!fit.is_ok()) {
    std::fprintf(stderr, "m3serve: --device cuda: %s; using the float32 CUDA backend\n",
                 fit.message().c_str());
    return r;
  }
  r.fits = true;
  if (load_format == "dummy") {
    r.weights = std::make_unique<minimax_m3::DummyWeightSource>(r.config);
  } else {
    M3_ASSIGN_OR_RETURN(r.weights, Checkpoint::open(model_path));
  }
  if (!model_path.empty()) {
    M3_ASSIGN_OR_RETURN(r.eos_token_ids, minimax_m3::read_generation_eos(model_path));
  }
  if (r.eos_token_ids.empty()) r.eos_token_ids = r.config.eos_token_ids;
  return r;
}

Result<std::unique_ptr<minimax_m3::CudaM3Model>> load_real_shape(const RealShapeSource& r,
                                                                 int64_t positions) {
  minimax_m3::CudaM3Options o;
  o.num_kv_pages = std::max<int64_t>(1, (positions + 127) / 128);
  o.max_batch = 1;  // one sequence
  // --load-format dummy: the weights are generated on the GPU in the same formats.
  o.gpu_dummy_weights =
      dynamic_cast<const minimax_m3::DummyWeightSource*>(r.weights.get()) != nullptr;
  return minimax_m3::CudaM3Model::load(r.config, *r.weights, o);
}

}  // namespace
#endif

Status real_shape_score(const std::string& model_path, const std::string& load_format,
                        int64_t num_layers, std::span<const int32_t> prompt, int64_t chunk,
                        bool* used, std::vector<float>* logits, int64_t* vocab) {
  *used = false;
#if defined(M3_HAVE_CUDA)
  M3_ASSIGN_OR_RETURN(RealShapeSource r, open_real_shape(model_path, load_format, num_layers));
  if (!r.fits) return Status::ok();
  M3_ASSIGN_OR_RETURN(auto model, load_real_shape(r, static_cast<int64_t>(prompt.size())));
  M3_ASSIGN_OR_RETURN(*logits, minimax_m3::cuda_score(model.get(), prompt, chunk));
  *vocab = r.config.vocab_size;
  *used = true;
#endif
  return Status::ok();
}

Status real_shape_generate(const std::string& model_path, const std::string& load_format,
                           int64_t num_layers, std::span<const int32_t> prompt,
                           minimax_m3::GenerateOptions opts, bool* used,
                           std::vector<int32_t>* output_ids) {
  *used = false;
#if defined(M3_HAVE_CUDA)
  M3_ASSIGN_OR_RETURN(RealShapeSource r, open_real_shape(model_path, load_format, num_layers));
  if (!r.fits) return Status::ok();
  M3_ASSIGN_OR_RETURN(auto model,
                      load_real_shape(r, static_cast<int64_t>(prompt.size()) + opts.max_tokens));
  opts.eos_token_ids = r.eos_token_ids;
  M3_ASSIGN_OR_RETURN(*output_ids, minimax_m3::cuda_generate(model.get(), prompt, opts));
  *used = true;
#endif
  return Status::ok();
}

Result<minimax_m3::LoadedModel> load_model(const std::string& model_path,
                                           const std::string& load_format, int64_t num_layers,
                                           Backend* backend) {
  if (load_format == "dummy") return minimax_m3::load_dummy_model(model_path, num_layers, backend);
  if (load_format != "auto" && load_format != "safetensors")
    return invalid_argument("--load-format must be auto, safetensors or dummy, got '" +
                            load_format + "'");
  if (num_layers > 0) return invalid_argument("--num-layers needs --load-format dummy");
  return minimax_m3::load_model_dir(model_path, backend);
}

}  // namespace m3::cli
