// Asks the GPU to bring a range of global memory into L2 (Hopper bulk prefetch, no registers or
// shared memory used, nothing returned). For weights that a later kernel will stream while the
// kernels before it leave HBM idle: at batch 1 the attention kernels of a decode layer read a few
// MB in ~20 us, so o_proj's weights can be on their way meanwhile (docs/perf-log.md, session 5).
// A hint: results never depend on it. This header includes no CUDA header.
#pragma once

#include <cstdint>

#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

// Prefetches [p, p + bytes) rounded inward to 16-byte boundaries; bytes <= 0 does nothing.
Status launch_l2_prefetch(const void* p, int64_t bytes, CUstream_st* stream);

}  // namespace m3::cuda
