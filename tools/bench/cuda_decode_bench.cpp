// Decode-kernel benchmarks at the real MiniMax-M3.1-Flash shapes on one GPU, with dummy weights
// generated on the GPU in the real storage formats (MXFP8 dense linears, NVFP4 routed experts,
// bf16 KV and index-key caches). For each kernel: median time over repeated launches, bytes that
// must move (each weight/cache byte once), FLOPs, achieved GB/s and the fraction of the 4.8 TB/s
// HBM roofline (and of the measured device-to-device copy rate). Weights and caches rotate over
// several copies or routings so that the 60 MB L2 cannot serve repeated launches.
//
// Usage: cuda_decode_bench [results.tsv|-] [kernel=split-k]
//   prints a table (writes TSV rows when a path is given); `kernel` (split-k, ring or direct: the
//   GemvKernels kDequantSplitK, kMmaRing, kMmaDirect) runs the MXFP8 main rows and the composed
//   estimate (the others get comparison rows).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/attention/sparse_decode.h"
#include "backend/cuda/gemm/nvfp4_repack.h"
#include "backend/cuda/dummy/dummy_weights.h"
#include "backend/cuda/gemm/nvfp4_repack.h"
#include "backend/cuda/gemm/quant_gemv.h"
#include "backend/cuda/gemm/x_f16.h"
#include "backend/cuda/moe/moe_route.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/sampling/sample.h"
#include "cuda_bench_util.h"
#include "read_probe.h"

namespace {

using namespace m3;
using namespace m3::cuda;
using namespace m3::cuda_bench;

constexpr double kHbm = 4.8e12;        // H200 datasheet HBM bandwidth, bytes/s
constexpr double kBf16Flops = 830e12;  // measured cuBLASLt bf16 ceiling (device.md)

double g_copy_rate = 0;  // measured D2D bytes/s (read + write)
FILE* g_tsv = nullptr;

void* dalloc(int64_t bytes) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 256))));
  return p;
}

// Median milliseconds per call of fn(iteration) over `reps` timed batches of `iters` calls.
double time_ms(const std::function<void(int)>& fn, int iters = 20, int reps = 7) {
  return median_ms(fn, 3, reps, iters);
}

struct Meas {
  double ms = 0, bytes = 0;
};

void report(const std::string& name, double ms, double bytes, double flops) {
  const double s = ms * 1e-3;
  std::printf("%-46s %9.2f us %9.1f MB %8.0f GB/s %6.1f%% HBM %6.1f%% copy %7.1f TFLOP/s\n",
              name.c_str(), ms * 1e3, bytes / 1e6, bytes / s / 1e9, 100 * bytes / s / kHbm,
              100 * bytes / s / g_copy_rate, flops / s / 1e12);
  if (g_tsv)
    std::fprintf(g_tsv, "%s\t%.3f\t%.0f\t%.0f\t%.4f\t%.4f\t%.3f\n", name.c_str(), ms * 1e3, bytes,
                 bytes / s / 1e9, bytes / s / kHbm, bytes / s / g_copy_rate, flops / s / 1e12);
  std::fflush(stdout);
}

void bench_copy() {
  const int64_t bytes = int64_t{2} << 30;
  void* a = dalloc(bytes);
  void* b = dalloc(bytes);
  CHECK_OK(fill_dummy(a, bytes, DummyKind::kE2m1Packed, 1, 1, st()));
  double ms = time_ms([&](int) { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, g_stream); },
                      5, 5);
  g_copy_rate = 2.0 * bytes / (ms * 1e-3);
  std::printf("%-46s %9.2f us %9.1f MB %8.0f GB/s %6.1f%% HBM   (ceiling used below as 'copy')\n",
              "d2d copy 2 GiB (read+write)", ms * 1e3, 2.0 * bytes / 1e6,
              g_copy_rate / 1e9, 100 * g_copy_rate / kHbm);
  if (g_tsv)
    std::fprintf(g_tsv, "d2d copy 2GiB\t%.3f\t%.0f\t%.0f\t%.4f\t1\t0\n", ms * 1e3, 2.0 * bytes,
                 g_copy_rate / 1e9, g_copy_rate / kHbm);
  cudaFree(a);
  cudaFree(b);
}

// The read floor: one launch of a plain streaming read (read_probe.h) of the byte counts
// the decode GEMVs stream, from a 1 GiB rotation (no L2 reuse): what a GEMV of that size can reach
// at best, launch, ramp and tail included.
void bench_read_floor() {
  const int64_t pool = int64_t{1} << 30;
  uint8_t* buf = static_cast<uint8_t*>(dalloc(pool));
  CHECK_OK(fill_dummy(buf, pool, DummyKind::kE2m1Packed, 7, 1, st()));
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  uint32_t* sink = static_cast<uint32_t*>(dalloc(4 * 64 * sms));
  for (double mb : {19.5, 39.0, 51.9, 62.5, 85.0, 127.5}) {
    const int64_t bytes = static_cast<int64_t>(mb * 1e6) / 4096 * 4096;
    const int64_t slots = pool / bytes;
    for (int per_sm : {4, 8}) {
      const double ms = time_ms([&](int i) {
        CHECK_OK(launch_read_probe(buf + (i % slots) * bytes, bytes, per_sm * sms, sink, st()));
      });
      char name[96];
      std::snprintf(name, sizeof name, "read floor %.1f MB (%d CTAs/SM)", mb, per_sm);
      report(name, ms, double(bytes), 0.0);
    }
  }
  cudaFree(sink);
  cudaFree(buf);
}

// A set of `copies` quantised [N, K] matrices (dense linear), rotated per launch.
struct DenseWeights {
  QuantFormat f;
  int64_t n, k, copies;
  uint8_t *w, *s;
  float* g;
  int64_t wbytes() const {
    return f == QuantFormat::kMxfp8 ? n * k : f == QuantFormat::kNvfp4 ? n * k / 2 : 2 * n * k;
  }
  int64_t sbytes() const {
    return f == QuantFormat::kMxfp8 ? n * k / 32 : f == QuantFormat::kNvfp4 ? n * k / 16 : 16;
  }
  int64_t bytes_one() const { return wbytes() + (f == QuantFormat::kBf16 ? 0 : sbytes()); }
};

DenseWeights make_dense(QuantFormat f, int64_t n, int64_t k, int64_t groups = 1) {
  DenseWeights d{f, n * groups, k, 1, nullptr, nullptr, nullptr};
  const int64_t one = d.bytes_one();
  d.copies = std::max<int64_t>(1, (int64_t{1} << 30) / one);  // >= 1 GiB in rotation
  d.copies = std::min<int64_t>(d.copies, 64);
  const int64_t wb = d.wbytes(), sb = d.sbytes();
  d.w = static_cast<uint8_t*>(dalloc(wb * d.copies));
  d.s = static_cast<uint8_t*>(dalloc(sb * d.copies));
  d.g = static_cast<float*>(dalloc(sizeof(float) * 4096));
  if (f == QuantFormat::kBf16) {
    CHECK_OK(fill_dummy(d.w, wb * d.copies / 2, DummyKind::kBf16Normal, 2, 0.02f, st()));
  } else {
    CHECK_OK(fill_dummy(d.w, wb * d.copies,
                        f == QuantFormat::kMxfp8 ? DummyKind::kE4m3Codes : DummyKind::kE2m1Packed,
                        2, 1, st()));
  }
  CHECK_OK(fill_dummy(d.s, sb * d.copies,
                      f == QuantFormat::kMxfp8 ? DummyKind::kE8m0Scales : DummyKind::kE4m3Scales,
                      3, 1, st()));
  CHECK_OK(fill_dummy(d.g, 4096, DummyKind::kF32Normal, 4, 0.001f, st()));
  return d;
}

void free_dense(DenseWeights& d) {
  cudaFree(d.w);
  cudaFree(d.s);
  cudaFree(d.g);
}

// The rows' kernel and storage: the GEMV kernels, kMmaDirect also on the mma layout (random
// bytes either way: the layout only changes the order in which they are read), there also with
// the f16 row at one row (as q|k|v reads the norm's output).
enum class Arm { kSplitK, kRing, kDirect, kDirectLayout, kDirectLayoutF16 };
const char* arm_name(Arm a) {
  switch (a) {
    case Arm::kSplitK: return "split-k";
    case Arm::kRing: return "ring";
    case Arm::kDirect: return "direct";
    case Arm::kDirectLayout: return "direct-layout";
    case Arm::kDirectLayoutF16: return "direct-layout-f16";
  }
  return "?";
}
bool is_direct(Arm a) { return a == Arm::kDirect || a == Arm::kDirectLayout || a == Arm::kDirectLayoutF16; }

// Dense GEMV + f32 epilogue at M rows (BF16: kBf16SplitK; MXFP8 / NVFP4: the arm's kernel).
Meas bench_dense(const std::string& name, QuantFormat f, int64_t n, int64_t k, int64_t m,
                 Arm arm) {
  DenseWeights d = make_dense(f, n, k);
  uint16_t* x = static_cast<uint16_t*>(dalloc(2 * m * k));
  CHECK_OK(fill_dummy(x, m * k, DummyKind::kBf16Normal, 5, 1.0f, st()));
  const GemvKernel kernel = f == QuantFormat::kBf16 ? GemvKernel::kBf16SplitK
                            : arm == Arm::kSplitK   ? GemvKernel::kDequantSplitK
                            : arm == Arm::kRing     ? GemvKernel::kMmaRing
                                                    : GemvKernel::kMmaDirect;
  const int64_t slices = quant_gemv_num_slices(f, k);
  float* partial = static_cast<float*>(dalloc(4 * slices * m * n));
  float* y = static_cast<float*>(dalloc(4 * m * n));
  // The tensor-core kernels read f16 activations (x_f16.h), prepared once here.
  uint16_t* xh = static_cast<uint16_t*>(dalloc(2 * m * k));
  float* xinv = static_cast<float*>(dalloc(4 * m));
  CHECK_OK(launch_x_to_f16({x, k, m, k, xh, k, xinv}, st()));
  const int64_t wb = d.wbytes(), sb = d.sbytes();
  // M3_BENCH_L2_WARM=1: the same copy every launch. This makes the matrix L2-resident only where
  // it is well below the L2: Nsight Compute measured a 3-4 % L2 hit rate on o_proj (52 MB) and
  // qkv (62.5 MB) in this mode, so warm = cold for those says
  // nothing about the kernels' dependence on HBM.
  static const bool warm = std::getenv("M3_BENCH_L2_WARM") != nullptr;
  const int64_t copies = warm ? 1 : d.copies;
  double ms = time_ms([&](int i) {
    const int64_t c = i % copies;
    QuantGemvParams p;
    p.format = f;
    p.x = x;
    p.ldx = k;
    p.w = d.w + c * wb;
    p.w_scale = d.s + c * sb;
    p.w_global = d.g;
    p.num_rows = m;
    p.n = n;
    p.k = k;
    p.partial = partial;
    p.kernel = kernel;
    GemvEpilogueParams e;
    e.partial = partial;
    e.num_slices = slices;
    e.num_rows = m;
    e.n = n;
    e.y = y;
    e.ldy = n;
    const bool ring = kernel == GemvKernel::kMmaRing;  // f16 activations, epilogue fused
    if (ring) p.xh = xh, p.x_inv_scale = xinv, p.epilogue = e;
    // kMmaDirect: the f16 rows (as the norms write them) from 2 rows, the bf16 row at one.
    if (kernel == GemvKernel::kMmaDirect)
      p.epilogue = e, p.xh = m > 1 || arm == Arm::kDirectLayoutF16 ? xh : nullptr,
      p.x_inv_scale = xinv;
    if (arm == Arm::kDirectLayout || arm == Arm::kDirectLayoutF16)
      p.w_layout = WeightLayout::kMmaRows16;
    CHECK_OK(launch_quant_gemv(p, st()));
    if (!ring && kernel != GemvKernel::kMmaDirect) CHECK_OK(launch_quant_gemv_epilogue(e, st()));
  });
  cudaFree(xh);
  cudaFree(xinv);
  const double bytes = double(d.bytes_one()) + 2.0 * m * k + 4.0 * m * n;
  report(name + " M=" + std::to_string(m) + " " +
             (f == QuantFormat::kBf16 ? "split-k" : arm_name(arm)),
         ms, bytes, 2.0 * m * n * k);
  cudaFree(x);
  cudaFree(partial);
  cudaFree(y);
  free_dense(d);
  return {ms, bytes};
}

// Routed experts of one MoE layer for T tokens (top-4 of 128): grouping, gate|up with SwiGLU
// epilogue, down with f32 epilogue, on kDequantSplitK or kMmaRing (`ring`). 8 random routings
// rotate between launches. `packed`: the NVFP4 weights repacked into the mma layout
// (quant/nvfp4_mma_layout.h; kMmaRing only).
Meas bench_moe(int64_t tokens, bool ring, bool packed = false) {
  const int64_t E = 128, K4 = 4, H = 6144, I = 3072, rows = tokens * K4;
  // Experts back to back: up [E, 2I, H], down [E, H, I] (packed + scales + globals).
  auto alloc_fill = [&](int64_t bytes, DummyKind kind, uint64_t seed) {
    uint8_t* p = static_cast<uint8_t*>(dalloc(bytes));
    CHECK_OK(fill_dummy(p, bytes, kind, seed, 1, st()));
    return p;
  };
  uint8_t* uw = alloc_fill(E * 2 * I * H / 2, DummyKind::kE2m1Packed, 10);
  uint8_t* us = alloc_fill(E * 2 * I * H / 16, DummyKind::kE4m3Scales, 11);
  uint8_t* dw = alloc_fill(E * H * I / 2, DummyKind::kE2m1Packed, 12);
  uint8_t* ds = alloc_fill(E * H * I / 16, DummyKind::kE4m3Scales, 13);
  float* gl = static_cast<float*>(dalloc(4 * E));
  CHECK_OK(fill_dummy(gl, E, DummyKind::kF32Normal, 14, 0.001f, st()));
  uint16_t* x = static_cast<uint16_t*>(dalloc(2 * tokens * H));
  CHECK_OK(fill_dummy(x, tokens * H, DummyKind::kBf16Normal, 15, 1.0f, st()));
  constexpr int kRoutings = 8;
  std::vector<int32_t*> ids(kRoutings);
  std::mt19937 rng(16);
  double unique_sum = 0;
  for (int r = 0; r < kRoutings; ++r) {
    std::vector<int32_t> h(rows);
    std::vector<bool> used(E, false);
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<int32_t> perm(E);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::sort(perm.begin(), perm.begin() + K4);
      for (int64_t s = 0; s < K4; ++s) h[t * K4 + s] = perm[s], used[perm[s]] = true;
    }
    unique_sum += std::count(used.begin(), used.end(), true);
    ids[r] = static_cast<int32_t*>(dalloc(4 * rows));
    CHECK_CUDA(cudaMemcpy(ids[r], h.data(), 4 * rows, cudaMemcpyHostToDevice));
  }
  const double unique = unique_sum / kRoutings;
  int32_t* offs = static_cast<int32_t*>(dalloc(4 * (E + 1)));
  int32_t* sorted = static_cast<int32_t*>(dalloc(4 * rows));
  int32_t* active = static_cast<int32_t*>(dalloc(4 * E));
  if (packed) {
    CHECK_OK(nvfp4_mma_repack_in_place(uw, E, 2 * I, H, nvfp4_mma::Tiling::kSwigluPairs, st()));
    CHECK_OK(nvfp4_mma_repack_in_place(dw, E, H, I, nvfp4_mma::Tiling::kRows16, st()));
  }
  const int64_t su = quant_gemv_num_slices(QuantFormat::kNvfp4, H);
  const int64_t sd = quant_gemv_num_slices(QuantFormat::kNvfp4, I);
  float* pu = static_cast<float*>(dalloc(4 * su * rows * 2 * I));
  float* pd = static_cast<float*>(dalloc(4 * sd * rows * H));
  uint16_t* act = static_cast<uint16_t*>(dalloc(2 * rows * I));
  float* y = static_cast<float*>(dalloc(4 * rows * H));
  uint16_t* xh = static_cast<uint16_t*>(dalloc(2 * tokens * H));  // kMmaRing: f16 activations
  float* xinv = static_cast<float*>(dalloc(4 * tokens));
  CHECK_OK(launch_x_to_f16({x, H, tokens, H, xh, H, xinv}, st()));
  // f16 activations, epilogue fused
  const bool tc = ring;
  // M3_BENCH_MOE_PART=up / down: time only that product (with the grouping), for A/Bs.
  const char* part_env = std::getenv("M3_BENCH_MOE_PART");
  const std::string part = part_env ? part_env : "";
  double ms = time_ms([&](int i) {
    CHECK_OK(launch_group_by_expert({ids[i % kRoutings], rows, E, offs, sorted, active}, st()));
    QuantGemvParams p;
    p.format = QuantFormat::kNvfp4;
    p.x = x;
    p.ldx = H;
    p.x_row_div = K4;
    p.w = uw;
    p.w_scale = us;
    p.w_global = gl;
    p.num_groups = E;
    p.group_offsets = offs;
    p.sorted_rows = sorted;
    p.active_groups = active;
    p.num_slots = std::min(E, rows);
    p.num_rows = rows;
    p.max_group_rows = tokens;
    p.n = 2 * I;
    p.k = H;
    p.partial = pu;
    p.kernel = ring ? GemvKernel::kMmaRing : GemvKernel::kDequantSplitK;
    p.w_layout = packed ? WeightLayout::kMmaSwigluPairs : WeightLayout::kRowMajor;
    GemvEpilogueParams e;
    e.kind = GemvEpilogue::kSwigluBf16;
    e.partial = pu;
    e.num_slices = su;
    e.num_rows = rows;
    e.n = 2 * I;
    e.act = act;
    if (tc) {
      p.xh = xh, p.x_inv_scale = xinv, p.epilogue = e;
      p.epilogue.kind = GemvEpilogue::kSwigluF16;
    }
    if (part != "down") CHECK_OK(launch_quant_gemv(p, st()));
    if (part != "down" && !tc) CHECK_OK(launch_quant_gemv_epilogue(e, st()));
    if (part == "up") return;
    p.x = act;
    p.xh = act, p.x_inv_scale = nullptr, p.x_inv_const = 1.0f / 256;
    p.ldx = I;
    p.x_row_div = 1;
    p.w = dw;
    p.w_scale = ds;
    p.w_layout = packed ? WeightLayout::kMmaRows16 : WeightLayout::kRowMajor;
    p.n = H;
    p.k = I;
    p.partial = pd;
    e = {};
    e.partial = pd;
    e.num_slices = sd;
    e.num_rows = rows;
    e.n = H;
    e.y = y;
    e.ldy = H;
    if (tc) p.epilogue = e;
    CHECK_OK(launch_quant_gemv(p, st()));
    if (!tc) CHECK_OK(launch_quant_gemv_epilogue(e, st()));
  }, 10, 7);
  const double expert_bytes = 3.0 * H * I * (0.5 + 1.0 / 16);
  const double bytes = unique * expert_bytes + 2.0 * tokens * H + 4.0 * rows * H;
  char name[112];
  std::snprintf(name, sizeof name, "moe nvfp4 experts T=%lld (%.1f experts)%s%s", (long long)tokens,
                unique, ring ? " ring" : " split-k",
                packed ? " mma layout" : "");
  report(name, ms, bytes, 2.0 * rows * 3 * H * I);
  for (void* p : std::vector<void*>{uw, us, dw, ds, gl, x, offs, sorted, active, pu, pd, act, y,
                                    xh, xinv})
    cudaFree(p);
  for (int32_t* p : ids) cudaFree(p);
  return {ms, bytes};
}

// GPU sampling of B rows of the 200064-token vocabulary: greedy, and temperature 0.8 with
// top_k 50 + top_p 0.9 + min_p 0.02 (the radix-select path). Bytes: the logits once (the kernel
// passes over each row ~12 times, from L2 after the first).
void bench_sampling(int64_t batch, bool greedy) {
  const int64_t V = 200064;
  float* logits = static_cast<float*>(dalloc(4 * batch * V));
  CHECK_OK(fill_dummy(logits, batch * V, DummyKind::kF32Normal, 21, 3.0f, st()));
  std::vector<SampleRowParams> h(batch);
  for (int64_t b = 0; b < batch; ++b) {
    h[b].temperature = greedy ? 0.0f : 0.8f;
    h[b].top_k = greedy ? 0 : 50;
    h[b].top_p = greedy ? 1.0f : 0.9f;
    h[b].min_p = greedy ? 0.0f : 0.02f;
    h[b].seed = 5;
    h[b].counter = static_cast<uint64_t>(b);
  }
  auto* rows = static_cast<SampleRowParams*>(dalloc(sizeof(SampleRowParams) * batch));
  CHECK_CUDA(cudaMemcpy(rows, h.data(), sizeof(SampleRowParams) * batch, cudaMemcpyHostToDevice));
  int32_t* out = static_cast<int32_t*>(dalloc(4 * batch));
  SampleParams p;
  p.logits = logits;
  p.batch = batch;
  p.vocab = V;
  p.ld = V;
  p.rows = rows;
  p.out = out;
  // The greedy rows over kSampleGreedySplits CTAs, as the model samples them.
  const int64_t sl = kSampleGreedySplits;
  p.greedy_value = static_cast<float*>(dalloc(4 * batch * sl));
  p.greedy_index = static_cast<int32_t*>(dalloc(4 * batch * sl));
  p.greedy_tickets = static_cast<uint32_t*>(dalloc(4 * batch));
  CHECK_CUDA(cudaMemset(p.greedy_tickets, 0, 4 * batch));
  const double ms = time_ms([&](int) { CHECK_OK(launch_sample(p, st())); }, 10, 7);
  report(std::string("sample ") + (greedy ? "greedy" : "T0.8 k50 p0.9 minp0.02") + " B=" +
             std::to_string(batch) + " V=200064",
         ms, 4.0 * batch * V, 0);
  cudaFree(logits);
  cudaFree(rows);
  cudaFree(out);
  cudaFree(p.greedy_value);
  cudaFree(p.greedy_index);
  cudaFree(p.greedy_tickets);
}

// One decode-attention problem at the real shapes: B sequences of `ctx` tokens (queries at
// position ctx - 1, shuffled block tables), random bf16 cache and queries, the indexer's and the
// attention's parameters and the bytes each moves.
struct AttentionProblem {
  static constexpr int64_t S = 128, Hkv = 4, D = 128, H = 64, Hix = 4, Dix = 128, top_k = 16;
  int64_t batch, ctx;
  std::vector<void*> bufs;
  IndexerDecodeParams ip;
  SparseDecodeParams ap;
  double ibytes = 0, abytes = 0;
  std::string tag;

  template <typename T>
  T* alloc(int64_t count) {
    bufs.push_back(dalloc(int64_t(sizeof(T)) * count));
    return static_cast<T*>(bufs.back());
  }
  AttentionProblem(int64_t b, int64_t c) : batch(b), ctx(c) {
    const int64_t nb = ctx / S, pages = batch * nb + 1;
    uint16_t* k = alloc<uint16_t>(pages * S * Hkv * D);
    uint16_t* v = alloc<uint16_t>(pages * S * Hkv * D);
    uint16_t* ik = alloc<uint16_t>(pages * S * Dix);
    uint16_t* q = alloc<uint16_t>(batch * H * D);
    uint16_t* iq = alloc<uint16_t>(batch * Hix * Dix);
    CHECK_OK(fill_dummy(k, pages * S * Hkv * D, DummyKind::kBf16Normal, 20, 1, st()));
    CHECK_OK(fill_dummy(v, pages * S * Hkv * D, DummyKind::kBf16Normal, 21, 1, st()));
    CHECK_OK(fill_dummy(ik, pages * S * Dix, DummyKind::kBf16Normal, 22, 1, st()));
    CHECK_OK(fill_dummy(q, batch * H * D, DummyKind::kBf16Normal, 23, 1, st()));
    CHECK_OK(fill_dummy(iq, batch * Hix * Dix, DummyKind::kBf16Normal, 24, 1, st()));
    std::vector<int32_t> tab(batch * nb), pos(batch, static_cast<int32_t>(ctx - 1));
    std::iota(tab.begin(), tab.end(), 1);
    std::shuffle(tab.begin(), tab.end(), std::mt19937(25));
    int32_t* dtab = alloc<int32_t>(int64_t(tab.size()));
    int32_t* dpos = alloc<int32_t>(batch);
    CHECK_CUDA(cudaMemcpy(dtab, tab.data(), 4 * tab.size(), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dpos, pos.data(), 4 * batch, cudaMemcpyHostToDevice));
    const KvCacheView cv = bf16_kv_view(k, v, ik, pages, S, Hkv, D, Dix);
    ip.iq = iq;
    ip.cache = cv;
    ip.positions = dpos;
    ip.block_tables = dtab;
    ip.batch = batch;
    ip.num_index_heads = Hix;
    ip.max_blocks = nb;
    ip.top_k = top_k;
    ip.block_scores = alloc<float>(batch * Hix * nb);
    ip.selected = alloc<int32_t>(batch * Hix * top_k);
    ap.q = q;
    ap.cache = cv;
    ap.positions = dpos;
    ap.block_tables = dtab;
    ap.selected = ip.selected;
    ap.batch = batch;
    ap.num_heads = H;
    ap.max_blocks = nb;
    ap.top_k = top_k;
    ap.scale = 1.0f / std::sqrt(float(D));
    ap.max_key_splits = 4;  // as the model (the launcher splits only small batches)
    ap.mma = true;          // as the model
    ap.o_partial = alloc<float>(batch * H * top_k * 4 * D);
    ap.ml_partial = alloc<float>(batch * H * top_k * 4 * 2);
    ap.out = alloc<uint16_t>(batch * H * D);
    ibytes = double(batch) * ctx * Dix * 2 + 4.0 * batch * Hix * nb * 2;
    abytes = double(batch) * Hkv * top_k * S * D * 2 * 2 +
             double(batch) * H * top_k * (D + 2) * 4 * 2;
    tag = " B=" + std::to_string(batch) + " ctx=" + std::to_string(ctx / 1024) + "K";
  }
  ~AttentionProblem() {
    for (void* p : bufs) cudaFree(p);
  }
  double indexer_flops() const { return 2.0 * batch * ctx * Hix * Dix; }
  double attention_flops() const { return 4.0 * batch * H * top_k * S * D; }
};

// Indexer + sparse attention for B sequences with `ctx` tokens each, launched back to back.
std::pair<Meas, Meas> bench_attention(int64_t batch, int64_t ctx) {
  AttentionProblem a(batch, ctx);
  const double ims = time_ms([&](int) { CHECK_OK(launch_indexer_decode(a.ip, st())); });
  report("indexer decode" + a.tag, ims, a.ibytes, a.indexer_flops());
  const double ams = time_ms([&](int) { CHECK_OK(launch_sparse_decode(a.ap, st())); });
  report("sparse attention decode" + a.tag, ams, a.abytes, a.attention_flops());
  return {Meas{ims, a.ibytes}, Meas{ams, a.abytes}};
}

// Milliseconds per call of `launch` (one call's launches) inside a CUDA graph of `reps` calls:
// graph time / reps, so the host's launch rate does not bound small kernels.
template <typename F>
double graph_ms_per_call(F launch, int64_t reps = 10) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CHECK_CUDA(cudaStreamBeginCapture(st(), cudaStreamCaptureModeThreadLocal));
  for (int64_t r = 0; r < reps; ++r) launch();
  CHECK_CUDA(cudaStreamEndCapture(st(), &g));
  CHECK_CUDA(cudaGraphInstantiate(&ge, g, 0));
  const double ms = time_ms([&](int) { CHECK_CUDA(cudaGraphLaunch(ge, st())); }, 5, 7) / reps;
  CHECK_CUDA(cudaGraphExecDestroy(ge));
  CHECK_CUDA(cudaGraphDestroy(g));
  return ms;
}

// Indexer and sparse attention timed as the model runs them, inside a CUDA graph of 10 calls
// (per call = graph time / 10): the rows of bench_attention time back-to-back stream launches,
// which at batches 1-8 the host's launch rate can bound. Rows: indexer, attention, both, and
// both with the top-k and the combine as plain launches instead of programmatic dependents.
void bench_attention_graph(int64_t batch, int64_t ctx) {
  AttentionProblem a(batch, ctx);
  CHECK_OK(launch_indexer_decode(a.ip, st()));  // eager once: one-time host setup before capture
  CHECK_OK(launch_sparse_decode(a.ap, st()));
  CHECK_CUDA(cudaStreamSynchronize(st()));
  const auto graph_us = [&](bool indexer, bool attention) {
    return graph_ms_per_call([&] {
      if (indexer) CHECK_OK(launch_indexer_decode(a.ip, st()));
      if (attention) CHECK_OK(launch_sparse_decode(a.ap, st()));
    });
  };
  report("graph indexer decode" + a.tag, graph_us(true, false), a.ibytes, a.indexer_flops());
  report("graph sparse attention decode" + a.tag, graph_us(false, true), a.abytes,
         a.attention_flops());
  report("graph indexer + attention" + a.tag, graph_us(true, true), a.ibytes + a.abytes, 0);
  a.ip.dependent_launch = a.ap.dependent_launch = false;  // A/B: second kernels as plain launches
  report("graph indexer + attention, no PDL" + a.tag, graph_us(true, true), a.ibytes + a.abytes,
         0);
  if (std::getenv("M3_BENCH_SPLITS") == nullptr) return;
  a.ip.dependent_launch = a.ap.dependent_launch = true;
  a.ap.force_key_splits = true;
  for (int s : {1, 2, 4}) {
    a.ap.max_key_splits = s;
    report("graph sparse attention, " + std::to_string(s) + " key splits" + a.tag,
           graph_us(false, true), a.abytes, a.attention_flops());
  }
  a.ap.max_key_splits = 1;
  a.ap.mma = false;  // the float32-FMA split kernel (the tensor cores' A/B)
  report("graph sparse attention, 1 key split on FMAs" + a.tag, graph_us(false, true), a.abytes,
         a.attention_flops());
  a.ap.mma = true;
}

// The fused MoE router (E = 128, top-4, hidden 6144, bf16 weights) at `rows` tokens inside a CUDA
// graph of 10 launches (per launch = graph time / 10).
void bench_router_graph(int64_t rows) {
  constexpr int64_t e = 128, hd = 6144, k = 4;
  std::vector<void*> bufs;
  auto alloc = [&](int64_t bytes) {
    bufs.push_back(dalloc(bytes));
    return bufs.back();
  };
  MoeRouteParams p;
  p.x = static_cast<uint16_t*>(alloc(2 * rows * hd));
  p.ldx = p.hidden = hd;
  p.rows = rows;
  p.w = static_cast<uint16_t*>(alloc(2 * e * hd));
  p.num_experts = e;
  p.top_k = k;
  p.scaling = 2.0f;
  CHECK_OK(fill_dummy(const_cast<uint16_t*>(p.x), rows * hd, DummyKind::kBf16Normal, 30, 1, st()));
  CHECK_OK(fill_dummy(const_cast<uint16_t*>(p.w), e * hd, DummyKind::kBf16Normal, 31, 0.02f, st()));
  p.logits = static_cast<float*>(alloc(4 * rows * e));
  p.topk_ids = static_cast<int32_t*>(alloc(4 * rows * k));
  p.topk_w = static_cast<float*>(alloc(4 * rows * k));
  p.group_offsets = static_cast<int32_t*>(alloc(4 * (e + 1)));
  p.sorted_rows = static_cast<int32_t*>(alloc(4 * rows * k));
  p.active_groups = static_cast<int32_t*>(alloc(4 * rows * k));
  p.counter = static_cast<uint32_t*>(alloc(4));
  CHECK_CUDA(cudaMemset(p.counter, 0, 4));
  CHECK_OK(launch_moe_route(p, st()));
  CHECK_CUDA(cudaStreamSynchronize(st()));
  const double ms = graph_ms_per_call([&] { CHECK_OK(launch_moe_route(p, st())); });
  report("graph moe_route rows=" + std::to_string(rows), ms, 2.0 * e * hd, 2.0 * rows * e * hd);
  for (void* b : bufs) cudaFree(b);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) g_tsv = std::fopen(argv[1], "w");
  const std::string main_name = argc > 2 ? argv[2] : "split-k";
  Arm main_arm = Arm::kSplitK;
  if (main_name == "ring") {
    main_arm = Arm::kRing;
  } else if (main_name == "direct") {
    main_arm = Arm::kDirect;
  } else if (main_name != "split-k") {
    std::fprintf(stderr, "kernel must be split-k, ring or direct\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB, HBM %.0f GiB; roofline %.1f TB/s, %.0f TFLOP/s bf16\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20,
              prop.totalGlobalMem / double(1 << 30), kHbm / 1e12, kBf16Flops / 1e12);
  CHECK_CUDA(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  if (g_tsv) std::fprintf(g_tsv, "kernel\tus\tbytes\tGB/s\tfrac_hbm\tfrac_copy\tTFLOP/s\n");
  std::printf("%-46s %12s %12s %13s %11s %11s %15s\n", "kernel", "time", "bytes", "rate", "HBM",
              "copy", "compute");
  // M3_BENCH_STREAM_ONLY=4: only the latency-bound kernels of a decode layer inside CUDA graphs
  // (indexer + sparse attention, the fused router), batch 1 and 8 (M3_BENCH_BATCHES=B,B,...:
  // those batches instead).
  if (const char* only = std::getenv("M3_BENCH_STREAM_ONLY"); only && *only == '4') {
    std::vector<int64_t> batches = {1, 8};
    if (const char* list = std::getenv("M3_BENCH_BATCHES")) {
      batches.clear();
      for (const char* c = list; *c != '\0';) {
        char* end = nullptr;
        const long v = std::strtol(c, &end, 10);
        if (end == c) break;
        if (v > 0) batches.push_back(v);
        c = *end == ',' ? end + 1 : end;
      }
    }
    for (int64_t b : batches) {
      for (int64_t ctx : {int64_t{1024}, int64_t{4096}, int64_t{32768}}) bench_attention_graph(b, ctx);
      bench_router_graph(b);
    }
    if (g_tsv) std::fclose(g_tsv);
    return 0;
  }
  bench_copy();
  bench_read_floor();
  // M3_BENCH_STREAM_ONLY=1: only the batch-1..8 rows of the three kernels (quick A/B); =2: only
  // the NVFP4 experts on kMmaRing in the mma layout at 1, 2, 8, 32 and 128 tokens.
  if (const char* only = std::getenv("M3_BENCH_STREAM_ONLY"); only && *only == '2') {
    for (int64_t b : {int64_t{1}, int64_t{2}, int64_t{8}, int64_t{32}, int64_t{128}})
      bench_moe(b, true, true);
    if (g_tsv) std::fclose(g_tsv);
    return 0;
  }
  // =3: the MXFP8 matrices at one row on every arm, and at 8 and 32 rows on kMmaRing and
  // kMmaDirect on the mma layout.
  if (const char* only = std::getenv("M3_BENCH_STREAM_ONLY"); only && *only == '3') {
    const struct { const char* name; int64_t n, k; } shapes[] = {
        {"mxfp8 qkv+indexer [9856x6144]", 9856, 6144}, {"mxfp8 o_proj [6144x8192]", 6144, 8192},
        {"mxfp8 shared gate|up [6144x6144]", 6144, 6144},
        {"mxfp8 shared down [6144x3072]", 6144, 3072},
        {"mxfp8 dense gate|up [24576x6144]", 24576, 6144}};
    // M3_BENCH_SHAPE=text / M3_BENCH_ARM=name: only the one-row rows of shapes whose name
    // contains the text, on that arm (one kernel to profile).
    const char* shape_only = std::getenv("M3_BENCH_SHAPE");
    const char* arm_only = std::getenv("M3_BENCH_ARM");
    for (const auto& sh : shapes)
      for (Arm a : {Arm::kSplitK, Arm::kRing, Arm::kDirect, Arm::kDirectLayout,
                    Arm::kDirectLayoutF16})
        if ((!shape_only || std::strstr(sh.name, shape_only)) &&
            (!arm_only || std::string(arm_only) == arm_name(a)))
          bench_dense(sh.name, QuantFormat::kMxfp8, sh.n, sh.k, 1, a);
    if (shape_only || arm_only) {
      if (g_tsv) std::fclose(g_tsv);
      return 0;
    }
    for (int64_t m : {int64_t{8}, int64_t{32}})
      for (const auto& sh : shapes)
        for (Arm a : {Arm::kRing, Arm::kDirectLayout})
          bench_dense(sh.name, QuantFormat::kMxfp8, sh.n, sh.k, m, a);
    if (g_tsv) std::fclose(g_tsv);
    return 0;
  }
  if (const char* only = std::getenv("M3_BENCH_STREAM_ONLY"); only && *only == '1') {
    const struct { const char* name; int64_t n, k; } shapes[] = {
        {"mxfp8 qkv+indexer [9856x6144]", 9856, 6144}, {"mxfp8 o_proj [6144x8192]", 6144, 8192},
        {"mxfp8 shared gate|up [6144x6144]", 6144, 6144},
        {"mxfp8 shared down [6144x3072]", 6144, 3072}};
    for (const auto& sh : shapes)
      for (int64_t m : {int64_t{1}, int64_t{8}})
        for (Arm a : {Arm::kSplitK, Arm::kRing, Arm::kDirect})
          bench_dense(sh.name, QuantFormat::kMxfp8, sh.n, sh.k, m, a);
    for (int64_t b : {int64_t{1}, int64_t{2}, int64_t{8}}) bench_moe(b, true, true);
    if (g_tsv) std::fclose(g_tsv);
    return 0;
  }

  // Per-layer dense linears of M3.1-Flash (MXFP8): q|k|v|index_q|index_k fused (8192 + 3·512 +
  // 128 rows... index_q is 512 rows: 8192 + 512 + 512 + 512 + 128 = 9856), o_proj, shared expert.
  struct L {
    const char* name;
    int64_t n, k;
  };
  const L dense[] = {{"mxfp8 qkv+indexer [9856x6144]", 9856, 6144},
                     {"mxfp8 o_proj [6144x8192]", 6144, 8192},
                     {"mxfp8 shared gate|up [6144x6144]", 6144, 6144},
                     {"mxfp8 shared down [6144x3072]", 6144, 3072},
                     {"mxfp8 dense gate|up [24576x6144]", 24576, 6144},
                     {"mxfp8 dense down [6144x12288]", 6144, 12288}};
  std::vector<std::vector<Meas>> dense_ms(6);
  const int64_t batches[] = {1, 8, 32, 128};
  std::printf("(main rows: %s)\n", arm_name(main_arm));
  for (int i = 0; i < 6; ++i)
    for (int64_t m : {int64_t{1}, int64_t{8}})
      dense_ms[i].push_back(bench_dense(dense[i].name, QuantFormat::kMxfp8, dense[i].n,
                                        dense[i].k, m, main_arm));
  std::vector<Meas> lm_head;
  for (int64_t m : {int64_t{1}, int64_t{8}})
    lm_head.push_back(bench_dense("bf16 lm_head [200064x6144]", QuantFormat::kBf16, 200064, 6144,
                                  m, Arm::kSplitK));
  // The experts: kDequantSplitK or kMmaRing (kMmaDirect reads one matrix, not experts).
  const bool moe_ring = main_arm != Arm::kSplitK;
  std::vector<Meas> moe_ms;
  for (int64_t b : batches) moe_ms.push_back(bench_moe(b, moe_ring));
  // kDequantSplitK (activations in shared memory, loads + scales in flight, 64 registers) beside
  // the main rows when they are another kernel.
  if (main_arm != Arm::kSplitK) {
    for (int i : {0, 1, 2, 3, 4, 5})
      for (int64_t m : {int64_t{1}, int64_t{2}, int64_t{8}})
        bench_dense(dense[i].name, QuantFormat::kMxfp8, dense[i].n, dense[i].k, m, Arm::kSplitK);
    for (int64_t b : batches) bench_moe(b, false);
  }
  // kMmaRing (tensor cores, fused epilogue) beside the main rows when they are another kernel.
  if (main_arm != Arm::kRing) {
    for (int i : {0, 1, 2, 3, 4, 5})
      for (int64_t m : {int64_t{1}, int64_t{8}, int64_t{32}})
        bench_dense(dense[i].name, QuantFormat::kMxfp8, dense[i].n, dense[i].k, m, Arm::kRing);
    if (!moe_ring)
      for (int64_t b : batches) bench_moe(b, true);
  } else {
    for (int i : {0, 1, 2, 3})
      for (int64_t m : {int64_t{2}, int64_t{32}})
        bench_dense(dense[i].name, QuantFormat::kMxfp8, dense[i].n, dense[i].k, m, Arm::kRing);
  }
  // kMmaRing on NVFP4 experts in the mma layout (what the model runs at every batch).
  for (int64_t b : batches) bench_moe(b, true, true);
  // kMmaDirect on the mma layout (what the model runs for every MXFP8 matrix: the bf16 row at one
  // row, f16 rows from two).
  if (!is_direct(main_arm))
    for (int i : {0, 1, 2, 3, 4, 5})
      for (int64_t m : {int64_t{1}, int64_t{8}, int64_t{32}})
        bench_dense(dense[i].name, QuantFormat::kMxfp8, dense[i].n, dense[i].k, m,
                    Arm::kDirectLayout);
  for (int64_t b : batches) bench_sampling(b, false);
  bench_sampling(1, true);
  bench_sampling(128, true);
  std::vector<std::pair<Meas, Meas>> attn4k, attn32k;
  for (int64_t b : batches) {
    attn4k.push_back(bench_attention(b, 4096));
    attn32k.push_back(bench_attention(b, 32768));
  }

  // Composed estimate (sum of measured kernel medians; NOT a measured decode step): 60 sparse
  // attention layers (qkv+indexer, indexer, attention, o_proj), 57 MoE layers (routed experts +
  // shared expert), 3 dense-MLP layers, lm_head. Norms, RoPE, router are not included.
  std::printf("\ncomposed per-token decode estimate (sum of kernel medians above; excludes norms, "
              "RoPE, router, residual adds):\n");
  for (int bi = 0; bi < 2; ++bi) {
    const int64_t b = batches[bi];
    const int col = bi;  // dense measured at M = 1 and 8
    for (int c = 0; c < 2; ++c) {
      const auto& at = c == 0 ? attn4k[bi] : attn32k[bi];
      Meas total;
      auto add = [&](const Meas& m, double times) {
        total.ms += times * m.ms;
        total.bytes += times * m.bytes;
      };
      for (const Meas* m : std::initializer_list<const Meas*>{&dense_ms[0][col], &at.first, &at.second, &dense_ms[1][col]}) add(*m, 60);
      for (const Meas* m : std::initializer_list<const Meas*>{&moe_ms[bi], &dense_ms[2][col], &dense_ms[3][col]}) add(*m, 57);
      for (const Meas* m : std::initializer_list<const Meas*>{&dense_ms[4][col], &dense_ms[5][col]}) add(*m, 3);
      add(lm_head[col], 1);
      const double rate = total.bytes / (total.ms * 1e-3);
      std::printf("  batch %3lld ctx %2dK: %.2f ms per step, %.2f GB moved, %.0f GB/s = %.1f%% of "
                  "HBM roofline\n",
                  (long long)b, c == 0 ? 4 : 32, total.ms, total.bytes / 1e9, rate / 1e9,
                  100 * rate / kHbm);
      if (g_tsv)
        std::fprintf(g_tsv, "composed step B=%lld ctx=%dK\t%.3f\t%.0f\t%.0f\t%.4f\t%.4f\t0\n",
                     (long long)b, c == 0 ? 4 : 32, total.ms * 1e3, total.bytes, rate / 1e9,
                     rate / kHbm, rate / g_copy_rate);
    }
  }
  std::printf("\nindexer and sparse attention inside CUDA graphs (no host launch overhead):\n");
  for (int64_t b : {1, 2, 4, 8})
    for (int64_t ctx : {4096, 32768}) bench_attention_graph(b, ctx);
  if (g_tsv) std::fclose(g_tsv);
  return 0;
}
