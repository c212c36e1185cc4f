// WeightSource: how model code asks for weights, independent of file format and quantisation.
// A checkpoint (safetensors, single or sharded) implements it; tests implement it in memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace m3 {

// A dense float32 host tensor (row-major). Used by the CPU reference backend.
struct HostTensorF32 {
  std::vector<int64_t> shape;
  std::vector<float> data;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// How a weight is stored in the checkpoint (detected per tensor from its dtype and companions).
enum class WeightFormat {
  kF32,
  kBF16,
  kF16,
  kMxfp8,          // F8_E4M3 `weight` + U8 E8M0 `weight_scale_inv` [out, in/32]
  kNvfp4Compressed,  // `weight_packed` U8 + `weight_scale` F8_E4M3 [out,in/16] + `weight_global_scale` (divides)
  kNvfp4ModelOpt,    // `weight` U8 + `weight_scale` F8_E4M3 + `weight_scale_2` (multiplies)
};

const char* weight_format_name(WeightFormat f);

class WeightSource {
 public:
  virtual ~WeightSource() = default;

  // True when a logical weight exists. `name` is the logical name, e.g.
  // "language_model.model.layers.3.block_sparse_moe.experts.0.w1.weight"; quantised storage
  // (".weight_packed", ".weight_scale_inv", ...) is resolved behind it.
  virtual bool has(const std::string& name) const = 0;

  // The storage format of a logical weight.
  virtual Result<WeightFormat> format(const std::string& name) const = 0;

  // Load and dequantise a logical weight to float32, checking that its logical shape equals
  // `expected_shape`. Errors name the file and the tensor.
  virtual Result<HostTensorF32> load_f32(const std::string& name,
                                         const std::vector<int64_t>& expected_shape) const = 0;

  // All logical weight names, sorted.
  virtual std::vector<std::string> names() const = 0;
};

}  // namespace m3
