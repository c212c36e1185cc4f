// The real-shape CUDA DSpark draft's host plan (model/minimax_m3/cuda/dspark_cuda_plan.h): the
// released draft's shapes and byte counts worked out by hand, the refusals naming their field,
// and the page bookkeeping the GPU draft reuses (DSparkContextCache without storage) against the
// storage-backed cache.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "model/minimax_m3/cuda/dspark_cuda_plan.h"
#include "model/minimax_m3/dspark/dspark_kv_cache.h"

namespace m3::minimax_m3 {
namespace {

using dspark::DSparkConfig;

DSparkConfig released() {
  DSparkConfig c;  // the released layout's defaults
  c.rope_theta = 5e6;
  c.rotary_dim = 64;
  return c;
}

TEST(DSparkCudaPlan, TheReleasedDraftByHand) {
  auto p = plan_dspark_cuda(released());
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(p->qkv_rows, 64 * 128 + 2 * 4 * 128);  // 9216
  EXPECT_EQ(p->feature_width, 5 * 6144);
  // ceil(4096 / 128) + 3 pages, each 5 layers x (K, V) x 128 positions x 512 values x 2 bytes.
  EXPECT_EQ(p->pages_per_sequence, 35);
  EXPECT_EQ(p->kv_bytes_per_page, 5 * 2 * 128 * 512 * 2);
  EXPECT_EQ(p->kv_bytes_per_sequence, 35 * 1310720);
  // Per layer (MXFP8: n·k + n·k/32): qkv 9216x6144, o 6144x8192, gate|up 24576x6144,
  // down 6144x12288; four bf16 norms. Then fc 6144x30720, two norms, two Markov tables 200064x256.
  const int64_t layer = (9216LL * 6144 + 9216LL * 192) + (6144LL * 8192 + 6144LL * 256) +
                        (24576LL * 6144 + 24576LL * 192) + (6144LL * 12288 + 6144LL * 384) +
                        2 * (2 * 6144 + 2 * 128);
  EXPECT_EQ(p->weight_bytes,
            5 * layer + 2 * 6144LL * 30720 + 2 * 2 * 6144 + 2 * 2 * 200064LL * 256);
  EXPECT_GT(p->propose_scratch_bytes, 7 * 200064LL * 4);  // at least the [B, V] logits
  EXPECT_EQ(p->append_scratch_bytes(0), 0);
  EXPECT_EQ(p->append_scratch_bytes(2) - p->append_scratch_bytes(1), p->append_scratch_bytes(1));
}

TEST(DSparkCudaPlan, RefusalsNameTheField) {
  struct Case {
    void (*edit)(DSparkConfig&);
    const char* field;
  };
  for (const Case& k : {Case{[](DSparkConfig& c) { c.use_gemma_norm = false; }, "use_gemma_norm"},
                        Case{[](DSparkConfig& c) { c.head_dim = 64; }, "head_dim"},
                        Case{[](DSparkConfig& c) { c.rotary_dim = 130; }, "rotary_dim"},
                        Case{[](DSparkConfig& c) { c.hidden_size = 6000; }, "hidden_size"},
                        Case{[](DSparkConfig& c) { c.intermediate_size = 1000; },
                             "dspark_ffn_hidden_size"},
                        Case{[](DSparkConfig& c) { c.sliding_window = 100000; },
                             "sliding_window"}}) {
    DSparkConfig c = released();
    k.edit(c);
    auto p = plan_dspark_cuda(c);
    ASSERT_FALSE(p.is_ok()) << k.field;
    EXPECT_EQ(p.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(p.status().message().find(k.field), std::string::npos) << p.status().message();
  }
  EXPECT_EQ(plan_dspark_cuda(released(), 0).status().code(), StatusCode::kInvalidArgument);
}

// The GPU draft keeps its pages' bookkeeping in a DSparkContextCache without storage: the same
// tables, releases and refusals as the storage-backed cache under the same appends.
TEST(DSparkCudaPlan, BookkeepingWithoutStorageFollowsTheCache) {
  DSparkConfig c = released();
  c.num_hidden_layers = 1;
  c.hidden_size = 64;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.sliding_window = 20;
  CpuBackend be(1);
  dspark::DSparkContextCache stored(&be, c, 8), bare(nullptr, c, 8);
  EXPECT_EQ(bare.capacity_pages(), stored.capacity_pages());
  EXPECT_EQ(dspark::DSparkContextCache(nullptr, released(), 128).capacity_pages(),
            plan_dspark_cuda(released())->pages_per_sequence);
  for (int64_t len : {3, 9, 30, 31, 60, 61, 100}) {
    ASSERT_TRUE(stored.prepare_append(len).is_ok());
    ASSERT_TRUE(bare.prepare_append(len).is_ok());
    stored.set_length(len);
    bare.set_length(len);
    EXPECT_EQ(bare.block_table(), stored.block_table()) << len;
    EXPECT_EQ(bare.pages_in_use(), stored.pages_in_use()) << len;
    EXPECT_LE(bare.pages_in_use(), bare.capacity_pages());
  }
  EXPECT_EQ(bare.truncate(98).code(), stored.truncate(98).code());
  EXPECT_EQ(bare.block_table(), stored.block_table());
  EXPECT_FALSE(bare.truncate(10).is_ok());  // its window was released
  EXPECT_THROW(bare.layer(0), InternalError);
}

}  // namespace
}  // namespace m3::minimax_m3
