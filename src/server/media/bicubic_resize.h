// Antialiased bicubic resize of 8-bit RGB with the arithmetic of torchvision's resize on a uint8
// CPU tensor (torch's _upsample_bicubic2d_aa, the path transformers' default "torchvision" image
// processors take), so pre-processed pixels match theirs to the byte:
//  * separable, two passes: horizontal first, then vertical, each on 8-bit values; a pass is
//    skipped when that dimension keeps its size;
//  * the Keys cubic kernel with a = -0.5, support 2 scaled by the downscale factor (so a downscale
//    averages over every covered pixel), taps centred at (i + 0.5) * scale, window bounds rounded
//    by truncating (x + 0.5), weights normalised to sum 1 (all in double);
//  * weights then rounded (half away from zero) to int16 fixed point with as many fraction bits
//    as the pass's largest weight leaves room for (at most 22), each output accumulated in 32-bit
//    integers from a bias of half a unit, shifted down and clamped to 0..255.
// Pillow's Image.resize(BICUBIC) is the same but for the fixed point (always 22 fraction bits, in
// int32 weights), which moves about one value in a hundred by one level.
#pragma once

#include "server/media/image_decode.h"

namespace m3::server {

RgbImage resize_bicubic(const RgbImage& in, int32_t out_width, int32_t out_height);

// The cubic convolution kernel with a = -0.5, evaluated as torch writes it.
double keys_bicubic_kernel(double x);

}  // namespace m3::server
