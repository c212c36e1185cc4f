// Benchmark of one batch-1 MoE block of MiniMax-M3.1-Flash (hidden 6144, 128 NVFP4 experts of
// intermediate 3072, top-4, an MXFP8 shared expert of 3072, a bf16 router) on the GPU, with dummy
// weights in the storage formats: the persistent launch (moe/moe_block_stream.h) against the
// per-kernel sequence the model runs at one row (fused router, variant-7 shared expert, variant-5
// routed experts), both inside CUDA graphs, and where the persistent kernel's CTAs spend their
// time (%globaltimer stamps, MoeBlockPhase).
//
// Usage: moe_block_bench [reps=5]. Each graph holds 8 blocks with 8 different token rows (so
// different experts; 186 MB per block, more than the 60 MB L2 holds); times are the median over
// `reps` replays, per block.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/dummy/dummy_weights.h"
#include "backend/cuda/gemm/quant_gemv.h"
#include "backend/cuda/gemm/x_f16.h"
#include "backend/cuda/moe/moe_block_stream.h"
#include "backend/cuda/moe/moe_route.h"

using namespace m3;
using namespace m3::cuda;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void check(const Status& s, const char* what) {
  if (!s.is_ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.to_string().c_str());
    std::exit(1);
  }
}
template <typename T>
T* dalloc(int64_t n) {
  void* p = nullptr;
  check(cudaMalloc(&p, std::max<int64_t>(n, 1) * sizeof(T)), "cudaMalloc");
  check(cudaMemset(p, 0, std::max<int64_t>(n, 1) * sizeof(T)), "cudaMemset");
  return static_cast<T*>(p);
}
uint8_t* dummy(int64_t bytes, DummyKind kind, uint64_t seed) {
  uint8_t* p = dalloc<uint8_t>(bytes);
  check(fill_dummy(p, bytes, kind, seed, 0.0f, nullptr), "fill_dummy");
  return p;
}

constexpr int64_t H = 6144, E = 128, K = 4, I = 3072, SI = 3072, kRows = 8;

struct Weights {
  uint16_t* router;
  float *bias, *eg_global, *ed_global;
  uint8_t *sg_w, *sg_s, *sd_w, *sd_s, *eg_w, *eg_s, *ed_w, *ed_s;
};

Weights make_weights() {
  Weights w;
  w.router = dalloc<uint16_t>(E * H);
  check(fill_dummy(w.router, E * H, DummyKind::kBf16Normal, 1, 0.02f, nullptr), "router");
  w.bias = dalloc<float>(E);
  check(fill_dummy(w.bias, E, DummyKind::kF32Normal, 2, 0.01f, nullptr), "bias");
  w.sg_w = dummy(2 * SI * H, DummyKind::kE4m3Codes, 3);
  w.sg_s = dummy(2 * SI * H / 32, DummyKind::kE8m0Scales, 4);
  w.sd_w = dummy(H * SI, DummyKind::kE4m3Codes, 5);
  w.sd_s = dummy(H * SI / 32, DummyKind::kE8m0Scales, 6);
  w.eg_w = dummy(E * 2 * I * H / 2, DummyKind::kE2m1Packed, 7);
  w.eg_s = dummy(E * 2 * I * H / 16, DummyKind::kE4m3Scales, 8);
  w.ed_w = dummy(E * H * I / 2, DummyKind::kE2m1Packed, 9);
  w.ed_s = dummy(E * H * I / 16, DummyKind::kE4m3Scales, 10);
  std::vector<float> g(E, 1.0f / 4096.0f);
  w.eg_global = dalloc<float>(E);
  w.ed_global = dalloc<float>(E);
  check(cudaMemcpy(w.eg_global, g.data(), E * 4, cudaMemcpyHostToDevice), "globals");
  check(cudaMemcpy(w.ed_global, g.data(), E * 4, cudaMemcpyHostToDevice), "globals");
  return w;
}

// Per token row: its inputs and outputs (the routing buffers are shared by both paths).
struct Row {
  uint16_t *x, *xh, *act_s, *act;
  float *inv, *logits, *topk_w, *shared, *contrib;
  int32_t *ids, *offs, *sorted, *active;
  uint32_t *counters, *route_counter;
};

Row make_row(int64_t r) {
  Row w;
  w.x = dalloc<uint16_t>(H);
  check(fill_dummy(w.x, H, DummyKind::kBf16Normal, 100 + uint64_t(r), 1.0f, nullptr), "x");
  w.xh = dalloc<uint16_t>(H);
  w.inv = dalloc<float>(1);
  check(launch_x_to_f16({w.x, H, 1, H, w.xh, H, w.inv}, nullptr), "x_to_f16");
  w.act_s = dalloc<uint16_t>(SI);
  w.act = dalloc<uint16_t>(K * I);
  w.logits = dalloc<float>(E);
  w.topk_w = dalloc<float>(K);
  w.shared = dalloc<float>(H);
  w.contrib = dalloc<float>(K * H);
  w.ids = dalloc<int32_t>(K);
  w.offs = dalloc<int32_t>(E + 1);
  w.sorted = dalloc<int32_t>(K);
  w.active = dalloc<int32_t>(K);
  w.counters = dalloc<uint32_t>(kMoeBlockCounters);
  w.route_counter = dalloc<uint32_t>(1);
  return w;
}

MoeRouteParams route_params(const Weights& w, const Row& r) {
  MoeRouteParams p;
  p.x = r.x;
  p.ldx = H;
  p.rows = 1;
  p.hidden = H;
  p.w = w.router;
  p.num_experts = E;
  p.bias = w.bias;
  p.top_k = K;
  p.scaling = 2.5f;
  p.logits = r.logits;
  p.topk_ids = r.ids;
  p.topk_w = r.topk_w;
  p.group_offsets = r.offs;
  p.sorted_rows = r.sorted;
  p.active_groups = r.active;
  p.counter = r.route_counter;
  return p;
}

QuantGemvParams gemv(QuantFormat f, const uint8_t* w, const uint8_t* s, const float* gl, int64_t n,
                     int64_t k, const uint16_t* xh, const float* inv, int layout) {
  QuantGemvParams q;
  q.format = f;
  q.w = w;
  q.w_scale = s;
  q.w_global = gl;
  q.w_layout = layout;
  q.n = n;
  q.k = k;
  q.xh = xh;
  q.ldx = k;
  q.x_inv_scale = inv;
  q.x_inv_const = inv ? 1.0f : 1.0f / 256.0f;
  q.num_rows = 1;
  return q;
}

MoeBlockParams block_params(const Weights& w, const Row& r) {
  MoeBlockParams p;
  p.route = route_params(w, r);
  p.shared_gu = gemv(QuantFormat::kMxfp8, w.sg_w, w.sg_s, nullptr, 2 * SI, H, r.xh, r.inv, 2);
  p.shared_gu.epilogue.kind = GemvEpilogue::kSwigluF16;
  p.shared_gu.epilogue.act = r.act_s;
  p.shared_down = gemv(QuantFormat::kMxfp8, w.sd_w, w.sd_s, nullptr, H, SI, r.act_s, nullptr, 1);
  p.shared_down.epilogue.y = r.shared;
  p.shared_down.epilogue.ldy = H;
  auto group = [&](QuantGemvParams& q) {
    q.num_groups = E;
    q.group_offsets = r.offs;
    q.sorted_rows = r.sorted;
    q.active_groups = r.active;
    q.num_slots = K;
    q.num_rows = K;
    q.max_group_rows = 1;
  };
  p.experts_gu = gemv(QuantFormat::kNvfp4, w.eg_w, w.eg_s, w.eg_global, 2 * I, H, r.xh, r.inv, 2);
  group(p.experts_gu);
  p.experts_gu.x_row_div = K;
  p.experts_gu.epilogue.kind = GemvEpilogue::kSwigluF16;
  p.experts_gu.epilogue.act = r.act;
  p.experts_down = gemv(QuantFormat::kNvfp4, w.ed_w, w.ed_s, w.ed_global, H, I, r.act, nullptr, 1);
  group(p.experts_down);
  p.experts_down.epilogue.y = r.contrib;
  p.experts_down.epilogue.ldy = H;
  p.counters = r.counters;
  return p;
}

// The per-kernel path of the model at one row, on one stream.
void per_kernel(const MoeBlockParams& p, cudaStream_t s) {
  check(launch_moe_route(p.route, s), "route");
  QuantGemvParams q = p.shared_gu;
  q.variant = 7;
  check(launch_quant_gemv(q, s), "shared gu");
  q = p.shared_down;
  q.variant = 7;
  check(launch_quant_gemv(q, s), "shared down");
  q = p.experts_gu;
  q.variant = 5;
  check(launch_quant_gemv(q, s), "experts gu");
  q = p.experts_down;
  q.variant = 5;
  check(launch_quant_gemv(q, s), "experts down");
}

template <typename F>
double graph_us_per_block(F body, int reps) {
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  cudaGraph_t g;
  cudaGraphExec_t ge;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "capture");
  body(s);
  check(cudaStreamEndCapture(s, &g), "end capture");
  check(cudaGraphInstantiate(&ge, g, 0), "instantiate");
  check(cudaGraphLaunch(ge, s), "warm-up");
  check(cudaStreamSynchronize(s), "warm-up sync");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a, s);
    cudaGraphLaunch(ge, s);
    cudaEventRecord(b, s);
    check(cudaEventSynchronize(b), "replay");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms * 1000.0 / kRows);
  }
  std::sort(t.begin(), t.end());
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  const Weights w = make_weights();
  std::vector<Row> rows;
  std::vector<MoeBlockParams> ps;
  for (int64_t r = 0; r < kRows; ++r) rows.push_back(make_row(r));
  for (const Row& r : rows) ps.push_back(block_params(w, r));
  std::string why;
  if (!moe_block_stream_fits(ps[0], &why)) {
    std::fprintf(stderr, "does not fit: %s\n", why.c_str());
    return 1;
  }
  check(cudaDeviceSynchronize(), "setup");
  // Bytes of one block: router, shared expert, 4 experts (codes + scales).
  const double bytes =
      E * H * 2.0 + 3.0 * SI * H * (1 + 1.0 / 32) + K * 3.0 * I * H * (0.5 + 1.0 / 16);
  const double roof_us = bytes / 4.8e12 * 1e6;
  std::printf("MoE block at one row, M3.1-Flash shapes: %.1f MB per block, %.1f us at 4.8 TB/s\n",
              bytes / 1e6, roof_us);
  for (int round = 0; round < 2; ++round) {
    const double pk = graph_us_per_block(
        [&](cudaStream_t s) {
          for (const auto& p : ps) per_kernel(p, s);
        },
        reps);
    const double pb = graph_us_per_block(
        [&](cudaStream_t s) {
          for (const auto& p : ps) check(launch_moe_block_stream(p, s), "block");
        },
        reps);
    std::printf(
        "round %d: per-kernel (one stream) %.1f us (%.1f %% of roofline), persistent %.1f us (%.1f "
        "%%)\n",
        round, pk, 100 * roof_us / pk, pb, 100 * roof_us / pb);
  }
  // Phase stamps of one persistent launch (after the graphs: caches in the same state).
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  uint64_t* stamps = dalloc<uint64_t>(int64_t{sms} * kMoeBlockPhases);
  MoeBlockParams p = ps[3];
  p.phase_ns = stamps;
  check(launch_moe_block_stream(ps[2], nullptr), "block");
  check(launch_moe_block_stream(p, nullptr), "block");
  check(cudaDeviceSynchronize(), "block");
  std::vector<uint64_t> h(int64_t{sms} * kMoeBlockPhases);
  check(cudaMemcpy(h.data(), stamps, h.size() * 8, cudaMemcpyDeviceToHost), "stamps");
  uint64_t t0 = ~uint64_t{0};
  for (int c = 0; c < sms; ++c) t0 = std::min(t0, h[c * kMoeBlockPhases + kPhaseProducerStart]);
  const char* names[] = {"consumers start",   "router rows",
                         "routing published", "shared gate|up",
                         "routing seen",      "routed gate|up",
                         "shared down ready", "shared down",
                         "routed down ready", "end",
                         "producer start",    "producer routing",
                         "producer end"};
  std::printf("phase (us after the first producer start): min / median / max over CTAs\n");
  for (int ph = 0; ph <= kPhaseProducerEnd; ++ph) {
    std::vector<double> v;
    for (int c = 0; c < sms; ++c) {
      const uint64_t x = h[c * kMoeBlockPhases + ph];
      if (x != 0) v.push_back((double(x) - double(t0)) / 1000.0);
    }
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    std::printf("  %-20s %7.2f %7.2f %7.2f  (%zu CTAs)\n", names[ph], v.front(), v[v.size() / 2],
                v.back(), v.size());
  }
  return 0;
}
