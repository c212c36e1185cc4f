#include "loader/raw_slice.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace m3 {

namespace {

// Bytes per element times 2 (NVFP4 is half a byte), for the data array of each format.
int64_t data_half_bytes(WeightFormat f) {
  switch (f) {
    case WeightFormat::kF32:
      return 8;
    case WeightFormat::kBF16:
    case WeightFormat::kF16:
      return 4;
    case WeightFormat::kMxfp8:
      return 2;
    case WeightFormat::kNvfp4Compressed:
    case WeightFormat::kNvfp4ModelOpt:
      return 1;
  }
  return 0;
}

}  // namespace

Result<RawWeight> slice_raw(const RawWeight& w, int64_t row_begin, int64_t row_end,
                            int64_t col_begin, int64_t col_end) {
  const std::string what = "[loader.slice_raw] ";
  if (w.shape.size() != 2)
    return invalid_argument(what + "needs a 2-D weight, got " + std::to_string(w.shape.size()) +
                            " dims");
  const int64_t rows = w.shape[0], cols = w.shape[1];
  if (row_begin < 0 || row_begin > row_end || row_end > rows || col_begin < 0 ||
      col_begin > col_end || col_end > cols)
    return invalid_argument(what + "rows [" + std::to_string(row_begin) + ", " +
                            std::to_string(row_end) + ") and columns [" +
                            std::to_string(col_begin) + ", " + std::to_string(col_end) +
                            ") outside the weight's [" + std::to_string(rows) + ", " +
                            std::to_string(cols) + "]");
  const int64_t block = weight_format_block(w.format);
  if (col_begin % block != 0 || col_end % block != 0)
    return invalid_argument(what + "columns [" + std::to_string(col_begin) + ", " +
                            std::to_string(col_end) + ") must fall on " + std::to_string(block) +
                            "-element scale blocks for " + weight_format_name(w.format));
  const int64_t hb = data_half_bytes(w.format);
  const int64_t out_rows = row_end - row_begin, out_cols = col_end - col_begin;
  const int64_t row_bytes = cols * hb / 2, out_row_bytes = out_cols * hb / 2;
  if (w.data == nullptr || w.data_bytes < static_cast<size_t>(rows * row_bytes))
    return invalid_argument(what + "data holds " + std::to_string(w.data_bytes) + " bytes, the " +
                            "shape needs " + std::to_string(rows * row_bytes));
  const bool scaled = block > 1;
  const int64_t scale_cols = scaled ? cols / block : 0, out_scale_cols = scaled ? out_cols / block : 0;
  if (scaled && (w.scale == nullptr || w.scale_bytes < static_cast<size_t>(rows * scale_cols)))
    return invalid_argument(what + "scales hold " + std::to_string(w.scale_bytes) +
                            " bytes, the shape needs " + std::to_string(rows * scale_cols));

  auto buf = std::make_shared<std::vector<uint8_t>>(
      static_cast<size_t>(out_rows * (out_row_bytes + out_scale_cols)));
  uint8_t* data = buf->data();
  uint8_t* scale = data + out_rows * out_row_bytes;
  for (int64_t r = 0; r < out_rows; ++r) {
    std::memcpy(data + r * out_row_bytes, w.data + (row_begin + r) * row_bytes + col_begin * hb / 2,
                static_cast<size_t>(out_row_bytes));
    if (scaled)
      std::memcpy(scale + r * out_scale_cols,
                  w.scale + (row_begin + r) * scale_cols + col_begin / block,
                  static_cast<size_t>(out_scale_cols));
  }
  RawWeight s;
  s.format = w.format;
  s.shape = {out_rows, out_cols};
  s.data = data;
  s.data_bytes = static_cast<size_t>(out_rows * out_row_bytes);
  s.scale = scaled ? scale : nullptr;
  s.scale_bytes = static_cast<size_t>(out_rows * out_scale_cols);
  s.global_scale = w.global_scale;
  s.keep_alive = buf;
  return s;
}

}  // namespace m3
