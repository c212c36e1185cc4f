#include "loader/safetensors_writer.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace m3 {

void SafetensorsWriter::add(const std::string& name, DType dtype,
                            const std::vector<int64_t>& shape, const void* data, size_t nbytes) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  M3_CHECK(numel >= 0 && size_t(numel) * dtype_size(dtype) == nbytes,
           "SafetensorsWriter::add('" + name + "'): byte count does not match the shape");
  Entry e{name, dtype, shape, std::vector<uint8_t>(nbytes)};
  if (nbytes) std::memcpy(e.bytes.data(), data, nbytes);
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::add_f32(const std::string& name, const std::vector<int64_t>& shape,
                                const std::vector<float>& values) {
  add(name, DType::kF32, shape, values.data(), values.size() * sizeof(float));
}

void SafetensorsWriter::add_bf16(const std::string& name, const std::vector<int64_t>& shape,
                                 const std::vector<float>& values) {
  std::vector<uint16_t> h(values.size());
  for (size_t i = 0; i < values.size(); ++i) h[i] = f32_to_bf16(values[i]);
  add(name, DType::kBF16, shape, h.data(), h.size() * 2);
}

void SafetensorsWriter::add_f16(const std::string& name, const std::vector<int64_t>& shape,
                                const std::vector<float>& values) {
  std::vector<uint16_t> h(values.size());
  for (size_t i = 0; i < values.size(); ++i) h[i] = f32_to_f16(values[i]);
  add(name, DType::kF16, shape, h.data(), h.size() * 2);
}

void SafetensorsWriter::add_u8(const std::string& name, DType dtype,
                               const std::vector<int64_t>& shape,
                               const std::vector<uint8_t>& bytes) {
  add(name, dtype, shape, bytes.data(), bytes.size());
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

std::vector<std::string> SafetensorsWriter::names() const {
  std::vector<std::string> out;
  for (const Entry& e : entries_) out.push_back(e.name);
  return out;
}

std::vector<uint8_t> SafetensorsWriter::to_bytes() const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const Entry& e : entries_) {
    header[e.name] = {{"dtype", dtype_name(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  std::vector<uint8_t> out(8 + text.size() + offset);
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = uint8_t(n >> (8 * i));
  std::memcpy(out.data() + 8, text.data(), text.size());
  size_t pos = 8 + text.size();
  for (const Entry& e : entries_) {
    if (!e.bytes.empty()) std::memcpy(out.data() + pos, e.bytes.data(), e.bytes.size());
    pos += e.bytes.size();
  }
  return out;
}

Status SafetensorsWriter::write(const std::string& path) const {
  return write_file_bytes(path, to_bytes());
}

Status write_file_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return invalid_argument(path + ": cannot open for writing");
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  out.close();
  if (!out) return invalid_argument(path + ": write failed");
  return Status::ok();
}

Status write_safetensors_index(const std::string& dir,
                               const std::map<std::string, std::string>& weight_map,
                               uint64_t total_size) {
  nlohmann::ordered_json j;
  j["metadata"] = {{"total_size", total_size}};
  j["weight_map"] = weight_map;
  const std::string text = j.dump(2) + "\n";
  const std::string path = (std::filesystem::path(dir) / "model.safetensors.index.json").string();
  return write_file_bytes(path, std::vector<uint8_t>(text.begin(), text.end()));
}

}  // namespace m3
