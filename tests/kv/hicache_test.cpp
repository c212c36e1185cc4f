// HiCache in the radix prefix index (kv/hicache.h): pages the device evicts come back from the
// host tier, then from the disk tier, byte for byte; the disk tier survives a new index on the
// same directory and rejects damaged files; a random workload over tiny pools keeps every
// invariant and returns every page. A fake copier stands in for the model runner: its "device"
// pages are byte arrays, and a computed page's bytes are derived from the prefix it holds, so a
// page loaded for the wrong prefix (or a stale one) is caught.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "kv/radix_prefix_index.h"

namespace m3 {
namespace {

namespace fs = std::filesystem;
constexpr int32_t P = 4;
constexpr int64_t kPageBytes = 64;

// With `lazy`, saves behave as a GPU copier's do: queued in order, each reading the device page
// when it runs, not when it is queued. A queued save runs at wait(), before a load (one copy
// stream, in order), and at order_before_forward() up to the last save of a released page (the
// compute stream waits for that one, hence for every earlier one) and, at random, a few more. A
// forward that wrote a page whose save had not run would leave other bytes in the host tier,
// which the byte checks of a later hit catch.
class FakeCopier final : public KvPageCopier {
 public:
  explicit FakeCopier(int32_t num_pages)
      : device(static_cast<size_t>(num_pages), std::vector<std::byte>(kPageBytes)) {}
  int64_t page_bytes() const override { return kPageBytes; }
  std::unique_ptr<HostPageArena> allocate_host_arena(int64_t bytes) override {
    return std::make_unique<HeapPageArena>(bytes);
  }
  Status save(std::span<const PageCopy> copies) override {
    for (const PageCopy& c : copies) queued.push_back({c, false});
    saves += copies.size();
    if (!lazy) run(queued.size());
    return Status::ok();
  }
  Status load(std::span<const PageCopy> copies) override {
    run(queued.size());
    for (const PageCopy& c : copies) std::memcpy(device.at(c.device_page).data(), c.host, kPageBytes);
    loads += copies.size();
    return Status::ok();
  }
  Status wait() override {
    run(queued.size());
    return Status::ok();
  }
  void release(PageId page) override {
    for (Queued& q : queued) q.released = q.released || q.copy.device_page == page;
    ++releases;
  }
  Status order_before_forward() override {
    size_t n = 0;
    for (size_t i = 0; i < queued.size(); ++i) {
      if (queued[i].released) n = i + 1;
    }
    run(std::min(queued.size(), n + rng() % 3));
    return Status::ok();
  }

  std::vector<std::vector<std::byte>> device;
  size_t saves = 0, loads = 0, releases = 0;
  bool lazy = false;

 private:
  struct Queued {
    PageCopy copy;
    bool released;
  };
  // Runs the first n queued saves.
  void run(size_t n) {
    for (size_t i = 0; i < n; ++i) {
      std::memcpy(queued[i].copy.host, device.at(queued[i].copy.device_page).data(), kPageBytes);
    }
    queued.erase(queued.begin(), queued.begin() + static_cast<std::ptrdiff_t>(n));
  }
  std::vector<Queued> queued;
  std::mt19937 rng{99};
};

// The bytes a page holding tokens [0, (i + 1) * P) of `t` must have.
std::vector<std::byte> page_bytes_for(std::span<const int32_t> t, size_t i) {
  PageKey k = root_page_key("content");
  for (size_t j = 0; j <= i; ++j) k = chain_page_key(k, t.subspan(j * P, P));
  std::vector<std::byte> b(kPageBytes);
  for (int64_t x = 0; x < kPageBytes; ++x) {
    b[static_cast<size_t>(x)] = static_cast<std::byte>((x % 2 ? k.hi : k.lo) >> (8 * (x % 8)));
  }
  return b;
}

struct Tiers {
  PagePool pool;
  FakeCopier copier;
  RadixPrefixIndex index;
  Tiers(int32_t device_pages, int32_t host_pages, HiCacheWritePolicy policy,
        const std::string& disk_dir = "", const std::string& identity = "model-a")
      : pool(device_pages), copier(device_pages), index(&pool, P) {
    HiCacheOptions o;
    o.host_pages = host_pages;
    o.policy = policy;
    o.disk_dir = disk_dir;
    o.model_identity = identity;
    o.page_size = P;
    auto hc = make_hicache(&copier, o);
    EXPECT_TRUE(hc.is_ok()) << hc.status().to_string();
    index.set_hicache(std::move(hc).value());
  }

  // A request over `t`: acquire the cached prefix (checking its bytes), compute and index the
  // rest of the full pages, release. Returns the number of pages that came from the cache.
  int32_t serve(const std::vector<int32_t>& t, HiCacheLoad* load = nullptr) {
    const int32_t num_full = static_cast<int32_t>(t.size()) / P;
    std::vector<PageId> pages = index.acquire(t, num_full, load);
    const int32_t hit = static_cast<int32_t>(pages.size());
    for (int32_t i = 0; i < hit; ++i) {
      EXPECT_EQ(copier.device[static_cast<size_t>(pages[i])], page_bytes_for(t, i))
          << "page " << i << " of a cached prefix holds other bytes";
    }
    const int32_t need = num_full - hit;
    if (pool.num_free() < need) index.evict(need - pool.num_free());
    std::vector<PageId> fresh;
    EXPECT_TRUE(pool.alloc(need, &fresh)) << "the device pool cannot hold one request";
    // The forward that computes the fresh pages, ordered after the copies it must follow.
    EXPECT_TRUE(copier.order_before_forward().is_ok());
    for (int32_t i = 0; i < need; ++i) {
      copier.device[static_cast<size_t>(fresh[i])] = page_bytes_for(t, hit + i);
    }
    pages.insert(pages.end(), fresh.begin(), fresh.end());
    std::vector<PageId> canon = index.insert(t, pages);
    for (size_t i = 0; i < pages.size(); ++i) {
      if (canon[i] != pages[i]) {
        pool.incref(canon[i]);
        pool.decref(pages[i]);
        pages[i] = canon[i];
      }
    }
    for (PageId p : pages) pool.decref(p);
    EXPECT_EQ(index.check_invariants(), "");
    return hit;
  }
};

std::vector<int32_t> tokens(uint32_t seed, int32_t n) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % 1000);
  return t;
}

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() /
               ("m3_hicache_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

TEST(HiCache, WritePolicyParsing) {
  EXPECT_EQ(*parse_hicache_write_policy("write_back"), HiCacheWritePolicy::kWriteBack);
  EXPECT_EQ(*parse_hicache_write_policy("write_through"), HiCacheWritePolicy::kWriteThrough);
  auto bad = parse_hicache_write_policy("write_through_selective");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("--hicache-write-policy"), std::string::npos);
}

TEST(HiCache, EvictedPrefixComesBackFromHost) {
  for (HiCacheWritePolicy policy : {HiCacheWritePolicy::kWriteBack, HiCacheWritePolicy::kWriteThrough}) {
    Tiers t(4, 16, policy);
    const auto a = tokens(1, 4 * P);
    EXPECT_EQ(t.serve(a), 0);
    const size_t saves_after_insert = t.copier.saves;
    EXPECT_EQ(saves_after_insert, policy == HiCacheWritePolicy::kWriteThrough ? 4u : 0u);
    // Another prefix takes the whole device pool: a's pages move to the host tier.
    EXPECT_EQ(t.serve(tokens(2, 4 * P)), 0);
    EXPECT_EQ(t.index.match(a, 4).size(), 0u);  // no longer on the device
    EXPECT_GE(t.index.num_host_nodes(), 4);
    HiCacheLoad load;
    EXPECT_EQ(t.serve(a, &load), 4);  // bytes checked inside
    EXPECT_EQ(load.host_pages, 4);
    EXPECT_EQ(t.index.hicache()->counters.host_hit_tokens, uint64_t(4 * P));
    EXPECT_EQ(t.index.hicache()->counters.num_loads, 1u);
    t.index.evict_all();
    EXPECT_EQ(t.pool.num_free(), 4);
    EXPECT_EQ(t.index.check_invariants(), "");
  }
}

TEST(HiCache, FullHostTierSpillsLeastRecentlyUsedToDisk) {
  const fs::path dir = temp_dir("spill");
  {
    Tiers t(4, 4, HiCacheWritePolicy::kWriteBack, dir.string());
    const auto a = tokens(1, 4 * P), b = tokens(2, 4 * P), c = tokens(3, 4 * P);
    t.serve(a);
    t.serve(b);  // a -> host
    t.serve(c);  // b -> host; the host is full, so a (least recently used) -> disk
    EXPECT_EQ(t.index.hicache()->counters.pages_written_to_disk, 4u);
    HiCacheLoad load;
    EXPECT_EQ(t.serve(a, &load), 4);  // from disk, bytes checked
    EXPECT_EQ(load.disk_pages, 4);
    EXPECT_EQ(load.host_pages, 0);
    EXPECT_EQ(t.index.hicache()->counters.disk_hit_tokens, uint64_t(4 * P));
    HiCacheLoad load_b;
    EXPECT_EQ(t.serve(b, &load_b), 4);  // from host or disk, wherever LRU left it
    EXPECT_EQ(load_b.host_pages + load_b.disk_pages, 4);
  }
  fs::remove_all(dir);
}

TEST(HiCache, DiskTierSurvivesANewIndexAndRejectsDamage) {
  const fs::path dir = temp_dir("restart");
  const auto a = tokens(7, 3 * P);
  {
    // A host tier of one page: a's pages go to disk as soon as another prefix needs the device.
    Tiers t(3, 1, HiCacheWritePolicy::kWriteBack, dir.string());
    t.serve(a);
    t.serve(tokens(8, 3 * P));
    t.serve(tokens(9, 3 * P));
  }
  const PageKey root = root_page_key("model-a");
  const PageKey k0 = chain_page_key(root, std::span<const int32_t>(a).subspan(0, P));
  const PageKey k1 = chain_page_key(k0, std::span<const int32_t>(a).subspan(P, P));
  const PageKey k2 = chain_page_key(k1, std::span<const int32_t>(a).subspan(2 * P, P));
  for (const PageKey& k : {k0, k1, k2}) {
    ASSERT_TRUE(fs::exists(dir / (k.hex() + ".kvpage"))) << "page " << k.hex() << " not on disk";
  }
  {
    // A restarted server on the same directory: every page of a comes from disk.
    Tiers t(3, 2, HiCacheWritePolicy::kWriteThrough, dir.string());
    HiCacheLoad load;
    EXPECT_EQ(t.serve(a, &load), 3);
    EXPECT_EQ(load.disk_pages, 3);
    EXPECT_EQ(t.index.hicache()->disk->num_corrupt(), 0u);
  }
  {
    // Another model on the same directory never reads them.
    Tiers t(3, 2, HiCacheWritePolicy::kWriteBack, dir.string(), "model-b");
    EXPECT_EQ(t.serve(a), 0);
  }
  // Flip one payload byte of the second page, truncate the third: the hit stops at page one.
  {
    const fs::path p1 = dir / (k1.hex() + ".kvpage");
    std::fstream f(p1, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(100);
    char ch = 0;
    f.read(&ch, 1);
    ch = static_cast<char>(ch ^ 0x5a);
    f.seekp(100);
    f.write(&ch, 1);
  }
  {
    Tiers t(3, 2, HiCacheWritePolicy::kWriteBack, dir.string());
    HiCacheLoad load;
    EXPECT_EQ(t.serve(a, &load), 1);
    EXPECT_EQ(load.disk_pages, 1);
    EXPECT_EQ(t.index.hicache()->disk->num_corrupt(), 1u);
  }
  // The serve above recomputed pages 1 and 2; they were not evicted, so k1's file is still bad.
  const fs::path p0 = dir / (k0.hex() + ".kvpage");
  fs::resize_file(p0, fs::file_size(p0) - 9);
  {
    Tiers t(3, 2, HiCacheWritePolicy::kWriteBack, dir.string());
    EXPECT_EQ(t.serve(a), 0);
    EXPECT_EQ(t.index.hicache()->disk->num_corrupt(), 1u);
  }
  fs::remove_all(dir);
}

TEST(HiCache, BadDiskDirectoryIsAClearError) {
  FakeCopier copier(2);
  HiCacheOptions o;
  o.host_pages = 2;
  o.disk_dir = "/proc/m3-no-such-dir/kv";
  o.model_identity = "m";
  o.page_size = P;
  auto hc = make_hicache(&copier, o);
  ASSERT_FALSE(hc.is_ok());
  EXPECT_NE(hc.status().message().find("--hicache-storage-dir"), std::string::npos);
  o.disk_dir = "";
  o.host_pages = 0;
  EXPECT_FALSE(make_hicache(&copier, o).is_ok());
}

// Random turns of many conversations over tiny pools: invariants after every turn, every cached
// byte checked, and all accounting back to the baseline at the end.
// With the lazy copier too: saves that run late, as on a GPU, still leave the right bytes.
TEST(HiCache, RandomConversationsLeakNothing) {
  const fs::path dir = temp_dir("fuzz");
  for (bool lazy : {false, true})
  for (HiCacheWritePolicy policy : {HiCacheWritePolicy::kWriteBack, HiCacheWritePolicy::kWriteThrough}) {
    for (bool disk : {false, true}) {
      SCOPED_TRACE(std::string(lazy ? "lazy" : "eager") + " copier, " +
                   (policy == HiCacheWritePolicy::kWriteBack ? "write_back" : "write_through") +
                   (disk ? ", disk" : ""));
      Tiers t(8, 6, policy, disk ? dir.string() : "");
      t.copier.lazy = lazy;
      std::mt19937 rng(1234);
      std::vector<std::vector<int32_t>> convs(50);
      int32_t hits = 0;
      for (int turn = 0; turn < 1000; ++turn) {
        auto& c = convs[rng() % convs.size()];
        if (c.size() > 6 * P) c.resize(rng() % 3 * P);  // a new conversation in its slot
        const int32_t extra = 1 + static_cast<int32_t>(rng() % (2 * P));
        for (int32_t i = 0; i < extra; ++i) c.push_back(static_cast<int32_t>(rng() % 50));
        hits += t.serve(c);
        if (rng() % 50 == 0) t.index.evict(static_cast<int32_t>(rng() % 8));
        ASSERT_EQ(t.pool.num_used(), 0) << "turn " << turn << ": a device page leaked";
        ASSERT_EQ(t.index.check_invariants(), "") << "turn " << turn;
      }
      EXPECT_GT(hits, 0);
      EXPECT_GT(t.copier.releases, 0u);
      EXPECT_GT(t.index.hicache()->counters.host_hit_tokens, 0u);
      if (disk) {
        EXPECT_GT(t.index.hicache()->counters.disk_hit_tokens, 0u);
      }
      t.index.evict_all();
      EXPECT_EQ(t.pool.num_free(), t.pool.num_pages());
      EXPECT_EQ(t.index.check_invariants(), "");
      fs::remove_all(dir);
    }
  }
}

}  // namespace
}  // namespace m3
