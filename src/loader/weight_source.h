// WeightSource: how model code asks for weights, independent of file format and quantisation.
// A checkpoint (safetensors, single or sharded) implements it; tests implement it in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
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

// Elements per block scale along a row: 32 (MXFP8), 16 (NVFP4), 1 (unquantised). A column window
// of a weight must start and end on a multiple of it.
int64_t weight_format_block(WeightFormat f);

// A window of a 2-D weight [out, in]: rows [row_begin, row_end) and columns [col_begin, col_end).
// What one tensor- or expert-parallel rank holds of a matrix: rows of a column-parallel linear
// (q/k/v, gate/up), columns of a row-parallel one (o_proj, down_proj).
struct WeightWindow {
  int64_t row_begin = 0, row_end = 0;
  int64_t col_begin = 0, col_end = 0;
  int64_t rows() const { return row_end - row_begin; }
  int64_t cols() const { return col_end - col_begin; }
  static WeightWindow all(int64_t rows, int64_t cols) { return {0, rows, 0, cols}; }
  static WeightWindow row_range(int64_t begin, int64_t end, int64_t cols) {
    return {begin, end, 0, cols};
  }
  static WeightWindow col_range(int64_t rows, int64_t begin, int64_t end) {
    return {0, rows, begin, end};
  }
};

// ok, or an invalid_argument naming `name` and the numbers, unless `shape` is 2-D, the window lies
// inside it, and (for block-quantised formats) its columns fall on the format's scale blocks.
Status check_weight_window(const std::string& name, WeightFormat format,
                           const std::vector<int64_t>& shape, const WeightWindow& window);

// The stored bytes of one logical weight in its checkpoint format, for backends that compute on
// the quantised formats directly (the CUDA real-shape path). The pointers need no alignment and
// stay valid while the WeightSource and `keep_alive` live.
struct RawWeight {
  WeightFormat format = WeightFormat::kF32;
  std::vector<int64_t> shape;      // logical shape
  const uint8_t* data = nullptr;   // F32 / BF16 / F16 elements | MXFP8 E4M3 codes [out, in]
                                   // | NVFP4 packed E2M1 [out, in/2] (low nibble first)
  size_t data_bytes = 0;
  const uint8_t* scale = nullptr;  // MXFP8 E8M0 [out, in/32] | NVFP4 E4M3 [out, in/16] | nullptr
  size_t scale_bytes = 0;
  float global_scale = 1.0f;       // NVFP4 as stored: kNvfp4Compressed divides, ModelOpt multiplies
  std::shared_ptr<const void> keep_alive;  // owns the bytes when the source made them
};

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

  // The window `w` of a 2-D logical weight whose shape must be `expected_shape`, dequantised to
  // float32 [w.rows(), w.cols()]; the values equal the same window of load_f32(name), bit for bit.
  // Column windows of MXFP8 / NVFP4 weights must fall on their scale blocks (check_weight_window).
  // This default reads the whole weight and keeps the window; sources that can read less override
  // it (Checkpoint reads only the window's bytes of the mapping, DummyWeightSource generates only
  // the window's values).
  virtual Result<HostTensorF32> load_f32_window(const std::string& name,
                                                const std::vector<int64_t>& expected_shape,
                                                const WeightWindow& w) const;

  // The stored bytes of a logical weight (see RawWeight), checking its logical shape. Sources
  // without raw access return unimplemented; callers then fall back to load_f32.
  virtual Result<RawWeight> load_raw(const std::string& name,
                                     const std::vector<int64_t>& expected_shape) const;

  // All logical weight names, sorted.
  virtual std::vector<std::string> names() const = 0;
};

}  // namespace m3
