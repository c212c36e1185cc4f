// WeightSource::load_raw (stored bytes for the real-shape CUDA path) and check_real_shape_fit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "small_real_shape_config.h"
#include "loader/checkpoint.h"
#include "loader/safetensors_writer.h"
#include "model/minimax_m3/dummy_weights.h"
#include "model/minimax_m3/cuda/fit_check.h"
#include "model/minimax_m3/tensor_parallel.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"

namespace m3 {
namespace {

using minimax_m3::builtin_m3_flash_config;
using minimax_m3::check_real_shape_fit;
using minimax_m3::DummyWeightSource;

std::string temp_dir() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("m3_model_cuda_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::vector<float> ramp(int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = scale * float((i * 7919) % 97 - 48) / 48.0f;
  return v;
}

// Dequantises a RawWeight on the host (the formats' reference decoders).
std::vector<float> dequant(const RawWeight& r) {
  int64_t n = 1;
  for (int64_t d : r.shape) n *= d;
  const int64_t cols = r.shape.back(), rows = n / cols;
  std::vector<float> out(static_cast<size_t>(n));
  switch (r.format) {
    case WeightFormat::kF32:
      std::memcpy(out.data(), r.data, static_cast<size_t>(n) * 4);
      break;
    case WeightFormat::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, r.data + 2 * i, 2);
        out[size_t(i)] = bf16_to_f32(b);
      }
      break;
    case WeightFormat::kMxfp8:
      EXPECT_TRUE(dequantize_mxfp8(r.data, r.scale, rows, cols, out.data()).is_ok());
      break;
    case WeightFormat::kNvfp4Compressed:
    case WeightFormat::kNvfp4ModelOpt:
      EXPECT_TRUE(dequantize_nvfp4(r.data, r.scale, r.global_scale,
                                   r.format == WeightFormat::kNvfp4Compressed
                                       ? Nvfp4GlobalScale::kDivide
                                       : Nvfp4GlobalScale::kMultiply,
                                   rows, cols, out.data())
                      .is_ok());
      break;
    default:
      ADD_FAILURE() << "unexpected format";
  }
  return out;
}

MiniMaxM3Config small_config() { return small_real_shape_config(512); }

TEST(DummyLoadRaw, DequantisesToLoadF32InEveryFormat) {
  const MiniMaxM3Config c = small_config();
  DummyWeightSource src(c);
  struct Case {
    std::string name;
    std::vector<int64_t> shape;
    WeightFormat want;
  };
  const std::vector<Case> cases = {
      {"model.layers.0.self_attn.q_proj.weight", {4096, 1024}, WeightFormat::kMxfp8},
      {"model.layers.1.block_sparse_moe.experts.3.w1.weight",
       {1024, 1024},
       WeightFormat::kNvfp4Compressed},
      {"model.layers.1.block_sparse_moe.e_score_correction_bias", {8}, WeightFormat::kF32},
      {"model.layers.1.input_layernorm.weight", {1024}, WeightFormat::kBF16},
      {"model.embed_tokens.weight", {512, 1024}, WeightFormat::kBF16},
      // A quantised name whose in-dim is no block multiple is stored BF16 (as load_f32 rounds it).
      {"model.layers.0.self_attn.k_proj.weight", {256, 40}, WeightFormat::kBF16},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    Result<RawWeight> r = src.load_raw(k.name, k.shape);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->format, k.want);
    EXPECT_EQ(r->shape, k.shape);
    ASSERT_NE(r->data, nullptr);
    EXPECT_NE(r->keep_alive, nullptr);
    Result<HostTensorF32> f = src.load_f32(k.name, k.shape);
    ASSERT_TRUE(f.is_ok());
    const std::vector<float> d = dequant(*r);
    ASSERT_EQ(d.size(), f->data.size());
    EXPECT_EQ(std::memcmp(d.data(), f->data.data(), d.size() * 4), 0);  // bitwise
  }
  EXPECT_FALSE(src.load_raw("model.nope.weight", {1}).is_ok());
}

TEST(CheckpointLoadRaw, ZeroCopyBytesAndShapeCheck) {
  const std::string dir = temp_dir();
  SafetensorsWriter w;
  const std::string p = "model.layers.0.";
  const Mxfp8Tensor mx = *quantize_mxfp8(ramp(64 * 64, 3.0f).data(), 64, 64);
  w.add_u8(p + "self_attn.q_proj.weight", DType::kF8E4M3, {64, 64}, mx.codes);
  w.add_u8(p + "self_attn.q_proj.weight_scale_inv", DType::kU8, {64, 2}, mx.scales);
  const Nvfp4Tensor ct =
      *quantize_nvfp4(ramp(8 * 32, 2.0f).data(), 8, 32, Nvfp4GlobalScale::kDivide);
  const std::string e = p + "block_sparse_moe.experts.0.w1.";
  w.add_u8(e + "weight_packed", DType::kU8, {8, 16}, ct.packed);
  w.add_u8(e + "weight_scale", DType::kF8E4M3, {8, 2}, ct.scales);
  w.add(e + "weight_global_scale", DType::kF32, {1}, &ct.global_scale, 4);
  w.add_bf16(p + "input_layernorm.weight", {16}, ramp(16, 1.0f));
  ASSERT_TRUE(w.write(dir + "/model.safetensors").is_ok());
  Result<std::unique_ptr<Checkpoint>> ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();

  Result<RawWeight> q = (*ck)->load_raw(p + "self_attn.q_proj.weight", {64, 64});
  ASSERT_TRUE(q.is_ok()) << q.status().to_string();
  EXPECT_EQ(q->format, WeightFormat::kMxfp8);
  ASSERT_EQ(q->data_bytes, mx.codes.size());
  ASSERT_EQ(q->scale_bytes, mx.scales.size());
  EXPECT_EQ(std::memcmp(q->data, mx.codes.data(), mx.codes.size()), 0);
  EXPECT_EQ(std::memcmp(q->scale, mx.scales.data(), mx.scales.size()), 0);

  Result<RawWeight> x = (*ck)->load_raw(e + "weight", {8, 32});
  ASSERT_TRUE(x.is_ok()) << x.status().to_string();
  EXPECT_EQ(x->format, WeightFormat::kNvfp4Compressed);
  EXPECT_EQ(x->data_bytes, ct.packed.size());
  EXPECT_EQ(x->scale_bytes, ct.scales.size());
  EXPECT_EQ(x->global_scale, ct.global_scale);
  EXPECT_EQ(std::memcmp(x->data, ct.packed.data(), ct.packed.size()), 0);
  // Raw bytes decode to exactly what load_f32 returns.
  const std::vector<float> d = dequant(*x);
  const HostTensorF32 f = *(*ck)->load_f32(e + "weight", {8, 32});
  EXPECT_EQ(std::memcmp(d.data(), f.data.data(), d.size() * 4), 0);

  Result<RawWeight> n = (*ck)->load_raw(p + "input_layernorm.weight", {16});
  ASSERT_TRUE(n.is_ok());
  EXPECT_EQ(n->format, WeightFormat::kBF16);
  EXPECT_EQ(n->data_bytes, 32u);
  EXPECT_EQ(n->scale, nullptr);

  Result<RawWeight> bad = (*ck)->load_raw(p + "self_attn.q_proj.weight", {64, 32});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("q_proj.weight"), std::string::npos);
  EXPECT_FALSE((*ck)->load_raw("missing.weight", {1}).is_ok());
  std::filesystem::remove_all(dir);
}

TEST(WeightSourceLoadRaw, DefaultIsUnimplemented) {
  class F32Only final : public WeightSource {
   public:
    bool has(const std::string&) const override { return true; }
    Result<WeightFormat> format(const std::string&) const override { return WeightFormat::kF32; }
    Result<HostTensorF32> load_f32(const std::string&,
                                   const std::vector<int64_t>& s) const override {
      HostTensorF32 t;
      t.shape = s;
      return t;
    }
    std::vector<std::string> names() const override { return {}; }
  };
  F32Only src;
  Result<RawWeight> r = src.load_raw("x.weight", {2});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("x.weight"), std::string::npos);
}

void expect_no_fit(const MiniMaxM3Config& c, const std::string& field) {
  Status s = check_real_shape_fit(c);
  ASSERT_FALSE(s.is_ok()) << "expected " << field << " to be rejected";
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
}

TEST(RealShapeFit, AcceptsTheRealAndTheTestShapes) {
  EXPECT_TRUE(check_real_shape_fit(builtin_m3_flash_config(60)).is_ok());
  EXPECT_TRUE(check_real_shape_fit(minimax_m3::builtin_m3_config(60)).is_ok());
  EXPECT_TRUE(check_real_shape_fit(builtin_m3_flash_config(4)).is_ok());
  EXPECT_TRUE(check_real_shape_fit(small_config()).is_ok());
}

TEST(RealShapeFit, NamesTheFieldThatDoesNotFit) {
  MiniMaxM3Config c = small_config();
  c.head_dim = 64;
  expect_no_fit(c, "head_dim");
  c = small_config();
  c.num_attention_heads = 16;  // 8 per KV head
  expect_no_fit(c, "num_attention_heads");
  c = small_config();
  c.index_n_heads = 1;
  expect_no_fit(c, "index_n_heads");
  c = small_config();
  c.index_head_dim = 64;
  expect_no_fit(c, "index_head_dim");
  c = small_config();
  c.index_block_size = 64;
  expect_no_fit(c, "index_block_size");
  c = small_config();
  c.hidden_size = 1536;
  expect_no_fit(c, "hidden_size");
  c = small_config();
  c.intermediate_size = 1152;  // a multiple of 128, not of 256
  expect_no_fit(c, "intermediate_size");
  c = small_config();
  c.dense_intermediate_size = 3000;
  expect_no_fit(c, "dense_intermediate_size");
  c = small_config();
  c.num_experts_per_tok = 9;
  expect_no_fit(c, "num_experts_per_tok");
  c = small_config();
  c.rotary_dim = 130;
  expect_no_fit(c, "rotary_dim");
}

// MiniMax-M3's full_attention layers run dense attention on this path: accepted, and with them
// the indexer's fields are checked only where some layer is sparse. A full layer caches K and V
// but no index keys.
TEST(RealShapeFit, AcceptsFullAttentionLayers) {
  const MiniMaxM3Config m3 = minimax_m3::builtin_m3_config(60);
  ASSERT_EQ(m3.layer_types[0], AttentionKind::kFull);
  ASSERT_EQ(m3.layer_types[2], AttentionKind::kFull);
  ASSERT_EQ(m3.layer_types[3], AttentionKind::kSparse);
  MiniMaxM3Config c = small_config();
  c.layer_types[1] = AttentionKind::kFull;
  EXPECT_TRUE(check_real_shape_fit(c).is_ok());
  c.index_n_heads = 1;  // the sparse layers 0 and 2 still need one index head per KV head
  expect_no_fit(c, "index_n_heads");
  c.layer_types.assign(3, AttentionKind::kFull);  // no sparse layer: the indexer is never run
  EXPECT_TRUE(check_real_shape_fit(c).is_ok());
  c.head_dim = 64;  // the attention kernels' limits still apply
  expect_no_fit(c, "head_dim");
  // Per page: 128 tokens x (K + V: 2 x Hkv x D, + Dix on a sparse layer) x 2 bytes.
  const MiniMaxM3Config flash = builtin_m3_flash_config(60);
  const int64_t kv = 2 * 4 * 128, ix = 128;
  EXPECT_EQ(minimax_m3::real_shape_kv_bytes_per_page(flash), 128 * 60 * (kv + ix) * 2);
  EXPECT_EQ(minimax_m3::real_shape_kv_bytes_per_page(m3), 128 * (60 * kv + 57 * ix) * 2);
  // Quantised (--kv-cache-dtype): fp8 one byte per element and a float32 scale per page and head
  // (K and V: 4 heads, the index keys one); fp4 half a byte, an E4M3 scale per 16 elements and
  // the same page-head scales. Both add one layer's bf16 pages, the prefill kernels' staging.
  using minimax_m3::real_shape_kv_stage_bytes_per_page;
  const int64_t scales = (2 * 4 + 1) * 4;  // bytes of page-head scales per sparse layer
  EXPECT_EQ(minimax_m3::real_shape_kv_bytes_per_page(flash, KvCacheDtype::kFp8E4M3),
            60 * (128 * (kv + ix) + scales));
  EXPECT_EQ(minimax_m3::real_shape_kv_bytes_per_page(flash, KvCacheDtype::kFp4E2M1),
            60 * (128 * (kv + ix) / 2 + 128 * (kv + ix) / 16 + scales));
  EXPECT_EQ(minimax_m3::real_shape_kv_bytes_per_page(m3, KvCacheDtype::kFp8E4M3),
            128 * (60 * kv + 57 * ix) + 60 * 8 * 4 + 57 * 4);
  EXPECT_EQ(real_shape_kv_stage_bytes_per_page(flash, KvCacheDtype::kBF16), 0);
  EXPECT_EQ(real_shape_kv_stage_bytes_per_page(flash, KvCacheDtype::kFp8E4M3),
            128 * (kv + ix) * 2);
  // Per token with the staging share, M3.1-Flash on one GPU: bf16 138,240 bytes, fp8 71,441
  // (1.94x the tokens), fp4 41,201 (3.36x).
  auto per_token = [&](KvCacheDtype d) {
    return double(minimax_m3::real_shape_kv_pool_bytes_per_page(flash, d)) / 128.0;
  };
  EXPECT_DOUBLE_EQ(per_token(KvCacheDtype::kBF16), 138240.0);
  EXPECT_NEAR(per_token(KvCacheDtype::kFp8E4M3), 71441.0, 1.0);
  EXPECT_NEAR(per_token(KvCacheDtype::kFp4E2M1), 41201.0, 1.0);
  for (int tp : {2, 4})
    for (int r = 0; r < tp; ++r)
      EXPECT_TRUE(check_real_shape_fit(minimax_m3::rank_config(m3, r, tp)).is_ok())
          << "--tp " << tp << " rank " << r;
}

// The GPU ranks of --tp N run at rank_config's shapes, which must fit too: M3.1-Flash's 3072-wide
// experts and shared expert split into 1536 and 768 columns, and its 4 KV heads keep 16 query heads
// each up to --tp 4. At --tp 8 two ranks share a KV head with 8 query heads each, which the sparse
// attention kernels do not take.
TEST(RealShapeFit, TensorParallelRanksOfTheRealModel) {
  const MiniMaxM3Config flash = builtin_m3_flash_config(60);
  for (int tp : {2, 4})
    for (int r = 0; r < tp; ++r)
      EXPECT_TRUE(check_real_shape_fit(minimax_m3::rank_config(flash, r, tp)).is_ok())
          << "--tp " << tp << " rank " << r;
  EXPECT_EQ(minimax_m3::rank_config(flash, 1, 2).intermediate_size, 1536);
  expect_no_fit(minimax_m3::rank_config(flash, 0, 8), "num_attention_heads");
  // The small test config splits over 2 ranks (the GPU tensor-parallel test's layout).
  EXPECT_TRUE(check_real_shape_fit(minimax_m3::rank_config(small_config(), 1, 2)).is_ok());
}

}  // namespace
}  // namespace m3
