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

}  // namespace m3
