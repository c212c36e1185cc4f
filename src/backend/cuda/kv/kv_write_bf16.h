// Writes one decode token per sequence into the bf16 paged cache (the real-shape path): K (already
// normed and roped, bf16), V (float32 projection output, rounded to bf16) and the index key
// (normed and roped, bf16). Page of sequence b's token: block_tables[b, positions[b] / S]; a -1
// page skips the write. This header includes no CUDA header.
#pragma once

#include <cstdint>

#include "backend/cuda/attention/sparse_decode.h"
#include "core/status.h"

namespace m3::cuda {

struct KvWriteBf16Params {
  KvCacheView cache;
  const uint16_t* k = nullptr;        // [B, Hkv, D] bf16
  const float* v = nullptr;           // [B, Hkv·D] float32, token stride ld_v
  int64_t ld_v = 0;                   // 0 = Hkv·D
  const uint16_t* idx_k = nullptr;    // [B, Dix] bf16 or nullptr
  const int32_t* positions = nullptr; // [B]
  const int32_t* block_tables = nullptr;  // [B, max_blocks]
  int64_t batch = 0, max_blocks = 0;
};

Status launch_kv_write_bf16(const KvWriteBf16Params& p, CUstream_st* stream);

}  // namespace m3::cuda
