#include "loader/weight_source.h"

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

Result<RawWeight> WeightSource::load_raw(const std::string& name,
                                         const std::vector<int64_t>&) const {
  return unimplemented("[loader] this weight source has no raw (stored-format) access; '" + name +
                       "' can only be read as float32");
}

}  // namespace m3
