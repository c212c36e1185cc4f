// A rectangular slice of a stored weight, in its storage format: what one tensor- or
// expert-parallel rank loads of a matrix (rows of a column-parallel linear, columns of a
// row-parallel one). The bytes are copied; the result owns them (RawWeight::keep_alive).
//
// Column ranges must start and end on the format's block boundary (MXFP8: 32 elements, one E8M0
// scale; NVFP4: 16 elements, one E4M3 scale, two codes per byte), so that the slice dequantises
// to exactly the same values as the same slice of the dequantised matrix. Errors name the
// constraint and the numbers.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "loader/weight_source.h"

namespace m3 {

// Rows [row_begin, row_end) and columns [col_begin, col_end) of a 2-D weight [out, in].
Result<RawWeight> slice_raw(const RawWeight& w, int64_t row_begin, int64_t row_end,
                            int64_t col_begin, int64_t col_end);

}  // namespace m3
