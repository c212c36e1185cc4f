// The launch arithmetic of the GPU sampler's kMultiCta kernel (backend/cuda/sampling/sample.h,
// host-only inline functions): CTAs per row, candidates per CTA and the workspace the model
// allocates once for its largest batch.
#include <gtest/gtest.h>

#include "backend/cuda/sampling/sample.h"

namespace m3::cuda {
namespace {

constexpr int64_t kVocab = 200064;

TEST(SampleMultiCtaPlan, SplitsAtTheRealVocab) {
  EXPECT_EQ(sample_multi_cta_splits(1, kVocab), 128);
  EXPECT_EQ(sample_multi_cta_splits(2, kVocab), 64);
  EXPECT_EQ(sample_multi_cta_splits(4, kVocab), 32);
  EXPECT_EQ(sample_multi_cta_splits(8, kVocab), 16);
  EXPECT_EQ(sample_multi_cta_splits(64, kVocab), 2);
  EXPECT_EQ(sample_multi_cta_splits(65, kVocab), 1);  // one CTA per row: kOneCtaPerRow
  EXPECT_EQ(sample_multi_cta_candidates(1, kVocab), kSampleMaxTopK);
}

TEST(SampleMultiCtaPlan, SmallVocabularies) {
  EXPECT_EQ(sample_multi_cta_splits(1, 1001), 1);
  EXPECT_EQ(sample_multi_cta_splits(1, 5000), 4);
  EXPECT_EQ(sample_multi_cta_candidates(1, 5000), kSampleMaxTopK);
  EXPECT_EQ(sample_multi_cta_splits(1, 2048), 2);
  EXPECT_EQ(sample_multi_cta_candidates(1, 2048), 1024);
  EXPECT_EQ(sample_multi_cta_splits(0, kVocab), 1);
}

// Every slice (v·s/S .. v·(s+1)/S) holds at least the candidates a CTA writes, the grid stays
// within kSampleTargetCtas, and the workspace sized for a largest batch covers every smaller one.
TEST(SampleMultiCtaPlan, InvariantsAndWorkspace) {
  for (int64_t v : {int64_t{1000}, int64_t{2048}, int64_t{5000}, int64_t{32000}, kVocab}) {
    const SampleMultiCtaSizes ws = sample_multi_cta_workspace(256, v);
    for (int64_t b = 1; b <= 256; ++b) {
      const int64_t s = sample_multi_cta_splits(b, v);
      if (s < 2) continue;
      EXPECT_LE(b * s, kSampleTargetCtas) << "B " << b << " V " << v;
      const int64_t c = sample_multi_cta_candidates(b, v);
      for (int64_t i = 0; i < s; ++i)
        ASSERT_GE(v * (i + 1) / s - v * i / s, c) << "B " << b << " V " << v << " slice " << i;
      EXPECT_LE(b * s * c, ws.candidates);
      EXPECT_LE(b * s, ws.slices);
    }
    EXPECT_EQ(ws.rows, 256);
  }
  EXPECT_EQ(sample_multi_cta_workspace(8, kVocab).candidates, 128 * kSampleMaxTopK);
}

}  // namespace
}  // namespace m3::cuda
