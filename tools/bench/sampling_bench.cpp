// launch_sample (backend/cuda/sampling/sample.h) at batch 1, 2, 4, 8 and the real vocabulary
// (200,064 float32 logits a row), both kernels: kOneCtaPerRow and kMultiCta. Knobs: the vendor's
// defaults (T 1, top_p 0.95, top_k 40), top_p 0.95 without top_k (kMultiCta's candidate filter),
// greedy; and, at batch 1, top_p 0.95 without top_k on flat logits (the filter's fallback to the
// whole row). Logits normal with scale 3 (flat: 0.05). Median of 200 launches, each between two
// CUDA events, back to back (the logits stay in L2 between launches, as they do after the head
// GEMV in a decode step). Roofline: the logits read once from HBM, B·V·4 bytes at 4.8 TB/s.
//   sampling_bench [out.tsv]   (rows appended: name, batch, kernel, us, roofline us)
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/sampling/sample.h"
#include "cuda_bench_util.h"

using namespace m3;
using namespace m3::cuda;
using namespace m3::cuda_bench;

namespace {

constexpr int64_t kVocab = 200064;
constexpr double kHbmBytesPerS = 4.8e12;

struct Knobs {
  const char* name;
  float temperature, top_p;
  int32_t top_k;
  float scale;  // of the normal logits
};

FILE* g_tsv = nullptr;

void bench(const Knobs& k, int64_t batch, SampleKernel kernel) {
  float* logits = dalloc<float>(batch * kVocab);
  CHECK_OK(fill_dummy(logits, batch * kVocab, DummyKind::kF32Normal, 21, k.scale, st()));
  std::vector<SampleRowParams> h(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    h[b].temperature = k.temperature;
    h[b].top_p = k.top_p;
    h[b].top_k = k.top_k;
    h[b].seed = 5;
    h[b].counter = static_cast<uint64_t>(b);
  }
  auto* rows = dalloc<SampleRowParams>(batch);
  CHECK_CUDA(cudaMemcpy(rows, h.data(), sizeof(SampleRowParams) * batch, cudaMemcpyHostToDevice));
  SampleParams p;
  p.logits = logits;
  p.batch = batch;
  p.vocab = p.ld = kVocab;
  p.rows = rows;
  p.out = dalloc<int32_t>(batch);
  // The greedy split of kOneCtaPerRow, as the model had it.
  p.greedy_value = dalloc<float>(batch * kSampleGreedySplits);
  p.greedy_index = dalloc<int32_t>(batch * kSampleGreedySplits);
  p.greedy_tickets = dalloc<uint32_t>(batch);
  CHECK_CUDA(cudaMemset(p.greedy_tickets, 0, 4 * batch));
  p.kernel = kernel;
  if (kernel == SampleKernel::kMultiCta) {
    const SampleMultiCtaSizes z = sample_multi_cta_workspace(batch, kVocab);
    SampleMultiCtaWorkspace& w = p.multi;
    w.cand_z = dalloc<float>(z.candidates);
    w.cand_id = dalloc<int32_t>(z.candidates);
    w.slice_max = dalloc<float>(z.slices);
    w.slice_arg = dalloc<int32_t>(z.slices);
    w.slice_cut = dalloc<float>(z.slices);
    w.slice_mass = dalloc<double>(z.slices);
    w.tickets = dalloc<uint32_t>(z.rows);
    CHECK_CUDA(cudaMemset(w.tickets, 0, 4 * z.rows));
    w.max_batch = batch;
  }
  const double ms = median_ms([&](int) { CHECK_OK(launch_sample(p, st())); }, 20, 200);
  int32_t tok = -1;
  CHECK_CUDA(cudaMemcpy(&tok, p.out, 4, cudaMemcpyDeviceToHost));
  const double bytes = 4.0 * batch * kVocab;
  const double roof_us = bytes / kHbmBytesPerS * 1e6;
  const char* kname = kernel == SampleKernel::kMultiCta ? "multi-cta" : "one-cta";
  const int64_t splits = kernel == SampleKernel::kMultiCta ? sample_multi_cta_splits(batch, kVocab) : 1;
  std::printf("%-28s B=%lld %-9s (%3lld CTAs/row) %9.1f us   %6.2f MB  roofline %5.2f us (%5.1f%%)  "
              "token[0] %d\n",
              k.name, (long long)batch, kname, (long long)splits, ms * 1e3, bytes / 1e6, roof_us,
              100.0 * roof_us / (ms * 1e3), tok);
  if (g_tsv)
    std::fprintf(g_tsv, "sample %s\t%lld\t%s\t%.2f\t%.2f\n", k.name, (long long)batch, kname,
                 ms * 1e3, roof_us);
}

}  // namespace

int main(int argc, char** argv) {
  CHECK_CUDA(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  if (argc > 1) g_tsv = std::fopen(argv[1], "a");
  const Knobs defaults{"T1 p0.95 k40", 1.0f, 0.95f, 40, 3.0f};
  const Knobs no_k{"T1 p0.95 k-off", 1.0f, 0.95f, 0, 3.0f};
  const Knobs greedy{"greedy", 0.0f, 1.0f, 0, 3.0f};
  const Knobs flat{"T1 p0.95 k-off flat", 1.0f, 0.95f, 0, 0.05f};
  std::printf("launch_sample, V=%lld float32 logits, median of 200 launches (CUDA events)\n",
              (long long)kVocab);
  for (const Knobs* k : {&defaults, &no_k, &greedy})
    for (int64_t b : {1, 2, 4, 8})
      for (SampleKernel kern : {SampleKernel::kOneCtaPerRow, SampleKernel::kMultiCta}) bench(*k, b, kern);
  for (SampleKernel kern : {SampleKernel::kOneCtaPerRow, SampleKernel::kMultiCta}) bench(flat, 1, kern);
  if (g_tsv) std::fclose(g_tsv);
  for (void* q : g_allocs) cudaFree(q);
  return 0;
}
