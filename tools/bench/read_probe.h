// A read-only streaming kernel for the benchmarks (cuda_decode_bench, stream_pattern_probe): the HBM read rate one launch achieves for a
// given size, the practical ceiling of a GEMV that streams that many weight bytes (launch, ramp
// and tail included). Each CTA reads a contiguous share with 16-byte non-allocating loads, 4 in
// flight per thread, and folds them into one word so that nothing is optimised away.
#pragma once

#include <cstdint>

#include "core/status.h"

struct CUstream_st;

namespace m3::cuda_bench {

// Reads bytes (a multiple of 16, 16-byte aligned) at p with ctas CTAs of 256 threads; writes one
// word per CTA to sink[0 .. ctas) (never read back: it only keeps the loads alive).
Status launch_read_probe(const void* p, int64_t bytes, int ctas, uint32_t* sink,
                         CUstream_st* stream);

}  // namespace m3::cuda_bench
