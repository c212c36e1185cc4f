#include "loader/checkpoint.h"

#include <cstring>
#include <filesystem>
#include <set>

#include "core/dtype.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"

namespace m3 {

namespace {

constexpr const char* kCompanionSuffixes[] = {".weight_scale_inv", ".weight_scale",
                                              ".weight_scale_2",   ".weight_global_scale",
                                              ".input_scale",      ".input_global_scale"};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_companion(const std::string& name) {
  for (const char* s : kCompanionSuffixes) {
    if (ends_with(name, s)) return true;
  }
  return false;
}

std::string where(const TensorView& v, const std::string& name) {
  return std::filesystem::path(v.file).filename().string() + ": tensor '" + name + "': ";
}

bool is_float_dtype(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

// Element i of a float tensor (F32/BF16/F16) as f32; the data may be unaligned.
float read_float(const TensorView& v, int64_t i) {
  switch (v.dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, static_cast<const uint8_t*>(v.data) + 4 * i, 4);
      return f;
    }
    case DType::kBF16:
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, static_cast<const uint8_t*>(v.data) + 2 * i, 2);
      return v.dtype == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
    default: M3_CHECK(false, "read_float on a non-float tensor");
  }
  return 0.0f;
}

// Checks a block-scale tensor against the data: same leading dims, last dim in / block.
Status check_scale(const StoredWeight& w, const char* what, DType want_dtype, int64_t block) {
  const int64_t in = w.shape.back();
  if (in % block != 0) {
    return invalid_argument(where(w.data, w.data_name) + "input dimension " + std::to_string(in) +
                            " of logical shape " + shape_to_string(w.shape) +
                            " is not divisible by the " + what + " block size " +
                            std::to_string(block));
  }
  std::vector<int64_t> want = w.shape;
  want.back() = in / block;
  if (w.scale.dtype != want_dtype) {
    return invalid_argument(where(w.scale, w.scale_name) + what + " scales must be " +
                            dtype_name(want_dtype) + ", found " + dtype_name(w.scale.dtype));
  }
  if (w.scale.shape != want) {
    return invalid_argument(where(w.scale, w.scale_name) + "expected shape " +
                            shape_to_string(want) + " for the " + what + " scales of '" + w.name +
                            "' " + shape_to_string(w.shape) + ", found " +
                            shape_to_string(w.scale.shape));
  }
  return Status::ok();
}

Status check_global_scale(const StoredWeight& w) {
  const TensorView& g = w.global_scale;
  if (!is_float_dtype(g.dtype) || g.numel() != 1) {
    return invalid_argument(where(g, w.global_scale_name) +
                            "expected one F32 value (the NVFP4 global scale), found " +
                            dtype_name(g.dtype) + " " + shape_to_string(g.shape));
  }
  return Status::ok();
}

Status classify_quantized(StoredWeight& w) {
  const TensorView& d = w.data;
  if (d.shape.size() < 2) {
    return invalid_argument(where(d, w.data_name) + "a " + weight_format_name(w.format) +
                            " weight must have at least 2 dimensions, found " +
                            shape_to_string(d.shape));
  }
  switch (w.format) {
    case WeightFormat::kMxfp8:
      w.shape = d.shape;
      return check_scale(w, "MXFP8", DType::kU8, kMxfp8BlockSize);
    case WeightFormat::kNvfp4Compressed:
    case WeightFormat::kNvfp4ModelOpt:
      if (d.dtype != DType::kU8) {
        return invalid_argument(where(d, w.data_name) + "packed NVFP4 codes must be U8, found " +
                                dtype_name(d.dtype));
      }
      w.shape = d.shape;
      w.shape.back() *= 2;
      M3_RETURN_IF_ERROR(check_scale(w, "NVFP4", DType::kF8E4M3, kNvfp4BlockSize));
      return check_global_scale(w);
    default: M3_CHECK(false, "classify_quantized on a plain format");
  }
  return Status::ok();
}

}  // namespace

namespace {
thread_local ReadCounter* t_scoped_counter = nullptr;
}  // namespace

ReadCounter::Scope::Scope(ReadCounter* counter) : previous_(t_scoped_counter) {
  t_scoped_counter = counter;
}

ReadCounter::Scope::~Scope() { t_scoped_counter = previous_; }

ReadCounter* ReadCounter::current() { return t_scoped_counter; }

void ReadCounter::add(const std::string& stored_name, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  bytes_[stored_name] += bytes;
}

uint64_t ReadCounter::total() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t t = 0;
  for (const auto& [name, b] : bytes_) t += b;
  return t;
}

std::map<std::string, uint64_t> ReadCounter::by_tensor() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

void Checkpoint::count_whole(const StoredWeight& w) const {
  count(w.data_name, w.data.nbytes);
  count(w.scale_name, w.scale.nbytes);
  count(w.global_scale_name, w.global_scale.nbytes);
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::open(const std::string& model_dir) {
  M3_ASSIGN_OR_RETURN(TensorStore store, TensorStore::open_dir(model_dir));
  return from_store(std::move(store));
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::from_store(TensorStore store) {
  std::unique_ptr<Checkpoint> c(new Checkpoint(std::move(store)));
  c->classify();
  return c;
}

void Checkpoint::classify() {
  std::set<std::string> consumed;
  auto view = [&](const std::string& n) { return store_.find(n); };
  auto take = [&](const std::string& n) {
    consumed.insert(n);
    return *store_.find(n);
  };
  const std::vector<std::string> all = store_.names();

  for (const std::string& n : all) {
    Entry e;
    StoredWeight& w = e.weight;
    if (ends_with(n, ".weight_packed")) {
      const std::string p = n.substr(0, n.size() - std::string(".weight_packed").size());
      w.name = p + ".weight";
      w.format = WeightFormat::kNvfp4Compressed;
      w.data_name = n;
      w.data = take(n);
      w.scale_name = p + ".weight_scale";
      w.global_scale_name = p + ".weight_global_scale";
      if (view(w.name) != nullptr) {
        e.error = invalid_argument(where(w.data, n) + "both '" + w.name + "' and '" + n +
                                   "' are stored; cannot tell which is the weight");
        consumed.insert(w.name);
      } else if (view(w.scale_name) == nullptr || view(w.global_scale_name) == nullptr) {
        e.error = invalid_argument(where(w.data, n) + "NVFP4 (compressed-tensors) weight needs '" +
                                   w.scale_name + "' and '" + w.global_scale_name + "'");
      } else {
        w.scale = take(w.scale_name);
        w.global_scale = take(w.global_scale_name);
        e.error = classify_quantized(w);
      }
      consumed.insert(p + ".input_global_scale");
    } else if (ends_with(n, ".weight") && consumed.count(n) == 0) {
      const std::string p = n.substr(0, n.size() - std::string(".weight").size());
      w.name = n;
      w.data_name = n;
      w.data = take(n);
      w.shape = w.data.shape;
      switch (w.data.dtype) {
        case DType::kF32: w.format = WeightFormat::kF32; break;
        case DType::kBF16: w.format = WeightFormat::kBF16; break;
        case DType::kF16: w.format = WeightFormat::kF16; break;
        case DType::kF8E4M3:
          w.format = WeightFormat::kMxfp8;
          w.scale_name = p + ".weight_scale_inv";
          if (view(w.scale_name) == nullptr) {
            e.error = view(p + ".weight_scale") != nullptr
                          ? unimplemented(where(w.data, n) +
                                          "F8_E4M3 weight with a 'weight_scale' (per-tensor or "
                                          "per-channel FP8) is not supported; only MXFP8 "
                                          "('weight_scale_inv' E8M0 per 32) is")
                          : invalid_argument(where(w.data, n) + "F8_E4M3 weight without '" +
                                             w.scale_name + "' (MXFP8 scales)");
          } else {
            w.scale = take(w.scale_name);
            e.error = classify_quantized(w);
          }
          break;
        case DType::kU8:
          w.format = WeightFormat::kNvfp4ModelOpt;
          w.scale_name = p + ".weight_scale";
          w.global_scale_name = p + ".weight_scale_2";
          if (view(w.scale_name) == nullptr || view(w.global_scale_name) == nullptr) {
            e.error = invalid_argument(where(w.data, n) +
                                       "U8 weight is not NVFP4 (ModelOpt): it needs '" +
                                       w.scale_name + "' and '" + w.global_scale_name + "'");
          } else {
            w.scale = take(w.scale_name);
            w.global_scale = take(w.global_scale_name);
            e.error = classify_quantized(w);
            consumed.insert(p + ".input_scale");  // activation scale: not used (dynamic quant)
          }
          break;
        default:
          e.error = unimplemented(where(w.data, n) + "dtype " + dtype_name(w.data.dtype) +
                                  " is not a supported weight format");
      }
    } else {
      continue;
    }
    entries_[w.name] = std::move(e);
  }
  // Everything else: plain tensors (norm weights, biases, router bias, ...) and leftovers.
  for (const std::string& n : all) {
    if (consumed.count(n) || entries_.count(n)) continue;
    const TensorView& v = *store_.find(n);
    if (is_companion(n)) {
      orphans_.push_back(where(v, n) + "scale tensor belongs to no quantised weight");
      continue;
    }
    Entry e;
    e.weight.name = n;
    e.weight.data_name = n;
    e.weight.data = v;
    e.weight.shape = v.shape;
    switch (v.dtype) {
      case DType::kF32: e.weight.format = WeightFormat::kF32; break;
      case DType::kBF16: e.weight.format = WeightFormat::kBF16; break;
      case DType::kF16: e.weight.format = WeightFormat::kF16; break;
      default:
        e.error = unimplemented(where(v, n) + "dtype " + dtype_name(v.dtype) +
                                " is not a supported weight format");
    }
    entries_[n] = std::move(e);
  }
}

const Checkpoint::Entry* Checkpoint::entry(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

bool Checkpoint::has(const std::string& name) const { return entry(name) != nullptr; }

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

Result<StoredWeight> Checkpoint::stored(const std::string& name) const {
  const Entry* e = entry(name);
  if (e == nullptr) return not_found("weight '" + name + "' is not in the checkpoint");
  if (!e->error.is_ok()) return e->error;
  return e->weight;
}

Result<WeightFormat> Checkpoint::format(const std::string& name) const {
  M3_ASSIGN_OR_RETURN(StoredWeight w, stored(name));
  return w.format;
}

Result<std::vector<int64_t>> Checkpoint::shape(const std::string& name) const {
  M3_ASSIGN_OR_RETURN(StoredWeight w, stored(name));
  return w.shape;
}

Result<StoredWeight> Checkpoint::stored_with_shape(const std::string& name,
                                                  const std::vector<int64_t>& expected) const {
  M3_ASSIGN_OR_RETURN(StoredWeight w, stored(name));
  if (w.shape != expected) {
    return invalid_argument(where(w.data, name) + "expected shape " + shape_to_string(expected) +
                            ", found " + shape_to_string(w.shape));
  }
  return w;
}

Result<HostTensorF32> Checkpoint::load_f32(const std::string& name,
                                           const std::vector<int64_t>& expected_shape) const {
  M3_RETURN_IF_ERROR(stored_with_shape(name, expected_shape).status());
  return load_f32_any(name);
}

Result<RawWeight> Checkpoint::load_raw(const std::string& name,
                                       const std::vector<int64_t>& expected_shape) const {
  M3_ASSIGN_OR_RETURN(StoredWeight w, stored_with_shape(name, expected_shape));
  RawWeight r;
  r.format = w.format;
  r.shape = w.shape;
  int64_t n = 1;
  for (int64_t d : w.shape) n *= d;
  // Bytes the format implies; classification checked the shapes, this guards the arithmetic.
  size_t want_data = 0, want_scale = 0;
  switch (w.format) {
    case WeightFormat::kF32: want_data = size_t(n) * 4; break;
    case WeightFormat::kBF16:
    case WeightFormat::kF16: want_data = size_t(n) * 2; break;
    case WeightFormat::kMxfp8: want_data = size_t(n), want_scale = size_t(n / 32); break;
    case WeightFormat::kNvfp4Compressed:
    case WeightFormat::kNvfp4ModelOpt: want_data = size_t(n / 2), want_scale = size_t(n / 16); break;
  }
  if (w.data.nbytes != want_data || (want_scale != 0 && w.scale.nbytes != want_scale)) {
    return invalid_argument(where(w.data, w.data_name) + "stored bytes " +
                            std::to_string(w.data.nbytes) + " (scales " +
                            std::to_string(w.scale.nbytes) + ") do not match " +
                            weight_format_name(w.format) + " of logical shape " +
                            shape_to_string(w.shape));
  }
  count_whole(w);
  r.data = static_cast<const uint8_t*>(w.data.data);
  r.data_bytes = w.data.nbytes;
  if (want_scale != 0) {
    r.scale = static_cast<const uint8_t*>(w.scale.data);
    r.scale_bytes = w.scale.nbytes;
  }
  if (w.format == WeightFormat::kNvfp4Compressed || w.format == WeightFormat::kNvfp4ModelOpt)
    r.global_scale = read_float(w.global_scale, 0);
  return r;
}

Result<HostTensorF32> Checkpoint::load_f32_any(const std::string& name) const {
  M3_ASSIGN_OR_RETURN(StoredWeight w, stored(name));
  HostTensorF32 t;
  t.shape = w.shape;
  const int64_t n = t.numel();
  t.data.resize(size_t(n));
  const int64_t cols = w.shape.empty() ? 1 : w.shape.back();
  const int64_t rows = cols == 0 ? 0 : n / cols;
  Status s;
  switch (w.format) {
    case WeightFormat::kF32:
      if (n) std::memcpy(t.data.data(), w.data.data, size_t(n) * 4);
      break;
    case WeightFormat::kBF16:
    case WeightFormat::kF16:
      for (int64_t i = 0; i < n; ++i) t.data[size_t(i)] = read_float(w.data, i);
      break;
    case WeightFormat::kMxfp8:
      s = dequantize_mxfp8(static_cast<const uint8_t*>(w.data.data),
                           static_cast<const uint8_t*>(w.scale.data), rows, cols, t.data.data());
      break;
    case WeightFormat::kNvfp4Compressed:
    case WeightFormat::kNvfp4ModelOpt:
      s = dequantize_nvfp4(static_cast<const uint8_t*>(w.data.data),
                           static_cast<const uint8_t*>(w.scale.data), read_float(w.global_scale, 0),
                           w.format == WeightFormat::kNvfp4Compressed ? Nvfp4GlobalScale::kDivide
                                                                      : Nvfp4GlobalScale::kMultiply,
                           rows, cols, t.data.data());
      break;
  }
  if (!s.is_ok()) return Status(s.code(), where(w.data, w.data_name) + s.message());
  count_whole(w);
  return t;
}

Result<HostTensorF32> Checkpoint::load_f32_window(const std::string& name,
                                                  const std::vector<int64_t>& expected_shape,
                                                  const WeightWindow& win) const {
  M3_ASSIGN_OR_RETURN(StoredWeight w, stored_with_shape(name, expected_shape));
  {
    const Status s = check_weight_window(name, w.format, w.shape, win);
    if (!s.is_ok()) return Status(s.code(), where(w.data, w.data_name) + s.message());
  }
  const int64_t cols = w.shape[1], out_rows = win.rows(), out_cols = win.cols();
  HostTensorF32 t;
  t.shape = {out_rows, out_cols};
  t.data.resize(static_cast<size_t>(out_rows * out_cols));
  if (out_rows == 0 || out_cols == 0) return t;
  const auto* data = static_cast<const uint8_t*>(w.data.data);
  const auto* scales = static_cast<const uint8_t*>(w.scale.data);
  const int64_t block = weight_format_block(w.format);
  const int64_t scale_cols = cols / block;
  uint64_t data_bytes = 0, scale_bytes = 0;
  Status s;
  for (int64_t r = 0; r < out_rows && s.is_ok(); ++r) {
    const int64_t row = win.row_begin + r;
    float* out = t.data.data() + r * out_cols;
    switch (w.format) {
      case WeightFormat::kF32:
        std::memcpy(out, data + (row * cols + win.col_begin) * 4, size_t(out_cols) * 4);
        data_bytes += uint64_t(out_cols) * 4;
        break;
      case WeightFormat::kBF16:
      case WeightFormat::kF16:
        for (int64_t c = 0; c < out_cols; ++c)
          out[c] = read_float(w.data, row * cols + win.col_begin + c);
        data_bytes += uint64_t(out_cols) * 2;
        break;
      case WeightFormat::kMxfp8:
        s = dequantize_mxfp8(data + row * cols + win.col_begin,
                             scales + row * scale_cols + win.col_begin / block, 1, out_cols, out);
        data_bytes += uint64_t(out_cols);
        scale_bytes += uint64_t(out_cols / block);
        break;
      case WeightFormat::kNvfp4Compressed:
      case WeightFormat::kNvfp4ModelOpt:
        // col_begin is a multiple of 16, so the window starts on a whole packed byte.
        s = dequantize_nvfp4(
            data + (row * cols + win.col_begin) / 2,
            scales + row * scale_cols + win.col_begin / block, read_float(w.global_scale, 0),
            w.format == WeightFormat::kNvfp4Compressed ? Nvfp4GlobalScale::kDivide
                                                       : Nvfp4GlobalScale::kMultiply,
            1, out_cols, out);
        data_bytes += uint64_t(out_cols / 2);
        scale_bytes += uint64_t(out_cols / block);
        break;
    }
  }
  if (!s.is_ok()) return Status(s.code(), where(w.data, w.data_name) + s.message());
  count(w.data_name, data_bytes);
  count(w.scale_name, scale_bytes);
  count(w.global_scale_name, w.global_scale.nbytes);
  return t;
}

Status Checkpoint::check_all() const {
  std::string msg;
  int count = 0;
  for (const auto& [name, e] : entries_) {
    if (e.error.is_ok()) continue;
    msg += (count++ ? "\n" : "") + e.error.message();
  }
  for (const std::string& o : orphans_) msg += (count++ ? "\n" : "") + o;
  if (count == 0) return Status::ok();
  return invalid_argument(std::to_string(count) + " problem(s) in the checkpoint:\n" + msg);
}

}  // namespace m3
