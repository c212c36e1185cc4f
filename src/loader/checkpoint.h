// Checkpoint: a model directory's safetensors (single or sharded) seen as logical weights.
//
// Each logical weight ("...q_proj.weight") is classified from its stored dtype and companions:
//   X.weight F8_E4M3 + X.weight_scale_inv U8 [..., in/32]                  -> kMxfp8
//   X.weight_packed U8 [..., in/2] + X.weight_scale F8_E4M3 [..., in/16]
//     + X.weight_global_scale F32 [1]                                      -> kNvfp4Compressed
//   X.weight U8 [..., in/2] + X.weight_scale F8_E4M3 [..., in/16]
//     + X.weight_scale_2 F32 (+ X.input_scale, ignored)                    -> kNvfp4ModelOpt
//   F32 / BF16 / F16                                                       -> kF32 / kBF16 / kF16
// The logical shape of NVFP4 is [..., 2 * packed_cols]. Scale shapes are checked when the
// checkpoint is opened; a weight that fails is still listed (has() is true) and format() /
// load_f32() return its error, which names the file and the tensor. check_all() reports them all.
// See docs/formats/checkpoint.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loader/safetensors.h"
#include "loader/weight_source.h"

namespace m3 {

// The stored tensors behind one logical weight (zero-copy views, for the GPU backend).
struct StoredWeight {
  std::string name;             // logical name
  WeightFormat format = WeightFormat::kF32;
  std::vector<int64_t> shape;   // logical shape
  std::string data_name;        // "X.weight" or "X.weight_packed"
  TensorView data;
  std::string scale_name;       // MXFP8 "X.weight_scale_inv", NVFP4 "X.weight_scale"; else ""
  TensorView scale;
  std::string global_scale_name;  // "X.weight_global_scale" / "X.weight_scale_2"; else ""
  TensorView global_scale;
};

// The checkpoint bytes that loads read, per stored tensor ("X.weight", "X.weight_scale_inv", ...):
// what one rank's load costs. A whole load counts the tensor's stored bytes, a window
// (load_f32_window) only the window's codes and block scales (plus the 4-byte NVFP4 global
// scale); load_raw counts the whole tensor, whose bytes it hands out. Thread-safe.
class ReadCounter {
 public:
  void add(const std::string& stored_name, uint64_t bytes);
  uint64_t total() const;
  std::map<std::string, uint64_t> by_tensor() const;

  // While a Scope lives, every Checkpoint's reads on this thread are also counted into its
  // counter (the innermost scope's). Loaders that take a `const WeightSource&` shared by several
  // ranks (TensorParallelCpuRunner) count each rank's reads this way: a counter set on the shared
  // checkpoint (set_read_counter) could not tell the ranks apart.
  class Scope {
   public:
    explicit Scope(ReadCounter* counter);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    ReadCounter* previous_;
  };
  // The innermost live Scope's counter on this thread, or nullptr.
  static ReadCounter* current();

 private:
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> bytes_;
};

class Checkpoint : public WeightSource {
 public:
  // Opens <model_dir> (see TensorStore::open_dir) and classifies every weight. Fails only when the
  // files themselves are unreadable or corrupt.
  static Result<std::unique_ptr<Checkpoint>> open(const std::string& model_dir);
  static Result<std::unique_ptr<Checkpoint>> from_store(TensorStore store);

  // WeightSource
  bool has(const std::string& name) const override;
  Result<WeightFormat> format(const std::string& name) const override;
  Result<HostTensorF32> load_f32(const std::string& name,
                                 const std::vector<int64_t>& expected_shape) const override;
  // Reads only rows [w.row_begin, w.row_end) of the mapping, and of each only the bytes of columns
  // [w.col_begin, w.col_end) with their block scales (rows are contiguous in row-major storage,
  // so a row window is one contiguous range of codes and one of scales).
  Result<HostTensorF32> load_f32_window(const std::string& name,
                                        const std::vector<int64_t>& expected_shape,
                                        const WeightWindow& w) const override;
  std::vector<std::string> names() const override;
  // Zero-copy: the pointers go into the file mappings.
  Result<RawWeight> load_raw(const std::string& name,
                             const std::vector<int64_t>& expected_shape) const override;

  // Logical shape (no data read).
  Result<std::vector<int64_t>> shape(const std::string& name) const;
  // Dequantises without a shape check.
  Result<HostTensorF32> load_f32_any(const std::string& name) const;
  // The stored tensors behind a logical weight.
  Result<StoredWeight> stored(const std::string& name) const;
  // The same, and an invalid_argument naming the file and tensor unless the logical shape is
  // `expected`.
  Result<StoredWeight> stored_with_shape(const std::string& name,
                                         const std::vector<int64_t>& expected) const;
  // ok, or one invalid_argument listing every weight that failed classification and every
  // companion tensor (scale) that belongs to no weight.
  Status check_all() const;

  // Counts every later read into `counter` (nullptr: stop counting); not owned.
  void set_read_counter(ReadCounter* counter) { counter_ = counter; }

  // Raw access to every stored tensor, by stored name.
  const TensorStore& store() const { return store_; }
  Result<TensorView> raw(const std::string& stored_name) const { return store_.tensor(stored_name); }

 private:
  struct Entry {
    StoredWeight weight;
    Status error;  // non-ok when the stored tensors are inconsistent
  };
  explicit Checkpoint(TensorStore store) : store_(std::move(store)) {}
  void classify();
  const Entry* entry(const std::string& name) const;
  void count(const std::string& stored_name, uint64_t bytes) const {
    if (stored_name.empty()) return;
    if (counter_ != nullptr) counter_->add(stored_name, bytes);
    if (ReadCounter* scoped = ReadCounter::current()) scoped->add(stored_name, bytes);
  }
  void count_whole(const StoredWeight& w) const;

  TensorStore store_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> orphans_;  // messages for unused companion tensors
  ReadCounter* counter_ = nullptr;
};

}  // namespace m3
