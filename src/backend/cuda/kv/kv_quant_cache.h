// Rows into, and bf16 pages out of, the real-shape paged KV cache in a quantised dtype
// (--kv-cache-dtype fp8_e4m3 / fp4_e2m1 on the GPU; formats and error model in quant/kv_quant.h
// and docs/kv-cache-dtype.md). This header includes no CUDA header.
//
//  * launch_kv_append_quantised: the new tokens' K, V and index-key rows of a step (bf16, as the
//    attention inputs computed them) appended to their pages with the CPU reference's rule
//    (kv_append_row): a page-head's scale is the smallest power of two holding every row written
//    so far, reset by row 0 of the page; a row that needs a larger scale first re-encodes the
//    rows already there. The result is kv_append_row's, byte for byte, applied to the rows in
//    step order. A page-head's rows are appended by one warp in order (rows of one page are
//    consecutive positions of one sequence: a "run"), runs of different page-heads in parallel.
//  * launch_kv_dequantise_pages: every element of the pages of one block table into a bf16 cache
//    of the same shape at the same page ids, exactly (kv/kv_load.cuh says why bf16 holds the
//    values). The prefill attention and indexer kernels then read that bf16 copy.
#pragma once

#include <cstdint>

#include "backend/cuda/attention/sparse_decode.h"
#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

struct KvAppendQuantisedParams {
  KvCacheView cache;                      // quantised (fp8_e4m3 or fp4_e2m1)
  const uint16_t* k = nullptr;            // [T, Hkv, D] bf16
  const uint16_t* v = nullptr;            // [T, Hkv, D] bf16
  const uint16_t* idx_k = nullptr;        // [T, Dix] bf16; nullptr: no index key written
  const int32_t* positions = nullptr;     // [T]
  const int32_t* block_tables = nullptr;  // [T, max_blocks]: row t's table at t · max_blocks
  int64_t t = 0, max_blocks = 0;
};

// Row t goes to page block_tables[t · max_blocks + positions[t] / S], row positions[t] % S; a -1
// page, a negative position or a block past max_blocks writes nothing. Rows writing the same page
// must be consecutive in the step with consecutive positions (as the scheduler's steps are: a
// page belongs to one sequence while it is written). Requires D and Dix multiples of 16 and at
// most 512 (checked).
Status launch_kv_append_quantised(const KvAppendQuantisedParams& p, CUstream_st* stream);

// Pages block_table[0 .. num_blocks) of the quantised `src` into the bf16 `dst` (same pages,
// heads and dims; dst's idx_k written where both have index keys); -1 entries skipped.
Status launch_kv_dequantise_pages(const KvCacheView& src, const KvCacheView& dst,
                                  const int32_t* block_table, int64_t num_blocks,
                                  CUstream_st* stream);

}  // namespace m3::cuda
