#include "kv/disk_page_store.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <system_error>

namespace m3 {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'M', '3', 'K', 'V', 'P', 'G', '0', '1'};

struct FileHeader {
  char magic[8];
  uint64_t identity;
  uint64_t key_hi, key_lo, parent_hi, parent_lo;
  uint32_t page_size;
  uint32_t reserved;
  int64_t page_bytes;
};
static_assert(sizeof(FileHeader) == 64, "the header is written as raw bytes");

}  // namespace

Result<std::unique_ptr<DiskPageStore>> DiskPageStore::open(const std::string& dir,
                                                           const std::string& model_identity,
                                                           int32_t page_size, int64_t page_bytes) {
  if (dir.empty()) {
    return invalid_argument("--hicache-storage-dir: empty; the file storage backend needs a directory");
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    return invalid_argument("--hicache-storage-dir " + dir + ": cannot create the directory (" +
                            ec.message() + ")");
  }
  if (::access(dir.c_str(), W_OK) != 0) {
    return invalid_argument("--hicache-storage-dir " + dir + ": the directory is not writable");
  }
  const PageKey id = root_page_key(model_identity);
  return std::unique_ptr<DiskPageStore>(
      new DiskPageStore(dir, id.hi ^ id.lo, page_size, page_bytes));
}

std::string DiskPageStore::path_of(const PageKey& key) const {
  return dir_ + "/" + key.hex() + ".kvpage";
}

bool DiskPageStore::contains(const PageKey& key) const {
  std::error_code ec;
  return fs::exists(path_of(key), ec);
}

void DiskPageStore::reject(const std::string& path, const std::string& why) {
  ++num_corrupt_;
  std::cerr << "[m3serve] hicache disk tier: ignoring " << path << ": " << why
            << " (treated as a cache miss)\n";
}

Status DiskPageStore::put(const PageKey& key, const PageKey& parent,
                          std::span<const int32_t> tokens, const std::byte* payload) {
  M3_CHECK(static_cast<int32_t>(tokens.size()) == page_size_,
           "[kv.disk_page_store.put] " + std::to_string(tokens.size()) + " tokens, page size " +
               std::to_string(page_size_));
  const std::string path = path_of(key);
  if (contains(key)) return Status::ok();
  FileHeader h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.identity = identity_hash_;
  h.key_hi = key.hi;
  h.key_lo = key.lo;
  h.parent_hi = parent.hi;
  h.parent_lo = parent.lo;
  h.page_size = static_cast<uint32_t>(page_size_);
  h.page_bytes = page_bytes_;
  // One buffer so the checksum covers exactly the bytes written.
  const size_t token_bytes = tokens.size() * sizeof(int32_t);
  std::vector<std::byte> buf(sizeof(h) + token_bytes + static_cast<size_t>(page_bytes_));
  std::memcpy(buf.data(), &h, sizeof(h));
  std::memcpy(buf.data() + sizeof(h), tokens.data(), token_bytes);
  std::memcpy(buf.data() + sizeof(h) + token_bytes, payload, static_cast<size_t>(page_bytes_));
  const uint64_t sum = checksum64(buf.data(), buf.size());
  const std::string tmp = path + ".tmp" + std::to_string(::getpid()) + "." +
                          std::to_string(tmp_counter_++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
    out.write(reinterpret_cast<const char*>(&sum), sizeof(sum));
    out.flush();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      std::cerr << "[m3serve] hicache disk tier: cannot write " << tmp << " (page dropped)\n";
      return data_loss("hicache disk tier: cannot write " + tmp);
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    std::cerr << "[m3serve] hicache disk tier: cannot rename into " << path << " (page dropped)\n";
    return data_loss("hicache disk tier: cannot rename into " + path);
  }
  ++num_written_;
  return Status::ok();
}

bool DiskPageStore::get(const PageKey& key, const PageKey& parent,
                        std::span<const int32_t> tokens, std::byte* payload) {
  const std::string path = path_of(key);
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  const size_t token_bytes = tokens.size() * sizeof(int32_t);
  const size_t body = sizeof(FileHeader) + token_bytes + static_cast<size_t>(page_bytes_);
  std::vector<std::byte> buf(body);
  uint64_t sum = 0;
  in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(body));
  in.read(reinterpret_cast<char*>(&sum), sizeof(sum));
  if (!in) {
    reject(path, "truncated (shorter than " + std::to_string(body + sizeof(sum)) + " bytes)");
    return false;
  }
  if (in.peek() != std::ifstream::traits_type::eof()) {
    reject(path, "longer than a page file of this model");
    return false;
  }
  if (checksum64(buf.data(), buf.size()) != sum) {
    reject(path, "checksum mismatch");
    return false;
  }
  FileHeader h;
  std::memcpy(&h, buf.data(), sizeof(h));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) {
    reject(path, "not a KV page file");
    return false;
  }
  if (h.identity != identity_hash_ || h.page_size != static_cast<uint32_t>(page_size_) ||
      h.page_bytes != page_bytes_) {
    reject(path, "written for another model or KV layout");
    return false;
  }
  if (h.key_hi != key.hi || h.key_lo != key.lo || h.parent_hi != parent.hi ||
      h.parent_lo != parent.lo ||
      std::memcmp(buf.data() + sizeof(h), tokens.data(), token_bytes) != 0) {
    reject(path, "holds another prefix (key, parent or tokens differ)");
    return false;
  }
  std::memcpy(payload, buf.data() + sizeof(h) + token_bytes, static_cast<size_t>(page_bytes_));
  return true;
}

}  // namespace m3
