// Bicubic resize of 8-bit RGB with the same arithmetic as PIL's Image.resize(size, BICUBIC) (what
// the Hugging Face image processors call on uint8 images), so pre-processed pixels match theirs:
//  * separable, two passes: horizontal first (over only the source rows the vertical pass will
//    read), then vertical; a pass is skipped when that dimension keeps its size;
//  * the cubic kernel with a = -0.5, support 2 scaled by the downscale factor (so a downscale
//    averages over all covered pixels), taps centred at (i + 0.5) * scale, window bounds rounded
//    by truncating (x + 0.5), weights normalised to sum 1;
//  * weights then quantised to 22-bit fixed point (rounded half away from zero), each output
//    accumulated in 32-bit integers from a bias of 2^21 and clipped to 0..255, so the
//    intermediate image between the passes is rounded to 8 bits.
#pragma once

#include "server/media/image_decode.h"

namespace m3::server {

RgbImage resize_bicubic_like_pil(const RgbImage& in, int32_t out_width, int32_t out_height);

// PIL's bicubic kernel (a = -0.5), exposed for tests.
double pil_bicubic_kernel(double x);

}  // namespace m3::server
