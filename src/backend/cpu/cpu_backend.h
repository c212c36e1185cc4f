// The CPU backend: float32 ops with float32 (or wider) accumulation, threaded over a ThreadPool.
// It is the numerical reference for other backends. Every op computes each output element in a
// fixed order that depends only on that element's inputs, so results are identical for any
// thread count and any batch composition.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "core/thread_pool.h"

namespace m3 {

class CpuBackend final : public Backend {
 public:
  // num_threads <= 0: all hardware threads.
  explicit CpuBackend(int num_threads);

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override;
  int num_threads() const { return pool_.num_threads(); }

  void* alloc(int64_t bytes) override;
  void free(void* p) override;
  void copy_to_device(void* dst, const void* src_host, int64_t bytes) override;
  void copy_to_host(void* dst_host, const void* src, int64_t bytes) override;
  void fill_zero(void* p, int64_t bytes) override;
  void synchronize() override {}

  void linear(const LinearParams& p) override;
  void rms_norm(const RmsNormParams& p) override;
  void rope(const RopeParams& p) override;
  void swiglu_oai(const SwigluOaiParams& p) override;
  void router_topk(const RouterTopkParams& p) override;
  void moe_experts(const MoeExpertsParams& p) override;
  void kv_write(const KvWriteParams& p) override;
  void indexer_topk(const IndexerTopkParams& p) override;
  void paged_attention(const PagedAttentionParams& p) override;
  void embedding(const EmbeddingParams& p) override;
  void add(const AddParams& p) override;
  void gather_rows(const GatherRowsParams& p) override;

  ThreadPool& pool() { return pool_; }

 private:
  ThreadPool pool_;
};

// Kernels shared by the CPU ops (cpu_kernels.cpp).
namespace cpu {
// Dot product of two length-n float vectors with 8 float32 lane accumulators over consecutive
// elements (lane = index mod 8, the tail zero-padded) and a fixed pairwise reduction of the
// lanes. The linear op uses exactly this order, so dot(x, w) equals one element of linear().
float dot(const float* a, const float* b, int64_t n);
// Serial y[M, N] (+)= x[M, K] · W[N, K]^T on a sub-range, same per-element order as dot().
void gemm_nt_serial(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
                    int64_t ldy, bool accumulate);
}  // namespace cpu

}  // namespace m3
