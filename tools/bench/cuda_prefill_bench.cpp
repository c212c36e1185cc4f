// Prefill throughput of the MiniMax-M3.1-Flash architecture on one GPU with dummy weights in the
// real formats (src/backend/cuda/dummy), at T = 8K and 32K prompt tokens (one chunk each), on a
// slice of two layers: one dense-MLP layer (layers 0-2) and one MoE layer (layers 3-59), both
// with MSA sparse attention. Per layer the matrix work runs through the prefill path
// (src/backend/cuda/prefill: exact bf16 dequantisation + cuBLASLt bf16, float32 accumulation):
//   q|k|v|index projections  MXFP8 [9856 x 6144]      -> bf16
//   indexer + block-sparse attention over the chunk (src/backend/cuda/attention/sparse_prefill)
//   o_proj                   MXFP8 [6144 x 8192]      -> f32
//   router                   BF16  [128 x 6144]       -> f32 (routing itself: uniform random
//                                                        top-4, fixed per run)
//   routed experts           NVFP4 128 x ([6144 x 6144] gate|up, [6144 x 3072] down), top-4
//   shared expert            MXFP8 [6144 x 6144] + SwiGLU + [6144 x 3072]
//   dense MLP (layers 0-2)   MXFP8 [24576 x 6144] + SwiGLU + [6144 x 12288]
// Not included (memory-bound, small at these T): RMSNorms, QK-norm + RoPE, KV write, residual
// adds, embedding; the lm_head (prefill needs only the last token's logits).
// Each component is timed with CUDA events (median of 3 after 1 warm-up); the layer time is their
// sum (NOT one measured launch sequence), and 60 layers = 3 dense + 57 MoE layers, extrapolated.
// FLOPs count 2 per multiply-add of the GEMMs as executed (routed rows only), 4·H·D per attended
// key (QK and PV; keys = min(causal keys, top-16 blocks)) and 2·Hix·Dix per indexer key.
//
// The routed experts are in the mma layouts the model repacks them to, and the layer sums the
// kernel the model picks for the step (CudaM3Kernels: the grouped kernel, kGroupedWgmma by
// default, up to 16384 tokens, else kDequantCublas); the other is timed beside it (printed, not
// summed).
//
// --experts: the routed experts alone (NVFP4, 128 experts, top-4, uniform random routing), old
// (kDequantCublas) vs the grouped kernels (kGroupedInLoop: mma.sync main loop; kGroupedWgmma:
// the Hopper wgmma main loop; kGroupedWgmmaRegisterWeights: the weights as wgmma's register
// operand, mma layouts only), with the weights row-major and then in the mma layouts the model
// repacks them to; FLOPs 2·T·top_k·(2·I·Hd + Hd·I), TFLOP/s and the fraction of the bf16 peak per
// row. Default tokens there: 512 2048 8192 32768.
//
// Usage: cuda_prefill_bench [results.tsv|-] [--experts] [tokens...]
//        (default tokens: 8192 32768)
//        cuda_prefill_bench --attention [tokens...]      attention and indexer of one layer
//          alone, old vs new kernels (attention_kernels_bench below)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/attention/sparse_prefill.h"
#include "backend/cuda/dummy/dummy_weights.h"
#include "backend/cuda/gemm/nvfp4_repack.h"
#include "backend/cuda/prefill/prefill_gemm.h"
#include "backend/cuda/runtime/caching_allocator.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "core/dtype.h"
#include "cuda_bench_util.h"
#include "model/minimax_m3/cuda/cuda_m3_model.h"

namespace {

using namespace m3;
using namespace m3::cuda;
using namespace m3::cuda_bench;

constexpr double kPeak = 830e12;  // bf16 dense, cuBLASLt on random data (docs/performance.md)
constexpr int64_t kHd = 6144, kH = 64, kHkv = 4, kD = 128, kHix = 4, kDix = 128, kS = 128;
constexpr int64_t kTopK = 16, kE = 128, kK4 = 4, kI = 3072, kSI = 3072, kDI = 12288;
constexpr int64_t kQkv = 9856;
constexpr int kDenseLayers = 3, kMoeLayers = 57;

FILE* g_tsv = nullptr;

QuantWeight make(QuantFormat f, int64_t n, int64_t k, int64_t g = 1) {
  QuantWeight w;
  w.format = f;
  w.n = n;
  w.k = k;
  const DummyMatrices d = dummy_matrices(f, n, k, g);
  w.w = d.w, w.w_scale = d.scale, w.w_global = d.global;
  return w;
}

// Median of 3 timed calls after 1 warm-up (plans, allocator).
template <typename F>
double time_ms(F&& f) {
  return median_ms([&](int) { f(); }, 1, 3);
}

struct Row {
  std::string name;
  double ms, flops;
};

void report(int64_t t, const Row& r) {
  const double tf = r.flops / (r.ms * 1e-3) / 1e12;
  std::printf("T=%-6lld %-44s %10.3f ms %9.2f TFLOP %8.1f TFLOP/s %6.1f%% of 830\n",
              (long long)t, r.name.c_str(), r.ms, r.flops / 1e12, tf, 100 * tf * 1e12 / kPeak);
  if (g_tsv)
    std::fprintf(g_tsv, "%lld\t%s\t%.4f\t%.6g\t%.3f\t%.4f\n", (long long)t, r.name.c_str(), r.ms,
                 r.flops, tf, tf * 1e12 / kPeak);
}

// Index queries [t, kHix, kDix] (device) that neighbouring tokens share, as the model's do: one
// random query per 64-token segment plus 0.25 noise per token. The dummy fill (independent per
// token) is the other regime: neighbours then share little beyond the forced init / local blocks,
// the worst case for kTiled's 8-token tiles.
void fill_correlated_index_queries(uint16_t* iq, int64_t t) {
  std::vector<uint16_t> hiq(static_cast<size_t>(t * kHix * kDix));
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::vector<float> base(static_cast<size_t>(kHix * kDix));
  for (int64_t i = 0; i < t; ++i) {
    if (i % 64 == 0)
      for (float& x : base) x = nd(rng);
    for (int64_t j = 0; j < kHix * kDix; ++j)
      hiq[static_cast<size_t>(i * kHix * kDix + j)] =
          f32_to_bf16(base[static_cast<size_t>(j)] + 0.25f * nd(rng));
  }
  CHECK_CUDA(cudaMemcpy(iq, hiq.data(), hiq.size() * 2, cudaMemcpyHostToDevice));
}

// --attention: the prefill attention of one layer, one chunk of T tokens at positions 0..T-1
// (chunk = context), its parts timed alone on the same data:
//   indexer block scores: kGemmScores (gather the index keys, then per sub-chunk of the 512 MiB
//     scratch the cuBLASLt token scores + max-pool; the causal widths from the known positions,
//     i.e. without the host synchronisation the real path has) vs kFusedMaxPool;
//   attention on a fixed selection (the fused indexer's top-16 with 1 init + 1 local block):
//     kTensorCore vs kTiled;
//   the whole launch_prefill_attention (indexer + top-k + attention): (kTensorCore, kGemmScores)
//     vs (kTiled, kFusedMaxPool).
// FLOPs actually needed: 4·T·H·D per attended key (the selection's causal keys, counted from the
// selection itself) and 2·T·Hix·Dix per causal indexer key.
void attention_kernels_bench(const std::vector<int64_t>& tokens, CachingAllocator* alloc,
                             PrefillGemm* gemm) {
  for (const int64_t t : tokens) {
    const int64_t nb = (t + kS - 1) / kS;
    uint16_t* kc = dfill<uint16_t>(nb * kS * kHkv * kD, DummyKind::kBf16Normal);
    uint16_t* vc = dfill<uint16_t>(nb * kS * kHkv * kD, DummyKind::kBf16Normal);
    uint16_t* ikc = dfill<uint16_t>(nb * kS * kDix, DummyKind::kBf16Normal);
    uint16_t* q = dfill<uint16_t>(t * kH * kD, DummyKind::kBf16Normal);
    uint16_t* iq = dfill<uint16_t>(t * kHix * kDix, DummyKind::kBf16Normal);
    std::vector<int32_t> hpos(t), htab(nb);
    for (int64_t i = 0; i < t; ++i) hpos[i] = static_cast<int32_t>(i);
    for (int64_t i = 0; i < nb; ++i) htab[i] = static_cast<int32_t>(i);
    int32_t* dpos = dalloc<int32_t>(t);
    int32_t* dtab = dalloc<int32_t>(nb);
    CHECK_CUDA(cudaMemcpy(dpos, hpos.data(), t * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dtab, htab.data(), nb * 4, cudaMemcpyHostToDevice));
    uint16_t* out = dalloc<uint16_t>(t * kH * kD);
    int32_t* sel = dalloc<int32_t>(t * kHix * kTopK);
    PrefillAttentionParams ap;
    ap.q = q;
    ap.iq = iq;
    ap.cache = {kc, vc, ikc, nb, kS, kHkv, kD, kDix};
    ap.positions = dpos;
    ap.block_table = dtab;
    ap.t = t;
    ap.num_heads = kH;
    ap.num_index_heads = kHix;
    ap.num_blocks = nb;
    ap.top_k = kTopK;
    ap.init_blocks = 1;
    ap.scale = 1.0f / std::sqrt(float(kD));
    ap.selected = sel;
    ap.out = out;
    ap.gemm = gemm;
    ap.kernel = PrefillAttentionKernel::kTiled;
    ap.indexer = PrefillIndexerKernel::kFusedMaxPool;
    double idx_keys = 0;
    for (int64_t i = 0; i < t; ++i) idx_keys += double(i + 1) * kHix;
    const double idx_flops = 2.0 * kDix * idx_keys;

    // Indexer block scores alone.
    float* bscores = dalloc<float>(t * kHix * nb);
    uint16_t* keys = dalloc<uint16_t>(nb * kS * kDix);
    const int64_t per_token = kHix * nb * kS * 4;
    const int64_t chunk = std::clamp<int64_t>((int64_t{512} << 20) / per_token, 1, t);
    float* tscores = dalloc<float>(chunk * kHix * nb * kS);
    const double idx_old = time_ms([&] {
      CHECK_OK(launch_gather_index_keys(ap.cache, dtab, nb, keys, st()));
      for (int64_t t0 = 0; t0 < t; t0 += chunk) {
        const int64_t n = std::min(chunk, t - t0);
        const int64_t nb_sub = std::min(nb, (t0 + n - 1) / kS + 1);
        PrefillLinearParams lp;
        lp.x = iq + t0 * kHix * kDix;
        lp.ldx = kDix;
        lp.m = n * kHix;
        lp.w.format = QuantFormat::kBf16;
        lp.w.w = reinterpret_cast<const uint8_t*>(keys);
        lp.w.n = nb_sub * kS;
        lp.w.k = kDix;
        lp.y = tscores;
        lp.ldy = nb_sub * kS;
        lp.out = PrefillOut::kF32;
        CHECK_OK(gemm->linear(lp, st()));
        CHECK_OK(launch_index_maxpool(tscores, nb_sub * kS, nb_sub, dpos + t0, dtab, nb, n, kHix,
                                      nb, bscores + t0 * kHix * nb, st()));
      }
    });
    report(t, {"indexer scores kGemmScores (v1)", idx_old, idx_flops});
    const double idx_new = time_ms([&] {
      CHECK_OK(launch_index_block_scores_fused(iq, ap.cache, dpos, dtab, t, kHix, nb, bscores,
                                               st()));
    });
    report(t, {"indexer scores kFusedMaxPool (v2)", idx_new, idx_flops});

    // Two selection regimes: the dummy index queries, then fill_correlated_index_queries.
    for (int regime = 0; regime < 2; ++regime) {
      if (regime == 1) fill_correlated_index_queries(iq, t);
      const char* rname = regime == 0 ? "random iq" : "correlated iq";
      ap.kernel = PrefillAttentionKernel::kTiled;
      ap.indexer = PrefillIndexerKernel::kFusedMaxPool;
      CHECK_OK(launch_prefill_attention(ap, alloc, st()));  // the selection of the attention rows
      std::vector<int32_t> hsel(static_cast<size_t>(t * kHix * kTopK));
      CHECK_CUDA(cudaMemcpy(hsel.data(), sel, hsel.size() * 4, cudaMemcpyDeviceToHost));
      double attn_keys = 0, union_blocks = 0, token_blocks = 0;
      for (int64_t i0 = 0; i0 < t; i0 += 8) {
        for (int64_t g = 0; g < kHkv; ++g) {
          std::vector<int32_t> tile;
          for (int64_t i = i0; i < std::min(i0 + 8, t); ++i) {
            const int32_t* s = hsel.data() + (i * kHkv + g) * kTopK;
            for (int64_t j = 0; j < kTopK; ++j) {
              const int64_t b = s[j];
              if (b < 0 || b > i / kS || std::find(s, s + j, s[j]) != s + j) continue;
              attn_keys += double(std::min<int64_t>(kS, i - b * kS + 1)) * (kH / kHkv);
              token_blocks += 1;
              tile.push_back(s[j]);
            }
          }
          std::sort(tile.begin(), tile.end());
          union_blocks += double(std::unique(tile.begin(), tile.end()) - tile.begin());
        }
      }
      const double tiles = double((t + 7) / 8) * kHkv;
      std::printf("T=%-6lld %s: %.1f blocks per token, %.1f blocks in the union of an 8-token "
                  "tile (kTiled loads each once)\n",
                  (long long)t, rname, token_blocks / (double(t) * kHkv), union_blocks / tiles);
      const double attn_flops = 4.0 * kD * attn_keys;
      // Attention alone on the fixed selection.
      const double attn_old =
          time_ms([&] { CHECK_OK(launch_prefill_attention_mma(ap, sel, kTopK, st())); });
      report(t, {std::string("sparse attention kTensorCore (v1), ") + rname, attn_old, attn_flops});
      const double attn_new =
          time_ms([&] { CHECK_OK(launch_prefill_attention_tiled(ap, sel, kTopK, st())); });
      report(t, {std::string("sparse attention kTiled (v2), ") + rname, attn_new, attn_flops});

      // The whole call.
      for (int v = 1; v <= 2; ++v) {
        ap.kernel = static_cast<PrefillAttentionKernel>(v);
        ap.indexer = static_cast<PrefillIndexerKernel>(v);
        const double ms = time_ms([&] { CHECK_OK(launch_prefill_attention(ap, alloc, st())); });
        report(t, {"launch_prefill_attention v" + std::to_string(v) + ", " + rname, ms,
                   attn_flops + idx_flops});
      }
    }
    std::printf("\n");
    CHECK_CUDA(cudaStreamSynchronize(g_stream));
    alloc->release_cached();
  }
}

const char* moe_kernel_name(PrefillMoeKernel k) {
  switch (k) {
    case PrefillMoeKernel::kDequantCublas: return "old (dequant+cublas)";
    case PrefillMoeKernel::kGroupedInLoop: return "grouped in-loop (mma.sync)";
    case PrefillMoeKernel::kGroupedWgmma: return "grouped in-loop (wgmma)";
    case PrefillMoeKernel::kGroupedWgmmaRegisterWeights: return "grouped wgmma, weights in registers";
  }
  return "?";
}

// Uniform random top-4 routing over the 128 experts (distinct, ascending per token), weights
// 0.25, on the device.
struct DevRouting {
  int32_t* ids = nullptr;
  float* wts = nullptr;
};
DevRouting random_routing(int64_t t) {
  std::vector<int32_t> ids(t * kK4);
  std::vector<float> wts(t * kK4, 0.25f);
  std::mt19937 rng(7);
  for (int64_t i = 0; i < t; ++i) {
    std::vector<int32_t> c;
    while (static_cast<int64_t>(c.size()) < kK4) {
      const int32_t e = static_cast<int32_t>(rng() % kE);
      if (std::find(c.begin(), c.end(), e) == c.end()) c.push_back(e);
    }
    std::sort(c.begin(), c.end());
    std::copy(c.begin(), c.end(), ids.begin() + i * kK4);
  }
  DevRouting r{dalloc<int32_t>(t * kK4), dalloc<float>(t * kK4)};
  CHECK_CUDA(cudaMemcpy(r.ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(r.wts, wts.data(), wts.size() * 4, cudaMemcpyHostToDevice));
  return r;
}

// The routed experts alone, old vs new kernel, row-major then mma-layout weights.
void bench_experts(PrefillGemm& gemm, CachingAllocator& alloc, const std::vector<int64_t>& tokens) {
  QuantWeight e13 = make(QuantFormat::kNvfp4, 2 * kI, kHd, kE);
  QuantWeight e2 = make(QuantFormat::kNvfp4, kHd, kI, kE);
  for (int layout = 0; layout < 2; ++layout) {
    if (layout == 1) {
      // As CudaM3Model::repack_nvfp4: gate|up in gate/up row pairs, down in 16-row tiles.
      CHECK_OK(nvfp4_mma_repack_in_place(const_cast<uint8_t*>(e13.w), kE, e13.n, e13.k,
                                         nvfp4_mma::Tiling::kSwigluPairs, st()));
      CHECK_OK(nvfp4_mma_repack_in_place(const_cast<uint8_t*>(e2.w), kE, e2.n, e2.k,
                                         nvfp4_mma::Tiling::kRows16, st()));
      e13.layout = WeightLayout::kMmaSwigluPairs;
      e2.layout = WeightLayout::kMmaRows16;
    }
    for (const int64_t t : tokens) {
      uint16_t* x = dfill<uint16_t>(t * kHd, DummyKind::kBf16Normal);
      float* out = dalloc<float>(t * kHd);
      const DevRouting r = random_routing(t);
      PrefillMoeParams mp;
      mp.x = x;
      mp.topk_ids = r.ids;
      mp.topk_weights = r.wts;
      mp.w13 = e13;
      mp.w2 = e2;
      mp.out = out;
      mp.t = t;
      mp.hidden = kHd;
      mp.inter = kI;
      mp.num_experts = kE;
      mp.top_k = kK4;
      const double flops = 2.0 * t * kK4 * (2 * kI * kHd + kHd * kI);
      const PrefillMoeKernel kernels[4] = {
          PrefillMoeKernel::kDequantCublas, PrefillMoeKernel::kGroupedInLoop,
          PrefillMoeKernel::kGroupedWgmma, PrefillMoeKernel::kGroupedWgmmaRegisterWeights};
      double ms[4];
      // Row-major weights: the register-weights loop would fall back to the wgmma one.
      const int n_kernels = layout == 1 ? 4 : 3;
      for (int k = 0; k < n_kernels; ++k) {
        mp.kernel = kernels[k];
        ms[k] = time_ms([&] { CHECK_OK(gemm.moe(mp, st())); });
        const std::string name = std::string("routed experts ") +
                                 (layout ? "mma-layout " : "row-major ") + moe_kernel_name(kernels[k]);
        report(t, {name, ms[k], flops});
        std::printf("T=%-6lld   %s: %.0f tokens/s through one layer's routed experts\n",
                    (long long)t, name.c_str(), t / (ms[k] * 1e-3));
      }
      std::printf("T=%-6lld   speed-up over dequant+cublas: mma.sync %.2fx, wgmma %.2fx; "
                  "wgmma / mma.sync %.2fx\n",
                  (long long)t, ms[0] / ms[1], ms[0] / ms[2], ms[1] / ms[2]);
      if (n_kernels == 4)
        std::printf("T=%-6lld   weights in registers: %.2fx dequant+cublas, %.2fx wgmma\n",
                    (long long)t, ms[0] / ms[3], ms[2] / ms[3]);
      CHECK_CUDA(cudaStreamSynchronize(g_stream));
      alloc.release_cached();
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  g_seed = 300;
  if (argc > 1 && std::string(argv[1]) == "--attention") {
    std::vector<int64_t> tokens;
    for (int i = 2; i < argc; ++i) tokens.push_back(std::atoll(argv[i]));
    if (tokens.empty()) tokens = {8192, 32768};
    CHECK_CUDA(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    CachingAllocator alloc;
    auto gemm_r = PrefillGemm::create(&alloc);
    CHECK_OK(gemm_r.status());
    attention_kernels_bench(tokens, &alloc, gemm_r->get());
    for (void* p : g_allocs) cudaFree(p);
    return 0;
  }
  std::vector<int64_t> tokens;
  bool experts_only = false;
  for (int i = 2; i < argc; ++i) {
    if (std::string(argv[i]) == "--experts") {
      experts_only = true;
    } else {
      tokens.push_back(std::atoll(argv[i]));
    }
  }
  if (tokens.empty() && experts_only) tokens = {512, 2048, 8192, 32768};
  if (tokens.empty()) tokens = {8192, 32768};
  if (argc > 1 && std::string(argv[1]) != "-") g_tsv = std::fopen(argv[1], "w");
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs; peak used: %.0f TFLOP/s bf16\n", prop.name,
              prop.multiProcessorCount, kPeak / 1e12);
  CHECK_CUDA(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  if (g_tsv) std::fprintf(g_tsv, "tokens\tcomponent\tms\tflops\tTFLOP/s\tfrac_peak\n");
  CachingAllocator alloc;
  auto gemm_r = PrefillGemm::create(&alloc);
  CHECK_OK(gemm_r.status());
  PrefillGemm& gemm = **gemm_r;
  if (experts_only) {
    bench_experts(gemm, alloc, tokens);
    if (g_tsv) std::fclose(g_tsv);
    for (void* p : g_allocs) cudaFree(p);
    return 0;
  }

  // Weights of the two layers of the slice.
  QuantWeight qkv = make(QuantFormat::kMxfp8, kQkv, kHd);
  QuantWeight o_proj = make(QuantFormat::kMxfp8, kHd, kH * kD);
  QuantWeight router = make(QuantFormat::kBf16, kE, kHd);
  QuantWeight e13 = make(QuantFormat::kNvfp4, 2 * kI, kHd, kE);
  QuantWeight e2 = make(QuantFormat::kNvfp4, kHd, kI, kE);
  // The routed experts in the layouts the model serves them in (CudaM3Model::repack_nvfp4).
  CHECK_OK(nvfp4_mma_repack_in_place(const_cast<uint8_t*>(e13.w), kE, e13.n, e13.k,
                                     nvfp4_mma::Tiling::kSwigluPairs, st()));
  CHECK_OK(nvfp4_mma_repack_in_place(const_cast<uint8_t*>(e2.w), kE, e2.n, e2.k,
                                     nvfp4_mma::Tiling::kRows16, st()));
  e13.layout = WeightLayout::kMmaSwigluPairs;
  e2.layout = WeightLayout::kMmaRows16;
  QuantWeight s13 = make(QuantFormat::kMxfp8, 2 * kSI, kHd);
  QuantWeight s2 = make(QuantFormat::kMxfp8, kHd, kSI);
  QuantWeight d13 = make(QuantFormat::kMxfp8, 2 * kDI, kHd);
  QuantWeight d2 = make(QuantFormat::kMxfp8, kHd, kDI);

  for (const int64_t t : tokens) {
    const int64_t nb = (t + kS - 1) / kS;
    std::vector<Row> attn_rows, moe_rows, dense_rows;
    uint16_t* x = dfill<uint16_t>(t * kHd, DummyKind::kBf16Normal);
    uint16_t* big_bf16 = dalloc<uint16_t>(t * std::max(kQkv, 2 * kDI));
    float* y = dalloc<float>(t * std::max<int64_t>(kHd, 2 * kDI));
    uint16_t* act = dalloc<uint16_t>(t * kDI);
    float* moe_out = dalloc<float>(t * kHd);
    auto lin = [&](const QuantWeight& w, const uint16_t* in, int64_t ldx, void* out,
                   PrefillOut ot) {
      PrefillLinearParams p;
      p.x = in;
      p.ldx = ldx;
      p.m = t;
      p.w = w;
      p.y = out;
      p.ldy = w.n;
      p.out = ot;
      CHECK_OK(gemm.linear(p, st()));
    };
    auto flops_of = [&](const QuantWeight& w, int64_t m) { return 2.0 * m * w.n * w.k; };
    attn_rows.push_back({"mxfp8 qkv+indexer [9856x6144] -> bf16",
                         time_ms([&] { lin(qkv, x, kHd, big_bf16, PrefillOut::kBf16); }),
                         flops_of(qkv, t)});

    // Attention over the chunk: dummy bf16 cache of the whole prompt, positions 0..T-1.
    uint16_t* kc = dfill<uint16_t>(nb * kS * kHkv * kD, DummyKind::kBf16Normal);
    uint16_t* vc = dfill<uint16_t>(nb * kS * kHkv * kD, DummyKind::kBf16Normal);
    uint16_t* ikc = dfill<uint16_t>(nb * kS * kDix, DummyKind::kBf16Normal);
    uint16_t* q = dfill<uint16_t>(t * kH * kD, DummyKind::kBf16Normal);
    uint16_t* iq = dfill<uint16_t>(t * kHix * kDix, DummyKind::kBf16Normal);
    std::vector<int32_t> hpos(t), htab(nb);
    for (int64_t i = 0; i < t; ++i) hpos[i] = static_cast<int32_t>(i);
    for (int64_t i = 0; i < nb; ++i) htab[i] = static_cast<int32_t>(i);
    int32_t* dpos = dalloc<int32_t>(t);
    int32_t* dtab = dalloc<int32_t>(nb);
    CHECK_CUDA(cudaMemcpy(dpos, hpos.data(), t * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dtab, htab.data(), nb * 4, cudaMemcpyHostToDevice));
    uint16_t* attn_out = dalloc<uint16_t>(t * kH * kD);
    PrefillAttentionParams ap;
    ap.q = q;
    ap.iq = iq;
    ap.cache = {kc, vc, ikc, nb, kS, kHkv, kD, kDix};
    ap.positions = dpos;
    ap.block_table = dtab;
    ap.t = t;
    ap.num_heads = kH;
    ap.num_index_heads = kHix;
    ap.num_blocks = nb;
    ap.top_k = kTopK;
    ap.init_blocks = 1;
    ap.scale = 1.0f / std::sqrt(float(kD));
    ap.out = attn_out;
    double attn_keys = 0, idx_keys = 0;
    for (int64_t i = 0; i < t; ++i) {
      const int64_t qb = i / kS;
      attn_keys += qb < kTopK ? double(i + 1) : double((kTopK - 1) * kS + i % kS + 1);
      idx_keys += double(i + 1);
    }
    // PrefillAttentionKernel kPerTokenDecode and kTensorCore with the per-token indexer, then
    // kTensorCore with kGemmScores, then kTiled with kFusedMaxPool; the layer sums take the fastest
    // (prefill_attention_test checks both on the same run).
    const double attn_flops = 4.0 * kH * kD * attn_keys + 2.0 * kHix * kDix * idx_keys;
    ap.gemm = &gemm;
    const int combos[4][2] = {{0, 0}, {1, 0}, {1, 1}, {2, 2}};  // (PrefillAttentionKernel, PrefillIndexerKernel)
    double attn_v[4];
    int best = 0;
    for (int v = 0; v < 4; ++v) {
      ap.kernel = static_cast<cuda::PrefillAttentionKernel>(combos[v][0]);
      ap.indexer = static_cast<cuda::PrefillIndexerKernel>(combos[v][1]);
      attn_v[v] = time_ms([&] { CHECK_OK(launch_prefill_attention(ap, &alloc, st())); });
      report(t, {"  indexer v" + std::to_string(combos[v][1]) + " + sparse attention v" +
                     std::to_string(combos[v][0]),
                 attn_v[v], attn_flops});
      if (attn_v[v] < attn_v[best]) best = v;
    }
    attn_rows.push_back({"indexer v" + std::to_string(combos[best][1]) + " + attention v" +
                             std::to_string(combos[best][0]) + " (fastest)",
                         attn_v[best], attn_flops});
    // The production pair again with index queries that neighbours share (the model's regime;
    // the FLOPs counted as above, which assume full blocks): reported, and summed into a second
    // extrapolation below, not into the layer rows.
    fill_correlated_index_queries(iq, t);
    ap.kernel = cuda::PrefillAttentionKernel::kTiled;
    ap.indexer = cuda::PrefillIndexerKernel::kFusedMaxPool;
    const double attn_correlated_ms =
        time_ms([&] { CHECK_OK(launch_prefill_attention(ap, &alloc, st())); });
    report(t, {"  (not summed) indexer v2 + attention v2, correlated index queries",
               attn_correlated_ms, attn_flops});
    attn_rows.push_back({"mxfp8 o_proj [6144x8192] -> f32",
                         time_ms([&] { lin(o_proj, attn_out, kH * kD, y, PrefillOut::kF32); }),
                         flops_of(o_proj, t)});

    // MoE layer: router GEMM, routed experts (uniform random top-4, fixed), shared expert.
    moe_rows.push_back({"bf16 router [128x6144] -> f32",
                        time_ms([&] { lin(router, x, kHd, y, PrefillOut::kF32); }),
                        flops_of(router, t)});
    const DevRouting routing = random_routing(t);
    PrefillMoeParams mp;
    mp.x = x;
    mp.topk_ids = routing.ids;
    mp.topk_weights = routing.wts;
    mp.w13 = e13;
    mp.w2 = e2;
    mp.out = moe_out;
    mp.t = t;
    mp.hidden = kHd;
    mp.inter = kI;
    mp.num_experts = kE;
    mp.top_k = kK4;
    char name[96];
    const double routed_flops = 2.0 * t * kK4 * (2 * kI * kHd + kHd * kI);
    // Both kernels; the layer sums the one the model picks (CudaM3Kernels' defaults).
    const minimax_m3::CudaM3Kernels model_choice;
    mp.kernel = PrefillMoeKernel::kDequantCublas;
    const double cublas_ms = time_ms([&] { CHECK_OK(gemm.moe(mp, st())); });
    mp.kernel = model_choice.prefill_moe_kernel();
    const double model_ms = time_ms([&] { CHECK_OK(gemm.moe(mp, st())); });
    const bool model_is_cublas = mp.kernel == PrefillMoeKernel::kDequantCublas;
    if (!model_is_cublas) {
      report(t, {"  (not summed) routed experts, dequant+cublas", cublas_ms, routed_flops});
    }
    std::snprintf(name, sizeof name, "nvfp4 routed experts top-4, %s", moe_kernel_name(mp.kernel));
    moe_rows.push_back({name, model_ms, routed_flops});
    auto mlp = [&](const QuantWeight& w13, const QuantWeight& w2, int64_t inter) {
      lin(w13, x, kHd, y, PrefillOut::kF32);
      CHECK_OK(launch_swiglu_oai_bf16(y, t, inter, 1.702f, 7.0f, act, st()));
      lin(w2, act, inter, moe_out, PrefillOut::kF32);
    };
    moe_rows.push_back({"mxfp8 shared expert (gate|up, swiglu, down)",
                        time_ms([&] { mlp(s13, s2, kSI); }),
                        flops_of(s13, t) + flops_of(s2, t)});
    dense_rows.push_back({"mxfp8 dense MLP (gate|up, swiglu, down)",
                          time_ms([&] { mlp(d13, d2, kDI); }),
                          flops_of(d13, t) + flops_of(d2, t)});

    double attn_ms = 0, attn_fl = 0, moe_ms_sum = 0, moe_fl = 0, dense_ms = 0, dense_fl = 0;
    for (auto& r : attn_rows) report(t, r), attn_ms += r.ms, attn_fl += r.flops;
    for (auto& r : moe_rows) report(t, r), moe_ms_sum += r.ms, moe_fl += r.flops;
    for (auto& r : dense_rows) report(t, r), dense_ms += r.ms, dense_fl += r.flops;
    const Row moe_layer{"MoE layer (sum of the above)", attn_ms + moe_ms_sum, attn_fl + moe_fl};
    const Row dense_layer{"dense-MLP layer (sum of the above)", attn_ms + dense_ms,
                          attn_fl + dense_fl};
    report(t, moe_layer);
    report(t, dense_layer);
    const Row model{"60 layers (3 dense + 57 MoE), extrapolated",
                    kDenseLayers * dense_layer.ms + kMoeLayers * moe_layer.ms,
                    kDenseLayers * dense_layer.flops + kMoeLayers * moe_layer.flops};
    report(t, model);
    const double attn_delta = attn_correlated_ms - attn_rows[1].ms;
    const Row model_correlated{"60 layers, attention with correlated index queries",
                               model.ms + (kDenseLayers + kMoeLayers) * attn_delta, model.flops};
    report(t, model_correlated);
    std::printf("T=%-6lld MoE layer: %.0f prefill tokens/s (one layer)\n", (long long)t,
                t / (moe_layer.ms * 1e-3));
    std::printf("T=%-6lld prefill %.0f tokens/s (60 layers, extrapolated); %.2f GFLOP/token; "
                "attention share %.0f%% of the MoE layer time; %.0f tokens/s with correlated "
                "index queries\n\n",
                (long long)t, t / (model.ms * 1e-3), model.flops / t / 1e9,
                100 * attn_rows[1].ms / moe_layer.ms, t / (model_correlated.ms * 1e-3));
    if (g_tsv)
      std::fprintf(g_tsv, "%lld\tprefill tokens/s (60 layers, extrapolated)\t%.4f\t%.6g\t%.1f\t0\n",
                   (long long)t, model.ms, model.flops, t / (model.ms * 1e-3));
    // Free this T's activations (weights stay).
    CHECK_CUDA(cudaStreamSynchronize(g_stream));
    alloc.release_cached();
  }
  if (g_tsv) std::fclose(g_tsv);
  for (void* p : g_allocs) cudaFree(p);
  return 0;
}
