// Launcher of GEMV variant 6 (quant_gemv_stream.cuh): which launches it can run, the ring depth
// from the shared memory left beside the activation rows, one CTA per SM.
#include <algorithm>
#include <mutex>
#include <string>

#include "backend/cuda/gemm/quant_gemv_internal.h"
#include "backend/cuda/gemm/quant_gemv_stream.cuh"
#include "backend/cuda/runtime/cuda_check.h"
#include "backend/cuda/runtime/stream.h"

namespace m3::cuda {

namespace gemv {

int64_t rows_per_group(const QuantGemvParams& p) {
  if (p.group_offsets == nullptr) return p.num_rows;
  return p.max_group_rows > 0 ? std::min(p.max_group_rows, p.num_rows) : p.num_rows;
}

namespace {

constexpr int kMinRing = 4;

// Shared memory left to other kernels' CTAs on the SM, so that under programmatic dependent
// launch this kernel's CTA can start (and stream) beside the tail of the kernel before it.
constexpr int kLeaveSmem = 40 * 1024;

int slot_bytes(QuantFormat f) {
  return f == QuantFormat::kMxfp8 ? stream_slot_bytes<QuantFormat::kMxfp8>()
                                  : stream_slot_bytes<QuantFormat::kNvfp4>();
}

// Dynamic shared memory of a launch: the ring, the activation rows, the fragment sums and the
// barriers (2 per slot).
int64_t smem_bytes(QuantFormat f, int64_t k, int64_t rows, int ring) {
  return int64_t{ring} * (slot_bytes(f) + 16) + rows * stream_act_stride(k) + kStreamRedBytes;
}

// Slots of the ring that fit beside the activation rows (at most 16: ~300 KB in flight per SM
// would be more than an SM has anyway); below kMinRing the launch does not fit.
int ring_slots(QuantFormat f, int64_t k, int64_t rows) {
  const int64_t budget = launch_limits().smem_optin - kLeaveSmem;
  int ring = 16;
  while (ring >= kMinRing && smem_bytes(f, k, rows, ring) > budget) --ring;
  return ring;
}

}  // namespace

Status launch_stream(const QuantGemvParams& p, cudaStream_t s) {
  std::string why;
  if (!quant_gemv_stream_fits(p, &why)) return invalid_argument("[cuda.quant_gemv] variant 6: " + why);
  const LaunchLimits& d = launch_limits();
  const int64_t rows = rows_per_group(p);
  const int ring = ring_slots(p.format, p.k, rows);
  const size_t smem = static_cast<size_t>(smem_bytes(p.format, p.k, rows, ring));
  const int64_t tiles = p.n / 16;
  // Dense: no more CTAs than tiles; grouped: the items are counted on the device.
  const int64_t ctas = p.group_offsets ? d.sms : std::min<int64_t>(d.sms, tiles);
  auto run = [&](auto* kernel, std::once_flag& once) -> Status {
    // The opt-in to the whole shared memory, once per instantiation.
    std::call_once(once, [&] {
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, d.smem_optin);
    });
    M3_CUDA_RETURN_IF_ERROR(launch_kernel(p.pdl, kernel, dim3(static_cast<unsigned>(ctas)),
                                          dim3(kStreamThreads), smem, s, p, ring,
                                          static_cast<int>(rows)));
    return Status::ok();
  };
  static std::once_flag once_mxfp8, once_nvfp4;
  if (p.format == QuantFormat::kMxfp8)
    return run(quant_gemv_stream_kernel<QuantFormat::kMxfp8>, once_mxfp8);
  return run(quant_gemv_stream_kernel<QuantFormat::kNvfp4>, once_nvfp4);
}

}  // namespace gemv

bool quant_gemv_stream_shape_fits(QuantFormat f, int w_layout, int64_t n, int64_t k,
                                  int64_t rows_per_group, std::string* why) {
  auto no = [&](const std::string& m) {
    if (why != nullptr) *why = m;
    return false;
  };
  if (f == QuantFormat::kMxfp8) {
    if (w_layout != 0) return no("MXFP8 weights are read in row-major order");
    if (k <= 0 || k % 512 != 0) return no("K = " + std::to_string(k) + " is not a multiple of 512");
  } else if (f == QuantFormat::kNvfp4) {
    if (w_layout != 1 && w_layout != 2)
      return no("NVFP4 weights must be in the mma layout (w_layout 1 or 2)");
    if (k <= 0 || k % 256 != 0)
      return no("K = " + std::to_string(k) + " is not a multiple of 256");
  } else {
    return no("takes MXFP8 or NVFP4 weights");
  }
  if (n <= 0 || n % 16 != 0 || n > (int64_t{1} << 26))
    return no("N = " + std::to_string(n) + " is not a positive multiple of 16");
  if (k > (int64_t{1} << 16)) return no("K = " + std::to_string(k) + " too large");
  if (rows_per_group < 1 || rows_per_group > gemv::kStreamMaxRows)
    return no(std::to_string(rows_per_group) + " rows per group (at most 8)");
  if (gemv::ring_slots(f, k, rows_per_group) < gemv::kMinRing)
    return no("the activation rows leave too little shared memory for the ring");
  return true;
}

bool quant_gemv_stream_fits(const QuantGemvParams& p, std::string* why) {
  auto no = [&](const std::string& m) {
    if (why != nullptr) *why = m;
    return false;
  };
  if (!quant_gemv_stream_shape_fits(p.format, p.w_layout, p.n, p.k, gemv::rows_per_group(p), why))
    return false;
  if (const std::string problem = gemv::tensor_core_params_problem(p); !problem.empty())
    return no(problem);
  if ((reinterpret_cast<uintptr_t>(p.w_scale) & 15) != 0) return no("scales must be 16-byte aligned");
  return true;
}

}  // namespace m3::cuda
