// Time to first token of one image plus text at the MiniMax-M3 shapes on one GPU, dummy weights:
//   1. the vision tower + projector (CudaVisionTower: 32 layers, hidden 1280, projector 6144) on
//      one 1024 x 1024 image, which the processor's smart_resize brings to max_pixels = 672²
//      (48 x 48 patches, 576 image tokens); timed as encode() runs in serving: the patches'
//      upload, every launch, the embeddings' copy back (median of 3 after 1 warm-up). Its FLOPs
//      (vision_tower_flops: every GEMM as executed, attention over the padded keys) and the
//      fraction of the bf16 peak, 832 TFLOP/s (cuBLASLt on an H200, docs/performance.md).
//   2. the text prefill of the 576 image tokens + 100 text tokens in one chunk through
//      CudaM3Model::forward (M3.1-Flash layers, GPU dummy weights), the path serving runs; the
//      injected image embeddings only replace rows of the embedding gather and do not change the
//      step's cost, so plain token ids are used. Models of 3 layers and of the largest of
//      24 / 16 / 12 / 8 layers that loads give the 60-layer time as the decode benchmark does:
//      t3 + 57 (tL - t3) / (L - 3), extrapolated (printed as such).
// TTFT = tower + 60-layer prefill (+ the host's pre-processing, not measured here).
//
// Usage: cuda_vision_ttft_bench [results.tsv (appended)|-] [image_side_px] [text_tokens]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/minimax_m3/cuda/cuda_m3_model.h"
#include "model/minimax_m3/cuda/cuda_vision_tower.h"
#include "model/minimax_m3/dummy_vision_weights.h"
#include "model/minimax_m3/dummy_weights.h"

namespace {

using namespace m3;
using namespace m3::minimax_m3;

constexpr double kPeak = 832e12;  // bf16 dense, cuBLASLt on an H200 (docs/performance.md)

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

[[noreturn]] void fail(const std::string& what, const Status& s) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), s.to_string().c_str());
  std::exit(1);
}

// smart_resize of a square image of `side` pixels (docs/vision.md): sides to multiples of
// factor 28, the area brought into [min_pixels, max_pixels]; for a square image above
// max_pixels that is floor(side / beta / 28) · 28 with beta = sqrt(side² / max_pixels).
int64_t resized_side(const VisionConfig& c, int64_t side) {
  const int64_t f = c.patch_size * c.spatial_merge_size;
  int64_t s = int64_t(std::nearbyint(double(side) / double(f))) * f;  // may be 0
  if (s * s > c.max_pixels) {
    const double beta = std::sqrt(double(side) * double(side) / double(c.max_pixels));
    s = std::max<int64_t>(f, int64_t(std::floor(double(side) / beta / double(f))) * f);
  } else if (s * s < c.min_pixels) {
    const double beta = std::sqrt(double(c.min_pixels) / (double(side) * double(side)));
    s = int64_t(std::ceil(double(side) * beta / double(f))) * f;
  }
  return s;
}

std::unique_ptr<CudaM3Model> load_text(int64_t layers, bool may_fail) {
  const MiniMaxM3Config cfg = builtin_m3_flash_config(layers);
  DummyWeightSource src(cfg);
  CudaM3Options o;
  o.num_kv_pages = 64;
  o.gpu_dummy_weights = true;
  auto m = CudaM3Model::load(cfg, src, o);
  if (!m.is_ok()) {
    if (may_fail) return nullptr;
    fail("load " + std::to_string(layers) + " layers", m.status());
  }
  return std::move(m).value();
}

// Median ms of one prefill step of `tokens` tokens (one sequence from position 0).
double prefill_ms(CudaM3Model* model, int64_t tokens) {
  std::vector<int32_t> ids(static_cast<size_t>(tokens)), table;
  for (int64_t i = 0; i < tokens; ++i) ids[size_t(i)] = int32_t((1000 + 7919 * i) % 200000);
  for (int64_t p = 0; p * 128 < tokens; ++p) table.push_back(int32_t(p));
  std::vector<SequenceInput> in(1);
  in[0].tokens = ids;
  in[0].start_pos = 0;
  in[0].block_table = table;
  in[0].logits_rows = {int32_t(tokens - 1)};
  std::vector<double> ms;
  for (int s = 0; s < 4; ++s) {
    ForwardOutput out;
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = model->forward(in, &out);
    if (!st.is_ok()) fail("prefill forward", st);
    if (s > 0) ms.push_back(ms_since(t0));
  }
  std::sort(ms.begin(), ms.end());
  return ms[1];
}

}  // namespace

int main(int argc, char** argv) {
  std::FILE* tsv = argc > 1 && std::string(argv[1]) != "-" ? std::fopen(argv[1], "a") : nullptr;
  const int64_t side = argc > 2 ? std::atoll(argv[2]) : 1024;
  const int64_t text_tokens = argc > 3 ? std::atoll(argv[3]) : 100;
  if (side < 1 || text_tokens < 0) {
    std::fprintf(stderr, "usage: cuda_vision_ttft_bench [results.tsv|-] [image_side_px >= 1] "
                         "[text_tokens >= 0]\n");
    return 2;
  }
  const VisionConfig vc;  // the M3 vision config's defaults
  const int64_t s = resized_side(vc, side), g = s / vc.patch_size;
  const VisionImageGrid grid{1, int32_t(g), int32_t(g)};
  const int64_t image_tokens = grid.patches() / (vc.spatial_merge_size * vc.spatial_merge_size);
  std::printf("vision TTFT, M3 shapes, dummy weights: %lldx%lld image -> %lldx%lld pixels, grid "
              "%lldx%lld = %lld patches, %lld image tokens + %lld text tokens\n",
              (long long)side, (long long)side, (long long)s, (long long)s, (long long)g,
              (long long)g, (long long)grid.patches(), (long long)image_tokens,
              (long long)text_tokens);

  // 1. The tower.
  const auto tl = std::chrono::steady_clock::now();
  DummyVisionWeightSource vsrc(vc);
  auto vw = load_vision_weights(vsrc, vc);
  if (!vw.is_ok()) fail("vision weights", vw.status());
  auto tower = CudaVisionTower::create(vc, *vw);
  if (!tower.is_ok()) fail("CudaVisionTower", tower.status());
  vw = VisionWeights{};
  std::printf("  tower weights %.2f GB (bf16 matrices), generated and uploaded in %.1f s\n",
              double((*tower)->weight_bytes()) / 1e9, ms_since(tl) / 1e3);
  std::vector<float> patches(static_cast<size_t>(grid.patches() * vc.patch_values()));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : patches) v = nd(rng);
  const std::vector<CudaVisionImage> images = {{patches, grid}};
  std::vector<double> tower_ms;
  for (int i = 0; i < 4; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto out = (*tower)->encode(images);
    if (!out.is_ok()) fail("encode", out.status());
    if (i > 0) tower_ms.push_back(ms_since(t0));
  }
  std::sort(tower_ms.begin(), tower_ms.end());
  const double t_tower = tower_ms[1];
  const std::vector<VisionImageGrid> grids = {grid};
  const VisionFlops fl = vision_tower_flops(vc, grids);
  const double tflops = fl.total() / (t_tower * 1e-3) / 1e12;
  std::printf("  tower + projector: %.2f ms, %.1f GFLOP (linears %.1f, attention %.1f), "
              "%.1f TFLOP/s = %.1f %% of the bf16 peak %.0f TFLOP/s\n",
              t_tower, fl.total() / 1e9, fl.linear / 1e9, fl.attention / 1e9, tflops,
              100.0 * tflops * 1e12 / kPeak, kPeak / 1e12);
  tower->reset();

  // 2. The text prefill of the image + text tokens.
  const int64_t tokens = image_tokens + text_tokens;
  auto m3 = load_text(3, false);
  const double t3 = prefill_ms(m3.get(), tokens);
  m3.reset();
  int64_t big = 0;
  double tbig = 0;
  for (int64_t l : {24, 16, 12, 8}) {
    auto m = load_text(l, true);
    if (m == nullptr) continue;
    big = l;
    tbig = prefill_ms(m.get(), tokens);
    break;
  }
  if (big == 0) {
    std::fprintf(stderr, "no model of 8 or more layers loaded: no 60-layer extrapolation\n");
    return 1;
  }
  const double t60 = t3 + 57.0 * (tbig - t3) / double(big - 3);
  std::printf("  prefill of %lld tokens: 3 layers %.2f ms, %lld layers %.2f ms -> 60 layers "
              "%.2f ms (extrapolated: t3 + 57 (t%lld - t3) / %lld)\n",
              (long long)tokens, t3, (long long)big, tbig, t60, (long long)big,
              (long long)(big - 3));
  std::printf("  TTFT (tower + 60-layer prefill, pre-processing not included): %.2f ms\n",
              t_tower + t60);
  if (tsv) {
    std::fprintf(tsv, "vision_ttft\t%lld\t%lld\t%lld\t%lld\t%.3f\t%.2f\t%.2f\t%lld\t%.3f\t%.3f\t%.3f\n",
                 (long long)side, (long long)grid.patches(), (long long)tokens,
                 (long long)text_tokens, t_tower, tflops, 100.0 * tflops * 1e12 / kPeak,
                 (long long)big, tbig, t60, t_tower + t60);
    std::fclose(tsv);
  }
  return 0;
}
