#include "loader/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/json_depth.h"

namespace m3 {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swapping");

namespace {

using json = nlohmann::ordered_json;  // keeps header order for names()

// Headers beyond this are rejected before parsing (the reference implementation uses 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

std::string base_name(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

std::string in_file(const std::string& path) { return base_name(path) + ": "; }

std::string in_tensor(const std::string& path, const std::string& name) {
  return base_name(path) + ": tensor '" + name + "': ";
}

// Reads a JSON integer into int64 (unsigned values above INT64_MAX are rejected).
bool json_int(const json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) return false;
    *out = int64_t(u);
    return true;
  }
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
    return true;
  }
  return false;
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// ---- MappedFile ----------------------------------------------------------------------------

Result<std::shared_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string why = std::strerror(err);
    if (err == ENOENT) return not_found(path + ": file not found");
    return invalid_argument(path + ": cannot open: " + why);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + ": not a regular file");
  }
  std::shared_ptr<MappedFile> m(new MappedFile());
  m->path_ = path;
  m->size_ = size_t(st.st_size);
  if (m->size_ > 0) {
    void* p = ::mmap(nullptr, m->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      return invalid_argument(path + ": mmap failed: " + why);
    }
    m->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return m;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

// ---- SafetensorsFile -----------------------------------------------------------------------

Result<std::shared_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  M3_ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> mapping, MappedFile::open(path));
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->mapping_ = mapping;
  M3_RETURN_IF_ERROR(f->parse_header(mapping->data(), mapping->size()));
  return f;
}

Result<std::shared_ptr<SafetensorsFile>> SafetensorsFile::parse(const uint8_t* bytes, size_t size,
                                                                const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  M3_RETURN_IF_ERROR(f->parse_header(bytes, size));
  return f;
}

Status SafetensorsFile::parse_header(const uint8_t* bytes, size_t size) {
  const std::string& p = path_;
  if (size < 8) {
    return data_loss(in_file(p) + "truncated: " + std::to_string(size) +
                     " bytes, shorter than the 8-byte header length");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > size - 8) {
    return data_loss(in_file(p) + "truncated or corrupt: header length " +
                     std::to_string(header_len) + " exceeds the " + std::to_string(size - 8) +
                     " bytes after the length field");
  }
  if (header_len > kMaxHeaderBytes) {
    return data_loss(in_file(p) + "header length " + std::to_string(header_len) +
                     " exceeds the 100 MiB limit");
  }
  const char* hbegin = reinterpret_cast<const char*>(bytes + 8);
  if (json_too_deep(std::string_view(hbegin, header_len))) {
    return data_loss(in_file(p) + "header nests more than " + std::to_string(kMaxJsonDepth) +
                     " levels deep");
  }
  json header = json::parse(hbegin, hbegin + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return data_loss(in_file(p) + "header is not valid JSON");
  if (!header.is_object()) return data_loss(in_file(p) + "header is not a JSON object");

  const uint8_t* data = bytes + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;

  struct Span {
    uint64_t begin, end;
    size_t view;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) return data_loss(in_file(p) + "__metadata__ is not a JSON object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (m.value().is_string()) metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = in_tensor(p, name);
    if (!entry.is_object()) return data_loss(where + "header entry is not a JSON object");
    auto dt = entry.find("dtype");
    auto sh = entry.find("shape");
    auto off = entry.find("data_offsets");
    if (dt == entry.end() || !dt->is_string()) return data_loss(where + "missing string 'dtype'");
    if (sh == entry.end() || !sh->is_array()) return data_loss(where + "missing array 'shape'");
    if (off == entry.end() || !off->is_array() || off->size() != 2) {
      return data_loss(where + "'data_offsets' must be an array [begin, end]");
    }
    Result<DType> dtype = parse_dtype(dt->get<std::string>());
    if (!dtype.is_ok()) return data_loss(where + dtype.status().message());

    TensorView v;
    v.dtype = *dtype;
    v.file = p;
    uint64_t numel = 1;
    for (const json& d : *sh) {
      int64_t n = 0;
      if (!json_int(d, &n) || n < 0) {
        return data_loss(where + "shape " + sh->dump() + " has a negative or non-integer entry");
      }
      v.shape.push_back(n);
      if (mul_overflows(numel, uint64_t(n), &numel)) {
        return data_loss(where + "shape " + sh->dump() + " overflows");
      }
    }
    int64_t begin = 0, end = 0;
    if (!json_int((*off)[0], &begin) || !json_int((*off)[1], &end) || begin < 0 || end < begin) {
      return data_loss(where + "invalid data_offsets " + off->dump());
    }
    if (uint64_t(end) > data_size) {
      return data_loss(where + "data_offsets " + off->dump() + " lie outside the " +
                       std::to_string(data_size) + "-byte data section (file truncated?)");
    }
    uint64_t nbytes = 0;
    if (mul_overflows(numel, dtype_size(v.dtype), &nbytes) || nbytes != uint64_t(end - begin)) {
      return data_loss(where + "data_offsets " + off->dump() + " span " +
                       std::to_string(end - begin) + " bytes, but " + dtype_name(v.dtype) + " " +
                       shape_to_string(v.shape) + " needs " +
                       std::to_string(numel * dtype_size(v.dtype)) + " bytes");
    }
    v.nbytes = size_t(nbytes);
    v.data = nbytes ? static_cast<const void*>(data + begin) : nullptr;
    if (nbytes) spans.push_back({uint64_t(begin), uint64_t(end), views_.size()});
    index_[name] = views_.size();
    names_.push_back(name);
    views_.push_back(std::move(v));
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].begin < spans[i - 1].end) {
      return data_loss(in_tensor(p, names_[spans[i].view]) + "data overlaps tensor '" +
                       names_[spans[i - 1].view] + "'");
    }
  }
  return Status::ok();
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &views_[it->second];
}

Result<TensorView> SafetensorsFile::tensor(const std::string& name) const {
  const TensorView* v = find(name);
  if (v == nullptr) return not_found(in_tensor(path_, name) + "not in this file");
  return *v;
}

// ---- TensorStore ---------------------------------------------------------------------------

Status TensorStore::add_file(std::shared_ptr<SafetensorsFile> file) {
  for (const std::string& name : file->names()) {
    auto [it, inserted] = tensors_.emplace(name, *file->find(name));
    if (!inserted) {
      return invalid_argument(in_tensor(file->path(), name) + "also stored in " +
                              base_name(it->second.file));
    }
  }
  files_.push_back(std::move(file));
  return Status::ok();
}

Result<TensorStore> TensorStore::open_files(const std::vector<std::string>& paths) {
  TensorStore store;
  for (const std::string& path : paths) {
    M3_ASSIGN_OR_RETURN(std::shared_ptr<SafetensorsFile> f, SafetensorsFile::open(path));
    M3_RETURN_IF_ERROR(store.add_file(std::move(f)));
  }
  return store;
}

Result<TensorStore> TensorStore::open_dir(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec)) return not_found(model_dir + ": not a directory");
  const fs::path dir(model_dir);
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (fs::exists(index_path, ec)) {
    const std::string ip = index_path.string();
    std::ifstream in(ip, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in.good() && !in.eof()) return invalid_argument(ip + ": cannot read");
    const std::string text = ss.str();
    if (json_too_deep(text)) {
      return data_loss(in_file(ip) + "nests more than " + std::to_string(kMaxJsonDepth) +
                       " levels deep");
    }
    json index = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object()) {
      return data_loss(in_file(ip) + "not a valid JSON object");
    }
    auto wm = index.find("weight_map");
    if (wm == index.end() || !wm->is_object()) {
      return data_loss(in_file(ip) + "missing object 'weight_map'");
    }
    // shard -> tensors it must hold, in a stable order.
    std::map<std::string, std::vector<std::string>> shards;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string()) {
        return data_loss(in_file(ip) + "weight_map['" + it.key() + "'] is not a file name");
      }
      const std::string shard = it.value().get<std::string>();
      const fs::path sp(shard);
      if (shard.empty() || sp.is_absolute() ||
          std::any_of(sp.begin(), sp.end(), [](const fs::path& c) { return c == ".."; })) {
        return invalid_argument(in_file(ip) + "weight_map['" + it.key() + "'] = '" + shard +
                                "' is not a file inside the model directory");
      }
      shards[shard].push_back(it.key());
    }
    TensorStore store;
    for (const auto& [shard, tensors] : shards) {
      const std::string path = (dir / shard).string();
      if (!fs::exists(path, ec)) {
        return not_found(in_file(ip) + "shard '" + shard + "' (holding tensor '" +
                         tensors.front() + "') does not exist");
      }
      M3_ASSIGN_OR_RETURN(std::shared_ptr<SafetensorsFile> f, SafetensorsFile::open(path));
      for (const std::string& name : tensors) {
        const TensorView* v = f->find(name);
        if (v == nullptr) {
          return not_found(in_tensor(path, name) + "listed in " + base_name(ip) +
                           " but not stored in this shard");
        }
        auto [pos, inserted] = store.tensors_.emplace(name, *v);
        M3_CHECK(inserted, "weight_map keys are unique");
      }
      store.files_.push_back(std::move(f));
    }
    return store;
  }
  const fs::path single = dir / "model.safetensors";
  if (fs::exists(single, ec)) return open_files({single.string()});
  std::vector<std::string> found;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors") found.push_back(e.path().string());
  }
  if (found.empty()) {
    return not_found(model_dir +
                     ": no model.safetensors.index.json, model.safetensors or *.safetensors");
  }
  std::sort(found.begin(), found.end());
  return open_files(found);
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, view] : tensors_) out.push_back(name);
  return out;
}

const TensorView* TensorStore::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Result<TensorView> TensorStore::tensor(const std::string& name) const {
  const TensorView* v = find(name);
  if (v == nullptr) return not_found("tensor '" + name + "' is not in the checkpoint");
  return *v;
}

}  // namespace m3
