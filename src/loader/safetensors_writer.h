// Writes .safetensors files and model.safetensors.index.json (test fixtures, tools).
// Output follows the format read by safetensors.h: tensors in insertion order, contiguous, the
// JSON header padded with spaces to a multiple of 8 bytes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace m3 {

class SafetensorsWriter {
 public:
  // Copies `nbytes` bytes; nbytes must equal product(shape) * dtype_size (M3_CHECK: a caller bug).
  void add(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
           const void* data, size_t nbytes);
  void add_f32(const std::string& name, const std::vector<int64_t>& shape,
               const std::vector<float>& values);
  // Rounds each value to bf16 (round-to-nearest-even) / f16.
  void add_bf16(const std::string& name, const std::vector<int64_t>& shape,
                const std::vector<float>& values);
  void add_f16(const std::string& name, const std::vector<int64_t>& shape,
               const std::vector<float>& values);
  void add_u8(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
              const std::vector<uint8_t>& bytes);
  void set_metadata(const std::string& key, const std::string& value);

  std::vector<std::string> names() const;
  // The complete file image.
  std::vector<uint8_t> to_bytes() const;
  Status write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes raw bytes to `path` (tests use it to write deliberately corrupted images).
Status write_file_bytes(const std::string& path, const std::vector<uint8_t>& bytes);

// Writes <dir>/model.safetensors.index.json with the given tensor -> shard file map.
Status write_safetensors_index(const std::string& dir,
                               const std::map<std::string, std::string>& weight_map,
                               uint64_t total_size = 0);

}  // namespace m3
