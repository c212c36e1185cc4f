// Launcher of GEMV variant 6 (quant_gemv_stream.cuh): which launches it can run, the ring depth
// from the shared memory left beside the activation rows, one CTA per SM.
#include <algorithm>
#include <mutex>
#include <string>

#include "backend/cuda/gemm/quant_gemv_internal.h"
#include "backend/cuda/gemm/quant_gemv_stream.cuh"
#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {

namespace gemv {
namespace {

struct DeviceLimits {
  int sms = 1;
  int smem_optin = 0;  // bytes of dynamic shared memory one CTA may use
};
const DeviceLimits& limits() {
  static DeviceLimits d;
  static std::once_flag once;
  std::call_once(once, [] {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    d.sms = std::max(d.sms, 1);
    if (d.smem_optin <= 0) d.smem_optin = 227 * 1024;  // no device (host-side checks): sm_90's
  });
  return d;
}

int64_t rows_per_group(const QuantGemvParams& p) {
  if (p.group_offsets == nullptr) return p.num_rows;
  return p.max_group_rows > 0 ? std::min(p.max_group_rows, p.num_rows) : p.num_rows;
}

constexpr int kMinRing = 4;

// Dynamic shared memory without the ring: activation rows, fragment sums, barriers (2 per slot).
int64_t fixed_smem(const QuantGemvParams& p, int ring) {
  return rows_per_group(p) * stream_act_stride(p.k) + kStreamRedBytes + 16 * int64_t{ring};
}

int slot_bytes(QuantFormat f) {
  return f == QuantFormat::kMxfp8 ? stream_slot_bytes<QuantFormat::kMxfp8>()
                                  : stream_slot_bytes<QuantFormat::kNvfp4>();
}

// Shared memory left to other kernels' CTAs on the SM, so that under programmatic dependent
// launch this kernel's CTA can start (and stream) beside the tail of the kernel before it.
constexpr int kLeaveSmem = 40 * 1024;

// Slots of the ring that fit beside the activation rows (at most 16: ~300 KB in flight per SM
// would be more than an SM has anyway).
int ring_slots(const QuantGemvParams& p, int smem_optin) {
  const int slot = slot_bytes(p.format);
  const int64_t budget = std::max<int64_t>(smem_optin - kLeaveSmem, 0);
  int ring = 16;
  while (ring >= kMinRing && fixed_smem(p, ring) + int64_t{ring} * slot > budget) --ring;
  return ring;
}

}  // namespace

Status launch_stream(const QuantGemvParams& p, cudaStream_t s) {
  std::string why;
  if (!quant_gemv_stream_fits(p, &why)) return invalid_argument("[cuda.quant_gemv] variant 6: " + why);
  const DeviceLimits& d = limits();
  const int ring = ring_slots(p, d.smem_optin);
  const int cap = static_cast<int>(rows_per_group(p));
  const size_t smem = static_cast<size_t>(fixed_smem(p, ring) + int64_t{ring} * slot_bytes(p.format));
  const int64_t tiles = p.n / 16;
  // Dense: no more CTAs than tiles; grouped: the items are counted on the device.
  const int64_t ctas = p.group_offsets ? d.sms : std::min<int64_t>(d.sms, tiles);
  auto run = [&](auto* kernel, std::once_flag& once) -> Status {
    // The opt-in to the whole shared memory, once per instantiation.
    std::call_once(once, [&] {
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, d.smem_optin);
    });
    M3_CUDA_RETURN_IF_ERROR(launch_kernel(p.pdl, kernel, dim3(static_cast<unsigned>(ctas)),
                                          dim3(kStreamThreads), smem, s, p, ring, cap));
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
  QuantGemvParams probe;
  probe.format = f;
  probe.k = k;
  probe.num_rows = rows_per_group;
  if (gemv::ring_slots(probe, gemv::limits().smem_optin) < gemv::kMinRing)
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
  const bool swiglu = p.epilogue.kind != GemvEpilogue::kStoreF32;
  if (p.w_layout != 0 && (p.w_layout == 2) != swiglu)
    return no("w_layout 2 (gate/up row pairs) goes with a SwiGLU epilogue, w_layout 1 with a store");
  if (p.xh == nullptr || p.ldx % 8 != 0 || (reinterpret_cast<uintptr_t>(p.xh) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(p.w) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(p.w_scale) & 15) != 0)
    return no("xh (f16 activations) rows, weights and scales must be 16-byte aligned");
  if ((p.group_offsets == nullptr) != (p.active_groups == nullptr) || p.x_row_div <= 0)
    return no("group_offsets and active_groups go together");
  if (!swiglu && p.epilogue.y == nullptr) return no("epilogue.y is null");
  if (swiglu && p.epilogue.act == nullptr) return no("epilogue.act is null");
  if (p.epilogue.kind == GemvEpilogue::kSwigluF16 &&
      !(p.epilogue.limit * (p.epilogue.limit + 1.0f) * gemv::kActF16Scale < 65504.0f))
    return no("the f16 SwiGLU output would overflow at limit " +
              std::to_string(p.epilogue.limit));
  return true;
}

}  // namespace m3::cuda
