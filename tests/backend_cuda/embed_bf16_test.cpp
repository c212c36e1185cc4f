// The decode's embedding lookup (backend/cuda/embed/embed_bf16.h): out[t] = float(table[id])
// bit for bit (a bf16 is the high half of its float), zeros for ids outside [0, vocab), on the
// vectorised path (dim % 8 == 0, aligned rows) and on the per-element one (odd width, or an
// output that is not 16-byte aligned); a tensor-parallel rank's slice of the vocabulary looks up
// only its ids, and the ranks' lookups sum to the whole table's.
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

// Three ranks' slices of a 37-id table (13, 12, 12 rows: vocab_slice's split): each rank's lookup
// is its rows bit for bit and zeros elsewhere, so exactly one rank writes each id in range.
TEST(EmbedBf16, RankSlicesLookUpTheirOwnIdsOnly) {
  const int64_t vocab = 37, dim = 64;
  const int64_t begins[3] = {0, 13, 25}, counts[3] = {13, 12, 12};
  std::mt19937 rng(7);
  std::vector<uint16_t> table(static_cast<size_t>(vocab * dim));
  for (uint16_t& x : table) x = static_cast<uint16_t>(rng() & 0x7F7F);  // finite
  const std::vector<int32_t> ids = {0, 12, 13, 24, 25, 36, 37, -1, 5};
  const int64_t t = static_cast<int64_t>(ids.size());
  Dev<int32_t> di(ids);
  std::vector<int> writers(static_cast<size_t>(t), 0);
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    std::vector<uint16_t> rows(table.begin() + begins[r] * dim,
                               table.begin() + (begins[r] + counts[r]) * dim);
    Dev<uint16_t> dt(rows);
    auto out = Dev<float>::poisoned(t * dim);
    cuda::EmbedBf16Params p{dt.ptr(), di.ptr(), out.ptr(), t, counts[r], dim};
    p.first_id = begins[r];
    ASSERT_TRUE(cuda::launch_embed_bf16(p, stream()).is_ok());
    const std::vector<float> got = out.host();
    int64_t bad = 0;
    for (int64_t i = 0; i < t; ++i) {
      const int32_t id = ids[static_cast<size_t>(i)];
      const bool mine = id >= begins[r] && id < begins[r] + counts[r];
      writers[static_cast<size_t>(i)] += mine;
      for (int64_t j = 0; j < dim; ++j) {
        const uint32_t want = mine ? uint32_t{table[static_cast<size_t>(id * dim + j)]} << 16 : 0u;
        uint32_t g;
        std::memcpy(&g, &got[static_cast<size_t>(i * dim + j)], 4);
        bad += g != want;
      }
    }
    EXPECT_EQ(bad, 0);
  }
  for (int64_t i = 0; i < t; ++i) {
    const int32_t id = ids[static_cast<size_t>(i)];
    EXPECT_EQ(writers[static_cast<size_t>(i)], id >= 0 && id < vocab ? 1 : 0) << "id " << id;
  }
}

TEST(EmbedBf16, RefusesBadShapes) {
  cuda::EmbedBf16Params p{nullptr, nullptr, nullptr, 1, 10, 8};
  EXPECT_EQ(cuda::launch_embed_bf16(p, stream()).code(), StatusCode::kInvalidArgument);
  std::vector<uint16_t> one(8);
  std::vector<int32_t> id = {0};
  Dev<uint16_t> dt(one);
  Dev<int32_t> di(id);
  auto out = Dev<float>::poisoned(8);
  cuda::EmbedBf16Params q{dt.ptr(), di.ptr(), out.ptr(), 1, 1, 8};
  q.first_id = -1;
  EXPECT_EQ(cuda::launch_embed_bf16(q, stream()).code(), StatusCode::kInvalidArgument);
  p.t = 0;
  EXPECT_TRUE(cuda::launch_embed_bf16(p, stream()).is_ok()) << "T = 0 launches nothing";
}

}  // namespace
}  // namespace m3::cuda_test
