// --load-format dummy and --device selection on the CPU:
//  * every dummy tensor is exactly representable in its real storage format (quantising the
//    loaded float32 values again reproduces them bit for bit: MXFP8 and NVFP4 round-trip exactly
//    only on their own value sets; BF16 tensors equal their bf16 rounding);
//  * the tensor set is what the model asks for (the model loads and scores a prompt with finite
//    logits), and two loads are identical (values depend only on name and shape);
//  * the built-in M3.1-Flash config has the real shapes, every layer sparse, layers 0-2 dense;
//  * --num-layers truncates a config; --device cuda on a build without CUDA is a clear error.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "app/devices.h"
#include "core/dtype.h"
#include "model/minimax_m3/dummy_weights.h"
#include "../model/single_sequence.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"

namespace m3 {
namespace {

namespace fs = std::filesystem;
const std::string kTiny = (fs::path(M3_REPO_ROOT) / "models" / "m3-tiny").string();

TEST(DummyWeights, BuiltInConfigHasTheRealShapes) {
  MiniMaxM3Config c = minimax_m3::builtin_m3_flash_config(5);
  EXPECT_TRUE(c.validate().is_ok()) << c.validate().to_string();
  EXPECT_EQ(c.hidden_size, 6144);
  EXPECT_EQ(c.num_local_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 4);
  EXPECT_EQ(c.vocab_size, 200064);
  ASSERT_EQ(c.num_hidden_layers, 5);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(c.layer_types[i], AttentionKind::kSparse) << i;
    EXPECT_EQ(c.mlp_layer_types[i], i < 3 ? MlpKind::kDense : MlpKind::kMoe) << i;
  }
  minimax_m3::DummyWeightSource src(c);
  EXPECT_EQ(src.format("model.layers.4.block_sparse_moe.experts.127.w2.weight").value(),
            WeightFormat::kNvfp4Compressed);
  EXPECT_EQ(src.format("model.layers.0.self_attn.index_q_proj.weight").value(),
            WeightFormat::kMxfp8);
  EXPECT_EQ(src.format("model.layers.0.mlp.down_proj.weight").value(), WeightFormat::kMxfp8);
  EXPECT_EQ(src.format("model.layers.3.block_sparse_moe.shared_experts.up_proj.weight").value(),
            WeightFormat::kMxfp8);
  EXPECT_EQ(src.format("model.layers.3.block_sparse_moe.gate.weight").value(),
            WeightFormat::kBF16);
  EXPECT_EQ(src.format("lm_head.weight").value(), WeightFormat::kBF16);
  EXPECT_FALSE(src.has("model.layers.0.block_sparse_moe.gate.weight"));  // dense layer
  EXPECT_FALSE(src.format("model.layers.9.mlp.up_proj.weight").is_ok());
}

TEST(DummyWeights, ValuesAreExactInTheirFormats) {
  MiniMaxM3Config c = minimax_m3::builtin_m3_flash_config(4);
  minimax_m3::DummyWeightSource src(c);
  // Small shapes of the right kinds (the source generates any requested shape).
  {
    // The global scale is the stored one (fixed by the draw's bound, so that a rank's slice
    // quantises like the whole tensor); under it every value is an NVFP4 value.
    const std::string name = "model.layers.3.block_sparse_moe.experts.5.w1.weight";
    auto t = src.load_f32(name, {64, 256});
    ASSERT_TRUE(t.is_ok());
    auto raw = src.load_raw(name, {64, 256});
    ASSERT_TRUE(raw.is_ok());
    auto q = quantize_nvfp4_with_global_scale(t->data.data(), 64, 256, Nvfp4GlobalScale::kDivide,
                                              raw->global_scale);
    ASSERT_TRUE(q.is_ok());
    std::vector<float> back(t->data.size());
    ASSERT_TRUE(dequantize_nvfp4(q->packed.data(), q->scales.data(), q->global_scale,
                                 Nvfp4GlobalScale::kDivide, 64, 256, back.data())
                    .is_ok());
    int64_t diff = 0;
    for (size_t i = 0; i < back.size(); ++i) diff += back[i] != t->data[i];
    EXPECT_EQ(diff, 0) << "NVFP4 values do not round-trip";
  }
  {
    auto t = src.load_f32("model.layers.0.self_attn.q_proj.weight", {64, 256});
    ASSERT_TRUE(t.is_ok());
    auto q = quantize_mxfp8(t->data.data(), 64, 256);
    ASSERT_TRUE(q.is_ok());
    std::vector<float> back(t->data.size());
    ASSERT_TRUE(dequantize_mxfp8(q->codes.data(), q->scales.data(), 64, 256, back.data()).is_ok());
    int64_t diff = 0;
    for (size_t i = 0; i < back.size(); ++i) diff += back[i] != t->data[i];
    EXPECT_EQ(diff, 0) << "MXFP8 values do not round-trip";
    double var = 0;
    for (float x : t->data) var += double(x) * x;
    EXPECT_NEAR(std::sqrt(var / t->data.size()), 0.02, 0.004);  // N(0, 0.02²) before quantising
  }
  {
    auto t = src.load_f32("model.embed_tokens.weight", {32, 48});
    ASSERT_TRUE(t.is_ok());
    for (float x : t->data) ASSERT_EQ(x, bf16_to_f32(f32_to_bf16(x)));
    auto again = src.load_f32("model.embed_tokens.weight", {32, 48});
    EXPECT_TRUE(again->data == t->data) << "dummy values are not deterministic";
  }
}

TEST(DummyWeights, TinyConfigLoadsAndScores) {
  CpuBackend backend(2);
  auto loaded = minimax_m3::load_dummy_model(kTiny, 2, &backend);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->config.num_hidden_layers, 2);
  const auto& cfg = loaded->config;
  std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  minimax_m3::PagedKvCache cache(&backend, cfg, 2);
  testing::SimplePagePool pool(2);
  testing::SequenceRunner seq(loaded->model.get(), &cache, &pool);
  std::vector<float> logits;
  ASSERT_TRUE(seq.append(prompt, 0, true, &logits).is_ok());
  ASSERT_EQ(static_cast<int64_t>(logits.size()), 5 * cfg.vocab_size);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

TEST(DeviceFlag, CpuWorksCudaIsClearWithoutIt) {
  auto cpu = app::make_backend("cpu", 1);
  ASSERT_TRUE(cpu.is_ok());
  EXPECT_EQ((*cpu)->kind(), DeviceKind::kCpu);
  auto bad = app::make_backend("tpu", 1);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("cpu or cuda"), std::string::npos);
  auto cuda = app::make_backend("cuda", 1);
  // Compiled here without M3_HAVE_CUDA: the message says how to get it.
  ASSERT_FALSE(app::cuda_built_in());
  ASSERT_FALSE(cuda.is_ok());
  EXPECT_NE(cuda.status().message().find("not built with the CUDA backend"), std::string::npos)
      << cuda.status().message();
}

}  // namespace
}  // namespace m3
