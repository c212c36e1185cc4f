// Dense split-context decode attention (the full_attention layers' decode kernel,
// attention/dense_decode.h) against double-precision attention over every key of each sequence,
// at the real shapes (64 query heads over 4 KV heads of 128, pages of 128, shuffled block tables),
// with the partial buffers' capacity at 1 split (one CTA walks up to 157 blocks with the online
// softmax), 3 and 64, and a padding row (block table -1) that must output zeros.
#include <algorithm>
#include <numeric>
#include <set>

#include "backend/cuda/attention/dense_decode.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace m3::cuda_test {
namespace {

// Bound on |gpu - cpu| for element i: the scores within delta (gamma_{D+2}·Σ|q||k|·scale), the
// softmax sum and weighted sum within gamma_{n+8}·Σp|v| as in sparse_decode_test (here n also
// counts the online softmax's two extra roundings per block: the rescale of the accumulator and
// of the running sum), both sides, plus the bf16 output rounding (2^-8).
double dense_bound(const AttentionRef& r, int64_t i, int64_t blocks) {
  const double f32b =
      2 * (2 * r.delta * r.dev[i] + gamma(double(r.keys) + 8 + 2 * double(blocks)) * r.pv[i]);
  return f32b + std::ldexp(std::abs(r.o[i]) + f32b, -8) + 1e-30;
}

TEST(DenseDecode, EveryBlockMatchesDoubleAttention) {
  const int64_t H = 64, Hkv = 4, D = 128, S = 128;
  // Query position = len - 1; the last row is padding (no page, position 0).
  const std::vector<int64_t> lens = {1, 129, 300, 2049, 9000, 20000, 0};
  const int64_t B = static_cast<int64_t>(lens.size());
  int64_t max_blocks = 0, pages = 1;  // page 0 unused
  for (int64_t l : lens)
    max_blocks = std::max(max_blocks, (l + S - 1) / S), pages += (l + S - 1) / S;
  std::vector<int32_t> perm(pages - 1);
  std::iota(perm.begin(), perm.end(), 1);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(80));
  std::vector<int32_t> tables(B * max_blocks, -1), pos(B, 0);
  int64_t next = 0;
  for (int64_t b = 0; b < B; ++b) {
    pos[b] = static_cast<int32_t>(std::max<int64_t>(lens[b] - 1, 0));
    for (int64_t j = 0; j < (lens[b] + S - 1) / S; ++j) tables[b * max_blocks + j] = perm[next++];
  }
  std::vector<float> kf, vf, qf;
  std::vector<uint16_t> kb, vb, qb;
  bf16_randn(pages * S * Hkv * D, 81, 1.0f, &kf, &kb);
  bf16_randn(pages * S * Hkv * D, 82, 1.0f, &vf, &vb);
  bf16_randn(B * H * D, 83, 1.0f, &qf, &qb);
  Dev<uint16_t> dk(kb), dv(vb), dq(qb);
  Dev<int32_t> dtab(tables), dpos(pos);
  const cuda::KvCacheView cv =
      cuda::bf16_kv_view(dk.ptr(), dv.ptr(), nullptr, pages, S, Hkv, D, 128);
  const float scale = 1.0f / std::sqrt(float(D));

  // The reference per (row, head): every key 0 .. pos of the row.
  std::vector<AttentionRef> refs(static_cast<size_t>(B * H));
  for (int64_t b = 0; b + 1 < B; ++b) {
    std::set<int64_t> blocks;
    for (int64_t j = 0; j <= pos[b] / S; ++j) blocks.insert(j);
    for (int64_t n = 0; n < H; ++n)
      refs[b * H + n] =
          attention_ref(qf.data() + (b * H + n) * D,
                        kv_rows(blocks, pos[b], tables.data() + b * max_blocks, S, Hkv, n / 16),
                        kf.data(), vf.data(), D, scale);
  }
  for (int64_t max_splits : {1, 3, 64}) {
    Dev<float> opart(std::vector<float>(B * H * max_splits * D)),
        ml(std::vector<float>(B * H * max_splits * 2));
    auto dout = Dev<uint16_t>::poisoned(B * H * D);
    cuda::DenseDecodeParams p;
    p.q = dq.ptr();
    p.cache = cv;
    p.positions = dpos.ptr();
    p.block_tables = dtab.ptr();
    p.batch = B;
    p.num_heads = H;
    p.max_blocks = max_blocks;
    p.max_splits = max_splits;
    p.scale = scale;
    p.pdl = max_splits == 3;  // as a programmatic dependent (same results)
    p.o_partial = opart.ptr();
    p.ml_partial = ml.ptr();
    p.out = dout.ptr();
    ASSERT_TRUE(cuda::launch_dense_decode(p, stream()).is_ok());
    const std::vector<uint16_t> gout = dout.host();
    const int64_t splits = cuda::dense_decode_splits(B, Hkv, max_blocks, max_splits);
    EXPECT_GE(splits, 1);
    EXPECT_LE(splits, max_splits);
    // The padding row: zeros.
    for (int64_t i = (B - 1) * H * D; i < B * H * D; ++i)
      ASSERT_EQ(gout[static_cast<size_t>(i)], 0) << "padding row, element " << i;
    const int64_t real = (B - 1) * H * D;
    std::vector<float> got(real), want(real);
    std::vector<double> bound(real);
    for (int64_t b = 0; b + 1 < B; ++b)
      for (int64_t n = 0; n < H; ++n) {
        const AttentionRef& r = refs[b * H + n];
        for (int64_t i = 0; i < D; ++i) {
          const size_t idx = (b * H + n) * D + i;
          got[idx] = bf16_to_f32(gout[idx]);
          want[idx] = static_cast<float>(r.o[i]);
          bound[idx] = dense_bound(r, i, pos[b] / S + 1);
        }
      }
    expect_close(got, want, bound,
                 "dense_decode max_splits " + std::to_string(max_splits) + " (" +
                     std::to_string(splits) + " used)");
    // The same launch again: the same bits (no state carried between launches).
    auto dout2 = Dev<uint16_t>::poisoned(B * H * D);
    p.out = dout2.ptr();
    ASSERT_TRUE(cuda::launch_dense_decode(p, stream()).is_ok());
    EXPECT_TRUE(dout2.host() == gout) << "max_splits " << max_splits << ": second launch differs";
  }
  // Refused: a config outside the kernel's shapes, named.
  cuda::DenseDecodeParams bad;
  bad.cache = cv;
  bad.batch = 1;
  bad.num_heads = 32;  // 8 per KV head
  bad.max_blocks = 1;
  const Status s = cuda::launch_dense_decode(bad, stream());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("dense_decode"), std::string::npos);
}

}  // namespace
}  // namespace m3::cuda_test
