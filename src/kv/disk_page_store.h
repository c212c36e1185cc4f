// The disk tier (--hicache-storage-backend file --hicache-storage-dir DIR): one file per KV page,
// named by the page's chained key (kv/page_key.h), so a server started later on the same
// directory finds a prefix's pages by hashing its tokens, and a different model (another identity)
// never reads them.
//
// File layout (little-endian, native widths):
//   magic "M3KVPG01" | u64 model identity hash | u64 key.hi | u64 key.lo | u64 parent.hi |
//   u64 parent.lo | u32 page_size | u32 reserved | i64 page_bytes | i32 tokens[page_size] |
//   payload[page_bytes] | u64 checksum of everything before it.
// A file is written to a temporary name and renamed into place, so a reader never sees half of
// one from this process; a file that is short, altered, or of another model or page shape is a
// miss (logged to stderr once per file and counted), never an error. The tier is not bounded:
// the directory grows until someone cleans it.
// Thread-compatible: one scheduler thread uses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "kv/page_key.h"

namespace m3 {

class DiskPageStore {
 public:
  // Creates `dir` if needed; fails (invalid argument naming the directory) when it cannot be
  // created or written. model_identity: the same string as the key chain's root.
  static Result<std::unique_ptr<DiskPageStore>> open(const std::string& dir,
                                                     const std::string& model_identity,
                                                     int32_t page_size, int64_t page_bytes);

  // Whether a file for `key` exists (not yet checked).
  bool contains(const PageKey& key) const;
  // Writes the page (no-op when the file exists). A failed write is logged and returns the error;
  // the caller treats it as a page lost from the cache, not as a failure of the request.
  Status put(const PageKey& key, const PageKey& parent, std::span<const int32_t> tokens,
             const std::byte* payload);
  // Reads and checks the page into payload[page_bytes]. False (a miss) when the file is absent or
  // fails any check; the reason of a failed check is logged and counted.
  bool get(const PageKey& key, const PageKey& parent, std::span<const int32_t> tokens,
           std::byte* payload);

  const std::string& dir() const { return dir_; }
  uint64_t num_corrupt() const { return num_corrupt_; }
  uint64_t num_written() const { return num_written_; }
  // The path of a key's file (tests damage files through it).
  std::string path_of(const PageKey& key) const;

 private:
  DiskPageStore(std::string dir, uint64_t identity_hash, int32_t page_size, int64_t page_bytes)
      : dir_(std::move(dir)),
        identity_hash_(identity_hash),
        page_size_(page_size),
        page_bytes_(page_bytes) {}
  void reject(const std::string& path, const std::string& why);

  std::string dir_;
  uint64_t identity_hash_;
  int32_t page_size_;
  int64_t page_bytes_;
  uint64_t num_corrupt_ = 0;
  uint64_t num_written_ = 0;
  uint64_t tmp_counter_ = 0;
};

}  // namespace m3
