#include "kv/kv_budget.h"

#include <gtest/gtest.h>

namespace m3 {
namespace {

TEST(KvBudget, BytesPerTokenMatchesArchitectureDoc) {
  // m3-architecture.md §3.6: BF16 sparse layer 2048 B (K+V) + 256 B (index key) = 2304 B;
  // M3 = 3 dense x 2048 + 57 sparse x 2304 = 137472 B (~134 KiB) per token.
  KvLayout m3{.num_dense_layers = 3, .num_sparse_layers = 57, .num_kv_heads = 4,
              .head_dim = 128, .index_head_dim = 128, .kv_dtype_bytes = 2,
              .index_dtype_bytes = 2};
  EXPECT_EQ(kv_bytes_per_token(m3), 3 * 2048 + 57 * 2304);
  EXPECT_EQ(kv_bytes_per_page(m3, 128), 128LL * (3 * 2048 + 57 * 2304));
}

TEST(KvBudget, PagesForBudget) {
  EXPECT_EQ(*kv_pages_for_budget(1000, 100), 10);
  EXPECT_EQ(*kv_pages_for_budget(1099, 100), 10);
  auto r = kv_pages_for_budget(99, 100);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("99"), std::string::npos);
}

TEST(KvBudget, MemFractionStatic) {
  GpuKvBudget b{.device_total_bytes = 1000, .weight_bytes = 500, .reserve_bytes = 100,
                .mem_fraction_static = 0.9};
  EXPECT_EQ(*kv_pages_for_mem_fraction(b, 100), 3);  // 900 - 600 = 300
  b.mem_fraction_static = 0.6;                       // 600 - 600 = 0: error names the flag
  auto r = kv_pages_for_mem_fraction(b, 100);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("--mem-fraction-static"), std::string::npos);
  b.mem_fraction_static = 1.5;
  EXPECT_FALSE(kv_pages_for_mem_fraction(b, 100).is_ok());
}

}  // namespace
}  // namespace m3
