// CudaBackend: the Backend interface (backend/backend.h) on one NVIDIA GPU (sm_90a), float32
// storage and arithmetic, so the whole existing model runs on the GPU and can be compared with
// the CPU backend op by op and end to end. Real-shape performance kernels (quantised GEMVs, bf16
// paged sparse attention) live beside it in the domain folders and are reached through their own
// parameter structs.
//
// Ops are enqueued on the backend's stream; copy_to_host and synchronize() wait for them.
// copy_to_device returns once the host buffer may be reused. Device memory comes from a caching
// allocator, so repeated steps of the same shapes do not call cudaMalloc.
// This header includes no CUDA header.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "core/status.h"

namespace m3 {

struct CudaBackendStats {
  int64_t bytes_in_use = 0, bytes_cached = 0, peak_in_use = 0;
  int64_t num_device_allocs = 0, num_cache_hits = 0;
};

class CudaBackend final : public Backend {
 public:
  // Selects `device`, checks that it is compute capability 9.0, creates the stream and cuBLASLt.
  static Result<std::unique_ptr<CudaBackend>> create(int device = 0);
  ~CudaBackend() override;

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override;

  void* alloc(int64_t bytes) override;
  void free(void* p) override;
  void copy_to_device(void* dst, const void* src_host, int64_t bytes) override;
  void copy_to_host(void* dst_host, const void* src, int64_t bytes) override;
  void fill_zero(void* p, int64_t bytes) override;
  void synchronize() override;

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

  CudaBackendStats allocator_stats() const;
  // The cudaStream_t the ops run on (as void* so this header needs no CUDA header).
  void* stream() const;

 private:
  struct Impl;
  explicit CudaBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace m3
