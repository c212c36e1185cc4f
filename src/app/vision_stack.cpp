#include "app/vision_stack.h"

#include <algorithm>
#include <memory>
#include <span>
#include <thread>

#include "app/devices.h"
#include "backend/cpu/cpu_backend.h"
#include "loader/checkpoint.h"
#include "loader/vision_config.h"
#include "model/minimax_m3/vision_tower.h"
#include "server/handlers/image_inputs.h"
#include "serving/engine_backend.h"
#include "serving/tokenizer_codec.h"

namespace m3::app {

namespace {

// The tower with the checkpoint mapping it was loaded from and its own CPU threads (the model's
// backend belongs to the engine thread; the tower runs on the server's request threads).
struct LoadedVisionTower {
  std::unique_ptr<CpuBackend> cpu;
  std::unique_ptr<VisionTower> tower;
};

server::VisionPreprocessConfig preprocess_config(const VisionConfig& c) {
  server::VisionPreprocessConfig p;
  p.patch_size = int32_t(c.patch_size);
  p.temporal_patch_size = int32_t(c.temporal_patch_size);
  p.merge_size = int32_t(c.spatial_merge_size);
  p.min_pixels = c.min_pixels;
  p.max_pixels = c.max_pixels;
  for (size_t i = 0; i < 3; ++i) {
    p.mean[i] = float(c.image_mean[i]);
    p.std[i] = float(c.image_std[i]);
  }
  return p;
}

}  // namespace

Status attach_vision(const std::string& model_path, const EngineStackOptions& options,
                     serving::EngineBackend& backend, const serving::TokenizerCodec& codec,
                     std::vector<std::string>& report) {
  M3_ASSIGN_OR_RETURN(std::optional<VisionConfig> config, load_vision_config(model_path));
  auto refuse = [&](const std::string& why) {
    report.push_back("vision: " + why + "; requests with images get 400 vision_not_available");
    return Status::ok();
  };
  if (!config) return refuse("config.json has no vision_config");
  if (options.dummy_weights) return refuse("not loaded with --load-format dummy");
  if (!backend.engine().takes_prompt_embeddings()) {
    return refuse("this model runner takes no input embeddings (the float32 CPU path does)");
  }
  if (!codec.token_id(server::kImageToken) || !codec.token_id(server::kImageStartToken) ||
      !codec.token_id(server::kImageEndToken)) {
    return refuse("the tokenizer lacks the image tokens");
  }
  M3_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint, Checkpoint::open(model_path));
  if (!find_vision_prefix(*checkpoint).is_ok()) {
    return refuse("config.json has a vision_config but the checkpoint has no vision weights");
  }
  const int64_t text_hidden = backend.engine().hidden_size();
  if (config->text_hidden_size != text_hidden) {
    return invalid_argument(model_path + "/config.json: the vision merge MLP ends in " +
                            std::to_string(config->text_hidden_size) +
                            " values but the text model's hidden size is " +
                            std::to_string(text_hidden));
  }
  M3_ASSIGN_OR_RETURN(VisionWeights weights, load_vision_weights(*checkpoint, *config));
  // On the GPU beside a model on --device cuda (the float32 CPU tower would take minutes per
  // image at the real shapes), else on the CPU with its own threads.
  ImageEncoder encode;
  std::string where;
  if (options.device == "cuda") {
    M3_ASSIGN_OR_RETURN(encode, make_cuda_image_encoder(*config, weights));
    where = "on GPU 0 (bf16 weights, float32 accumulation)";
  } else {
    auto loaded = std::make_shared<LoadedVisionTower>();
    const int threads = options.num_threads > 0
                            ? options.num_threads
                            : int(std::max(1u, std::thread::hardware_concurrency()));
    loaded->cpu = std::make_unique<CpuBackend>(threads);
    loaded->tower = std::make_unique<VisionTower>(*config, std::move(weights), loaded->cpu.get());
    encode = [loaded](std::span<const float> patches, int32_t t, int32_t h, int32_t w) {
      return loaded->tower->encode(patches, t, h, w);
    };
    where = "on the CPU in float32";
  }
  const int64_t patch_values = config->patch_values();
  backend.enable_vision(
      preprocess_config(*config),
      [encode, patch_values](const server::BackendImage& img) -> Result<std::vector<float>> {
        if (img.patch_values != patch_values) {
          return invalid_argument("[vision] an image of " + std::to_string(img.patch_values) +
                                  " values per patch; the tower takes " +
                                  std::to_string(patch_values));
        }
        return encode(img.pixel_values, img.grid_t, img.grid_h, img.grid_w);
      });
  report.push_back("vision: " + std::to_string(config->num_hidden_layers) +
                   "-layer tower (hidden " + std::to_string(config->hidden_size) + ") " + where +
                   "; images of " + std::to_string(config->min_pixels) + ".." +
                   std::to_string(config->max_pixels) + " pixels");
  return Status::ok();
}

}  // namespace m3::app
