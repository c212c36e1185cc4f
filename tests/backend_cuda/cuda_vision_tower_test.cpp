// CudaVisionTower (bf16 GEMMs, float32 accumulation) against the float32 CPU tower
// (vision_tower.h), the oracle: a small random config with several images of several sizes in
// one call, and one image through the real M3 shapes (32 layers, hidden 1280, projector 6144)
// with dummy weights.
//
// Error model. Every bf16 rounding (round to nearest, 8 significant bits) perturbs a value by a
// relative error of RMS u ≈ 2^-8 / sqrt(12) · E[1/m] (m the significand in [1, 2)) ≈ 1.6e-3.
// A GEMM whose inputs and weights are both rounded gets ≈ sqrt(2) u relative RMS error on its
// output (independent term errors, a sum whose size is that of its terms for these random,
// zero-mean weights). Along the tower's path there are R such rounding stages:
//   patches, patch weight                                               2
//   per layer: LN1 out, q|k|v weight, q/k/v bf16, probabilities, attention out, out_proj weight,
//              LN2 out, fc1 weight, GELU out, fc2 weight                 10 x layers
//   projector: tower out, linear_1 w, GELU out, linear_2 w, its out, merge_1 w, GELU out,
//              merge_2 w                                                 8
// Independent errors add in quadrature: relative RMS error ≈ u · sqrt(R). Later layers may
// amplify an early error; pre-LN blocks with residual connections keep that near 1, and the
// allowance A = 4 is a margin for it (not fitted to a run). So
//   ||gpu - cpu||_2 / ||cpu||_2 <= A · u · sqrt(R)
// (small config: R = 30, bound 3.5 %; real shapes: R = 330, bound 11.6 %), every element finite,
// and max |gpu - cpu| <= 8 · bound · rms(cpu) (no localised garbage: a wrong image, a NaN from the
// padding keys). The CPU's own float32 rounding is orders of magnitude below this. A wrong RoPE
// axis, head layout, key padding or merge order moves the result by O(100 %).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "model/minimax_m3/cuda/cuda_vision_tower.h"
#include "model/minimax_m3/dummy_vision_weights.h"
#include "model/minimax_m3/vision_tower.h"

namespace m3 {
namespace {

constexpr double kU = 1.6e-3, kAmplification = 4.0;

double bound(const VisionConfig& c) {
  const double stages = 2.0 + 10.0 * double(c.num_hidden_layers) + 8.0;
  return kAmplification * kU * std::sqrt(stages);
}

std::vector<float> random_patches(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);  // the normalised pixels' scale
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = d(rng);
  return v;
}

void compare(const std::vector<float>& gpu, const std::vector<float>& cpu, double tol,
             const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  double err2 = 0, ref2 = 0, max_err = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_TRUE(std::isfinite(gpu[i])) << what << " element " << i;
    const double e = double(gpu[i]) - double(cpu[i]);
    err2 += e * e;
    ref2 += double(cpu[i]) * cpu[i];
    max_err = std::max(max_err, std::fabs(e));
  }
  const double rel = std::sqrt(err2 / ref2), rms = std::sqrt(ref2 / double(cpu.size()));
  std::printf("%s: relative RMS error %.3e (bound %.3e), max abs error %.3e (bound %.3e), "
              "rms %.3e\n", what.c_str(), rel, tol, max_err, 8 * tol * rms, rms);
  EXPECT_GT(ref2, 0.0) << what;
  EXPECT_LE(rel, tol) << what;
  EXPECT_LE(max_err, 8 * tol * rms) << what;
}

void run(const VisionConfig& c, const WeightSource& src, const std::vector<VisionImageGrid>& grids) {
  auto w = load_vision_weights(src, c);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  auto gpu = CudaVisionTower::create(c, *w);
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
  CpuBackend cpu_backend(0);
  VisionTower cpu(c, std::move(w).value(), &cpu_backend);
  std::vector<std::vector<float>> patches;
  std::vector<CudaVisionImage> images;
  for (size_t i = 0; i < grids.size(); ++i) {
    patches.push_back(random_patches(grids[i].patches() * c.patch_values(), uint32_t(17 + i)));
  }
  for (size_t i = 0; i < grids.size(); ++i) images.push_back({patches[i], grids[i]});
  auto out = (*gpu)->encode(images);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  ASSERT_EQ(out->size(), grids.size());
  for (size_t i = 0; i < grids.size(); ++i) {
    auto ref = cpu.encode(patches[i], grids[i].t, grids[i].h, grids[i].w);
    ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
    const std::string what = "image " + std::to_string(i) + " grid (" +
                             std::to_string(grids[i].t) + ", " + std::to_string(grids[i].h) +
                             ", " + std::to_string(grids[i].w) + ")";
    compare((*out)[i], *ref, bound(c), what);
  }
}

TEST(CudaVisionTower, SmallConfigSeveralImagesMatchTheCpu) {
  VisionConfig c;
  c.hidden_size = 64;
  c.num_attention_heads = 4;  // head_dim 16: 12 rotated dims, 4 passing through
  c.num_hidden_layers = 2;
  c.intermediate_size = 128;
  c.patch_size = 4;  // 96 values per patch
  c.projector_hidden_size = 48;
  c.text_hidden_size = 40;
  // float32 weights (not bf16 values): the GPU's weight rounding is part of what is checked.
  minimax_m3::DummyVisionWeightSource src(c, 0.1f, /*bf16_values=*/false);
  // 4 patches (keys padded to 8), 24, 2 frames x 24, 80 (padded to 80), 36 (padded to 40).
  run(c, src, {{1, 2, 2}, {1, 4, 6}, {2, 6, 4}, {1, 10, 8}, {1, 6, 6}});
}

TEST(CudaVisionTower, RealShapesOneImageMatchesTheCpu) {
  const VisionConfig c;  // the M3 vision config's defaults
  minimax_m3::DummyVisionWeightSource src(c);
  run(c, src, {{1, 16, 20}});  // a 224 x 280 image: 320 patches, 80 image tokens
}

TEST(CudaVisionTower, RefusesPatchesOfTheWrongSize) {
  VisionConfig c;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.num_hidden_layers = 1;
  c.intermediate_size = 128;
  c.patch_size = 4;
  c.projector_hidden_size = 48;
  c.text_hidden_size = 40;
  minimax_m3::DummyVisionWeightSource src(c);
  auto w = load_vision_weights(src, c);
  ASSERT_TRUE(w.is_ok());
  auto gpu = CudaVisionTower::create(c, *w);
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
  std::vector<float> patches(static_cast<size_t>(4 * c.patch_values() - 1));
  const std::vector<CudaVisionImage> images = {{patches, {1, 2, 2}}};
  auto out = (*gpu)->encode(images);
  ASSERT_FALSE(out.is_ok());
  EXPECT_NE(out.status().to_string().find("patch values"), std::string::npos);
  const std::vector<CudaVisionImage> odd = {{patches, {1, 3, 2}}};
  EXPECT_FALSE((*gpu)->encode(odd).is_ok());
}

}  // namespace
}  // namespace m3
