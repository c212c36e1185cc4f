// Reading a window (a rank's rows or block-aligned columns) of a checkpoint weight: the values
// equal the same window of the whole dequantised weight bit for bit in every format (MXFP8, both
// NVFP4 layouts, BF16, F16, F32), only the window's bytes (codes, block scales, the NVFP4 global
// scale) are read, and columns off the scale blocks are refused with the tensor and the numbers.
#include <gtest/gtest.h>

#include <cstring>

#include "loader/checkpoint.h"
#include "loader/safetensors_writer.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"
#include "test_util.h"

namespace m3 {
namespace {

using testing_util::contains;
using testing_util::make_temp_dir;

const std::string kMx = "model.layers.0.self_attn.q_proj.weight";         // MXFP8 [8, 128]
const std::string kCt = "model.layers.0.mlp.experts.0.w1.weight";         // NVFP4 CT [6, 64]
const std::string kMo = "model.layers.0.mlp.experts.1.w2.weight";         // NVFP4 MO [4, 64]
const std::string kBf = "model.layers.0.self_attn.o_proj.weight";         // BF16 [5, 48]
const std::string kF16 = "model.layers.0.self_attn.k_proj.weight";        // F16 [3, 10]
const std::string kF32 = "model.layers.0.self_attn.v_proj.weight";        // F32 [4, 6]
const std::string kBad = "model.layers.0.self_attn.index_q_proj.weight";  // MXFP8, row 7 NaN

std::vector<float> values(int64_t n, float scale, int salt) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = scale * float(((i + salt) * 7919) % 193 - 96) / 96.0f;
  return v;
}

std::string make_checkpoint() {
  const std::string dir = make_temp_dir();
  SafetensorsWriter w;
  Mxfp8Tensor mx = *quantize_mxfp8(values(8 * 128, 2.0f, 1).data(), 8, 128);
  w.add_u8(kMx, DType::kF8E4M3, {8, 128}, mx.codes);
  w.add_u8(kMx + "_scale_inv", DType::kU8, {8, 4}, mx.scales);
  Nvfp4Tensor ct =
      *quantize_nvfp4(values(6 * 64, 1.5f, 2).data(), 6, 64, Nvfp4GlobalScale::kDivide);
  const std::string ctp = kCt.substr(0, kCt.size() - std::string(".weight").size());
  w.add_u8(ctp + ".weight_packed", DType::kU8, {6, 32}, ct.packed);
  w.add_u8(ctp + ".weight_scale", DType::kF8E4M3, {6, 4}, ct.scales);
  w.add_f32(ctp + ".weight_global_scale", {1}, {ct.global_scale});
  Nvfp4Tensor mo =
      *quantize_nvfp4(values(4 * 64, 0.5f, 3).data(), 4, 64, Nvfp4GlobalScale::kMultiply);
  w.add_u8(kMo, DType::kU8, {4, 32}, mo.packed);
  w.add_u8(kMo + "_scale", DType::kF8E4M3, {4, 4}, mo.scales);
  w.add_f32(kMo + "_scale_2", {1}, {mo.global_scale});
  w.add_bf16(kBf, {5, 48}, values(5 * 48, 1.0f, 4));
  w.add_f16(kF16, {3, 10}, values(3 * 10, 1.0f, 5));
  w.add_f32(kF32, {4, 6}, values(4 * 6, 1.0f, 6));
  // A weight whose last row has the E8M0 NaN scale: only a read of that row can fail.
  Mxfp8Tensor bad = *quantize_mxfp8(values(8 * 64, 1.0f, 7).data(), 8, 64);
  bad.scales[7 * 2] = 0xFF;
  w.add_u8(kBad, DType::kF8E4M3, {8, 64}, bad.codes);
  w.add_u8(kBad + "_scale_inv", DType::kU8, {8, 2}, bad.scales);
  EXPECT_TRUE(w.write(dir + "/model.safetensors").is_ok());
  return dir;
}

// The window of a whole [rows, cols] tensor.
std::vector<float> cut(const HostTensorF32& t, const WeightWindow& w) {
  std::vector<float> out;
  for (int64_t r = w.row_begin; r < w.row_end; ++r)
    for (int64_t c = w.col_begin; c < w.col_end; ++c)
      out.push_back(t.data[size_t(r * t.shape[1] + c)]);
  return out;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  // Empty windows have no data pointer: memcmp must not see it (UBSan).
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST(LoaderWeightWindow, EqualsTheWindowOfTheWholeTensorBitwise) {
  std::unique_ptr<Checkpoint> ck = Checkpoint::open(make_checkpoint()).value();
  struct Case {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<WeightWindow> windows;
  };
  const std::vector<Case> cases = {
      {kMx, {8, 128}, {{0, 8, 0, 128}, {2, 5, 0, 128}, {0, 8, 32, 96}, {3, 7, 64, 128}}},
      {kCt, {6, 64}, {{0, 3, 0, 64}, {3, 6, 0, 64}, {0, 6, 16, 48}, {1, 2, 48, 64}}},
      {kMo, {4, 64}, {{1, 3, 0, 64}, {0, 4, 32, 64}, {2, 4, 16, 32}}},
      {kBf, {5, 48}, {{1, 4, 0, 48}, {0, 5, 7, 30}}},
      {kF16, {3, 10}, {{1, 2, 0, 10}, {0, 3, 3, 9}}},
      {kF32, {4, 6}, {{2, 4, 0, 6}, {0, 4, 1, 5}}},
  };
  for (const Case& c : cases) {
    Result<HostTensorF32> whole = ck->load_f32(c.name, c.shape);
    ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
    for (const WeightWindow& w : c.windows) {
      Result<HostTensorF32> got = ck->load_f32_window(c.name, c.shape, w);
      ASSERT_TRUE(got.is_ok()) << c.name << ": " << got.status().to_string();
      EXPECT_EQ(got->shape, (std::vector<int64_t>{w.rows(), w.cols()}));
      EXPECT_TRUE(bitwise_equal(got->data, cut(*whole, w)))
          << c.name << " rows [" << w.row_begin << ", " << w.row_end << ") cols [" << w.col_begin
          << ", " << w.col_end << ")";
    }
  }
}

TEST(LoaderWeightWindow, ReadsOnlyTheWindowsBytes) {
  std::unique_ptr<Checkpoint> ck = Checkpoint::open(make_checkpoint()).value();
  ReadCounter counter;
  ck->set_read_counter(&counter);
  // MXFP8 rows [2, 5), columns [32, 96): 3 x 64 codes and 3 x 2 E8M0 scales.
  ASSERT_TRUE(ck->load_f32_window(kMx, {8, 128}, {2, 5, 32, 96}).is_ok());
  // NVFP4 (compressed-tensors) rows [0, 6), columns [16, 48): 6 x 16 packed bytes, 6 x 2 E4M3
  // scales, and the 4-byte global scale.
  ASSERT_TRUE(ck->load_f32_window(kCt, {6, 64}, {0, 6, 16, 48}).is_ok());
  // BF16 rows [1, 4): 3 x 48 x 2 bytes.
  ASSERT_TRUE(ck->load_f32_window(kBf, {5, 48}, {1, 4, 0, 48}).is_ok());
  const std::string ctp = kCt.substr(0, kCt.size() - std::string(".weight").size());
  const std::map<std::string, uint64_t> want = {
      {kMx, 3 * 64},
      {kMx + "_scale_inv", 3 * 2},
      {ctp + ".weight_packed", 6 * 16},
      {ctp + ".weight_scale", 6 * 2},
      {ctp + ".weight_global_scale", 4},
      {kBf, 3 * 48 * 2},
  };
  EXPECT_EQ(counter.by_tensor(), want);
  // A whole read counts every stored byte.
  ReadCounter whole;
  ck->set_read_counter(&whole);
  ASSERT_TRUE(ck->load_f32(kMx, {8, 128}).is_ok());
  EXPECT_EQ(whole.total(), 8u * 128 + 8 * 4);
  ck->set_read_counter(nullptr);
}

TEST(LoaderWeightWindow, NeverDequantisesRowsOutsideTheWindow) {
  std::unique_ptr<Checkpoint> ck = Checkpoint::open(make_checkpoint()).value();
  // Row 7 holds the NaN scale: the whole tensor and any window with row 7 fail, the others load.
  EXPECT_EQ(ck->load_f32(kBad, {8, 64}).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(ck->load_f32_window(kBad, {8, 64}, {4, 8, 0, 64}).status().code(),
            StatusCode::kDataLoss);
  EXPECT_TRUE(ck->load_f32_window(kBad, {8, 64}, {0, 7, 0, 64}).is_ok());
  EXPECT_TRUE(ck->load_f32_window(kBad, {8, 64}, {7, 8, 32, 64}).is_ok());  // the NaN is block 0
}

TEST(LoaderWeightWindow, ColumnsOffTheScaleBlocksAreNamed) {
  std::unique_ptr<Checkpoint> ck = Checkpoint::open(make_checkpoint()).value();
  const Status mx = ck->load_f32_window(kMx, {8, 128}, {0, 8, 16, 80}).status();
  EXPECT_EQ(mx.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(mx.message(), kMx)) << mx.message();
  EXPECT_TRUE(contains(mx.message(), "[16, 80)")) << mx.message();
  EXPECT_TRUE(contains(mx.message(), "32-element")) << mx.message();
  const Status nv = ck->load_f32_window(kCt, {6, 64}, {0, 6, 0, 40}).status();
  EXPECT_EQ(nv.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(nv.message(), kCt)) << nv.message();
  EXPECT_TRUE(contains(nv.message(), "[0, 40)")) << nv.message();
  EXPECT_TRUE(contains(nv.message(), "16-element")) << nv.message();
  // Outside the weight, and a shape that is not the stored one.
  const Status out = ck->load_f32_window(kBf, {5, 48}, {3, 6, 0, 48}).status();
  EXPECT_TRUE(contains(out.message(), "rows [3, 6)")) << out.message();
  EXPECT_EQ(ck->load_f32_window(kBf, {5, 40}, {0, 5, 0, 40}).status().code(),
            StatusCode::kInvalidArgument);
}

// The quantised golden fixtures (tests/fixtures/golden/mxfp8_nvfp4_ct, nvfp4_modelopt): every
// 2-D MXFP8 / NVFP4 weight, cut into halves by rows and by whole scale blocks of columns, equals
// the same halves of its full dequantisation bit for bit, and the halves' bytes add up to the
// whole tensor's.
TEST(LoaderWeightWindow, QuantisedFixturesSliceLikeTheirDequantisation) {
  int checked = 0;
  for (const char* fixture : {"mxfp8_nvfp4_ct", "nvfp4_modelopt"}) {
    const std::string dir = std::string(M3_REPO_ROOT) + "/tests/fixtures/golden/" + fixture;
    Result<std::unique_ptr<Checkpoint>> opened = Checkpoint::open(dir);
    ASSERT_TRUE(opened.is_ok()) << opened.status().to_string();
    Checkpoint& ck = **opened;
    for (const std::string& name : ck.names()) {
      const StoredWeight sw = ck.stored(name).value();
      const int64_t block = weight_format_block(sw.format);
      if (block == 1 || sw.shape.size() != 2) continue;
      const int64_t rows = sw.shape[0], cols = sw.shape[1];
      const HostTensorF32 whole = ck.load_f32(name, sw.shape).value();
      const int64_t half_cols = (cols / block / 2) * block;
      const std::vector<WeightWindow> halves = {{0, rows / 2, 0, cols},
                                                {rows / 2, rows, 0, cols},
                                                {0, rows, 0, half_cols},
                                                {0, rows, half_cols, cols}};
      uint64_t row_bytes = 0, col_bytes = 0;
      for (size_t h = 0; h < halves.size(); ++h) {
        ReadCounter counter;
        ck.set_read_counter(&counter);
        Result<HostTensorF32> got = ck.load_f32_window(name, sw.shape, halves[h]);
        ck.set_read_counter(nullptr);
        ASSERT_TRUE(got.is_ok()) << got.status().to_string();
        EXPECT_TRUE(bitwise_equal(got->data, cut(whole, halves[h]))) << fixture << ": " << name;
        (h < 2 ? row_bytes : col_bytes) += counter.total() - sw.global_scale.nbytes;
      }
      EXPECT_EQ(row_bytes, sw.data.nbytes + sw.scale.nbytes) << name;
      EXPECT_EQ(col_bytes, sw.data.nbytes + sw.scale.nbytes) << name;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0) << "no quantised weight in the fixtures";
}

}  // namespace
}  // namespace m3
