// The real-shape CUDA DSpark draft's host plan (model/minimax_m3/cuda/dspark_cuda_plan.h): the
// released draft's shapes and byte counts worked out by hand, the block attention's split layout,
// the refusals naming their field, and the page bookkeeping the GPU draft reuses
// (DSparkContextCache without storage) against the storage-backed cache.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/dspark/block_attention.h"
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

// The block attention's split layout (backend/cuda/dspark/block_attention.h), host code: the
// released shape fills about one wave of an H100/H200 with one sequence, and the layout (so each
// sequence's rounding) does not depend on the anchor or on how many sequences share a launch.
TEST(DSparkCudaPlan, BlockAttentionSplits) {
  cuda::DSparkBlockAttentionParams a;
  a.block = 7;
  a.num_heads = 64;
  a.num_kv_heads = 4;
  a.head_dim = 128;
  a.window = 4096;
  cuda::DSparkAttentionSplits s = cuda::dspark_attention_splits(a);
  EXPECT_EQ(s.rows, 7 * 16);
  EXPECT_EQ(s.chunks, 1);
  EXPECT_EQ(s.keys_per_split, 128);
  EXPECT_EQ(s.splits, 33);  // 4095 + 7 keys in 128-key splits
  EXPECT_EQ(s.partial_floats, 128 * 130);
  const int64_t one = cuda::dspark_block_attention_workspace_floats(a);
  EXPECT_EQ(one, 4 * 33 * 128 * 130);
  cuda::DSparkBlockAttentionParams moved = a;
  moved.anchor_pos = 123456;
  EXPECT_EQ(cuda::dspark_block_attention_workspace_floats(moved), one);
  cuda::DSparkBlockAttentionSeq seq;
  cuda::DSparkBlockAttentionParams batched = a;
  batched.seqs = &seq;
  batched.num_seqs = 16;
  EXPECT_EQ(cuda::dspark_attention_splits(batched).splits, s.splits);
  EXPECT_EQ(cuda::dspark_block_attention_workspace_floats(batched), 16 * one);
  // 32 query heads per KV head: 224 rows in two CTAs; head_dim 256: 64 rows per CTA.
  cuda::DSparkBlockAttentionParams wide = a;
  wide.num_kv_heads = 2;
  EXPECT_EQ(cuda::dspark_attention_splits(wide).chunks, 2);
  wide.head_dim = 256;
  EXPECT_EQ(cuda::dspark_attention_splits(wide).chunks, 4);
  EXPECT_EQ(cuda::dspark_attention_splits(wide).partial_floats, 64 * 258);
  // A short window: one tile per split.
  cuda::DSparkBlockAttentionParams small = a;
  small.window = 512;
  EXPECT_EQ(cuda::dspark_attention_splits(small).keys_per_split, 64);
  EXPECT_EQ(cuda::dspark_attention_splits(small).splits, 9);
  cuda::DSparkBlockAttentionParams bad = a;
  bad.num_kv_heads = 3;
  EXPECT_EQ(cuda::dspark_block_attention_workspace_floats(bad), 0);
  // The propose scratch counts the attention's partials.
  auto p = plan_dspark_cuda(released());
  ASSERT_TRUE(p.is_ok());
  EXPECT_GT(p->propose_scratch_bytes, 7 * 200064LL * 4 + 4 * one);
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
                        Case{[](DSparkConfig& c) { c.sliding_window = int64_t{1} << 29; },
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
