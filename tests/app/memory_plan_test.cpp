// Memory planning (app/memory_plan.h) on MiniMax-M3.1-Flash's real shapes for devices this
// machine does not have: 1, 2, 4 and 8 GPUs of 141 GB, bf16 and fp8 KV caches.
#include "app/memory_plan.h"

#include <gtest/gtest.h>

#include "app/startup_report.h"
#include "model/minimax_m3/kv_cache.h"

#include <cmath>
#include <tuple>

#include "loader/checkpoint.h"
#include "model/minimax_m3/cuda/fit_check.h"
#include "model/minimax_m3/tensor_parallel.h"
#include "model/minimax_m3/dummy_weights.h"
#include "model/minimax_m3/weights.h"
#include "backend/cpu/cpu_backend.h"
#include "model/minimax_m3/dspark/dspark_draft.h"
#include "model/minimax_m3/dspark/dspark_dummy_weights.h"
#include "model/minimax_m3/dspark/dspark_engine_draft.h"
#include "model/minimax_m3/model_dir.h"

namespace m3::app {
namespace {

constexpr int64_t kH200 = 141'000'000'000;

MiniMaxM3Config flash() { return minimax_m3::builtin_m3_flash_config(60); }

TEST(MemoryPlan, FlashWeightBytesFromParameterCounts) {
  const MiniMaxM3Config c = flash();
  // Counted another way: parameters by storage format over the whole model.
  const double h = 6144, experts = 128, inter = 3072, vocab = 200064;
  const double attention = 64 * 128 * h * 2 + 4 * 128 * h * 2 + 4 * 128 * h + 128 * h;  // q o k v iq ik
  const double mxfp8_params = 60 * attention + 3 * 3 * 12288 * h + 57 * 3 * 3072 * h;
  const double nvfp4_params = 57 * experts * 3 * inter * h;
  const double bf16_params = 2 * vocab * h + 57 * experts * h;
  const double expected = mxfp8_params * (1 + 1.0 / 32) + nvfp4_params * (0.5 + 1.0 / 16) +
                          bf16_params * 2;
  const double one = static_cast<double>(weight_bytes_per_device(c, WeightStorage::kCheckpointFormats, 1));
  EXPECT_NEAR(one / expected, 1.0, 1e-3) << one;  // norms, biases and globals are the rest
  EXPECT_GT(one, 240e9);  // the checkpoint's text model is ~246 GB
  EXPECT_LT(one, 255e9);
  // Split over ranks: about 1/N each, the replicated router and norms on top.
  for (int ranks : {2, 4, 8}) {
    const double per = static_cast<double>(
        weight_bytes_per_device(c, WeightStorage::kCheckpointFormats, ranks));
    EXPECT_GT(per, one / ranks) << ranks;
    EXPECT_LT(per, one / ranks * 1.02) << ranks;
  }
  // The float32 path holds 4 bytes per parameter.
  const double f32 = static_cast<double>(weight_bytes_per_device(c, WeightStorage::kFloat32, 1));
  EXPECT_NEAR(f32 / (4 * (mxfp8_params + nvfp4_params + bf16_params)), 1.0, 1e-3);
}

TEST(MemoryPlan, KvPageBytesMatchTheRunnerAndSplitByHeads) {
  const MiniMaxM3Config c = flash();
  // bf16 on one device: what the real-shape runner allocates per page.
  EXPECT_EQ(kv_bytes_per_page_per_device(c, 1, 2, 2), minimax_m3::real_shape_kv_bytes_per_page(c));
  // 60 layers x 128 tokens x (K and V of 4 heads x 128 + one 128-wide index key).
  EXPECT_EQ(kv_bytes_per_page_per_device(c, 1, 2, 2), 60 * 128 * (2 * 4 * 128 * 2 + 128 * 2));
  EXPECT_EQ(kv_bytes_per_page_per_device(c, 1, 1, 2), 60 * 128 * (2 * 4 * 128 + 128 * 2));  // fp8
  // Two ranks hold two KV heads each; eight ranks still one (replicated); index keys everywhere.
  EXPECT_EQ(kv_bytes_per_page_per_device(c, 2, 2, 2), 60 * 128 * (2 * 2 * 128 * 2 + 128 * 2));
  EXPECT_EQ(kv_bytes_per_page_per_device(c, 8, 2, 2), kv_bytes_per_page_per_device(c, 4, 2, 2));
  // Attention data parallelism: a rank holds its group's pool, the heads split over tp / dp.
  EXPECT_EQ(kv_bytes_per_page_per_device(c, 4, 2, 2, 2), kv_bytes_per_page_per_device(c, 2, 2, 2));
  EXPECT_EQ(kv_bytes_per_page_per_device(c, 4, 2, 2, 4), kv_bytes_per_page_per_device(c, 1, 2, 2));
  EXPECT_GT(kv_bytes_per_page_per_device(c, 4, 2, 2, 4), kv_bytes_per_page_per_device(c, 4, 2, 2));
}

// --kv-cache-dtype: MiniMax-M3.1-Flash's bytes per token (60 layers of K and V of 4 heads x 128
// and a 128-wide index key) in each storage, the page-head scales spread over the page's tokens.
TEST(MemoryPlan, KvBytesPerTokenForEachDtype) {
  const MiniMaxM3Config c = flash();
  EXPECT_EQ(kv_bytes_per_page_for_dtype(c, 1, KvCacheDtype::kBF16), 138'240 * 128);
  EXPECT_EQ(kv_bytes_per_page_for_dtype(c, 1, KvCacheDtype::kBF16),
            minimax_m3::real_shape_kv_bytes_per_page(c));
  EXPECT_EQ(kv_bytes_per_page_for_dtype(c, 1, KvCacheDtype::kFloat32), 2 * 138'240 * 128);
  // fp8: a byte per element; a float per page-head: 9 page-heads (4 K, 4 V, 1 index) per layer.
  EXPECT_EQ(kv_bytes_per_page_for_dtype(c, 1, KvCacheDtype::kFp8E4M3),
            60 * (128 * (2 * 4 * 128 + 128) + 9 * 4));
  EXPECT_EQ(kv_bytes_per_page_for_dtype(c, 1, KvCacheDtype::kFp8E4M3), 69'136.875 * 128);
  // fp4: 64 bytes of codes and 8 E4M3 block scales per 128-element row, a float per page-head.
  EXPECT_EQ(kv_bytes_per_page_for_dtype(c, 1, KvCacheDtype::kFp4E2M1),
            60 * (128 * 9 * 72 + 9 * 4));
  EXPECT_EQ(kv_bytes_per_page_for_dtype(c, 1, KvCacheDtype::kFp4E2M1), 38'896.875 * 128);
  // Two ranks: two KV heads each, the index key whole on both.
  EXPECT_EQ(kv_bytes_per_page_for_dtype(c, 2, KvCacheDtype::kFp8E4M3),
            60 * (128 * (2 * 2 * 128 + 128) + 5 * 4));
  // The startup report's phrase.
  EXPECT_EQ(kv_pool_summary(KvCacheDtype::kFp8E4M3,
                            kv_bytes_per_page_for_dtype(c, 1, KvCacheDtype::kFp8E4M3), 128, 4096),
            "kv dtype fp8_e4m3 (69136.875 bytes per token), 4096 tokens fit");
  EXPECT_EQ(kv_pool_summary(KvCacheDtype::kBF16, 138'240 * 128, 128, 1024),
            "kv dtype bf16 (138240 bytes per token), 1024 tokens fit");
}

// The planned page bytes are what the CPU cache allocates per page in every dtype, so the pool
// holds the planned number of tokens.
TEST(MemoryPlan, KvBytesPerPageAreWhatTheCacheAllocates) {
  const MiniMaxM3Config c = minimax_m3::builtin_m3_flash_config(4);
  CpuBackend backend(1);
  for (KvCacheDtype d : {KvCacheDtype::kFloat32, KvCacheDtype::kBF16, KvCacheDtype::kFp8E4M3,
                         KvCacheDtype::kFp4E2M1}) {
    minimax_m3::PagedKvCache one(&backend, c, 1, d);
    EXPECT_EQ(one.bytes_per_page(), kv_bytes_per_page_for_dtype(c, 1, d))
        << kv_cache_dtype_name(d);
  }
}

struct FlashCase {
  int gpus;
  double kv_bytes;  // 2 bf16, 1 fp8
};

MemoryPlanInput flash_input(int gpus, double kv_bytes, double fraction) {
  const MiniMaxM3Config c = flash();
  MemoryPlanInput in;
  in.device_name = "GPU";
  in.device_memory_bytes = kH200;
  in.ranks = gpus;
  in.mem_fraction_static = fraction;
  in.weight_bytes = weight_bytes_per_device(c, WeightStorage::kCheckpointFormats, gpus);
  in.activation_bytes =
      activation_bytes_per_device(c, WeightStorage::kCheckpointFormats, gpus, 32768, 128);
  in.kv_bytes_per_page = kv_bytes_per_page_per_device(c, gpus, kv_bytes, 2);
  in.page_size = 128;
  in.max_context_length = 524288;
  return in;
}

TEST(MemoryPlan, FlashOnH200s) {
  for (double kv : {2.0, 1.0}) {
    SCOPED_TRACE(kv == 2 ? "bf16 KV" : "fp8 KV");
    // One GPU: the weights alone exceed the fraction.
    auto one = plan_memory(flash_input(1, kv, 0.85));
    ASSERT_FALSE(one.is_ok());
    EXPECT_NE(one.status().message().find("--tp"), std::string::npos) << one.status().message();
    EXPECT_NE(one.status().message().find("weight bytes"), std::string::npos);
    // Two GPUs at 0.85 do not hold the weights (~124 GB each of 119.9); at 0.9 they do, with a
    // pool too small for the model's 512K context: it is capped, with a warning naming both.
    EXPECT_FALSE(plan_memory(flash_input(2, kv, 0.85)).is_ok());
    const MemoryPlanInput two = flash_input(2, kv, 0.9);
    auto p2 = plan_memory(two);
    ASSERT_TRUE(p2.is_ok()) << p2.status().to_string();
    const int64_t static_bytes = static_cast<int64_t>(0.9 * kH200);
    const int64_t reserve = std::max<int64_t>(0, two.activation_bytes - (kH200 - static_bytes));
    EXPECT_EQ(p2->reserve_bytes, reserve);
    const int64_t left = static_bytes - two.weight_bytes - reserve;
    EXPECT_EQ(p2->pages, left / two.kv_bytes_per_page);
    EXPECT_EQ(p2->kv_cache_bytes, p2->pages * two.kv_bytes_per_page);
    EXPECT_EQ(p2->max_tokens, p2->pages * 128);
    EXPECT_LT(p2->context_length, 524288);
    EXPECT_EQ(p2->context_length, p2->max_tokens);
    std::printf("[ %-40s ] 2 x 141 GB, %s KV, 0.9: %lld pages, %lld tokens\n",
                "memory plan M3.1-Flash", kv == 2 ? "bf16" : "fp8", (long long)p2->pages,
                (long long)p2->max_tokens);
    if (kv == 2) {
      EXPECT_EQ(p2->pages, 264) << "docs/memory.md's table";
    }
    ASSERT_EQ(p2->warnings.size(), 1u);
    EXPECT_NE(p2->warnings[0].find("524288"), std::string::npos) << p2->warnings[0];
    EXPECT_NE(p2->warnings[0].find(std::to_string(p2->max_tokens)), std::string::npos);
    // An explicit context the pool cannot hold is an error, not a cap.
    MemoryPlanInput two_long = two;
    two_long.context_length = 524288;
    auto e2 = plan_memory(two_long);
    ASSERT_FALSE(e2.is_ok());
    EXPECT_NE(e2.status().message().find("524288"), std::string::npos) << e2.status().message();
    // Four and eight GPUs: the whole context, several requests of it, no warning.
    int64_t last_pages = 0;
    for (int gpus : {4, 8}) {
      const MemoryPlanInput in = flash_input(gpus, kv, 0.85);
      auto p = plan_memory(in);
      ASSERT_TRUE(p.is_ok()) << gpus << ": " << p.status().to_string();
      EXPECT_EQ(p->context_length, 524288) << gpus;
      EXPECT_TRUE(p->warnings.empty()) << gpus;
      EXPECT_EQ(p->reserve_bytes, 0) << "the step fits in the other 15 %";
      EXPECT_EQ(p->pages, (static_cast<int64_t>(0.85 * kH200) - in.weight_bytes) /
                              in.kv_bytes_per_page)
          << gpus;
      EXPECT_GE(p->max_tokens, 2 * 524288) << gpus;
      if (kv == 2) {
        EXPECT_EQ(p->pages, gpus == 4 ? 9763 : 15009) << "docs/memory.md's table";
      }
      EXPECT_GT(p->pages, last_pages);
      last_pages = p->pages;
      std::printf("[ %-40s ] %d x 141 GB, %s KV, 0.85: %lld pages, %lld tokens\n",
                  "memory plan M3.1-Flash", gpus, kv == 2 ? "bf16" : "fp8",
                  (long long)p->pages, (long long)p->max_tokens);
    }
  }
  // fp8 halves K and V, not the bf16 index keys: at one KV head per rank (4 GPUs) the pages are
  // 2/3 the size, so 1.5x the tokens.
  auto bf16 = plan_memory(flash_input(4, 2, 0.85));
  auto fp8 = plan_memory(flash_input(4, 1, 0.85));
  ASSERT_TRUE(bf16.is_ok() && fp8.is_ok());
  EXPECT_NEAR(static_cast<double>(fp8->max_tokens) / static_cast<double>(bf16->max_tokens), 1.5,
              0.01);
}

// The real-shape GPU kernels' pages by --kv-cache-dtype (fit_check.h: K, V and the index keys all
// in the dtype, with their scales, and for a quantised pool one layer's bf16 staging pages), per
// rank at --tp N: the tokens a pool of H200s holds, as docs/memory.md's table gives them.
TEST(MemoryPlan, FlashOnH200sByGpuKvDtype) {
  const MiniMaxM3Config c = flash();
  for (int gpus : {2, 4, 8}) {
    const MiniMaxM3Config rc = minimax_m3::rank_config(c, 0, gpus);
    int64_t bf16_tokens = 0;
    for (KvCacheDtype d : {KvCacheDtype::kBF16, KvCacheDtype::kFp8E4M3, KvCacheDtype::kFp4E2M1}) {
      MemoryPlanInput in = flash_input(gpus, 2, gpus == 2 ? 0.9 : 0.85);
      const int64_t page = minimax_m3::real_shape_kv_pool_bytes_per_page(rc, d);
      if (d == KvCacheDtype::kBF16) {
        EXPECT_EQ(page, in.kv_bytes_per_page) << gpus;
      }
      in.kv_bytes_per_page = page;
      auto p = plan_memory(in);
      ASSERT_TRUE(p.is_ok()) << gpus << " " << kv_cache_dtype_name(d) << ": "
                             << p.status().to_string();
      std::printf("[ %-40s ] %d x 141 GB, %s KV on the GPU kernels: %.1f bytes per token, %lld "
                  "pages, %lld tokens\n",
                  "memory plan M3.1-Flash", gpus, kv_cache_dtype_name(d), double(page) / 128,
                  (long long)p->pages, (long long)p->max_tokens);
      if (d == KvCacheDtype::kBF16) {
        bf16_tokens = p->max_tokens;
        continue;
      }
      // The pool is the same bytes: the tokens scale with the page's size (to one page).
      const double ratio =
          double(page) / double(minimax_m3::real_shape_kv_bytes_per_page(rc, KvCacheDtype::kBF16));
      EXPECT_NEAR(double(p->max_tokens), double(bf16_tokens) / ratio, 128.0 / ratio + 128.0);
      EXPECT_GT(p->max_tokens, bf16_tokens * (d == KvCacheDtype::kFp8E4M3 ? 19 : 33) / 10);
    }
  }
}

// A 1,048,576-token context (a config whose max_position_embeddings allows it): one request is
// 8,192 KV pages of 128 tokens, 1,048,576 x 138,240 bytes in bf16 on one device (beyond int32;
// the plan's arithmetic is int64). Four and eight 141 GB devices hold it with bf16 and fp8 KV;
// two do not, and an explicit --context-length 1048576 there is an error naming the pages.
TEST(MemoryPlan, FlashAtOneMillionTokens) {
  constexpr int32_t kMillion = 1'048'576;
  const MiniMaxM3Config c = flash();
  EXPECT_EQ(int64_t{kMillion} / 128 * kv_bytes_per_page_for_dtype(c, 1, KvCacheDtype::kBF16),
            int64_t{kMillion} * 138'240);
  EXPECT_EQ(kv_pool_summary(KvCacheDtype::kBF16, 138'240 * 128, 128, kMillion),
            "kv dtype bf16 (138240 bytes per token), 1048576 tokens fit");
  for (double kv : {2.0, 1.0}) {
    SCOPED_TRACE(kv == 2 ? "bf16 KV" : "fp8 KV");
    for (int gpus : {4, 8}) {
      MemoryPlanInput in = flash_input(gpus, kv, 0.85);
      in.max_context_length = kMillion;
      in.context_length = kMillion;
      auto p = plan_memory(in);
      ASSERT_TRUE(p.is_ok()) << gpus << ": " << p.status().to_string();
      EXPECT_EQ(p->context_length, kMillion) << gpus;
      EXPECT_GE(p->pages, 8'192) << gpus;
      EXPECT_GE(p->kv_cache_bytes, int64_t{8'192} * in.kv_bytes_per_page) << gpus;
      EXPECT_TRUE(p->warnings.empty()) << gpus;
    }
    MemoryPlanInput two = flash_input(2, kv, 0.9);
    two.max_context_length = kMillion;
    two.context_length = kMillion;
    auto e = plan_memory(two);
    ASSERT_FALSE(e.is_ok());
    EXPECT_NE(e.status().message().find("1048576 needs 8192 pages"), std::string::npos)
        << e.status().message();
  }
}

TEST(MemoryPlan, WorkingMemoryBeyondTheRestIsReserved) {
  MemoryPlanInput in;
  in.device_name = "GPU";
  in.device_memory_bytes = 1000;
  in.mem_fraction_static = 0.8;
  in.weight_bytes = 300;
  in.activation_bytes = 250;  // 50 more than the 200 outside the fraction
  in.kv_bytes_per_page = 10;
  in.page_size = 4;
  in.max_context_length = 64;
  auto p = plan_memory(in);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(p->reserve_bytes, 50);
  EXPECT_EQ(p->pages, (800 - 300 - 50) / 10);
  in.activation_bytes = 150;
  EXPECT_EQ(plan_memory(in)->reserve_bytes, 0);
  EXPECT_EQ(plan_memory(in)->pages, 50);
  in.mem_fraction_static = 1.5;
  EXPECT_FALSE(plan_memory(in).is_ok());
}

// After a profile step the pool never takes more than the step left free (less the headroom),
// even where the fraction's rule would: the working memory may use all of (1 - F).
TEST(MemoryPlan, MeasuredFreeMemoryCapsThePool) {
  MemoryPlanInput in;
  in.device_name = "GPU";
  in.device_memory_bytes = 1000;
  in.mem_fraction_static = 0.85;
  in.weight_bytes = 260;
  in.activation_bytes = 230;  // 80 reserved inside F: the pool would be 850 - 260 - 80 = 510
  in.kv_bytes_per_page = 10;
  in.page_size = 4;
  in.max_context_length = 64;
  ASSERT_EQ(plan_memory(in)->pages, 51);
  in.free_bytes_limit = 1000 - 260 - 230 - 25;  // free after the step, less a headroom of 25
  auto p = plan_memory(in);
  ASSERT_TRUE(p.is_ok()) << p.status().to_string();
  EXPECT_EQ(p->pages, 48);
  EXPECT_LE(in.weight_bytes + in.activation_bytes + p->kv_cache_bytes, 1000 - 25);
  ASSERT_EQ(p->warnings.size(), 1u);
  EXPECT_NE(p->warnings[0].find("free"), std::string::npos) << p->warnings[0];
  EXPECT_NE(p->sized_by.find("capped at the memory free"), std::string::npos) << p->sized_by;
  in.free_bytes_limit = 10000;  // a limit above the fraction's pool changes nothing
  EXPECT_EQ(plan_memory(in)->pages, 51);
  EXPECT_TRUE(plan_memory(in)->warnings.empty());
  in.free_bytes_limit = 5;  // less than a page: the plan says so
  EXPECT_FALSE(plan_memory(in).is_ok());
}

TEST(MemoryPlan, ExplicitBytesDefaultsAndTheRunningCap) {
  MemoryPlanInput in;
  in.device_name = "CPU";
  in.device_memory_bytes = 1'000'000;
  in.kv_bytes_per_page = 100;
  in.page_size = 32;
  in.max_context_length = 4096;
  // --kv-cache-bytes wins over a fraction.
  in.kv_cache_bytes = 12'345;
  in.mem_fraction_static = 0.5;
  auto p = plan_memory(in);
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(p->pages, 123);
  EXPECT_EQ(p->kv_cache_bytes, 12'300);
  EXPECT_NE(p->sized_by.find("--kv-cache-bytes 12345"), std::string::npos);
  EXPECT_EQ(p->context_length, 123 * 32) << "capped to the pool, with a warning";
  EXPECT_EQ(p->warnings.size(), 1u);
  // Too small for one page: the error names the flag and the pages.
  in.kv_cache_bytes = 50;
  auto small = plan_memory(in);
  ASSERT_FALSE(small.is_ok());
  EXPECT_NE(small.status().message().find("--kv-cache-bytes 50 holds 0 KV pages"),
            std::string::npos)
      << small.status().message();
  // A fraction with the running cap: 0.5 of 1 MB = 5000 pages, capped at 2 requests of 4096.
  in.kv_cache_bytes = 0;
  in.cap_to_running_requests = 2;
  p = plan_memory(in);
  ASSERT_TRUE(p.is_ok());
  EXPECT_EQ(p->pages, 2 * 128);
  EXPECT_EQ(p->context_length, 4096);
  // No fraction: the default pool, grown to one request of an explicit context length.
  in.mem_fraction_static = 0;
  in.cap_to_running_requests = 0;
  in.default_kv_cache_bytes = 1000;
  EXPECT_EQ(plan_memory(in)->pages, 10);
  in.context_length = 1000;
  EXPECT_EQ(plan_memory(in)->pages, (1000 - 1 + 31) / 32);
  EXPECT_EQ(plan_memory(in)->context_length, 1000);
  // No default either: exactly one request (generate, score).
  in.default_kv_cache_bytes = 0;
  in.context_length = 65;
  EXPECT_EQ(plan_memory(in)->pages, 2);
  in.context_length = 5000;
  EXPECT_FALSE(plan_memory(in).is_ok()) << "beyond max_position_embeddings";
}

TEST(MemoryPlan, AvailableHostMemoryFromMeminfo) {
  auto m = available_host_memory("MemTotal:       24000000 kB\nMemFree:  100 kB\n"
                                 "MemAvailable:   20000000 kB\n");
  ASSERT_TRUE(m.is_ok());
  EXPECT_EQ(*m, int64_t{20000000} * 1024);
  EXPECT_FALSE(available_host_memory("MemTotal: 1 kB\n").is_ok());
  EXPECT_TRUE(available_host_memory().is_ok()) << "this machine's /proc/meminfo";
  EXPECT_EQ(format_bytes(141'000'000'000), "141.0 GB");
}

// Weights per rank of M3.1-Flash under --tp 2/4/8 with --ep 1/2/4/8 (ep dividing tp), from the
// config alone: every rank holds E/ep routed experts at 1/(tp/ep) of their intermediate width, so
// the routed experts' payload per rank is 1/tp of the whole under any ep, and what ep changes is
// the count of per-tensor NVFP4 global scales (4 bytes each, 3 tensors per expert held).
TEST(MemoryPlan, FlashWeightBytesPerRankUnderExpertParallelism) {
  const MiniMaxM3Config c = flash();
  const double one =
      static_cast<double>(weight_bytes_per_device(c, WeightStorage::kCheckpointFormats, 1));
  const int64_t moe_layers = 57, experts = 128;
  for (int tp : {2, 4, 8}) {
    const int64_t tp_only = weight_bytes_per_device(c, WeightStorage::kCheckpointFormats, tp, 1);
    for (int ep : {2, 4, 8}) {
      if (tp % ep != 0) continue;
      const int64_t per = weight_bytes_per_device(c, WeightStorage::kCheckpointFormats, tp, ep);
      const int64_t scales_dropped = moe_layers * (experts - experts / ep) * 3 * 4;
      EXPECT_NEAR(static_cast<double>(tp_only - per), static_cast<double>(scales_dropped), 2.0)
          << "tp " << tp << " ep " << ep;
      EXPECT_GT(static_cast<double>(per), one / tp) << tp << " " << ep;
      EXPECT_LT(static_cast<double>(per), one / tp * 1.02) << tp << " " << ep;
      // The float32 path: the same routed payload whatever ep (no per-tensor scales).
      EXPECT_EQ(weight_bytes_per_device(c, WeightStorage::kFloat32, tp, ep),
                weight_bytes_per_device(c, WeightStorage::kFloat32, tp, 1));
      std::printf("[ %-40s ] --tp %d --ep %d: %s per rank (%lld routed experts each)\n",
                  "memory plan M3.1-Flash weights", tp, ep, format_bytes(per).c_str(),
                  static_cast<long long>(experts / ep));
    }
  }
  // --ep 8 on 8 ranks: 16 whole experts of 3 x 3072 x 6144 NVFP4 per MoE layer per rank.
  const double expert_bytes = 3 * (3072.0 * 6144 * (0.5 + 1.0 / 16) + 4);
  const double routed_per_rank = moe_layers * 16 * expert_bytes;
  const double per8 =
      static_cast<double>(weight_bytes_per_device(c, WeightStorage::kCheckpointFormats, 8, 8));
  EXPECT_GT(per8, routed_per_rank);
  // The rest (attention, dense and shared MLPs, vocabulary) is split 8 ways; the replicated KV
  // heads and norms add a little, and every rank holds the whole float32 router.
  const double router = moe_layers * experts * 6144 * 4.0;
  EXPECT_LT(per8 - routed_per_rank, (one - moe_layers * experts * expert_bytes) / 8 * 1.1 + router);
}

// Sum of the weight buffers the float32 loader holds for one rank.
int64_t loaded_bytes(const minimax_m3::ModelWeights& w) {
  int64_t n = w.embed.size() + w.final_norm.size() + w.lm_head.size();
  for (const minimax_m3::LayerWeights& l : w.layers) {
    for (const DeviceBuffer<float>* b :
         {&l.input_norm, &l.post_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.q_norm, &l.k_norm, &l.wiq,
          &l.wik, &l.iq_norm, &l.ik_norm, &l.mlp_w13, &l.mlp_w2, &l.router, &l.router_bias,
          &l.shared_w13, &l.shared_w2})
      n += b->size();
    for (const auto& e : l.expert_w13) n += e.size();
    for (const auto& e : l.expert_w2) n += e.size();
  }
  return n * static_cast<int64_t>(sizeof(float));
}

// The float32 plan per rank is what the loader holds on every rank of the bundled model, under
// tensor and expert parallelism, and the loader reads only the rank's experts.
TEST(MemoryPlan, Float32WeightsPerRankAreWhatTheLoaderHolds) {
  const std::string dir = std::string(M3_REPO_ROOT) + "/models/m3-tiny";
  auto cfg = load_minimax_m3_config(dir);
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  auto ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  // Records the names read.
  struct Recording final : WeightSource {
    const WeightSource& inner;
    mutable std::vector<std::string> read;
    explicit Recording(const WeightSource& s) : inner(s) {}
    bool has(const std::string& n) const override { return inner.has(n); }
    Result<WeightFormat> format(const std::string& n) const override { return inner.format(n); }
    Result<HostTensorF32> load_f32(const std::string& n,
                                   const std::vector<int64_t>& shape) const override {
      read.push_back(n);
      return inner.load_f32(n, shape);
    }
    std::vector<std::string> names() const override { return inner.names(); }
  };
  const int64_t experts = cfg->num_local_experts;
  // (tp, ep, dp): under --dp a rank holds its attention group's (tp / dp ranks') heads.
  for (auto [tp, ep, dp] : std::vector<std::tuple<int, int, int>>{
           {1, 1, 1}, {2, 1, 1}, {4, 1, 1}, {2, 2, 1}, {4, 4, 1}, {4, 2, 1}, {8, 8, 1},
           {2, 1, 2}, {4, 1, 2}, {4, 2, 2}}) {
    for (int rank : {0, tp - 1}) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " ep " + std::to_string(ep) + " dp " +
                   std::to_string(dp) + " rank " + std::to_string(rank));
      CpuBackend backend(1);
      Recording src(**ckpt);
      minimax_m3::ParallelLayout layout{rank, tp, nullptr, ep};
      layout.dp = dp;
      auto w = minimax_m3::load_weights(src, *cfg, &backend, layout);
      ASSERT_TRUE(w.is_ok()) << w.status().to_string();
      EXPECT_EQ(loaded_bytes(*w),
                weight_bytes_per_device(*cfg, WeightStorage::kFloat32, tp, ep, dp));
      const int64_t begin = rank / (tp / ep) * (experts / ep), end = begin + experts / ep;
      for (const std::string& n : src.read) {
        const size_t at = n.find(".experts.");
        if (at == std::string::npos) continue;
        const int64_t e = std::stoll(n.substr(at + 9));
        EXPECT_TRUE(e >= begin && e < end) << n << " read on a rank holding experts [" << begin
                                           << ", " << end << ")";
      }
    }
  }
}

// The DSpark draft's memory (docs/dspark.md, "Memory"). The released shape by hand from the
// weight table; the m3-tiny default draft against what the loader actually reads and what a
// context cache actually allocates.
DraftMemoryShape released_draft() {
  DraftMemoryShape d;
  d.hidden = 6144, d.layers = 5, d.heads = 64, d.kv_heads = 4, d.head_dim = 128;
  d.intermediate = 12288, d.vocab = 200064, d.markov_rank = 256, d.sliding_window = 4096;
  d.num_target_layers = 5, d.confidence_head = true, d.confidence_with_markov = true;
  return d;
}

TEST(MemoryPlan, DSparkDraftBytesOfTheReleasedShape) {
  const DraftMemoryShape d = released_draft();
  // fc 6144 x 30720; two norms; Markov w1, w2 200064 x 256; confidence [1, 6144 + 256] + bias;
  // per layer four norms (2 x 6144 + 2 x 128), q/o 8192 x 6144, k/v 512 x 6144, MLP 3 x 12288 x
  // 6144.
  const int64_t per_layer = 2 * 6144 + 2 * 128 + 2 * 8192LL * 6144 + 2 * 512LL * 6144 +
                            3 * 12288LL * 6144;
  const int64_t params = 6144LL * 30720 + 2 * 6144 + 2 * 200064LL * 256 + (6144 + 256 + 1) +
                         5 * per_layer;
  EXPECT_EQ(params, 1'958'493'697);
  EXPECT_EQ(draft_weight_bytes(d), params * 4);
  // 5 layers x K and V x (4096 / 128 + 3) pages x 128 positions x 4 heads x 128 dims x 4 bytes:
  // the "about 80 MB per running sequence" of docs/dspark.md.
  EXPECT_EQ(draft_context_bytes_per_sequence(d), 5LL * 2 * 35 * 128 * 4 * 128 * 4);
  EXPECT_EQ(draft_feature_bytes_per_kv_page(d, 128), 5LL * 6144 * 128 * 4);
}

TEST(MemoryPlan, DSparkDraftBytesMatchWhatIsLoadedAndAllocated) {
  CpuBackend backend(1);
  auto target = minimax_m3::load_model_dir(std::string(M3_REPO_ROOT) + "/models/m3-tiny", &backend);
  ASSERT_TRUE(target.is_ok()) << target.status().to_string();
  const minimax_m3::dspark::DSparkConfig cfg =
      minimax_m3::dspark::default_dspark_config_for(target->config);
  // Counts the elements of every tensor the draft's loader reads.
  struct Counting final : WeightSource {
    const WeightSource& inner;
    mutable int64_t elements = 0;
    explicit Counting(const WeightSource& w) : inner(w) {}
    bool has(const std::string& n) const override { return inner.has(n); }
    Result<WeightFormat> format(const std::string& n) const override { return inner.format(n); }
    Result<HostTensorF32> load_f32(const std::string& n,
                                   const std::vector<int64_t>& shape) const override {
      auto t = inner.load_f32(n, shape);
      if (t.is_ok()) elements += t->numel();
      return t;
    }
    std::vector<std::string> names() const override { return inner.names(); }
  };
  minimax_m3::dspark::DummyDSparkWeightSource dummy(cfg, 3);
  Counting src(dummy);
  auto draft = minimax_m3::dspark::DSparkDraft::load(
      cfg, target->config, src, "dummy",
      minimax_m3::dspark::TargetSharedWeights::view_of(target->model->weights()), &backend);
  ASSERT_TRUE(draft.is_ok()) << draft.status().to_string();
  DraftMemoryShape d;
  d.hidden = cfg.hidden_size, d.layers = cfg.num_hidden_layers, d.heads = cfg.num_attention_heads;
  d.kv_heads = cfg.num_key_value_heads, d.head_dim = cfg.head_dim;
  d.intermediate = cfg.intermediate_size, d.vocab = cfg.vocab_size, d.markov_rank = cfg.markov_rank;
  d.sliding_window = cfg.sliding_window;
  d.num_target_layers = static_cast<int64_t>(cfg.target_layer_ids.size());
  d.confidence_head = cfg.enable_confidence_head;
  d.confidence_with_markov = cfg.confidence_head_with_markov;
  EXPECT_EQ(draft_weight_bytes(d), src.elements * 4);
  auto cache = (*draft)->new_cache();
  EXPECT_EQ(draft_context_bytes_per_sequence(d),
            cfg.num_hidden_layers * 2 * cache->capacity_pages() * cache->page_size() *
                cfg.num_key_value_heads * cfg.head_dim * 4);
}

TEST(MemoryPlan, TheDraftShrinksTheKvPool) {
  MemoryPlanInput in;
  in.device_name = "CPU";
  in.device_memory_bytes = 4'000'000'000;
  in.mem_fraction_static = 0.5;
  in.weight_bytes = 500'000'000;
  in.activation_bytes = 100'000'000;
  in.kv_bytes_per_page = 1'000'000;
  in.page_size = 128;
  in.max_context_length = 4096;
  auto plain = plan_memory(in);
  ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
  // engine_stack adds the draft's weights and context caches to the static part and its features
  // to every page.
  in.weight_bytes += 300'000'000;
  in.kv_bytes_per_page += 250'000;
  auto with_draft = plan_memory(in);
  ASSERT_TRUE(with_draft.is_ok()) << with_draft.status().to_string();
  EXPECT_LT(with_draft->pages, plain->pages);
  EXPECT_EQ(with_draft->pages, (plain->kv_cache_bytes - 300'000'000) / 1'250'000)
      << "the pool is what is left after the draft, in pages that carry the features";
}

// MiniMax-M3's vision tower as CudaVisionTower holds it: 865.0 M bf16 matrix elements (1,280 x
// 1,176 patch embedding; 32 layers of q, k, v, o 1,280 x 1,280 and the MLP 2 x 1,280 x 5,120;
// projector 6,144 x 1,280 and 6,144 x 6,144; merge MLP 6,144 x 24,576 and 6,144 x 6,144) and
// 0.42 M float32 norms and biases.
TEST(MemoryPlan, VisionTowerOnTheGpu) {
  VisionConfig v;  // the M3 defaults
  const int64_t matrices = 1280LL * 1176 + 32 * (4 * 1280LL * 1280 + 2 * 1280LL * 5120) +
                           6144LL * 1280 + 6144LL * 6144 + 6144LL * 24576 + 6144LL * 6144;
  const int64_t vectors = 2 * 1280 + 32 * (9 * 1280 + 5120) + 4 * 6144;
  EXPECT_EQ(vision_tower_gpu_bytes(v), 2 * matrices + 4 * vectors);
  EXPECT_NEAR(double(vision_tower_gpu_bytes(v)), 1.73e9, 0.01e9);
}

}  // namespace
}  // namespace m3::app
