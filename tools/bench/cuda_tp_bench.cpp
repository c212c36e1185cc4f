// The whole MiniMax-M3.1-Flash over the GPUs of this machine with tensor parallelism
// (CudaM3ModelRunner, NCCL; what `m3serve serve --device cuda --tp N` runs), weights generated on
// the GPUs in the real formats (--load-format dummy), all 60 layers unless M3_BENCH_LAYERS says
// otherwise: no extrapolation.
//
//  * Decode: B sequences at context C, one new token each, the median of 15 steps of
//    runner.forward as the engine calls it (host bookkeeping, input copies, every rank's CUDA
//    graph replay, B x V float32 logits to the host; M3_BENCH_SAMPLE=1: GPU-sampled ids). Bytes
//    per GPU per step as cuda_model_decode_bench counts them (each GPU reads 1/N of every sharded
//    weight and of the touched experts, the whole router, embedding row and lm_head, its KV heads'
//    selected blocks and index keys), against N x the GPU's HBM bandwidth.
//  * Prefill: one sequence of T tokens in one step; tokens/s and the GEMM FLOPs per GPU against
//    the bf16 peak used by cuda_prefill_bench (830 TFLOP/s).
//  * Collectives: one decode step makes 2 all-reduces per layer of B x hidden float32; they are
//    timed alone on a second NCCL group (200 in a row per size, CUDA events) to give the time a
//    step spends in them.
//
// Usage: cuda_tp_bench [results.tsv (appended)|-]
// Environment: M3_TP=N ranks (default: every GPU); M3_BENCH_LAYERS=L; M3_BENCH_ONLY=B,C[;B,C..];
// M3_BENCH_PREFILL=T[,T..] (default 8192,32768; 0: none); M3_BENCH_SAMPLE=1.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/comm/nccl_communicator.h"
#include "model/minimax_m3/cuda/cuda_m3_runner.h"
#include "model/minimax_m3/dummy_weights.h"
#include "model/minimax_m3/tensor_parallel.h"

namespace {

using namespace m3;
using namespace m3::minimax_m3;

constexpr double kPeakBf16 = 830e12;

struct Config {
  int64_t batch, ctx;
};

[[noreturn]] void die(const std::string& what, const Status& s) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), s.to_string().c_str());
  std::exit(1);
}

// HBM bandwidth of the GPUs this runs on (bytes/s; 0 when unknown).
double hbm_bandwidth(const std::string& name) {
  if (name.find("H200") != std::string::npos) return 4.8e12;
  if (name.find("H100") != std::string::npos) return 3.35e12;
  return 0;
}

std::vector<Config> configs_from_env() {
  std::vector<Config> out = {{1, 4096}, {4, 4096}, {8, 4096}, {32, 4096},
                             {128, 4096}, {1, 32768}, {32, 32768}};
  const char* only = std::getenv("M3_BENCH_ONLY");
  if (only == nullptr) return out;
  out.clear();
  for (const char* q = only; *q != '\0';) {
    long long b = 0, c = 0;
    if (std::sscanf(q, "%lld,%lld", &b, &c) != 2 || b < 1 || b > 128 || c < 128 || c % 128) {
      std::fprintf(stderr, "M3_BENCH_ONLY=B,C[;B,C...]: batch 1..128, context a multiple of 128\n");
      std::exit(2);
    }
    out.push_back({b, c});
    const char* next = std::strchr(q, ';');
    q = next ? next + 1 : q + std::strlen(q);
  }
  return out;
}

std::vector<int64_t> prefill_from_env() {
  const char* e = std::getenv("M3_BENCH_PREFILL");
  if (e == nullptr) return {8192, 32768};
  std::vector<int64_t> out;
  for (const char* q = e; *q != '\0';) {
    const long long t = std::atoll(q);
    if (t > 0) out.push_back(t);
    const char* next = std::strchr(q, ',');
    q = next ? next + 1 : q + std::strlen(q);
  }
  return out;
}

// Median ms of runner.forward over 15 decode steps after 3 warm-up steps.
double decode_ms(CudaM3ModelRunner* r, const Config& c, int64_t vocab) {
  const int64_t blocks = c.ctx / 128;
  std::vector<std::vector<int32_t>> tokens(c.batch), tables(c.batch);
  ModelStep step;
  step.slices.resize(c.batch);
  const bool sample = std::getenv("M3_BENCH_SAMPLE") && std::atoi(std::getenv("M3_BENCH_SAMPLE"));
  for (int64_t b = 0; b < c.batch; ++b) {
    ModelSlice& s = step.slices[b];
    for (int64_t j = 0; j < blocks; ++j) tables[b].push_back(static_cast<int32_t>(b * blocks + j));
    s.block_table = tables[b];
    tokens[b] = {static_cast<int32_t>((1000 + 7919 * b) % vocab)};
    s.tokens = tokens[b];
    s.start_pos = c.ctx - 1;
    s.logits_rows = {0};
    if (sample) s.sample = DeviceSampling{0.0f, 0, 1.0f, 0.0f, RngKey{1, static_cast<uint64_t>(b), 0}};
  }
  std::vector<double> ms;
  for (int s = 0; s < 18; ++s) {
    ModelOutput out;
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = r->forward(step, out);
    const auto t1 = std::chrono::steady_clock::now();
    if (!st.is_ok()) die("decode step", st);
    if (s >= 3) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Wall ms of one prefill step of t tokens (after one warm-up step of the same size).
double prefill_ms(CudaM3ModelRunner* r, int64_t t, int64_t vocab) {
  std::vector<int32_t> tokens(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) tokens[i] = static_cast<int32_t>((17 + 7919 * i) % vocab);
  ModelStep step;
  step.slices.resize(1);
  ModelSlice& s = step.slices[0];
  s.tokens = tokens;
  std::vector<int32_t> table;
  for (int64_t j = 0; j < (t + 127) / 128; ++j) table.push_back(static_cast<int32_t>(j));
  s.block_table = table;
  s.logits_rows = {static_cast<int32_t>(t - 1)};
  double best = 1e30;
  for (int rep = 0; rep < 2; ++rep) {
    ModelOutput out;
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = r->forward(step, out);
    const auto t1 = std::chrono::steady_clock::now();
    if (!st.is_ok()) die("prefill step", st);
    if (rep == 1) best = std::chrono::duration<double, std::milli>(t1 - t0).count();
  }
  return best;
}

// Microseconds of one float32 all-reduce of `count` elements over n GPUs (NCCL, 200 in a row).
double all_reduce_us(int n, int64_t count) {
  auto id = comm::make_nccl_unique_id();
  if (!id.is_ok()) die("nccl id", id.status());
  std::vector<double> us(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(r);
      cudaStream_t st = nullptr;
      cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
      float* buf = nullptr;
      cudaMalloc(&buf, static_cast<size_t>(count) * 4);
      cudaMemset(buf, 0, static_cast<size_t>(count) * 4);
      auto c = comm::create_nccl_communicator(r, n, r, *id, st);
      if (!c.is_ok()) die("nccl group", c.status());
      for (int i = 0; i < 20; ++i) (void)(*c)->all_reduce(buf, count, comm::DataType::kF32, comm::ReduceOp::kSum);
      (void)(*c)->synchronize();
      cudaEvent_t a, b;
      cudaEventCreate(&a);
      cudaEventCreate(&b);
      cudaEventRecord(a, st);
      for (int i = 0; i < 200; ++i) (void)(*c)->all_reduce(buf, count, comm::DataType::kF32, comm::ReduceOp::kSum);
      cudaEventRecord(b, st);
      (void)(*c)->synchronize();
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      us[static_cast<size_t>(r)] = 1e3 * ms / 200;
      c->reset();
      cudaFree(buf);
      cudaStreamDestroy(st);
    });
  }
  for (std::thread& t : threads) t.join();
  return *std::max_element(us.begin(), us.end());
}

}  // namespace

int main(int argc, char** argv) {
  std::FILE* tsv = argc > 1 && std::string(argv[1]) != "-" ? std::fopen(argv[1], "a") : nullptr;
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) {
    std::fprintf(stderr, "no GPU\n");
    return 1;
  }
  const int n = std::getenv("M3_TP") ? std::atoi(std::getenv("M3_TP")) : gpus;
  if (n < 1 || n > gpus) {
    std::fprintf(stderr, "M3_TP=%d: this machine has %d GPUs\n", n, gpus);
    return 2;
  }
  const int64_t layers = std::getenv("M3_BENCH_LAYERS") ? std::atoll(std::getenv("M3_BENCH_LAYERS")) : 60;
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const double hbm = hbm_bandwidth(prop.name);
  const MiniMaxM3Config cfg = builtin_m3_flash_config(layers);
  const std::vector<Config> configs = configs_from_env();
  const std::vector<int64_t> prefills = prefill_from_env();
  int64_t pages = 0;
  for (const Config& c : configs) pages = std::max(pages, c.batch * c.ctx / 128);
  for (int64_t t : prefills) pages = std::max(pages, (t + 127) / 128);

  CudaM3Options o;
  o.max_batch = 128;
  o.gpu_dummy_weights = true;
  CudaRanks ranks;
  ranks.ranks = n;
  DummyWeightSource src(cfg);
  const auto t_load = std::chrono::steady_clock::now();
  auto runner = CudaM3ModelRunner::create(cfg, src, pages * CudaM3Model::kv_bytes_per_page(cfg, n),
                                          o, ranks);
  if (!runner.is_ok()) die("load", runner.status());
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  const CudaM3Stats st0 = (*runner)->rank_model(0).stats();
  std::printf("MiniMax-M3.1-Flash shapes, %lld layers, --tp %d on %d x %s; load %.1f s; weights "
              "%.1f GB per GPU, KV %.1f GB per GPU (%lld pages)\n",
              (long long)layers, n, n, prop.name, load_s, st0.weight_bytes / 1e9, st0.kv_bytes / 1e9,
              (long long)pages);

  // Bytes per GPU of one decode step (see the header comment).
  const MiniMaxM3Config rc = rank_config(cfg, 0, n);
  const double mx = 1.0 + 1.0 / 32, fp4 = 0.5 + 1.0 / 16;
  const int64_t hd = cfg.hidden_size, d = cfg.head_dim;
  const double nqkv = double(rc.num_attention_heads * d + 2 * rc.num_key_value_heads * d +
                             rc.index_n_heads * rc.index_head_dim + rc.index_head_dim);
  const double attn_w = (nqkv * hd + double(hd) * rc.num_attention_heads * d) * mx;
  const double dense = 3.0 * rc.dense_intermediate_size * hd * mx;
  const double shared = 3.0 * rc.shared_intermediate_size * rc.n_shared_experts * hd * mx;
  const double router = 4.0 * cfg.num_local_experts * hd;
  const double expert = 3.0 * rc.intermediate_size * hd * fp4;
  const double head = 2.0 * cfg.vocab_size * hd;
  int64_t n_dense = 0;
  for (int64_t l = 0; l < layers; ++l) n_dense += cfg.is_moe_layer(l) ? 0 : 1;
  const int64_t n_moe = layers - n_dense;
  const int64_t e = cfg.num_local_experts, k = cfg.num_experts_per_tok;

  std::printf("%-16s %10s %10s %12s %10s %10s %12s\n", "decode", "ms/step", "tok/s", "GB/GPU/step",
              "HBM %", "AR us", "AR % step");
  for (const Config& c : configs) {
    const double ms = decode_ms(runner->get(), c, cfg.vocab_size);
    const double touched = c.batch == 1 ? double(k) : e * (1 - std::pow(1 - double(k) / e, double(c.batch)));
    const int64_t ctx_blocks = (c.ctx + 127) / 128;
    const bool all_fit = ctx_blocks <= cfg.index_topk_blocks;
    const double kv = double(c.batch) *
                      (double(std::min<int64_t>(cfg.index_topk_blocks, ctx_blocks)) * 128.0 *
                           rc.num_key_value_heads * d * 2 * 2 +
                       (all_fit ? 0.0 : c.ctx * cfg.index_head_dim * 2.0));
    const double bytes = layers * (attn_w + kv) + n_dense * dense +
                         n_moe * (shared + router + touched * expert) + head;
    const double frac = hbm > 0 ? bytes / (ms * 1e-3) / hbm : 0;
    const double ar = n > 1 ? all_reduce_us(n, c.batch * hd) : 0;
    const double ar_frac = 2.0 * layers * ar * 1e-3 / ms;
    char name[48];
    std::snprintf(name, sizeof name, "B=%lld ctx=%lldK", (long long)c.batch, (long long)(c.ctx / 1024));
    std::printf("%-16s %10.3f %10.1f %12.3f %9.1f%% %10.1f %11.1f%%\n", name, ms,
                1e3 * c.batch / ms, bytes / 1e9, 100 * frac, ar, 100 * ar_frac);
    if (tsv)
      std::fprintf(tsv, "tp%d\tdecode\t%s\t%.4f\t%.1f\t%.4g\t%.4f\t%.2f\t%.4f\n", n, name, ms,
                   1e3 * c.batch / ms, bytes, frac, ar, ar_frac);
  }
  for (int64_t t : prefills) {
    const double ms = prefill_ms(runner->get(), t, cfg.vocab_size);
    // GEMM FLOPs per GPU: every linear's rows x its rank share, routed rows x top-k.
    const double per_token = 2.0 * (layers * (nqkv * hd + double(hd) * rc.num_attention_heads * d) +
                                    n_dense * 3.0 * rc.dense_intermediate_size * hd +
                                    n_moe * (3.0 * rc.shared_intermediate_size * rc.n_shared_experts * hd +
                                             k * 3.0 * rc.intermediate_size * hd));
    const double flops = per_token * double(t);
    const double frac = flops / (ms * 1e-3) / kPeakBf16;
    std::printf("prefill T=%-6lld %10.1f ms %10.1f tok/s  %.1f TFLOP/GPU  %.1f%% of %.0f TFLOP/s "
                "(GEMMs only)\n",
                (long long)t, ms, 1e3 * double(t) / ms, flops / 1e12, 100 * frac, kPeakBf16 / 1e12);
    if (tsv)
      std::fprintf(tsv, "tp%d\tprefill\tT=%lld\t%.3f\t%.1f\t%.4g\t%.4f\n", n, (long long)t, ms,
                   1e3 * double(t) / ms, flops, frac);
  }
  if (tsv) std::fclose(tsv);
  return 0;
}
