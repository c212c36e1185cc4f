#include "backend/cuda/prefill/prefill_gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/moe/grouped_expert_gemm.h"
#include "backend/cuda/runtime/caching_allocator.h"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {

int64_t quant_weight_bytes(QuantFormat f, int64_t n, int64_t k) {
  switch (f) {
    case QuantFormat::kMxfp8: return n * k;
    case QuantFormat::kNvfp4: return n * k / 2;
    case QuantFormat::kBf16: return n * k * 2;
  }
  return 0;
}

int64_t quant_scale_bytes(QuantFormat f, int64_t n, int64_t k) {
  switch (f) {
    case QuantFormat::kMxfp8: return n * k / 32;
    case QuantFormat::kNvfp4: return n * k / 16;
    case QuantFormat::kBf16: return 0;
  }
  return 0;
}

namespace {

constexpr int64_t kPanelRows = 128;
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// A device allocation from the caching allocator, returned on scope exit.
struct Scoped {
  CachingAllocator* a = nullptr;
  void* p = nullptr;
  ~Scoped() {
    if (p != nullptr) a->free(p);
  }
};

Result<void*> take(CachingAllocator* a, Scoped* s, int64_t bytes) {
  s->a = a;
  M3_ASSIGN_OR_RETURN(s->p, a->allocate(std::max<int64_t>(bytes, 16)));
  return s->p;
}

QuantWeight matrix_of(const QuantWeight& w, int64_t g) {
  QuantWeight m = w;
  m.w = w.w + g * quant_weight_bytes(w.format, w.n, w.k);
  if (w.w_scale != nullptr) m.w_scale = w.w_scale + g * quant_scale_bytes(w.format, w.n, w.k);
  if (w.w_global != nullptr) m.w_global = w.w_global + g;
  return m;
}

}  // namespace

struct PrefillGemm::Impl {
  CachingAllocator* alloc = nullptr;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  uint16_t* scratch = nullptr;
  int64_t scratch_bytes = 0;
  float* consts = nullptr;  // device {0, 1}: beta / alpha in device pointer mode
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // (m, n, k, ldb, ldc, out type)
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int>, Plan> plans;

  ~Impl() {
    for (auto& [key, p] : plans) {
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
      cublasLtMatmulDescDestroy(p.desc);
    }
    if (handle != nullptr) cublasLtDestroy(handle);
    if (workspace != nullptr) alloc->free(workspace);
    if (scratch != nullptr) alloc->free(scratch);
    if (consts != nullptr) alloc->free(consts);
  }

  // Row-major y[M,N] = x[M,K]·W[N,K]^T is column-major C[N,M] = A^T·B with A = W as [K,N]
  // (lda = K) and B = x as [K,M] (ldb = ldx); C has ldc = ldy.
  Result<Plan*> plan(int64_t m, int64_t n, int64_t k, int64_t ldb, int64_t ldc, PrefillOut out) {
    auto key = std::make_tuple(m, n, k, ldb, ldc, static_cast<int>(out));
    if (auto it = plans.find(key); it != plans.end()) return &it->second;
    Plan p;
    M3_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_DEVICE;
    M3_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    M3_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    M3_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof(pm)));
    const cudaDataType_t ct = out == PrefillOut::kF32 ? CUDA_R_32F : CUDA_R_16BF;
    M3_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, k, n, k));
    M3_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, k, m, ldb));
    M3_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&p.c, ct, n, m, ldc));
    cublasLtMatmulPreference_t pref = nullptr;
    M3_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = kWorkspaceBytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof(ws));
    // Sub-matrices (tiles, experts) start at 16-byte multiples only.
    uint32_t align = 16;
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.c, p.c, pref,
                                                       1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
      cublasLtMatmulDescDestroy(p.desc);
      return internal_error("[cuda.prefill_gemm] cuBLASLt has no bf16 algorithm for M=" +
                            std::to_string(m) + " N=" + std::to_string(n) + " K=" +
                            std::to_string(k) + " ldx=" + std::to_string(ldb) +
                            " ldy=" + std::to_string(ldc));
    }
    p.algo = result.algo;
    return &plans.emplace(key, p).first->second;
  }

  // y = alpha · x · wt^T (+ y), wt bf16 [n, k] (device), alpha / beta device pointers.
  Status gemm(const uint16_t* x, int64_t ldx, int64_t m, const uint16_t* wt, int64_t n,
              int64_t k, const float* alpha, bool accumulate, void* y, int64_t ldy,
              PrefillOut out, cudaStream_t s) {
    if (m == 0 || n == 0) return Status::ok();
    M3_ASSIGN_OR_RETURN(Plan * pl, plan(m, n, k, ldx, ldy, out));
    const float* beta = accumulate ? consts + 1 : consts;
    M3_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(handle, pl->desc, alpha, wt, pl->a, x, pl->b, beta,
                                             y, pl->c, y, pl->c, &pl->algo, workspace,
                                             kWorkspaceBytes, s));
    return Status::ok();
  }

  int64_t tile_rows(int64_t n, int64_t k) const {
    const int64_t panels = std::max<int64_t>(1, scratch_bytes / (kPanelRows * k * 2));
    return std::min(n, panels * kPanelRows);
  }

  // y[:, :n] (+)= x · W^T · global for one matrix, dequantised tile by tile.
  Status matrix(const uint16_t* x, int64_t ldx, int64_t m, const QuantWeight& w, void* y,
                int64_t ldy, PrefillOut out, bool accumulate, cudaStream_t s) {
    const float* alpha = (w.format == QuantFormat::kNvfp4 && w.w_global != nullptr)
                             ? w.w_global
                             : consts + 1;
    if (w.format == QuantFormat::kBf16) {
      return gemm(x, ldx, m, reinterpret_cast<const uint16_t*>(w.w), w.n, w.k, alpha, accumulate,
                  y, ldy, out, s);
    }
    const int64_t rows = tile_rows(w.n, w.k);
    if (rows * w.k * 2 > scratch_bytes) {
      return invalid_argument("[cuda.prefill_gemm] K=" + std::to_string(w.k) +
                              " needs more than the scratch buffer for one 128-row panel");
    }
    const size_t elem = out == PrefillOut::kF32 ? 4 : 2;
    for (int64_t r0 = 0; r0 < w.n; r0 += rows) {
      const int64_t nr = std::min(rows, w.n - r0);
      M3_RETURN_IF_ERROR(launch_dequant_bf16({w, r0, nr, scratch}, s));
      M3_RETURN_IF_ERROR(gemm(x, ldx, m, scratch, nr, w.k, alpha, accumulate,
                              static_cast<char*>(y) + r0 * elem, ldy, out, s));
    }
    return Status::ok();
  }
};

Result<std::unique_ptr<PrefillGemm>> PrefillGemm::create(CachingAllocator* alloc,
                                                         int64_t scratch_bytes) {
  if (alloc == nullptr) return invalid_argument("[cuda.prefill_gemm] allocator is null");
  std::unique_ptr<PrefillGemm> g(new PrefillGemm());
  g->impl_ = std::make_unique<Impl>();
  Impl& im = *g->impl_;
  im.alloc = alloc;
  M3_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&im.handle));
  M3_ASSIGN_OR_RETURN(im.workspace, alloc->allocate(kWorkspaceBytes));
  im.scratch_bytes = std::max<int64_t>(scratch_bytes, 1 << 20);
  M3_ASSIGN_OR_RETURN(void* sc, alloc->allocate(im.scratch_bytes));
  im.scratch = static_cast<uint16_t*>(sc);
  M3_ASSIGN_OR_RETURN(void* c, alloc->allocate(2 * sizeof(float)));
  im.consts = static_cast<float*>(c);
  const float host[2] = {0.0f, 1.0f};
  M3_CUDA_RETURN_IF_ERROR(cudaMemcpy(im.consts, host, sizeof(host), cudaMemcpyHostToDevice));
  return g;
}

PrefillGemm::~PrefillGemm() = default;

Status PrefillGemm::linear(const PrefillLinearParams& p, CUstream_st* stream) {
  if (p.accumulate && p.out != PrefillOut::kF32)
    return invalid_argument("[cuda.prefill_linear] accumulate needs float32 output");
  if (p.ldx < p.w.k || p.ldy < p.w.n)
    return invalid_argument("[cuda.prefill_linear] ldx < K or ldy < N");
  return impl_->matrix(p.x, p.ldx, p.m, p.w, p.y, p.ldy, p.out, p.accumulate, stream);
}

Status PrefillGemm::moe(const PrefillMoeParams& p, CUstream_st* stream) {
  moe_stats_ = {};
  if (p.t == 0) return Status::ok();
  if (p.w13.n != 2 * p.inter || p.w13.k != p.hidden || p.w2.n != p.hidden || p.w2.k != p.inter)
    return invalid_argument("[cuda.prefill_moe] w13 must be [E, 2·inter, hidden] and w2 "
                            "[E, hidden, inter]");
  const bool grouped = p.kernel == PrefillMoeKernel::kGroupedInLoop ||
                       p.kernel == PrefillMoeKernel::kGroupedWgmma ||
                       p.kernel == PrefillMoeKernel::kGroupedWgmmaRegisterWeights;
  if (!grouped && p.kernel != PrefillMoeKernel::kDequantCublas)
    return invalid_argument("[cuda.prefill_moe] unknown kernel " +
                            std::to_string(static_cast<int>(p.kernel)));
  if (grouped &&
      grouped_expert_gemm_fits(p.w13, GroupedEpilogue::kSwigluBf16) &&
      grouped_expert_gemm_fits(p.w2, GroupedEpilogue::kStoreF32))
    return moe_grouped(p, stream);
  Impl& im = *impl_;
  CachingAllocator* a = im.alloc;
  const int64_t rows = p.t * p.top_k, e = p.num_experts, hd = p.hidden, in = p.inter;
  Scoped s_off, s_sorted, s_active, s_inv, s_xs, s_h, s_act, s_y;
  M3_ASSIGN_OR_RETURN(void* off_v, take(a, &s_off, (e + 1) * 4));
  M3_ASSIGN_OR_RETURN(void* sorted_v, take(a, &s_sorted, rows * 4));
  M3_ASSIGN_OR_RETURN(void* active_v, take(a, &s_active, std::min(e, rows) * 4));
  M3_ASSIGN_OR_RETURN(void* inv_v, take(a, &s_inv, rows * 4));
  auto* off = static_cast<int32_t*>(off_v);
  auto* sorted = static_cast<int32_t*>(sorted_v);
  auto* inv = static_cast<int32_t*>(inv_v);
  GroupByExpertParams gp;
  gp.topk_ids = p.topk_ids;
  gp.num_rows = rows;
  gp.num_experts = e;
  gp.expert_base = p.expert_base;
  gp.group_offsets = off;
  gp.sorted_rows = sorted;
  gp.active_groups = static_cast<int32_t*>(active_v);
  M3_RETURN_IF_ERROR(launch_group_by_expert(gp, stream));
  std::vector<int32_t> offsets(static_cast<size_t>(e + 1));
  M3_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(offsets.data(), off, (e + 1) * 4,
                                          cudaMemcpyDeviceToHost, stream));
  M3_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  const int64_t routed = offsets[static_cast<size_t>(e)];  // rows with a valid id

  M3_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(inv, 0xFF, rows * 4, stream));
  M3_RETURN_IF_ERROR(launch_invert_rows(sorted, routed, inv, stream));
  M3_ASSIGN_OR_RETURN(void* xs_v, take(a, &s_xs, routed * hd * 2));
  M3_ASSIGN_OR_RETURN(void* h_v, take(a, &s_h, routed * 2 * in * 4));
  M3_ASSIGN_OR_RETURN(void* act_v, take(a, &s_act, routed * in * 2));
  M3_ASSIGN_OR_RETURN(void* y_v, take(a, &s_y, routed * hd * 4));
  auto* xs = static_cast<uint16_t*>(xs_v);
  auto* h = static_cast<float*>(h_v);
  auto* act = static_cast<uint16_t*>(act_v);
  auto* y = static_cast<float*>(y_v);
  M3_RETURN_IF_ERROR(launch_gather_bf16(p.x, sorted, p.top_k, routed, hd, xs, stream));
  for (int64_t g = 0; g < e; ++g) {
    const int64_t r0 = offsets[static_cast<size_t>(g)];
    const int64_t nr = offsets[static_cast<size_t>(g + 1)] - r0;
    if (nr == 0) continue;
    ++moe_stats_.active_experts;
    M3_RETURN_IF_ERROR(im.matrix(xs + r0 * hd, hd, nr, matrix_of(p.w13, g), h + r0 * 2 * in,
                                 2 * in, PrefillOut::kF32, false, stream));
  }
  M3_RETURN_IF_ERROR(launch_swiglu_oai_bf16(h, routed, in, p.alpha, p.limit, act, stream));
  for (int64_t g = 0; g < e; ++g) {
    const int64_t r0 = offsets[static_cast<size_t>(g)];
    const int64_t nr = offsets[static_cast<size_t>(g + 1)] - r0;
    if (nr == 0) continue;
    M3_RETURN_IF_ERROR(im.matrix(act + r0 * in, in, nr, matrix_of(p.w2, g), y + r0 * hd, hd,
                                 PrefillOut::kF32, false, stream));
  }
  return launch_moe_combine_sorted(y, inv, p.topk_weights, p.shared, p.t, p.top_k, hd, p.out,
                                   stream);
}

// Everything sized for all T·top_k rows (ids outside [0, E) only leave rows unused), counts read
// on the device only.
Status PrefillGemm::moe_grouped(const PrefillMoeParams& p, CUstream_st* stream) {
  CachingAllocator* a = impl_->alloc;
  const int64_t rows = p.t * p.top_k, e = p.num_experts, hd = p.hidden, in = p.inter;
  Scoped s_off, s_tiles, s_sorted, s_active, s_inv, s_act, s_y;
  M3_ASSIGN_OR_RETURN(void* off_v, take(a, &s_off, (e + 1) * 4));
  M3_ASSIGN_OR_RETURN(void* tiles_v, take(a, &s_tiles, (e + 1) * 4));
  M3_ASSIGN_OR_RETURN(void* sorted_v, take(a, &s_sorted, rows * 4));
  M3_ASSIGN_OR_RETURN(void* active_v, take(a, &s_active, std::min(e, rows) * 4));
  M3_ASSIGN_OR_RETURN(void* inv_v, take(a, &s_inv, rows * 4));
  M3_ASSIGN_OR_RETURN(void* act_v, take(a, &s_act, rows * in * 2));
  M3_ASSIGN_OR_RETURN(void* y_v, take(a, &s_y, rows * hd * 4));
  auto* off = static_cast<int32_t*>(off_v);
  auto* tiles = static_cast<int32_t*>(tiles_v);
  auto* sorted = static_cast<int32_t*>(sorted_v);
  auto* inv = static_cast<int32_t*>(inv_v);
  auto* act = static_cast<uint16_t*>(act_v);
  auto* y = static_cast<float*>(y_v);
  GroupByExpertParams gp;
  gp.topk_ids = p.topk_ids;
  gp.num_rows = rows;
  gp.num_experts = e;
  gp.expert_base = p.expert_base;
  gp.group_offsets = off;
  gp.sorted_rows = sorted;
  gp.active_groups = static_cast<int32_t*>(active_v);
  M3_RETURN_IF_ERROR(launch_group_by_expert(gp, stream));
  M3_RETURN_IF_ERROR(launch_moe_tile_schedule(off, e, tiles, stream));
  M3_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(inv, 0xFF, rows * 4, stream));
  M3_RETURN_IF_ERROR(launch_invert_rows_counted(sorted, off, e, rows, inv, stream));

  GroupedExpertGemmParams g;
  g.group_offsets = off;
  g.tile_offsets = tiles;
  g.num_experts = e;
  g.max_rows = rows;
  g.alpha = p.alpha;
  g.limit = p.limit;
  const GroupedExpertKernel loop = p.kernel == PrefillMoeKernel::kGroupedInLoop
                                      ? GroupedExpertKernel::kMmaSync
                                      : GroupedExpertKernel::kWgmma;
  // The register-weights loop for each matrix it takes, the wgmma loop for the other.
  auto kernel_for = [&](const QuantWeight& w, GroupedEpilogue ep) {
    return p.kernel == PrefillMoeKernel::kGroupedWgmmaRegisterWeights &&
                   grouped_expert_gemm_register_weights_fit(w, ep)
               ? GroupedExpertKernel::kWgmmaRegisterWeights
               : loop;
  };
  // Both matrices on the register-weights loop: x and act in the weights' k order, so that the
  // kernel copies token rows 16 bytes at a time (one pass over x here; act is written so).
  const bool k_order =
      kernel_for(p.w13, GroupedEpilogue::kSwigluBf16) == GroupedExpertKernel::kWgmmaRegisterWeights &&
      kernel_for(p.w2, GroupedEpilogue::kStoreF32) == GroupedExpertKernel::kWgmmaRegisterWeights;
  Scoped s_xk;
  const uint16_t* x = p.x;
  if (k_order) {
    M3_ASSIGN_OR_RETURN(void* xk_v, take(a, &s_xk, p.t * hd * 2));
    M3_RETURN_IF_ERROR(launch_to_k_order(p.x, hd, p.t, hd, static_cast<uint16_t*>(xk_v), hd,
                                         stream));
    x = static_cast<const uint16_t*>(xk_v);
  }
  // gate|up: x rows gathered through the sorted row ids, SwiGLU-OAI to bf16 act (sorted order).
  g.a = x;
  g.lda = hd;
  g.a_rows = sorted;
  g.a_row_div = p.top_k;
  g.w = p.w13;
  g.epilogue = GroupedEpilogue::kSwigluBf16;
  g.act = act;
  g.ldact = in;
  g.kernel = kernel_for(g.w, g.epilogue);
  g.a_in_k_order = k_order;
  g.act_in_k_order = k_order;
  M3_RETURN_IF_ERROR(launch_grouped_expert_gemm(g, stream));
  g.act_in_k_order = false;
  // down: act rows in order, float32 y (sorted order).
  g.a = act;
  g.lda = in;
  g.a_rows = nullptr;
  g.a_row_div = 1;
  g.w = p.w2;
  g.epilogue = GroupedEpilogue::kStoreF32;
  g.act = nullptr;
  g.ldact = 0;
  g.y = y;
  g.ldy = hd;
  g.kernel = kernel_for(g.w, g.epilogue);
  M3_RETURN_IF_ERROR(launch_grouped_expert_gemm(g, stream));
  return launch_moe_combine_sorted(y, inv, p.topk_weights, p.shared, p.t, p.top_k, hd, p.out,
                                   stream);
}

}  // namespace m3::cuda
