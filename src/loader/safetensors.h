// Read-only, zero-copy access to .safetensors files (mmap).
//
// File layout: 8-byte little-endian header length N, N bytes of JSON header, then the data
// section. Header: {"<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]},
// ..., "__metadata__": {"k": "v"}}; offsets are relative to the data section.
// Everything is validated when the file is opened (see docs/formats/checkpoint.md); afterwards a
// TensorView points straight into the mapping. Views stay valid while the SafetensorsFile lives.
// Data pointers are NOT necessarily aligned to the element size: copy with memcpy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace m3 {

// One stored tensor, as it is in the file.
struct TensorView {
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // into the mapping; unaligned; nullptr only when nbytes == 0
  size_t nbytes = 0;
  std::string file;  // path of the file it lives in

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// "[64,16]" (used in error messages).
std::string shape_to_string(const std::vector<int64_t>& shape);

// A read-only memory mapping of a whole file.
class MappedFile {
 public:
  static Result<std::shared_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

class SafetensorsFile {
 public:
  // Maps and validates `path`. Errors (not_found, data_loss, invalid_argument) name the file and,
  // where there is one, the tensor.
  static Result<std::shared_ptr<SafetensorsFile>> open(const std::string& path);

  // Validates an in-memory image of a file (no copy: `bytes` must outlive the result). `path` is
  // only used in messages and TensorView::file.
  static Result<std::shared_ptr<SafetensorsFile>> parse(const uint8_t* bytes, size_t size,
                                                        const std::string& path);

  const std::string& path() const { return path_; }
  // Tensor names in header order.
  const std::vector<std::string>& names() const { return names_; }
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  // nullptr when absent.
  const TensorView* find(const std::string& name) const;
  // not_found naming the file and the tensor when absent.
  Result<TensorView> tensor(const std::string& name) const;
  // String entries of "__metadata__" (non-string values are skipped).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  Status parse_header(const uint8_t* bytes, size_t size);

  std::shared_ptr<MappedFile> mapping_;  // null for parse()
  std::string path_;
  std::vector<std::string> names_;
  std::vector<TensorView> views_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint's stored tensors across one or more files.
class TensorStore {
 public:
  // Opens a model directory:
  //  * model.safetensors.index.json: every shard named in "weight_map" (each must exist and hold
  //    the tensors mapped to it; tensors a shard holds but the map does not name are ignored);
  //  * else model.safetensors;
  //  * else every *.safetensors in the directory (a name in two files is an error).
  static Result<TensorStore> open_dir(const std::string& model_dir);
  // Opens explicit files (a name in two files is an error).
  static Result<TensorStore> open_files(const std::vector<std::string>& paths);

  // Sorted names of all stored tensors.
  std::vector<std::string> names() const;
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorView* find(const std::string& name) const;
  Result<TensorView> tensor(const std::string& name) const;
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  Status add_file(std::shared_ptr<SafetensorsFile> file);

  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorView> tensors_;
};

}  // namespace m3
