// Rewriting `groups` weight matrices of one size in place through a temporary device buffer of
// one matrix (allocated and freed here; synchronises the stream): the load-time half of the
// mma-layout repacks (nvfp4_repack.h, mxfp8_repack.h). This header includes no CUDA header.
#pragma once

#include <cstdint>
#include <functional>

#include "core/status.h"

struct CUstream_st;

namespace m3::cuda {

// For each matrix g: copy it to the buffer, then repack(buffer, w + g · bytes) on the stream.
Status repack_in_place(uint8_t* w, int64_t groups, int64_t bytes,
                       const std::function<Status(const uint8_t* src, uint8_t* dst)>& repack,
                       CUstream_st* stream);

}  // namespace m3::cuda
