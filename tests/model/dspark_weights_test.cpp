// The DSpark draft's weights: the released checkpoint's 97 stored tensors, every accepted name
// prefix, errors that name the source and the tensor (in memory and in safetensors files), and
// the seeded dummy weights.
#include "model/minimax_m3/dspark/dspark_weights.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "dspark_reference.h"
#include "loader/checkpoint.h"
#include "loader/safetensors_writer.h"
#include "model/minimax_m3/dspark/dspark_dummy_weights.h"
#include "quant/mxfp8.h"

namespace m3 {
namespace {

using minimax_m3::dspark::DSparkConfig;
using minimax_m3::dspark::DummyDSparkWeightSource;
using minimax_m3::dspark::load_dspark_weights;

const std::string kPrefix = "language_model.model.dspark.";

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

std::vector<float> host(CpuBackend&, const DeviceBuffer<float>& b) {
  return std::vector<float>(b.data(), b.data() + b.size());
}

TEST(DSparkWeights, TheReleasedDraftHas97StoredTensors) {
  DSparkConfig c;  // the released shape (defaults)
  const auto names = minimax_m3::dspark::dspark_weight_names(c, kPrefix);
  int64_t mxfp8 = 0;
  for (const std::string& n : names) {
    EXPECT_EQ(n.rfind(kPrefix, 0), 0u) << n;
    mxfp8 += ends_with(n, "_proj.weight") ? 1 : 0;  // each with a weight_scale_inv
  }
  EXPECT_EQ(names.size(), 62u);
  EXPECT_EQ(mxfp8, 35);  // q, k, v, o, gate, up, down in 5 layers
  EXPECT_EQ(static_cast<int64_t>(names.size()) + mxfp8, 97);
  c.enable_confidence_head = false;
  EXPECT_EQ(minimax_m3::dspark::dspark_weight_names(c, kPrefix).size(), 60u);
}

TEST(DSparkWeights, AcceptsEveryPrefix) {
  const DSparkConfig c = testing::tiny_dspark_config();
  for (const std::string& prefix : minimax_m3::dspark::dspark_prefixes()) {
    CpuBackend backend(1);
    auto src = testing::random_dspark_weights(c, 3, prefix);
    auto w = load_dspark_weights(src, c, &backend, "draft");
    ASSERT_TRUE(w.is_ok()) << "'" << prefix << "': " << w.status().to_string();
    EXPECT_EQ(w->prefix, prefix);
    EXPECT_EQ(host(backend, w->fc), src.get(prefix + "fc.weight"));
    // gate rows, then up rows
    std::vector<float> w13 = src.get(prefix + "layers.1.decoder_layer.mlp.gate_proj.weight");
    const auto& up = src.get(prefix + "layers.1.decoder_layer.mlp.up_proj.weight");
    w13.insert(w13.end(), up.begin(), up.end());
    EXPECT_EQ(host(backend, w->layers[1].mlp_w13), w13);
    EXPECT_EQ(host(backend, w->markov_w2), src.get(prefix + "markov_head.markov_w2.weight"));
  }
}

TEST(DSparkWeights, ErrorsNameTheSourceAndTheTensor) {
  const DSparkConfig c = testing::tiny_dspark_config();
  CpuBackend backend(1);
  {
    testing::MemoryWeightSource empty;
    auto w = load_dspark_weights(empty, c, &backend, "/m/dspark");
    ASSERT_FALSE(w.is_ok());
    EXPECT_EQ(w.status().code(), StatusCode::kNotFound);
    for (const char* s : {"/m/dspark", "'language_model.model.dspark.fc.weight'",
                          "'model.dspark.fc.weight'", "'dspark.fc.weight'", "'fc.weight'"})
      EXPECT_NE(w.status().message().find(s), std::string::npos) << w.status().message();
  }
  {
    auto src = testing::random_dspark_weights(c, 3);
    const std::string gone = kPrefix + "layers.1.decoder_layer.mlp.down_proj.weight";
    src.tensors.erase(gone);
    auto w = load_dspark_weights(src, c, &backend, "/m/dspark");
    ASSERT_FALSE(w.is_ok());
    EXPECT_EQ(w.status().code(), StatusCode::kNotFound);
    EXPECT_NE(w.status().message().find("/m/dspark: missing tensor '" + gone + "'"),
              std::string::npos)
        << w.status().message();
  }
  {
    auto src = testing::random_dspark_weights(c, 3);
    const std::string bad = kPrefix + "markov_head.markov_w1.weight";
    src.tensors[bad].shape = {c.markov_rank, c.vocab_size};  // transposed
    auto w = load_dspark_weights(src, c, &backend, "/m/dspark");
    ASSERT_FALSE(w.is_ok());
    EXPECT_NE(w.status().message().find("tensor '" + bad + "'"), std::string::npos)
        << w.status().message();
  }
  {
    // The confidence head is needed only when enabled.
    auto src = testing::random_dspark_weights(c, 3);
    src.tensors.erase(kPrefix + "confidence_head.proj.bias");
    auto w = load_dspark_weights(src, c, &backend, "d");
    ASSERT_FALSE(w.is_ok());
    EXPECT_NE(w.status().message().find("confidence_head.proj.bias"), std::string::npos);
    DSparkConfig off = c;
    off.enable_confidence_head = false;
    EXPECT_TRUE(load_dspark_weights(src, off, &backend, "d").is_ok());
  }
}

// A draft in real files: MXFP8 linears (F8_E4M3 + U8 weight_scale_inv) and BF16 for the rest,
// as in the released dspark/ folder.
Status write_draft(const std::string& dir, const testing::MemoryWeightSource& src,
                   const std::string& wrong_shape = "") {
  std::filesystem::create_directories(dir);
  SafetensorsWriter w;
  for (const auto& [name, t] : src.tensors) {
    std::vector<int64_t> shape = t.shape;
    if (name == wrong_shape) std::swap(shape[0], shape[1]);
    if (ends_with(name, "_proj.weight")) {
      auto q = quantize_mxfp8(t.data.data(), shape[0], shape[1]);
      if (!q.is_ok()) return q.status();
      w.add_u8(name, DType::kF8E4M3, shape, q->codes);
      const std::string scale = name.substr(0, name.size() - 6) + "weight_scale_inv";
      w.add_u8(scale, DType::kU8, {shape[0], shape[1] / 32}, q->scales);
    } else {
      w.add_bf16(name, shape, t.data);
    }
  }
  return w.write(dir + "/model.safetensors");
}

TEST(DSparkWeights, LoadsTheCheckpointFormat) {
  const DSparkConfig c = testing::tiny_dspark_config();
  const auto src = testing::random_dspark_weights(c, 4);
  const std::string base =
      (std::filesystem::temp_directory_path() / ("m3_dspark_weights_" + std::to_string(getpid())))
          .string();
  ASSERT_TRUE(write_draft(base + "/good", src).is_ok());
  auto ckpt = Checkpoint::open(base + "/good");
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  EXPECT_EQ((*ckpt)->store().names().size(), src.tensors.size() + 2 * 7);  // + 14 scales
  CpuBackend backend(1);
  auto w = load_dspark_weights(**ckpt, c, &backend, base + "/good");
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  // BF16 tensors load rounded; MXFP8 ones as their dequantisation.
  const auto& fc = src.get(kPrefix + "fc.weight");
  const auto fc_loaded = host(backend, w->fc);
  for (size_t i = 0; i < fc.size(); ++i) ASSERT_EQ(fc_loaded[i], bf16_to_f32(f32_to_bf16(fc[i])));
  const auto& wq = src.get(kPrefix + "layers.0.decoder_layer.self_attn.q_proj.weight");
  const int64_t rows = c.num_attention_heads * c.head_dim, cols = c.hidden_size;
  auto q = quantize_mxfp8(wq.data(), rows, cols);
  ASSERT_TRUE(q.is_ok());
  std::vector<float> deq(wq.size());
  ASSERT_TRUE(dequantize_mxfp8(q->codes.data(), q->scales.data(), rows, cols, deq.data()).is_ok());
  EXPECT_EQ(host(backend, w->layers[0].wq), deq);

  const std::string bad = kPrefix + "layers.1.decoder_layer.mlp.down_proj.weight";
  ASSERT_TRUE(write_draft(base + "/bad", src, bad).is_ok());
  auto bad_ckpt = Checkpoint::open(base + "/bad");
  ASSERT_TRUE(bad_ckpt.is_ok()) << bad_ckpt.status().to_string();
  auto e = load_dspark_weights(**bad_ckpt, c, &backend, base + "/bad");
  ASSERT_FALSE(e.is_ok());
  for (const std::string& s : {base + "/bad", std::string("model.safetensors"), bad})
    EXPECT_NE(e.status().message().find(s), std::string::npos) << e.status().message();
  std::filesystem::remove_all(base);
}

TEST(DSparkWeights, DummyWeightsAreSeededAndInTheCheckpointFormats) {
  const DSparkConfig c = testing::tiny_dspark_config();
  DummyDSparkWeightSource a(c, 1), a2(c, 1), b(c, 2);
  EXPECT_EQ(a.names(), minimax_m3::dspark::dspark_weight_names(c, kPrefix));
  const std::string q = kPrefix + "layers.0.decoder_layer.self_attn.q_proj.weight";
  const std::string fc = kPrefix + "fc.weight";
  EXPECT_EQ(*a.format(q), WeightFormat::kMxfp8);
  EXPECT_EQ(*a.format(fc), WeightFormat::kBF16);
  EXPECT_FALSE(a.format("nope").is_ok());
  const std::vector<int64_t> qs = {c.num_attention_heads * c.head_dim, c.hidden_size};
  auto qa = a.load_f32(q, qs), qa2 = a2.load_f32(q, qs), qb = b.load_f32(q, qs);
  ASSERT_TRUE(qa.is_ok() && qa2.is_ok() && qb.is_ok());
  EXPECT_EQ(qa->data, qa2->data);
  EXPECT_NE(qa->data, qb->data);
  // MXFP8 values survive another quantisation round trip unchanged (they are representable).
  auto rq = quantize_mxfp8(qa->data.data(), qs[0], qs[1]);
  ASSERT_TRUE(rq.is_ok());
  std::vector<float> back(qa->data.size());
  ASSERT_TRUE(
      dequantize_mxfp8(rq->codes.data(), rq->scales.data(), qs[0], qs[1], back.data()).is_ok());
  EXPECT_EQ(back, qa->data);
  auto f = a.load_f32(fc, {c.hidden_size, c.feature_width()});
  ASSERT_TRUE(f.is_ok());
  double ss = 0;
  for (float x : f->data) {
    EXPECT_EQ(x, bf16_to_f32(f32_to_bf16(x)));
    ss += double(x) * x;
  }
  EXPECT_NEAR(std::sqrt(ss / f->data.size()), 0.02, 0.002);  // N(0, 0.02²)
  // The whole draft loads, at the tiny shape and under another prefix.
  CpuBackend backend(1);
  EXPECT_TRUE(load_dspark_weights(a, c, &backend, "dummy").is_ok());
  DummyDSparkWeightSource bare(c, 1, "");
  auto w = load_dspark_weights(bare, c, &backend, "dummy");
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_EQ(w->prefix, "");
}

}  // namespace
}  // namespace m3
