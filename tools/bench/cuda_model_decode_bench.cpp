// Decode through CudaM3Model::forward, the path `m3serve serve --device cuda` runs: the
// MiniMax-M3.1-Flash shapes (builtin_m3_flash_config: layers 0-2 dense MLP, the rest MoE, MSA
// sparse attention everywhere) with weights generated on the GPU in the real formats, B sequences
// at context C, one new token per sequence per step. The step time is the median over 15 steps of
// forward() as the engine calls it: host bookkeeping, the copies of ids / positions / block
// tables, the CUDA-graph replay, and the copy of B x V float32 logits back to the host.
//
// The KV pages are zero (attention costs the same whatever the values); each step rewrites
// position C - 1. Models of 1, 3 and 8 layers, and the largest of up to 24 that fits the free
// memory, give by difference the time of a dense-MLP layer (1 -> 3), a MoE layer (3 -> the
// largest; 8 where no larger one fits) and the rest (embedding, final norm, lm_head, host work);
// the 60-layer figure (3 dense + 57 MoE layers) is extrapolated from them and says so. The step
// is then t3 + 57 (tL - t3) / (L - 3): with L = 24 a noise of s in each measured step moves it by
// ~3.2 s, with L = 8 by ~15 s (11.4 t8 - 10.4 t3).
//
// Bytes per 60-layer step (for the roofline): every dense weight byte once (MXFP8 1 + 1/32 bytes
// per element, BF16 router and lm_head 2), each touched routed expert once (NVFP4 0.5 + 1/16):
// exactly top-k experts at B = 1, the uniform expectation E·(1 - (1 - k/E)^B) above (the dummy
// router's real choice is not measured), and per sequence and layer the selected K/V blocks
// (min(top_k, C / 128) x 128 tokens x Hkv x D x 2 x 2 bytes) plus the whole index-key cache
// (C x Dix x 2) where the indexer runs (C > top_k x 128).
//
// Usage: cuda_model_decode_bench [results.tsv (appended)|-]
// Environment, for profilers and A/B runs: M3_BENCH_ONLY=B,C[;B,C...] runs those configs (batch
// B, context C tokens); M3_BENCH_NORM_CLUSTER_ROWS=N and M3_BENCH_FUSED_ROUTER_ROWS=N set
// CudaM3Tuning's cluster_norm_max_rows and fused_router_max_rows;
// M3_BENCH_LAYERS=L loads one model of L layers (the per-layer split is then not printed);
// M3_BENCH_MAX_BATCH=N sets CudaM3Options::max_batch (the decode path's rows; a batch above it
// takes the prefill path), for an A/B of the two paths at one batch;
// M3_BENCH_BIG_LAYERS=L (9..60, or 0 for none) the model the MoE layer's time is taken from.
// M3_BENCH_KV_DTYPE=fp8_e4m3|fp4_e2m1 stores the KV cache quantised (--kv-cache-dtype; the bytes
// count its codes and scales).
// M3_BENCH_MODEL=m3 runs MiniMax-M3's layer mix instead (builtin_m3_config: layers 0-2 full
// attention, so the "dense" layer time is a full-attention dense-MLP layer's, and the bytes count
// their whole K / V context and no index keys); M3_BENCH_MODEL=flash (the default) M3.1-Flash's.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "model/minimax_m3/dummy_weights.h"
#include "model/minimax_m3/cuda/cuda_m3_model.h"

namespace {

using namespace m3;
using namespace m3::minimax_m3;

constexpr double kHbm = 4.8e12;

// M3_BENCH_MODEL: MiniMax-M3's layer types (layers 0-2 full attention) instead of M3.1-Flash's.
bool g_m3 = false;
// M3_BENCH_KV_DTYPE: the KV cache's storage.
KvCacheDtype g_kv = KvCacheDtype::kBF16;

MiniMaxM3Config bench_config(int64_t layers) {
  return g_m3 ? builtin_m3_config(layers) : builtin_m3_flash_config(layers);
}

struct Config {
  int64_t batch, ctx;
};

// Median ms of forward() over `steps` steps after 3 warm-up steps (the first captures the graph).
double step_ms(CudaM3Model* model, const Config& c, int64_t steps) {
  const int64_t blocks = c.ctx / 128;
  std::vector<std::vector<int32_t>> tables(c.batch), tokens(c.batch);
  std::vector<SequenceInput> in(c.batch);
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t j = 0; j < blocks; ++j) tables[b].push_back(static_cast<int32_t>(b * blocks + j));
    tokens[b] = {static_cast<int32_t>((1000 + 7919 * b) % 200000)};
    in[b].tokens = tokens[b];
    in[b].start_pos = c.ctx - 1;
    in[b].block_table = tables[b];
    in[b].logits_rows = {0};
    // M3_BENCH_SAMPLE=1: every row greedy-sampled on the GPU (what the engine's CUDA runner
    // does for rows without logprobs or penalties): token ids come back instead of logits.
    if (std::getenv("M3_BENCH_SAMPLE") != nullptr && std::atoi(std::getenv("M3_BENCH_SAMPLE")) != 0)
      in[b].sample = DeviceSampling{0.0f, 0, 1.0f, 0.0f, RngKey{1, static_cast<uint64_t>(b), 0}};
  }
  std::vector<double> ms;
  CudaM3Stats before;
  for (int64_t s = 0; s < steps + 3; ++s) {
    if (s == 3) before = model->stats();
    ForwardOutput out;
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = model->forward(in, &out);
    const auto t1 = std::chrono::steady_clock::now();
    if (!st.is_ok()) {
      std::fprintf(stderr, "forward: %s\n", st.to_string().c_str());
      std::exit(1);
    }
    if (s >= 3) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  const CudaM3Stats after = model->stats();
  if (const int64_t n = after.graph_replays - before.graph_replays; n > 0)
    std::printf("  (B=%lld ctx=%lld: host time in cudaGraphLaunch %.1f us per step)\n",
                (long long)c.batch, (long long)c.ctx,
                (after.graph_launch_us - before.graph_launch_us) / double(n));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The tuning of the models: CudaM3Tuning's defaults unless the environment sets them.
CudaM3Tuning tuning() {
  CudaM3Tuning t;
  if (const char* e = std::getenv("M3_BENCH_NORM_CLUSTER_ROWS")) t.cluster_norm_max_rows = std::atoll(e);
  if (const char* e = std::getenv("M3_BENCH_FUSED_ROUTER_ROWS")) t.fused_router_max_rows = std::atoll(e);
  return t;
}

// The model of `layers` layers; a failed load exits, unless `may_fail` (then null).
std::unique_ptr<CudaM3Model> load(int64_t layers, int64_t pages, bool may_fail = false) {
  const MiniMaxM3Config cfg = bench_config(layers);
  DummyWeightSource src(cfg);
  CudaM3Options o;
  o.num_kv_pages = pages;
  if (const char* e = std::getenv("M3_BENCH_MAX_BATCH")) o.max_batch = std::atoll(e);
  o.gpu_dummy_weights = true;
  o.tuning = tuning();
  o.kv_cache_dtype = g_kv;
  auto m = CudaM3Model::load(cfg, src, o);
  if (!m.is_ok()) {
    std::fprintf(stderr, "load %lld layers: %s\n", (long long)layers, m.status().to_string().c_str());
    if (may_fail) return nullptr;
    std::exit(1);
  }
  return std::move(m).value();
}

// Bytes one decode step reads, by part (the header comment's rule).
struct StepBytes {
  double attn_w = 0;     // q|k|v|index + o_proj, one sparse layer (MXFP8)
  double attn_w_full = 0;  // q|k|v + o_proj, one full_attention layer (MXFP8)
  double dense_mlp = 0;  // one dense layer's MLP (MXFP8)
  double shared = 0;     // one MoE layer's shared expert (MXFP8)
  double router = 0;     // one MoE layer's router (BF16)
  double expert = 0;     // one routed expert (NVFP4)
  double head = 0;       // lm_head (BF16)
};
StepBytes step_bytes(const MiniMaxM3Config& f) {
  const int64_t hd = f.hidden_size, d = f.head_dim, nh = f.num_attention_heads;
  const int64_t nqkv = nh * d + 2 * f.num_key_value_heads * d +
                       f.index_n_heads * f.index_head_dim + f.index_head_dim;
  const double mx = 1.0 + 1.0 / 32, fp4 = 0.5 + 1.0 / 16;
  StepBytes b;
  b.attn_w = (double(nqkv) * hd + double(hd) * nh * d) * mx;
  const int64_t nqkv_full = nh * d + 2 * f.num_key_value_heads * d;
  b.attn_w_full = (double(nqkv_full) * hd + double(hd) * nh * d) * mx;
  b.dense_mlp = 3.0 * f.dense_intermediate_size * hd * mx;
  b.shared = 3.0 * f.shared_intermediate_size * f.n_shared_experts * hd * mx;
  b.router = 2.0 * f.num_local_experts * hd;
  b.expert = 3.0 * f.intermediate_size * hd * fp4;
  b.head = 2.0 * f.vocab_size * hd;
  return b;
}

// Bytes one decode step of config c reads through model f's layers (the header comment's rule):
// every layer's attention weights and selected K/V (and index keys where the indexer runs; a
// full_attention layer its whole K/V context), its dense MLP or its MoE layer's shared expert,
// router and touched routed experts, and the lm_head.
double step_read_bytes(const MiniMaxM3Config& f, const Config& c) {
  const StepBytes sb = step_bytes(f);
  const double k = double(f.num_experts_per_tok), e = double(f.num_local_experts);
  const double touched = c.batch == 1 ? k : e * (1 - std::pow(1 - k / e, double(c.batch)));
  const double hkv = double(f.num_key_value_heads), d = double(f.head_dim);
  // Stored bytes per K / V and index-key element (codes and scales; 2 for bf16).
  const double eb = kv_bytes_per_element(g_kv, 128, f.head_dim);
  const double eb_ix = kv_bytes_per_element(g_kv, 128, f.index_head_dim);
  // Selected blocks (all of them where they fit the selection: no index keys are read then).
  const int64_t ctx_blocks = (c.ctx + 127) / 128;
  const bool all_fit = ctx_blocks <= f.index_topk_blocks;
  const double kv = double(c.batch) *
                    (double(std::min<int64_t>(f.index_topk_blocks, ctx_blocks)) * 128.0 * hkv *
                         d * 2 * eb +
                     (all_fit ? 0.0 : c.ctx * f.index_head_dim * eb_ix));
  const double kv_full = double(c.batch) * double(c.ctx) * hkv * d * 2 * eb;
  double bytes = sb.head;
  for (int64_t l = 0; l < f.num_hidden_layers; ++l) {
    bytes += f.is_sparse_layer(l) ? sb.attn_w + kv : sb.attn_w_full + kv_full;
    bytes += f.is_moe_layer(l) ? sb.shared + sb.router + touched * sb.expert : sb.dense_mlp;
  }
  return bytes;
}

// The largest model of up to 24 layers whose weights and KV pages fit the free device memory
// (0: none larger than 8), or M3_BENCH_BIG_LAYERS.
int64_t big_layers(int64_t pages) {
  if (const char* e = std::getenv("M3_BENCH_BIG_LAYERS")) {
    const int64_t l = std::atoll(e);
    return l > 8 && l <= 60 ? l : 0;
  }
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return 0;
  const MiniMaxM3Config f = bench_config(60);
  const StepBytes sb = step_bytes(f);
  // Every expert of a MoE layer is resident (not only the touched ones).
  const double layer = sb.attn_w + sb.shared + sb.router + f.num_local_experts * sb.expert +
                       double(pages) * double(CudaM3Model::kv_bytes_per_page(f, 1, 1, g_kv)) / 60.0;
  // Embedding and lm_head (bf16), the decode buffers and a margin.
  const double fixed = 2.0 * sb.head + 6e9;
  const int64_t fit = static_cast<int64_t>((double(free_b) - fixed) / layer);
  const int64_t l = std::min<int64_t>(24, fit);
  return l > 8 ? l : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::FILE* tsv = argc > 1 && std::string(argv[1]) != "-" ? std::fopen(argv[1], "a") : nullptr;
  const CudaM3Tuning tn = tuning();
  if (const char* k = std::getenv("M3_BENCH_KV_DTYPE")) {
    auto d = parse_kv_cache_dtype(k);
    if (!d.is_ok()) {
      std::fprintf(stderr, "M3_BENCH_KV_DTYPE: %s\n", d.status().to_string().c_str());
      return 2;
    }
    g_kv = *d;
  }
  if (const char* m = std::getenv("M3_BENCH_MODEL")) {
    const std::string model = m;
    if (model != "m3" && model != "flash") {
      std::fprintf(stderr, "M3_BENCH_MODEL=%s: expected m3 or flash\n", m);
      return 2;
    }
    g_m3 = model == "m3";
  }
  std::vector<Config> configs = {{1, 4096},  {1, 32768},  {8, 4096},  {8, 32768},
                                 {32, 4096}, {32, 32768}, {128, 4096}};
  if (const char* only = std::getenv("M3_BENCH_ONLY")) {  // "B,C" or "B,C;B,C;..."
    configs.clear();
    for (const char* q = only; *q != '\0';) {
      long long b = 0, c = 0;
      if (std::sscanf(q, "%lld,%lld", &b, &c) != 2 || b < 1 || b > 1024 || c < 128 || c % 128) {
        std::fprintf(stderr, "M3_BENCH_ONLY=B,C[;B,C...]: batch 1..1024, context a multiple of 128\n");
        return 2;
      }
      configs.push_back({b, c});
      const char* next = std::strchr(q, ';');
      q = next ? next + 1 : q + std::strlen(q);
    }
  }
  int64_t pages = 0;
  for (const Config& c : configs) pages = std::max(pages, c.batch * c.ctx / 128);
  const MiniMaxM3Config f = bench_config(60);

  std::printf("decode through CudaM3Model::forward, %s shapes, GPU dummy weights, KV %s, "
              "cluster norms up to %lld rows, fused router up to %lld rows; median of 15 steps "
              "(host + graph + %s to host)\n",
              g_m3 ? "MiniMax-M3 (layers 0-2 full attention)" : "M3.1-Flash",
              kv_cache_dtype_name(g_kv),
              (long long)tn.cluster_norm_max_rows, (long long)tn.fused_router_max_rows,
              std::getenv("M3_BENCH_SAMPLE") && std::atoi(std::getenv("M3_BENCH_SAMPLE")) != 0
                  ? "GPU-sampled token ids"
                  : "logits");
  std::vector<std::vector<double>> t(configs.size());
  if (const char* l = std::getenv("M3_BENCH_LAYERS")) {
    const int64_t layers = std::atoll(l);
    if (layers < 1 || layers > 60) {
      std::fprintf(stderr, "M3_BENCH_LAYERS: 1..60\n");
      return 2;
    }
    auto model = load(layers, pages);
    const MiniMaxM3Config fl = bench_config(layers);
    for (const Config& c : configs) {
      const double ms = step_ms(model.get(), c, 15);
      const double bytes = step_read_bytes(fl, c);
      std::printf("B=%lld ctx=%lld, %lld layers: %.3f ms per step, %.2f GB read: %.0f GB/s\n",
                  (long long)c.batch, (long long)c.ctx, (long long)layers, ms, bytes / 1e9,
                  bytes / (ms * 1e-3) / 1e9);
    }
    return 0;
  }
  int64_t big = big_layers(pages);
  std::vector<int64_t> counts = {1, 3, 8};
  if (big > 0) counts.push_back(big);
  for (int64_t layers : counts) {
    auto model = load(layers, pages, layers == big);
    if (model == nullptr) {  // the estimate of what fits was wrong: the 8-layer slope then
      std::fprintf(stderr, "the %lld-layer model did not load: MoE layer from 3 -> 8 layers\n",
                   static_cast<long long>(big));
      big = 0;
      break;
    }
    for (size_t i = 0; i < configs.size(); ++i) t[i].push_back(step_ms(model.get(), configs[i], 15));
  }
  const std::string big_col = big > 0 ? "L=" + std::to_string(big) + " ms" : "";
  std::printf("%-16s %8s %8s %8s %8s | %9s %9s %9s %8s %8s\n", "config", "L=1 ms", "L=3 ms",
              "L=8 ms", big_col.c_str(), "dense us", "MoE us", "rest ms", "60L ms*", "HBM %*");
  for (size_t i = 0; i < configs.size(); ++i) {
    const Config& c = configs[i];
    const double t_big = big > 0 ? t[i][3] : t[i][2];
    const double dense_layer = (t[i][1] - t[i][0]) / 2,
                 moe_layer = (t_big - t[i][1]) / double((big > 0 ? big : 8) - 3);
    const double rest = t[i][0] - dense_layer;
    const double step60 = 3 * dense_layer + 57 * moe_layer + rest;
    const double bytes60 = step_read_bytes(f, c);
    const double frac = bytes60 / (step60 * 1e-3) / kHbm;
    char name[48];
    std::snprintf(name, sizeof name, "B=%lld ctx=%lldK", (long long)c.batch, (long long)(c.ctx / 1024));
    char big_ms[16] = "";
    if (big > 0) std::snprintf(big_ms, sizeof big_ms, "%.3f", t_big);
    std::printf("%-16s %8.3f %8.3f %8.3f %8s | %9.1f %9.1f %9.3f %8.2f %7.1f%%\n", name, t[i][0],
                t[i][1], t[i][2], big_ms, dense_layer * 1e3, moe_layer * 1e3, rest, step60,
                100 * frac);
    if (tsv)
      std::fprintf(tsv, "n%lld r%lld\t%s\t%.4f\t%.4f\t%.4f\t%.2f\t%.2f\t%.4f\t%.3f\t%.4g\t%.4f\n", (long long)tn.cluster_norm_max_rows,
                   (long long)tn.fused_router_max_rows,
                   name, t[i][0], t[i][1], t[i][2], dense_layer * 1e3, moe_layer * 1e3, rest, step60,
                   bytes60, frac);
  }
  std::printf("* 60 layers extrapolated: 3 x dense + 57 x MoE layer time + rest, measured by "
              "difference of the 1-, 3- and %lld-layer models; bytes as in the header comment.\n",
              static_cast<long long>(big > 0 ? big : 8));
  if (tsv) std::fclose(tsv);
  return 0;
}
