// The compute device of the model commands (--device cpu|cuda): the backend, and the runner of
// the real-shape CUDA path.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "app/kv_pool_request.h"
#include "backend/backend.h"
#include "core/status.h"
#include "model/minimax_m3/dspark/dspark_attention.h"
#include "model/draft_model.h"
#include "model/model.h"
#include "loader/model_config.h"
#include "loader/vision_config.h"
#include "loader/weight_source.h"
#include "model/minimax_m3/vision_tower.h"

namespace m3::app {

// True when this binary has the CUDA backend built in.
bool cuda_built_in();

// "auto": "cuda" when this binary has the CUDA backend and a GPU is usable, else "cpu", with one
// line on stderr saying which and why; "cpu" and "cuda" stay as they are.
std::string resolve_device(const std::string& device);

// "cpu": the CPU backend with `threads` threads (0: all cores). "cuda": the CUDA backend on GPU 0
// (an error naming the reason when the binary was built without CUDA or no usable GPU is
// present). Anything else: invalid_argument.
Result<std::unique_ptr<Backend>> make_backend(const std::string& device, int threads);

// The total memory of GPU 0 in bytes, as the CUDA runtime reports it (the --mem-fraction-static
// base); unimplemented without CUDA.
Result<int64_t> cuda_memory_bytes();

// --device cuda, real-shape path (src/model/minimax_m3/cuda): the model on the quantised GPU
// kernels with a bf16 KV cache sized as `pool` says. invalid_argument naming the field when `cfg`
// does not fit those kernels (the caller then uses the float32 CudaBackend path), unimplemented
// without CUDA.
Result<std::unique_ptr<ModelRunner>> make_cuda_model_runner(const MiniMaxM3Config& cfg,
                                                            const WeightSource& src,
                                                            const CudaKvPoolRequest& pool);

// --speculative-algorithm DSPARK on the real-shape CUDA path: the draft on the GPU of `runner`
// (a one-GPU CudaM3ModelRunner), its weights from `draft_dir` (config.json + tensors), or random
// ones with `dummy_weights` (at draft_dir's config.json when there is one, else the released
// layout scaled to the target), context memory for at most `max_sequences` sequences. Errors name
// --speculative-draft-model-path; unimplemented without CUDA or over GPU ranks.
Result<std::unique_ptr<DraftModel>> make_cuda_dspark_draft(ModelRunner& runner,
                                                           const std::string& draft_dir,
                                                           bool dummy_weights,
                                                           int64_t max_sequences);

// Image features of one image: [outputs, text hidden] from its patches ([t·h·w, patch values]
// in merge-window order) and grid; callable from any thread.
using ImageEncoder = std::function<Result<std::vector<float>>(
    std::span<const float> patches, int32_t grid_t, int32_t grid_h, int32_t grid_w)>;

// The vision tower and projector on GPU 0 (model/minimax_m3/cuda/cuda_vision_tower.h: bf16
// weights uploaded now, one image at a time under a lock); unimplemented without CUDA, and the
// upload's error (resource_exhausted when the KV pool left too little memory).
Result<ImageEncoder> make_cuda_image_encoder(const VisionConfig& config,
                                             const VisionWeights& weights);

// The DSpark draft's block attention for a draft on `backend`: empty on the CPU backend (the
// host code), the float32 kernel on the CUDA backend (model/minimax_m3/cuda/cuda_dspark_f32.h).
minimax_m3::dspark::BlockAttentionFn dspark_block_attention_for(Backend* backend);

}  // namespace m3::app
