#include "backend/cuda/cuda_backend.h"

#include <cstring>
#include <map>
#include <vector>

#include "backend/cuda/f32_ops.h"
#include "backend/cuda/gemm/linear_f32.h"
#include "backend/cuda/runtime/caching_allocator.h"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/stream.h"

namespace m3 {

namespace {
constexpr size_t kCublasWorkspace = size_t{32} << 20;
}

struct CudaBackend::Impl {
  cuda::DeviceInfo info;
  cuda::Stream stream;
  cuda::CachingAllocator allocator;
  void* workspace = nullptr;
  cuda::LinearF32 linear;
  // Device copies of the MoE expert-pointer arrays, keyed by the host array; the host contents
  // are kept to detect a changed array at the same address.
  struct PtrTable {
    std::vector<const float*> host;
    void* dev = nullptr;
  };
  std::map<const void*, PtrTable> ptr_tables;

  ~Impl() {
    for (auto& [k, t] : ptr_tables) allocator.free(t.dev);
    allocator.free(workspace);
  }

  // Scratch from the caching allocator, returned when the guard dies (stream-ordered reuse).
  struct Scratch {
    cuda::CachingAllocator* a;
    void* p;
    ~Scratch() { a->free(p); }
  };
  Scratch scratch(int64_t bytes) {
    Result<void*> r = allocator.allocate(bytes);
    M3_CHECK_OK(r.status());
    return Scratch{&allocator, r.value()};
  }

  const float* const* device_ptr_table(const float* const* host, int64_t n) {
    PtrTable& t = ptr_tables[host];
    if (t.dev == nullptr || static_cast<int64_t>(t.host.size()) != n ||
        std::memcmp(t.host.data(), host, sizeof(void*) * n) != 0) {
      t.host.assign(host, host + n);
      if (t.dev != nullptr) {
        M3_CUDA_CHECK(cudaStreamSynchronize(stream.get()));  // the old table may be in use
        allocator.free(t.dev);
      }
      Result<void*> r = allocator.allocate(static_cast<int64_t>(sizeof(void*)) * n);
      M3_CHECK_OK(r.status());
      t.dev = r.value();
      M3_CUDA_CHECK(cudaMemcpyAsync(t.dev, t.host.data(), sizeof(void*) * n,
                                    cudaMemcpyHostToDevice, stream.get()));
      M3_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    }
    return static_cast<const float* const*>(t.dev);
  }
};

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaBackend::~CudaBackend() {
  if (impl_) cudaStreamSynchronize(impl_->stream.get());
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(int device) {
  auto impl = std::make_unique<Impl>();
  M3_ASSIGN_OR_RETURN(impl->info, cuda::select_device(device));
  M3_ASSIGN_OR_RETURN(impl->stream, cuda::Stream::create());
  M3_ASSIGN_OR_RETURN(impl->workspace, impl->allocator.allocate(kCublasWorkspace));
  M3_RETURN_IF_ERROR(impl->linear.init(impl->workspace, kCublasWorkspace));
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
}

std::string CudaBackend::name() const {
  return "cuda:" + std::to_string(impl_->info.device) + " (" + impl_->info.name + ", " +
         std::to_string(impl_->info.num_sms) + " SMs)";
}

void* CudaBackend::alloc(int64_t bytes) {
  Result<void*> r = impl_->allocator.allocate(bytes);
  return r.is_ok() ? r.value() : nullptr;
}

void CudaBackend::free(void* p) { impl_->allocator.free(p); }

void CudaBackend::copy_to_device(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  // The source is pageable host memory the caller may free on return: wait for the copy.
  M3_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice,
                                impl_->stream.get()));
  M3_CUDA_CHECK(cudaStreamSynchronize(impl_->stream.get()));
}

void CudaBackend::copy_to_host(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  M3_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost,
                                impl_->stream.get()));
  M3_CUDA_CHECK(cudaStreamSynchronize(impl_->stream.get()));
}

void CudaBackend::fill_zero(void* p, int64_t bytes) {
  if (bytes <= 0) return;
  M3_CUDA_CHECK(cudaMemsetAsync(p, 0, static_cast<size_t>(bytes), impl_->stream.get()));
}

void CudaBackend::synchronize() { M3_CUDA_CHECK(cudaStreamSynchronize(impl_->stream.get())); }

void CudaBackend::linear(const LinearParams& p) {
  M3_CHECK_OK(impl_->linear.run(p, impl_->stream.get()));
}
void CudaBackend::rms_norm(const RmsNormParams& p) {
  M3_CHECK_OK(cuda::launch_rms_norm(p, impl_->stream.get()));
}
void CudaBackend::rope(const RopeParams& p) {
  M3_CHECK_OK(cuda::launch_rope(p, impl_->stream.get()));
}
void CudaBackend::swiglu_oai(const SwigluOaiParams& p) {
  M3_CHECK_OK(cuda::launch_swiglu_oai(p, impl_->stream.get()));
}
void CudaBackend::router_topk(const RouterTopkParams& p) {
  M3_CHECK_OK(cuda::launch_router_topk(p, impl_->stream.get()));
}
void CudaBackend::moe_experts(const MoeExpertsParams& p) {
  if (p.m == 0) return;
  const float* const* w13 = impl_->device_ptr_table(p.w13, p.num_experts);
  const float* const* w2 = impl_->device_ptr_table(p.w2, p.num_experts);
  auto act = impl_->scratch(static_cast<int64_t>(sizeof(float)) * p.m * p.top_k * p.inter);
  auto contrib = impl_->scratch(static_cast<int64_t>(sizeof(float)) * p.m * p.top_k * p.hidden);
  M3_CHECK_OK(cuda::launch_moe_experts(p, w13, w2, static_cast<float*>(act.p),
                                       static_cast<float*>(contrib.p), impl_->stream.get()));
}
void CudaBackend::kv_write(const KvWriteParams& p) {
  M3_CHECK_OK(cuda::launch_kv_write(p, impl_->stream.get()));
}
void CudaBackend::indexer_topk(const IndexerTopkParams& p) {
  if (p.t == 0) return;
  auto scores = impl_->scratch(static_cast<int64_t>(sizeof(float)) * p.t * p.num_index_heads *
                               std::max<int64_t>(1, p.num_blocks));
  M3_CHECK_OK(cuda::launch_indexer_topk(p, static_cast<float*>(scores.p), impl_->stream.get()));
}
void CudaBackend::paged_attention(const PagedAttentionParams& p) {
  M3_CHECK_OK(cuda::launch_paged_attention(p, impl_->stream.get()));
}
void CudaBackend::embedding(const EmbeddingParams& p) {
  M3_CHECK_OK(cuda::launch_embedding(p, impl_->stream.get()));
}
void CudaBackend::add(const AddParams& p) { M3_CHECK_OK(cuda::launch_add(p, impl_->stream.get())); }
void CudaBackend::gather_rows(const GatherRowsParams& p) {
  M3_CHECK_OK(cuda::launch_gather_rows(p, impl_->stream.get()));
}

CudaBackendStats CudaBackend::allocator_stats() const {
  cuda::AllocatorStats s = impl_->allocator.stats();
  return {s.bytes_in_use, s.bytes_cached, s.peak_in_use, s.num_device_allocs, s.num_cache_hits};
}

void* CudaBackend::stream() const { return impl_->stream.get(); }

}  // namespace m3
