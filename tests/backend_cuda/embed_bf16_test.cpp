// The decode's embedding lookup (backend/cuda/embed/embed_bf16.h): out[t] = float(table[id])
// bit for bit (a bf16 is the high half of its float), zeros for ids outside [0, vocab), on the
// vectorised path (dim % 8 == 0, aligned rows) and on the per-element one (odd width, or an
// output that is not 16-byte aligned).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "backend/cuda/embed/embed_bf16.h"

namespace m3::cuda_test {
namespace {

TEST(EmbedBf16, RowsBitExactAndZerosOutsideTheVocabulary) {
  const int64_t vocab = 37;
  int64_t cases = 0;
  for (const int64_t dim : {6144, 1000, 8, 13, 2056})
    for (const int64_t out_offset : {0, 1}) {  // 1 float: a misaligned output
      SCOPED_TRACE("dim " + std::to_string(dim) + " offset " + std::to_string(out_offset));
      std::mt19937 rng(static_cast<uint32_t>(dim + 100 * out_offset));
      std::vector<uint16_t> table(static_cast<size_t>(vocab * dim));
      for (uint16_t& x : table) x = static_cast<uint16_t>(rng());  // any bits, NaNs included
      const std::vector<int32_t> ids = {3, -1, static_cast<int32_t>(vocab - 1),
                                        static_cast<int32_t>(vocab), 0, 3};
      const int64_t t = static_cast<int64_t>(ids.size());
      Dev<uint16_t> dt(table);
      Dev<int32_t> di(ids);
      auto out = Dev<float>::poisoned(t * dim + out_offset);
      cuda::EmbedBf16Params p{dt.ptr(), di.ptr(), out.ptr() + out_offset, t, vocab, dim};
      ASSERT_TRUE(cuda::launch_embed_bf16(p, stream()).is_ok());
      const std::vector<float> got = out.host();
      int64_t bad = 0;
      for (int64_t r = 0; r < t; ++r)
        for (int64_t i = 0; i < dim; ++i) {
          const int32_t id = ids[static_cast<size_t>(r)];
          const uint32_t want =
              id < 0 || id >= vocab ? 0u : uint32_t{table[static_cast<size_t>(id * dim + i)]} << 16;
          uint32_t g;
          std::memcpy(&g, &got[static_cast<size_t>(out_offset + r * dim + i)], 4);
          bad += g != want;
        }
      EXPECT_EQ(bad, 0);
      ++cases;
    }
  std::printf("[ %-40s ] %lld cases bit exact\n", "embed_bf16", (long long)cases);
}

TEST(EmbedBf16, RefusesBadShapes) {
  cuda::EmbedBf16Params p{nullptr, nullptr, nullptr, 1, 10, 8};
  EXPECT_EQ(cuda::launch_embed_bf16(p, stream()).code(), StatusCode::kInvalidArgument);
  p.t = 0;
  EXPECT_TRUE(cuda::launch_embed_bf16(p, stream()).is_ok()) << "T = 0 launches nothing";
}

}  // namespace
}  // namespace m3::cuda_test
