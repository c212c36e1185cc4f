// The NVFP4 mma layout (quant/nvfp4_mma_layout.h): the packed word map is a bijection, the
// fragments give back every code, and the whole-matrix repack is a permutation of the codes that
// packed_code() inverts element by element, for both tilings; walking the storage lane by lane
// (the prefill dequantisation's order) visits every code of a row window exactly once.
#include "quant/nvfp4_mma_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <set>

namespace m3::nvfp4_mma {
namespace {

// Decodes code (h, j) of a word the way the GEMV does: fragment (j/2)·2 + h, half j % 2.
uint32_t code_at(uint32_t x, int h, int j) { return code_of(fragment(x, (j >> 1) * 2 + h), j & 1); }

TEST(Nvfp4MmaLayout, EveryCodeOfEverySlotRoundTrips) {
  const uint32_t* table = pack_table().data();
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    uint8_t nib[2][4];
    for (auto& row : nib)
      for (auto& v : row) v = static_cast<uint8_t>(rng() & 15);
    // Sweep one slot through all 16 codes, the others random.
    const int hs = trial % 2, js = (trial / 2) % 4;
    for (uint8_t v = 0; v < 16; ++v) {
      nib[hs][js] = v;
      const uint32_t x = pack_word(table, nib);
      for (int h = 0; h < 2; ++h)
        for (int j = 0; j < 4; ++j)
          ASSERT_EQ(code_at(x, h, j), nib[h][j]) << "slot " << h << "," << j << " trial " << trial;
    }
  }
}

TEST(Nvfp4MmaLayout, WordMapIsABijection) {
  // 2^32 words map to 2^32 code sets iff no nonzero word decodes to all-zero fragments; the map is
  // linear, so checking that the 32 basis words decode to independent vectors suffices: pack
  // their decodes back and get the basis again.
  const uint32_t* table = pack_table().data();
  for (int e = 0; e < 32; ++e) {
    const uint32_t x = 1u << e;
    uint8_t nib[2][4];
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < 4; ++j) nib[h][j] = static_cast<uint8_t>(code_at(x, h, j));
    EXPECT_EQ(pack_word(table, nib), x) << "basis word " << e;
  }
  // The fragments only ever set the f16 bits of T: the rest of each register is zero.
  std::mt19937 rng(3);
  for (int i = 0; i < 1000; ++i) {
    const uint32_t x = rng();
    for (int f = 0; f < 4; ++f) EXPECT_EQ(fragment(x, f) & ~kT, 0u);
  }
}

// The bf16 fragments hold the same codes as the f16 ones, times 2^-126, and nothing else.
TEST(Nvfp4MmaLayout, Bf16FragmentsAreTheCodesTimesTwoToMinus126) {
  constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float two_m126 = std::ldexp(1.0f, -126);
  auto bf16_to_float = [](uint32_t bits16) {
    const uint32_t b = bits16 << 16;
    float v;
    std::memcpy(&v, &b, sizeof v);
    return v;
  };
  std::mt19937 rng(5);
  for (int i = 0; i < 20000; ++i) {
    const uint32_t x = i < 256 ? (i * 0x01010101u) : rng();
    for (int f = 0; f < 4; ++f) {
      const uint32_t b = fragment_bf16(x, f);
      for (int half = 0; half < 2; ++half) {
        const uint32_t code = code_of(fragment(x, f), half);
        const float want = (code & 8 ? -1.0f : 1.0f) * kMag[code & 7] * two_m126;
        const float got = bf16_to_float((b >> (16 * half)) & 0xFFFF);
        ASSERT_EQ(got, want) << "word " << x << " fragment " << f << " half " << half;
        ASSERT_EQ(std::signbit(got), (code & 8) != 0) << "the sign of a zero code is kept";
      }
    }
  }
}

TEST(Nvfp4MmaLayout, MatrixRepackIsInvertedByPackedCode) {
  std::mt19937 rng(11);
  struct Shape {
    int64_t groups, n, k;
    Tiling tiling;
  };
  for (const Shape s : {Shape{1, 16, 128, Tiling::kRows16}, Shape{2, 48, 384, Tiling::kRows16},
                        Shape{3, 32, 256, Tiling::kSwigluPairs},
                        Shape{1, 96, 640, Tiling::kSwigluPairs}}) {
    ASSERT_TRUE(fits(s.n, s.k, s.tiling));
    const int64_t bytes = s.n * s.k / 2;
    std::vector<uint8_t> src(static_cast<size_t>(s.groups * bytes));
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    const auto packed = pack_matrix(src.data(), s.groups, s.n, s.k, s.tiling);
    ASSERT_EQ(packed.size(), src.size());
    std::set<int64_t> words;
    for (int64_t g = 0; g < s.groups; ++g)
      for (int64_t r = 0; r < s.n; ++r)
        for (int64_t c = 0; c < s.k; ++c) {
          const uint8_t byte = src[static_cast<size_t>(g * bytes + r * (s.k / 2) + c / 2)];
          const uint32_t want = c % 2 ? byte >> 4 : byte & 15;
          ASSERT_EQ(packed_code(packed.data() + g * bytes, r, c, s.n, s.k, s.tiling), want)
              << "group " << g << " row " << r << " col " << c << " n " << s.n << " k " << s.k;
          if (g == 0) words.insert(locate(r, c, s.n, s.k, s.tiling).word);
        }
    EXPECT_EQ(static_cast<int64_t>(words.size()), bytes / 4) << "every word holds 8 codes";
  }
  EXPECT_FALSE(fits(16, 96, Tiling::kRows16));
  EXPECT_FALSE(fits(24, 128, Tiling::kRows16));
  EXPECT_FALSE(fits(24, 128, Tiling::kSwigluPairs));
}

// The storage-order walk of the prefill dequantisation (backend/cuda/prefill): for every tile of
// tiles_of_rows() and every chunk and lane, the lane's 8 words (word_offset) give tile rows g and
// g + 8 at its 32 columns (code_at). Over a window of rows it must produce each element of the
// window once, equal to the checkpoint-order code, and nothing outside it (the kernel skips rows
// outside the window).
TEST(Nvfp4MmaLayout, StorageOrderWalkVisitsEveryCodeOfARowWindowOnce) {
  std::mt19937 rng(12);
  struct Case {
    int64_t n, k;
    Tiling tiling;
    int64_t row0, rows;
  };
  for (const Case c : {Case{48, 256, Tiling::kRows16, 0, 48}, Case{48, 256, Tiling::kRows16, 8, 30},
                       Case{96, 384, Tiling::kSwigluPairs, 0, 96},
                       Case{96, 384, Tiling::kSwigluPairs, 8, 40},    // gate rows only
                       Case{96, 384, Tiling::kSwigluPairs, 40, 30},   // across the halves
                       Case{96, 384, Tiling::kSwigluPairs, 56, 40},   // up rows only
                       Case{96, 384, Tiling::kSwigluPairs, 3, 5}}) {
    SCOPED_TRACE("n " + std::to_string(c.n) + " window " + std::to_string(c.row0) + " + " +
                 std::to_string(c.rows) + (c.tiling == Tiling::kSwigluPairs ? " pairs" : ""));
    const int64_t bytes = c.n * c.k / 2, chunks = c.k / kChunkK;
    std::vector<uint8_t> src(static_cast<size_t>(bytes));
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    const auto packed = pack_matrix(src.data(), 1, c.n, c.k, c.tiling);
    std::vector<int> seen(static_cast<size_t>(c.n * c.k), 0);
    int64_t wrong = 0;
    const TileRange tr = tiles_of_rows(c.row0, c.rows, c.n, c.tiling);
    for (int64_t tau = tr.first; tau < tr.end; ++tau)
      for (int64_t ch = 0; ch < chunks; ++ch)
        for (int lane = 0; lane < 32; ++lane) {
          uint32_t words[8];  // k-steps 0..7
          for (int i = 0; i < 8; ++i)
            std::memcpy(&words[i], packed.data() + word_offset(tau, ch, lane, i, c.k), 4);
          const int g = lane >> 2, t = lane & 3;
          for (int h = 0; h < 2; ++h) {
            const int64_t row = tile_row(tau, 8 * h + g, c.n, c.tiling);
            if (row < c.row0 || row >= c.row0 + c.rows) continue;
            for (int i = 0; i < 8; ++i)
              for (int j = 0; j < 4; ++j) {
                const int64_t col = ch * kChunkK + 32 * t + 4 * i + j;
                const uint8_t byte = src[static_cast<size_t>(row * (c.k / 2) + col / 2)];
                const uint32_t want = col % 2 ? byte >> 4 : byte & 15;
                wrong += code_at(words[i], h, j) != want;
                ++seen[static_cast<size_t>(row * c.k + col)];
              }
          }
        }
    EXPECT_EQ(wrong, 0);
    int64_t bad = 0;
    for (int64_t r = 0; r < c.n; ++r)
      for (int64_t col = 0; col < c.k; ++col)
        bad += seen[static_cast<size_t>(r * c.k + col)] !=
               (r >= c.row0 && r < c.row0 + c.rows ? 1 : 0);
    EXPECT_EQ(bad, 0) << "elements visited other than once in the window, or outside it";
  }
}

// k_order_position is the order in which the layout's k-steps consume a chunk's columns: element
// (row, col) sits in k-step i = (col % 32) / 4 of lane 4g + t, fragment f, half `half`, i.e. at
// mma.m16n8k16's A register f / 2 of logical k 2t + half (+ 8 for fragments 2 and 3), position
// 16i + that k in the chunk; a bijection of 0..127 keeping column pairs (2m, 2m + 1) adjacent.
TEST(Nvfp4MmaLayout, KOrderPositionIsTheKStepOrder) {
  std::vector<int> seen(128, 0);
  for (int p = 0; p < 128; ++p) {
    const Loc l = locate(/*row=*/3, /*col=*/p, /*n=*/16, /*k=*/128, Tiling::kRows16);
    const int t = p / 32, i = (p % 32) / 4;
    const int logical_k = 2 * t + l.half + (l.frag >= 2 ? 8 : 0);
    EXPECT_EQ(k_order_position(p), 16 * i + logical_k) << "column " << p;
    if (p % 2 == 0) {
      EXPECT_EQ(k_order_position(p + 1), k_order_position(p) + 1) << p;
    }
    ++seen[static_cast<size_t>(k_order_position(p))];
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 128);
}

}  // namespace
}  // namespace m3::nvfp4_mma
