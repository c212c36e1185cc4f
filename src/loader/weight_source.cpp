#include "loader/weight_source.h"

#include <algorithm>

namespace m3 {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kF32: return "F32";
    case WeightFormat::kBF16: return "BF16";
    case WeightFormat::kF16: return "F16";
    case WeightFormat::kMxfp8: return "MXFP8";
    case WeightFormat::kNvfp4Compressed: return "NVFP4 (compressed-tensors)";
    case WeightFormat::kNvfp4ModelOpt: return "NVFP4 (ModelOpt)";
  }
  return "unknown";
}

int64_t weight_format_block(WeightFormat f) {
  switch (f) {
    case WeightFormat::kMxfp8: return 32;
    case WeightFormat::kNvfp4Compressed:
    case WeightFormat::kNvfp4ModelOpt: return 16;
    default: return 1;
  }
}

Status check_weight_window(const std::string& name, WeightFormat format,
                           const std::vector<int64_t>& shape, const WeightWindow& w) {
  const std::string what = "[loader] tensor '" + name + "': ";
  auto range = [](int64_t b, int64_t e) {
    return "[" + std::to_string(b) + ", " + std::to_string(e) + ")";
  };
  if (shape.size() != 2)
    return invalid_argument(what + "a row / column window needs a 2-D weight, the shape has " +
                            std::to_string(shape.size()) + " dims");
  if (w.row_begin < 0 || w.row_begin > w.row_end || w.row_end > shape[0] || w.col_begin < 0 ||
      w.col_begin > w.col_end || w.col_end > shape[1])
    return invalid_argument(what + "rows " + range(w.row_begin, w.row_end) + " and columns " +
                            range(w.col_begin, w.col_end) + " are not inside the weight's [" +
                            std::to_string(shape[0]) + ", " + std::to_string(shape[1]) + "]");
  const int64_t block = weight_format_block(format);
  if (w.col_begin % block != 0 || w.col_end % block != 0)
    return invalid_argument(what + "columns " + range(w.col_begin, w.col_end) + " of a " +
                            weight_format_name(format) + " weight [" + std::to_string(shape[0]) +
                            ", " + std::to_string(shape[1]) + "] must start and end on its " +
                            std::to_string(block) + "-element scale blocks");
  return Status::ok();
}

Result<HostTensorF32> WeightSource::load_f32_window(const std::string& name,
                                                    const std::vector<int64_t>& expected_shape,
                                                    const WeightWindow& w) const {
  M3_ASSIGN_OR_RETURN(WeightFormat f, format(name));
  M3_RETURN_IF_ERROR(check_weight_window(name, f, expected_shape, w));
  M3_ASSIGN_OR_RETURN(HostTensorF32 whole, load_f32(name, expected_shape));
  if (w.row_begin == 0 && w.row_end == expected_shape[0] && w.col_begin == 0 &&
      w.col_end == expected_shape[1])
    return whole;
  const int64_t cols = expected_shape[1];
  HostTensorF32 out;
  out.shape = {w.rows(), w.cols()};
  out.data.resize(static_cast<size_t>(w.rows() * w.cols()));
  for (int64_t r = 0; r < w.rows(); ++r)
    std::copy_n(whole.data.begin() + (w.row_begin + r) * cols + w.col_begin, w.cols(),
                out.data.begin() + r * w.cols());
  return out;
}

Result<RawWeight> WeightSource::load_raw(const std::string& name,
                                         const std::vector<int64_t>&) const {
  return unimplemented("[loader] this weight source has no raw (stored-format) access; '" + name +
                       "' can only be read as float32");
}

}  // namespace m3
