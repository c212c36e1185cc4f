// The batch-1 MoE block in one persistent launch (moe_block_stream.h). Layout of one CTA (one per
// SM): warps 0..15 consume, warp 16 produces, warp 17 computes the routing.
//
//  * Work items per op: router rows (one bulk copy of a bf16 row each), 16-row tiles of the
//    MXFP8 shared expert (a stage = 1024 K: 8 consecutive 2-KB runs of the mma layout, one bulk
//    copy, and 16 rows x 32 E8M0 bytes by cp.async), 16-row tiles of each routed expert (a stage
//    = 2048 K of the NVFP4 mma layout, one bulk copy, and 16 rows x 128 E4M3 bytes: variant 6's
//    stage). CTA c takes the contiguous items [c·I/C, (c+1)·I/C) of each op.
//  * Slots: one ring of shared-memory slots with a "full" and an "empty" mbarrier each, used in
//    the same order by the producer and the consumers across all ops (variant 6's protocol).
//    Until the routing is known the producer keeps only kEarlyDepth stages in flight (a deep
//    queue delays every dependent load); after it, the whole ring.
//  * Routing: every CTA's control warp waits for the router rows of all CTAs (a global
//    counter), reads the logits and runs the same top-k (so no further round trip through
//    memory stands between the logits and the routed weights); CTA 0 also stores the routing
//    outputs for the kernels after this one. It hands the routing to its producer and consumers
//    through shared memory and an mbarrier.
//  * Counters (global, per launch site): the router rows done, the shared and routed gate|up
//    tiles done, the CTAs done. A producer of data that another CTA reads fences its stores and
//    adds 1; a waiter spins on ld.acquire with a back-off (one thread), then the consumer warps
//    pass a named barrier and read the data through L2 (ld.cg: never a stale L1 line). The last
//    CTA to finish sets the counters back to zero (graph replays).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <string>

#include "backend/cuda/gemm/quant_gemv_stream.cuh"
#include "backend/cuda/moe/moe_block_stream.h"
#include "backend/cuda/moe/routing_device.cuh"
#include "backend/cuda/runtime/cp_async.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/mbarrier.cuh"
#include "backend/cuda/runtime/pdl.cuh"
#include "backend/cuda/runtime/stream.h"

namespace m3::cuda {
namespace {

using gemv::consumers_sync;
using gemv::stream_mxfp8_block;
using gemv::e8m0_exact;
using gemv::mma_fragment_store;
using gemv::mma_tile_weight_row;

constexpr int kConsumers = gemv::kStreamConsumers;  // 16 (consumers_sync counts them)
constexpr int kProducerWarp = kConsumers, kControlWarp = kConsumers + 1;
constexpr int kThreads = 32 * (kConsumers + 2);
constexpr int kSlotWeights = 16384;
constexpr int kMxScaleStride = 48;    // E8M0 bytes per row per stage: 32 (rows on other banks)
constexpr int kFp4ScaleStride = 144;  // E4M3 bytes per row per stage: 128
constexpr int kSlotBytes = kSlotWeights + 16 * kFp4ScaleStride;
constexpr int kMxStageK = 1024;  // MXFP8: 8 runs of the mma layout (2 KB = 16 rows x 128)
constexpr int kMxRunBytes = 2048;
constexpr int kFp4ChunkK = 128;  // NVFP4: a (tile, chunk) block of the mma layout is 1 KB
constexpr int kFp4StageChunks = 16;
constexpr int kRedBytes = 2 * kConsumers * 32 * 16;
constexpr int kMiscBytes = 1024;
constexpr int kMaxRing = 16;
// Stages in flight per SM until the routing is known (then the whole ring): enough for the
// bandwidth (~0.8 us x 4.8 TB/s / 132 SMs is ~30 KB), no more, because every request queued
// beyond that delays the dependent loads (router rows, logits, counters) by its share of the
// queue. H200: the router rows were done 2.3 / 3.1 / 5.9 us after the start with 2 / 4 / 10
// stages in flight.
constexpr int kEarlyDepth = 3;
// Bytes of an f16 activation row of K elements in shared memory (+64: rows of a quarter-warp on
// other banks; 128-byte multiples).
__host__ __device__ constexpr int act_row_bytes(int64_t k) {
  return static_cast<int>((2 * k + 64 + 127) / 128 * 128);
}
constexpr int kMinRing = 4;

enum CounterId : int {
  kRouterDone = 0,
  kSharedGuDone = 1,
  kExpertsGuDone = 2,
  kCtasDone = 3,
};

// The routing of the token as every CTA's control warp computed it (shared memory): routed slot
// s < count goes through expert group[s] with routed row row[s] (one token: an expert takes at
// most one row), and the NVFP4 multipliers of that expert (x 128, mma_fragment_tokens' factor).
struct RoutingSmem {
  int32_t count;
  int32_t ids[routing::kMaxTopK];  // the top-k's expert per slot, ascending
  int32_t group[routing::kMaxTopK], row[routing::kMaxTopK];
  float gm_gu[routing::kMaxTopK], gm_down[routing::kMaxTopK];
  int32_t scratch_ids[routing::kMaxTopK];  // top-k outputs of the CTAs that do not store them
  float scratch_w[routing::kMaxTopK];
};

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void spin_until(const uint32_t* p, uint32_t target) {
  // Backed off, since every CTA polls the same words (its own effect was not measured apart).
  while (ld_acquire(p) < target) __nanosleep(64);
  __threadfence();
}

// [lo, hi) of `items` for CTA c of C.
__device__ __forceinline__ int2 item_range(int64_t items, int c, int C) {
  return make_int2(static_cast<int>(items * c / C), static_cast<int>(items * (c + 1) / C));
}

__device__ __forceinline__ int mx_stages(const QuantGemvParams& q) {
  return static_cast<int>(q.k / kMxStageK);
}
__device__ __forceinline__ int fp4_stages(const QuantGemvParams& q) {
  const int units = static_cast<int>(q.k / kFp4ChunkK);
  return (units + kFp4StageChunks - 1) / kFp4StageChunks;
}

using routing::dot8;
using routing::unpack8;

// The grouping of one token's routed rows (n <= 32, ids in shared memory) by one warp: the
// outputs of routing::group_by_expert_block for the same ids (ids outside [0, E) dropped).
__device__ void group_one_token(const int32_t* ids, int n, int num_experts, int32_t* offs,
                                int32_t* sorted, int32_t* active) {
  const int lane = threadIdx.x & 31;
  auto valid = [&](int32_t v) { return v >= 0 && v < num_experts; };
  const int32_t id = lane < n ? ids[lane] : -1;
  bool first = lane < n && valid(id);
  for (int i = 0; i < lane && i < n; ++i)
    if (ids[i] == id) first = false;
  for (int e = lane; e <= num_experts; e += 32) {
    int c = 0;
    for (int j = 0; j < n; ++j) c += valid(ids[j]) && ids[j] < e ? 1 : 0;
    offs[e] = c;
  }
  if (lane < n && valid(id)) {
    int pos = 0, slot = 0;
    for (int i = 0; i < n; ++i) {
      const int32_t v = ids[i];
      if (!valid(v)) continue;
      pos += v < id || (v == id && i < lane) ? 1 : 0;
      bool earlier = false;  // v's first occurrence is at i
      for (int j = 0; j < i; ++j) earlier = earlier || ids[j] == v;
      slot += !earlier && v < id ? 1 : 0;
    }
    sorted[pos] = lane;
    if (first) active[slot] = id;
  }
  const int distinct = __popc(__ballot_sync(0xffffffffu, first));
  const int slots = min(num_experts, n);
  for (int i = distinct + lane; i < slots; i += 32) active[i] = -1;
}

struct Ring {
  uint8_t* base;
  uint32_t full0, empty0;
  int slots, slot;
  uint32_t phase;
  __device__ __forceinline__ void next() {
    if (++slot == slots) slot = 0, phase ^= 1;
  }
  __device__ __forceinline__ uint8_t* at() const { return base + slot * kSlotBytes; }
  __device__ __forceinline__ uint32_t full() const { return full0 + 8 * slot; }
  __device__ __forceinline__ uint32_t empty() const { return empty0 + 8 * slot; }
};

// ---- Producer: one stage of an op's item into the next slot.
struct Producer {
  Ring r;
  uint64_t pol;
  int lane;
  int depth;       // stages in flight at most (<= the ring's slots)
  int issued = 0;  // stages issued so far
  // Waits for the slot, lets `fill` issue its copies (lane 0 the bulk copy with its expect_tx,
  // every lane its cp.async), and arrives for each lane once its cp.async have landed.
  template <typename Fill>
  __device__ __forceinline__ void stage(Fill fill) {
    // Stage i goes once stage i - depth has been released (slot (i - depth) % slots, whose
    // barrier cannot complete another phase before stage i - depth + slots > i is issued).
    if (issued >= depth) {
      const int j = issued - depth;
      mbar_wait(r.empty0 + 8 * (j % r.slots), (j / r.slots) & 1);
    }
    ++issued;
    const uint32_t bar = r.full();
    fill(bar, smem_u32(r.at()));
    cp_async_mbar_arrive_noinc(bar);
    r.next();
  }
  __device__ void router_row(const MoeRouteParams& q, int e) {
    stage([&](uint32_t bar, uint32_t dst) {
      if (lane == 0) {
        const uint32_t bytes = static_cast<uint32_t>(q.hidden * 2);
        mbar_expect_tx(bar, bytes);
        bulk_copy(dst, q.w + int64_t{e} * q.hidden, bytes, bar, pol);
      }
    });
  }
  __device__ void mxfp8_tile(const QuantGemvParams& q, int tile) {
    const bool swiglu = q.epilogue.kind != GemvEpilogue::kStoreF32;
    const int n = static_cast<int>(q.n), k = static_cast<int>(q.k);
    const int runs = k / 128;  // 2-KB runs per tile
    const int r = lane >> 1, h = 16 * (lane & 1);
    const uint8_t* srow = q.w_scale + int64_t{mma_tile_weight_row(tile, r, n, swiglu)} * (k / 32);
    for (int st = 0; st < k / kMxStageK; ++st) {
      stage([&](uint32_t bar, uint32_t dst) {
        if (lane == 0) {
          mbar_expect_tx(bar, kSlotWeights);
          bulk_copy(dst, q.w + (int64_t{tile} * runs + st * 8) * kMxRunBytes, kSlotWeights, bar,
                    pol);
        }
        cp_async16(dst + kSlotWeights + r * kMxScaleStride + h, srow + st * 32 + h, 16);
      });
    }
  }
  __device__ void nvfp4_tile(const QuantGemvParams& q, int64_t grp, int tile) {
    const bool swiglu = q.epilogue.kind != GemvEpilogue::kStoreF32;
    const int n = static_cast<int>(q.n), k = static_cast<int>(q.k);
    const int units = k / kFp4ChunkK;
    const int r = lane >> 1, h = 16 * (lane & 1);
    const uint8_t* wg = q.w + grp * n * (k / 2);
    const uint8_t* srow =
        q.w_scale + (grp * n + mma_tile_weight_row(tile, r, n, swiglu)) * (k / 16);
    for (int st = 0; st * kFp4StageChunks < units; ++st) {
      const int valid = min(kFp4StageChunks, units - st * kFp4StageChunks);
      stage([&](uint32_t bar, uint32_t dst) {
        if (lane == 0) {
          mbar_expect_tx(bar, 1024 * valid);
          bulk_copy(dst, wg + (int64_t{tile} * units + st * kFp4StageChunks) * 1024, 1024 * valid,
                    bar, pol);
        }
        for (int o = h; o < 8 * valid; o += 32)
          cp_async16(dst + kSlotWeights + r * kFp4ScaleStride + o, srow + st * 128 + o, 16);
      });
    }
  }
};

// An activation row held in shared memory by the consumers: which one (source, row) and its
// inverse f16 factor.
struct ActBuf {
  uint8_t* p;
  const uint16_t* src;
  int64_t row;
  float xinv;
};

// ---- Consumers (warps 0..15, 512 threads).
struct Consumer {
  Ring r;
  float4* red;  // fragment sums, two buffers
  float* misc;  // router warp sums
  int warp, lane, seq;

  __device__ void wait_for(const uint32_t* c, uint32_t target) {
    if (threadIdx.x == 0) spin_until(c, target);
    consumers_sync();
  }

  // logits[e] = x · w[e] in moe_route's order: thread t's chunks t, t + 512 (then + 1024 ...),
  // a warp butterfly, the 16 warp sums in order.
  __device__ void router_row(const MoeRouteParams& q, int e, uint32_t* done) {
    const int tid = threadIdx.x;
    const int64_t nch = q.hidden / 8;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    // The first pass's activations are requested before the wait for the weights.
    const uint4 xa = tid < nch ? __ldg(reinterpret_cast<const uint4*>(q.x + tid * 8)) : zero;
    const uint4 xb = tid + 32 * kConsumers < nch
                         ? __ldg(reinterpret_cast<const uint4*>(q.x + (tid + 32 * kConsumers) * 8))
                         : zero;
    mbar_wait(r.full(), r.phase);
    const uint16_t* wr = reinterpret_cast<const uint16_t*>(r.at());
    float acc = 0.0f;
    for (int64_t c = tid; c < nch; c += 2 * 32 * kConsumers) {
      const int64_t c2 = c + 32 * kConsumers;
      const bool has2 = c2 < nch;
      const bool first = c == tid;
      const uint4 w0 = *reinterpret_cast<const uint4*>(wr + c * 8);
      const uint4 w1 = has2 ? *reinterpret_cast<const uint4*>(wr + c2 * 8) : zero;
      const uint4 x0 = first ? xa : __ldg(reinterpret_cast<const uint4*>(q.x + c * 8));
      const uint4 x1 = first  ? xb
                       : has2 ? __ldg(reinterpret_cast<const uint4*>(q.x + c2 * 8))
                              : zero;
      float wf[8];
      unpack8(w0, wf);
      acc = dot8(acc, x0, wf);
      if (has2) {
        unpack8(w1, wf);
        acc = dot8(acc, x1, wf);
      }
    }
    __syncwarp();
    if (lane == 0) mbar_arrive(r.empty());
    r.next();
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) misc[warp] = acc;
    consumers_sync();
    if (threadIdx.x == 0) {
      float s = misc[0];
#pragma unroll
      for (int w = 1; w < kConsumers; ++w) s += misc[w];
      q.logits[e] = s;
      __threadfence();
      atomicAdd(done, 1u);
    }
    consumers_sync();  // misc is free again
  }

  // Item `it` of a GEMV op (16-row tile it % tiles of group slot it / tiles); grouped ops take
  // their expert and row from the routing `rt` (gm: its multipliers for this op), one matrix has
  // rt = null. The activation row is held in `ab` (reloaded when the row changes). `done` (or
  // null) counts the items whose outputs are stored.
  template <QuantFormat F>
  __device__ void item(const QuantGemvParams& q, int it, uint32_t* done, ActBuf& ab,
                       const RoutingSmem* rt = nullptr, const float* gm = nullptr) {
    const int g = lane >> 2, t = lane & 3;
    const int n = static_cast<int>(q.n), k = static_cast<int>(q.k);
    const int tiles = n / 16;
    const bool swiglu = q.epilogue.kind != GemvEpilogue::kStoreF32;
    const int stages = F == QuantFormat::kMxfp8 ? mx_stages(q) : fp4_stages(q);
    const int units = k / kFp4ChunkK;
    uint8_t* act = ab.p;
    {
      const int tile = it % tiles;
      const int slot = it / tiles;
      const int64_t row = rt ? rt->row[slot] : 0;
      const int64_t xrow = row / q.x_row_div;
      if (q.xh != ab.src || xrow != ab.row) {
        // The activation row -> shared memory (ld.cg: it may have been written in this launch).
        // Every consumer warp is past the previous item's barrier, so none still reads the
        // previous row.
        const uint4* src = reinterpret_cast<const uint4*>(q.xh + xrow * q.ldx);
        for (int i = threadIdx.x; i < k / 8; i += 32 * kConsumers)
          reinterpret_cast<uint4*>(act)[i] = __ldcg(src + i);
        ab.xinv = q.x_inv_scale ? q.x_inv_scale[xrow] : q.x_inv_const;
        ab.src = q.xh;
        ab.row = xrow;
        consumers_sync();
      }
      int64_t rid[2] = {-1, -1};
      float fac[2] = {0.0f, 0.0f};
      // Lane (g, t) stores tokens 2t and 2t + 1 of the mma's column block: only token 0 is real.
      rid[0] = t == 0 ? row : -1;
      fac[0] = ab.xinv * (gm ? gm[slot] : 1.0f);
      float acc[4][4] = {};
      for (int st = 0; st < stages; ++st) {
        mbar_wait(r.full(), r.phase);
        const uint8_t* sp = r.at();
        const uint8_t* sc = sp + kSlotWeights;
        if constexpr (F == QuantFormat::kMxfp8) {
          // Blocks 2·warp, 2·warp + 1 of the stage's 32: run j / 4, 512-byte block j % 4; lane
          // (g, t) reads rows g and g + 8, elements 8t .. 8t + 7 (gemv_mma_direct.cu's A).
#pragma unroll
          for (int hb = 0; hb < 2; ++hb) {
            const int j = 2 * warp + hb;
            const uint4 v = *reinterpret_cast<const uint4*>(sp + (j >> 2) * kMxRunBytes +
                                                            (j & 3) * 512 + 16 * lane);
            const uint4 xv =
                *reinterpret_cast<const uint4*>(act + 2 * (st * kMxStageK + 32 * j + 8 * t));
            stream_mxfp8_block(make_uint2(v.x, v.y), make_uint2(v.z, v.w), xv,
                               e8m0_exact(sc[g * kMxScaleStride + j]),
                               e8m0_exact(sc[(g + 8) * kMxScaleStride + j]), acc[hb]);
          }
        } else if constexpr (F == QuantFormat::kNvfp4) {
          const int valid = min(kFp4StageChunks, units - st * kFp4StageChunks);
          if (warp < valid)
            gemv::stream_nvfp4_chunk(sp, sc, act, st * kFp4StageChunks + warp, warp, lane,
                                     kFp4ScaleStride, acc);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(r.empty());
        r.next();
      }
      // The item's sum over the warps in warp order, then the epilogue by one (rotating) warp;
      // two buffers, as variant 6.
      const int par = seq & 1;
      float4 mine;
      mine.x = (acc[0][0] + acc[1][0]) + (acc[2][0] + acc[3][0]);
      mine.y = (acc[0][1] + acc[1][1]) + (acc[2][1] + acc[3][1]);
      mine.z = (acc[0][2] + acc[1][2]) + (acc[2][2] + acc[3][2]);
      mine.w = (acc[0][3] + acc[1][3]) + (acc[2][3] + acc[3][3]);
      red[(par * kConsumers + warp) * 32 + lane] = mine;
      consumers_sync();
      if (warp == seq % kConsumers) {
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int w = 0; w < kConsumers; ++w) {
          const float4 f = red[(par * kConsumers + w) * 32 + lane];
          v[0] += f.x, v[1] += f.y, v[2] += f.z, v[3] += f.w;
        }
        mma_fragment_store(q, v, mma_tile_weight_row(tile, g, n, swiglu),
                           mma_tile_weight_row(tile, g + 8, n, swiglu), rid, fac);
        if (done != nullptr) {
          __threadfence();
          __syncwarp();
          if (lane == 0) atomicAdd(done, 1u);
        }
      }
      ++seq;
    }
  }
};

__global__ void __launch_bounds__(kThreads, 1)
    moe_block_kernel(const __grid_constant__ MoeBlockParams p, int ring, int act_bytes) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int C = gridDim.x, cta = blockIdx.x;
  const int bar_bytes = (16 * ring + 8 + 127) / 128 * 128;
  uint8_t* ring_base = smem + bar_bytes;
  uint8_t* act = ring_base + ring * kSlotBytes;
  float4* red = reinterpret_cast<float4*>(act + act_bytes);
  float* misc = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(red) + kRedBytes);
  RoutingSmem* rt = reinterpret_cast<RoutingSmem*>(misc + 32);
  const uint32_t full0 = smem_u32(smem), empty0 = full0 + 8 * ring;
  const uint32_t route_bar = empty0 + 8 * ring;  // completes once the routing is in *rt
  uint32_t* cnt = p.counters;
  // Phase stamps (benchmarks): one thread of the consumers (thread 0) or of the producer (lane 0).
  const auto stamp = [&](int phase) {
    if (p.phase_ns != nullptr)
      p.phase_ns[int64_t{cta} * kMoeBlockPhases + phase] = globaltimer_ns();
  };

  if (threadIdx.x == 0) {
    for (int i = 0; i < ring; ++i) {
      mbar_init(full0 + 8 * i, 1 + 32);  // lane 0's arrive (expect_tx) + the lanes' cp.async
      mbar_init(empty0 + 8 * i, kConsumers);
    }
    mbar_init(route_bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  pdl_launch_dependents();

  const MoeRouteParams& rp = p.route;
  const bool shared = p.shared_gu.n > 0;
  const int2 router_items = item_range(rp.num_experts, cta, C);
  const int sg_tiles = shared ? static_cast<int>(p.shared_gu.n / 16) : 0;
  const int sd_tiles = shared ? static_cast<int>(p.shared_down.n / 16) : 0;
  const int rg_tiles = static_cast<int>(p.experts_gu.n / 16);
  const int rd_tiles = static_cast<int>(p.experts_down.n / 16);
  const int2 sg = item_range(sg_tiles, cta, C), sd = item_range(sd_tiles, cta, C);
  // The second activation row's offset: after the shared expert's SwiGLU row.
  const int act_split = shared ? act_row_bytes(p.shared_down.k) : 0;

  if (warp == kControlWarp) {
    // ---- Control: once every router logit is stored, this CTA's own top-k of the token (the
    // same in every CTA: no further round trip through memory before the routed weights can be
    // requested); CTA 0 also stores the routing outputs for the kernels after this one.
    const MoeRouteParams& q = p.route;
    if (lane == 0) spin_until(cnt + kRouterDone, static_cast<uint32_t>(q.num_experts));
    __syncwarp();
    const bool store = cta == 0;
    const float* l = q.logits;
    routing::router_topk_row<16>([l](int x) { return __ldcg(l + x); }, q.bias, q.num_experts,
                                 q.top_k, q.scaling, store ? q.topk_ids : rt->scratch_ids,
                                 store ? q.topk_w : rt->scratch_w, rt->ids);
    __syncwarp();
    if (store)
      group_one_token(rt->ids, static_cast<int>(q.top_k), static_cast<int>(q.num_experts),
                      q.group_offsets, q.sorted_rows, q.active_groups);
    const int32_t id = lane < q.top_k ? rt->ids[lane] : -1;
    const bool valid = lane < q.top_k && id >= 0 && id < q.num_experts;
    const unsigned m = __ballot_sync(0xffffffffu, valid);
    if (valid) {  // slots in ascending expert order, as group_one_token's active groups
      const int pos = __popc(m & ((1u << lane) - 1u));
      rt->group[pos] = id;
      rt->row[pos] = lane;
      const float* ga = p.experts_gu.w_global;
      const float* gd = p.experts_down.w_global;
      rt->gm_gu[pos] = (ga ? ga[id] : 1.0f) * 128.0f;
      rt->gm_down[pos] = (gd ? gd[id] : 1.0f) * 128.0f;
    }
    if (lane == 0) rt->count = __popc(m);
    __syncwarp();
    if (lane == 0) {
      mbar_arrive(route_bar);
      stamp(kPhaseRoutingPublished);
    }
    return;
  }

  if (warp == kProducerWarp) {
    // ---- Producer: weights depend on no kernel, so they stream before the previous kernel has
    // finished; only the routed experts wait (for the routing of this launch).
    Producer pr{{ring_base, full0, empty0, ring, 0, 0},
                l2_evict_first(),
                lane,
                min(ring, kEarlyDepth)};
    if (lane == 0) stamp(kPhaseProducerStart);
    for (int e = router_items.x; e < router_items.y; ++e) pr.router_row(rp, e);
    for (int it = sg.x; it < sg.y; ++it) pr.mxfp8_tile(p.shared_gu, it);
    mbar_wait(route_bar, 0);
    if (lane == 0) stamp(kPhaseProducerRouting);
    // From here on nothing latency-bound is left but the counters: the whole ring may fill.
    pr.depth = ring;
    const int groups = rt->count;
    const int2 rg = item_range(int64_t{groups} * rg_tiles, cta, C);
    const int2 rd = item_range(int64_t{groups} * rd_tiles, cta, C);
    for (int it = rg.x; it < rg.y; ++it)
      pr.nvfp4_tile(p.experts_gu, rt->group[it / rg_tiles], it % rg_tiles);
    for (int it = sd.x; it < sd.y; ++it) pr.mxfp8_tile(p.shared_down, it);
    for (int it = rd.x; it < rd.y; ++it)
      pr.nvfp4_tile(p.experts_down, rt->group[it / rd_tiles], it % rd_tiles);
    if (lane == 0) stamp(kPhaseProducerEnd);
    return;
  }

  // ---- Consumers. The activations (and the outputs' previous readers) belong to earlier kernels.
  pdl_wait();
  const bool lead = threadIdx.x == 0;
  if (lead) stamp(kPhaseStart);
  Consumer cs{{ring_base, full0, empty0, ring, 0, 0}, red, misc, warp, lane, 0};
  // Two activation rows: the token's (both gate|ups, then the shared expert's SwiGLU row for its
  // down) and a routed slot's SwiGLU row (the routed down).
  ActBuf a0{act, nullptr, -1, 1.0f}, a1{act + act_split, nullptr, -1, 1.0f};
  for (int e = router_items.x; e < router_items.y; ++e) cs.router_row(rp, e, cnt + kRouterDone);
  if (lead) stamp(kPhaseRouterRows);
  for (int it = sg.x; it < sg.y; ++it)
    cs.item<QuantFormat::kMxfp8>(p.shared_gu, it, cnt + kSharedGuDone, a0);
  if (lead) stamp(kPhaseSharedGu);
  mbar_wait(route_bar, 0);
  if (lead) stamp(kPhaseRoutingSeen);
  const int groups = rt->count;
  const int2 rg = item_range(int64_t{groups} * rg_tiles, cta, C);
  const int2 rd = item_range(int64_t{groups} * rd_tiles, cta, C);
  for (int it = rg.x; it < rg.y; ++it)
    cs.item<QuantFormat::kNvfp4>(p.experts_gu, it, cnt + kExpertsGuDone, a0, rt, rt->gm_gu);
  if (lead) stamp(kPhaseExpertsGu);
  if (sd.y > sd.x) cs.wait_for(cnt + kSharedGuDone, static_cast<uint32_t>(sg_tiles));
  if (lead) stamp(kPhaseSharedDownReady);
  for (int it = sd.x; it < sd.y; ++it) cs.item<QuantFormat::kMxfp8>(p.shared_down, it, nullptr, a0);
  if (lead) stamp(kPhaseSharedDown);
  if (rd.y > rd.x) cs.wait_for(cnt + kExpertsGuDone, static_cast<uint32_t>(groups * rg_tiles));
  if (lead) stamp(kPhaseExpertsDownReady);
  for (int it = rd.x; it < rd.y; ++it)
    cs.item<QuantFormat::kNvfp4>(p.experts_down, it, nullptr, a1, rt, rt->gm_down);
  if (lead) stamp(kPhaseEnd);

  // ---- The last CTA to finish sets the counters back to zero: every other CTA has passed all
  // its waits (its consumers are done, so its producer issued everything).
  consumers_sync();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(cnt + kCtasDone, 1u) == static_cast<uint32_t>(C - 1)) {
      for (int i = 0; i < kMoeBlockCounters; ++i) cnt[i] = 0u;
      __threadfence();
    }
  }
}

// The two activation rows: the token's (K = hidden) | the shared SwiGLU row + a routed one.
int act_bytes_of(const MoeBlockParams& p) {
  const int shared = p.shared_gu.n > 0 ? act_row_bytes(p.shared_down.k) : 0;
  return std::max(act_row_bytes(p.experts_gu.k), shared + act_row_bytes(p.experts_down.k));
}
int64_t smem_bytes(int ring, int act_bytes) {
  return (16 * ring + 8 + 127) / 128 * 128 + int64_t{ring} * kSlotBytes + act_bytes + kRedBytes +
         kMiscBytes;
}
int ring_slots(int act_bytes) {
  int ring = kMaxRing;
  while (ring >= kMinRing && smem_bytes(ring, act_bytes) > launch_limits().smem_optin) --ring;
  return ring;
}

std::string gemv_problem(const QuantGemvParams& q, QuantFormat f, int layout, bool up,
                         const char* what) {
  const std::string w = what;
  if (q.format != f || q.w_layout != layout)
    return w + ": needs " + (f == QuantFormat::kMxfp8 ? "MXFP8" : "NVFP4") +
           " weights in the mma layout " + std::to_string(layout);
  if (q.n <= 0 || q.n % 16 != 0 || q.n > (int64_t{1} << 24))
    return w + ": N = " + std::to_string(q.n) + " is not a positive multiple of 16";
  const int64_t kmod = f == QuantFormat::kMxfp8 ? kMxStageK : 256;
  if (q.k <= 0 || q.k % kmod != 0 || q.k > 16384)
    return w + ": K = " + std::to_string(q.k) + " is not a multiple of " + std::to_string(kmod) +
           " up to 16384";
  if (q.w == nullptr || q.w_scale == nullptr || q.xh == nullptr ||
      (reinterpret_cast<uintptr_t>(q.w) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(q.w_scale) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(q.xh) & 15) != 0 || q.ldx < q.k || q.ldx % 8 != 0)
    return w + ": weights, scales and f16 activations must be 16-byte aligned (ldx >= K)";
  const bool swiglu = q.epilogue.kind == GemvEpilogue::kSwigluF16;
  if (up != swiglu)
    return w + (up ? ": gate|up needs the f16 SwiGLU epilogue" : ": down stores f32");
  if (up ? q.epilogue.act == nullptr : (q.epilogue.y == nullptr || q.epilogue.ldy < q.n))
    return w + ": no output";
  return "";
}

}  // namespace

bool moe_block_stream_fits(const MoeBlockParams& p, std::string* why) {
  auto no = [&](const std::string& m) {
    if (why != nullptr) *why = "[cuda.moe_block] " + m;
    return false;
  };
  const MoeRouteParams& r = p.route;
  if (r.rows != 1) return no("one token only, got " + std::to_string(r.rows));
  if (r.hidden <= 0 || r.hidden % 8 != 0 || r.hidden * 2 > kSlotBytes || r.ldx < r.hidden)
    return no("router hidden " + std::to_string(r.hidden) + " must be a multiple of 8 up to " +
              std::to_string(kSlotBytes / 2));
  if (r.num_experts < 1 || r.num_experts > routing::kMaxExperts || r.top_k < 1 ||
      r.top_k > routing::kMaxTopK || r.top_k > r.num_experts)
    return no("E in [1, 512] and top_k in [1, min(16, E)] needed");
  if (r.x == nullptr || r.w == nullptr || r.logits == nullptr || r.topk_ids == nullptr ||
      r.topk_w == nullptr || r.group_offsets == nullptr || r.sorted_rows == nullptr ||
      r.active_groups == nullptr || (reinterpret_cast<uintptr_t>(r.x) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(r.w) & 15) != 0)
    return no("router pointers missing or not 16-byte aligned");
  if (p.counters == nullptr) return no("no counters");
  std::string m;
  const QuantGemvParams &eg = p.experts_gu, &ed = p.experts_down;
  if (!(m = gemv_problem(eg, QuantFormat::kNvfp4, 2, true, "experts gate|up")).empty())
    return no(m);
  if (!(m = gemv_problem(ed, QuantFormat::kNvfp4, 1, false, "experts down")).empty()) return no(m);
  if (eg.group_offsets != r.group_offsets || eg.sorted_rows != r.sorted_rows ||
      eg.active_groups != r.active_groups || ed.group_offsets != r.group_offsets ||
      ed.sorted_rows != r.sorted_rows || ed.active_groups != r.active_groups)
    return no("the experts must be grouped by the router's outputs");
  if (eg.num_rows != r.top_k || ed.num_rows != r.top_k || eg.x_row_div != r.top_k ||
      ed.x_row_div != 1 || eg.num_slots < r.top_k || ed.num_slots != eg.num_slots ||
      eg.num_groups != r.num_experts || ed.num_groups != r.num_experts)
    return no("the experts take top_k routed rows of one token");
  if (eg.k != r.hidden || ed.n != r.hidden || ed.k != eg.n / 2 || ed.xh != eg.epilogue.act ||
      ed.x_inv_scale != nullptr || ed.x_inv_const != 1.0f / 256.0f)
    return no("the experts' shapes or activations do not chain (gate|up -> SwiGLU f16 -> down)");
  const QuantGemvParams &sg = p.shared_gu, &sd = p.shared_down;
  if (sg.n > 0 || sd.n > 0) {
    if (!(m = gemv_problem(sg, QuantFormat::kMxfp8, 2, true, "shared gate|up")).empty())
      return no(m);
    if (!(m = gemv_problem(sd, QuantFormat::kMxfp8, 1, false, "shared down")).empty()) return no(m);
    if (sg.group_offsets != nullptr || sd.group_offsets != nullptr || sg.num_rows != 1 ||
        sd.num_rows != 1 || sg.k != r.hidden || sd.n != r.hidden || sd.k != sg.n / 2 ||
        sd.xh != sg.epilogue.act || sd.x_inv_scale != nullptr || sd.x_inv_const != 1.0f / 256.0f)
      return no("the shared expert's shapes or activations do not chain");
  }
  const int act_bytes = act_bytes_of(p);
  if (ring_slots(act_bytes) < kMinRing) return no("K too large: no room for the ring");
  return true;
}

Status launch_moe_block_stream(const MoeBlockParams& p, CUstream_st* stream) {
  std::string why;
  if (!moe_block_stream_fits(p, &why)) return invalid_argument(why);
  const LaunchLimits& d = launch_limits();
  const int act_bytes = act_bytes_of(p);
  const int ring = ring_slots(act_bytes);
  const size_t smem = static_cast<size_t>(smem_bytes(ring, act_bytes));
  // Once per process: the opt-in to the whole shared memory and the check that a CTA of the
  // largest size fits on an SM (every CTA must be resident at once: they wait on each other;
  // smaller rings fit wherever the largest does).
  static std::once_flag once;
  static cudaError_t setup_err = cudaSuccess;
  static int per_sm = 0;
  std::call_once(once, [&] {
    setup_err = cudaFuncSetAttribute(moe_block_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     d.smem_optin);
    if (setup_err == cudaSuccess)
      setup_err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, moe_block_kernel, kThreads,
                                                                d.smem_optin);
  });
  M3_CUDA_RETURN_IF_ERROR(setup_err);
  if (per_sm < 1) return internal_error("[cuda.moe_block] the kernel does not fit on an SM");
  M3_CUDA_RETURN_IF_ERROR(launch_kernel(p.pdl, moe_block_kernel, dim3(static_cast<unsigned>(d.sms)),
                                        dim3(kThreads), smem, stream, p, ring, act_bytes));
  return Status::ok();
}

}  // namespace m3::cuda
