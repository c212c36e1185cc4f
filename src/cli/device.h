// The compute device of the model commands (--device cpu|cuda) and how their model is loaded
// (--load-format auto|safetensors|dummy).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "model/model.h"
#include "loader/model_config.h"
#include "loader/weight_source.h"
#include "model/minimax_m3/model_dir.h"
#include "model/minimax_m3/runner.h"

namespace m3::cli {

// True when this binary has the CUDA backend built in.
bool cuda_built_in();

// "cpu": the CPU backend with `threads` threads (0: all cores). "cuda": the CUDA backend on GPU 0
// (an error naming the reason when the binary was built without CUDA or no usable GPU is
// present). Anything else: invalid_argument.
Result<std::unique_ptr<Backend>> make_backend(const std::string& device, int threads);

// --device cuda, real-shape path (src/model/minimax_m3_cuda): the model on the quantised GPU
// kernels with a bf16 KV cache of kv_cache_bytes. invalid_argument naming the field when `cfg`
// does not fit those kernels (the caller then uses the float32 CudaBackend path), unimplemented
// without CUDA.
Result<std::unique_ptr<ModelRunner>> make_cuda_model_runner(const MiniMaxM3Config& cfg,
                                                            const WeightSource& src,
                                                            int64_t kv_cache_bytes);

// `score` / `generate` with --device cuda on the real-shape kernels: the config and weights of
// `model_path` (or dummy weights, as load_model) go straight to the GPU when the config fits
// those kernels. *used is false (nothing ran; one stderr line says why) when it does not, or
// without CUDA: the caller then runs the float32 path. generate fills opts.eos_token_ids itself.
Status real_shape_score(const std::string& model_path, const std::string& load_format,
                        int64_t num_layers, std::span<const int32_t> prompt, int64_t chunk,
                        bool* used, std::vector<float>* logits, int64_t* vocab);
Status real_shape_generate(const std::string& model_path, const std::string& load_format,
                           int64_t num_layers, std::span<const int32_t> prompt,
                           minimax_m3::GenerateOptions opts, bool* used,
                           std::vector<int32_t>* output_ids);

// "auto" / "safetensors": the checkpoint in `model_path`; "dummy": random weights in the real
// storage formats (model/minimax_m3/dummy_weights.h) for model_path's config.json, or the
// built-in MiniMax-M3.1-Flash config when model_path is empty; num_layers > 0 keeps the first
// num_layers layers (dummy only).
Result<minimax_m3::LoadedModel> load_model(const std::string& model_path,
                                           const std::string& load_format, int64_t num_layers,
                                           Backend* backend);

}  // namespace m3::cli
