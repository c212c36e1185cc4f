// The Hopper wgmma building blocks that the grouped expert GEMM's two wgmma main loops share
// (grouped_expert_gemm_wgmma.cu: both operands from shared memory; grouped_expert_gemm_wgmma_rs.cu:
// the weights from registers): the 128-byte-swizzled K-major operand tile of 128 rows x 128
// bf16 columns, its shared-memory matrix descriptor, the fences and the m64n128k16 instructions.
// sm_90a only (the callers guard their kernels with __CUDA_ARCH_FEAT_SM90_ALL).
//
// Operand tile (128 rows; 128 bf16 columns = 256 bytes per row): two halves of 64 columns (128
// bytes a row), 16 KB each, half h holding columns 64h .. 64h + 63 of every row. Inside a half,
// row r at r·128 and its 16-byte chunk c (columns 8c .. 8c + 7 of the half) at position c ^ (r % 8):
// the "128-byte swizzle" that wgmma's descriptors describe (the XOR of address bits 4-6 with bits
// 7-9, so every half starts on a 1024-byte boundary). This is the canonical K-major SW128 layout:
// 8-row x 128-byte atoms, atoms of consecutive rows 1024 bytes apart (the descriptor's stride
// byte offset), the leading byte offset unused (one instruction's k16 = 32 bytes stays inside the
// 128-byte row). The k-step kk (16 columns) of a tile starts at half kk / 4, byte 32·(kk % 4) of
// the row (k_step_offset): the descriptor's start address moves by that much and the hardware
// applies the same XOR to the moved address (the row bits 7-9 do not change, so the base-offset
// field stays 0).
#pragma once

#include <cstdint>

namespace m3::cuda::wgmma {

constexpr int kTileRows = 128;
constexpr int kHalfBytes = kTileRows * 128;   // 128 rows x 64 bf16 columns, 16 KB
constexpr int kTileBytes = 2 * kHalfBytes;    // one 128 x 128 bf16 operand tile
constexpr int kSwizzleAtomBytes = 1024;       // 8 rows x 128 bytes

// Byte offset of (row r, 16-byte chunk c = columns 8c .. 8c + 7, c < 16) in an operand tile.
__device__ __forceinline__ int sw128_off(int r, int c) {
  return (c >> 3) * kHalfBytes + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}

// Where k-step kk (columns 16kk .. 16kk + 15) of a tile starts, from the tile's (or its first
// row's) address.
__device__ __forceinline__ uint32_t k_step_offset(int kk) {
  return static_cast<uint32_t>((kk >> 2) * kHalfBytes + (kk & 3) * 32);
}

// wgmma shared-memory matrix descriptor of a K-major, 128-byte-swizzled operand starting at
// shared address `addr` (PTX ISA "Matrix Descriptor Format"): bits 0-13 start address >> 4,
// 16-29 leading byte offset >> 4 (unused here, 1 by convention), 32-45 stride byte offset >> 4
// (1024: the next 8 rows), 49-51 base offset (0: every half is 1024-aligned and k-steps move the
// start by < 128 bytes), 62-63 swizzle mode (1 = 128 bytes).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{kSwizzleAtomBytes >> 4} << 32) | (uint64_t{1} << 62);
}

// Generic-proxy writes (cp.async, st.shared) -> visible to the async proxy that wgmma reads by.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Before the first wgmma that reads registers (accumulators, register operands) written by
// other instructions.
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
// Waits until at most N committed groups of this warpgroup are still running.
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator accesses across the asynchronous region.
__device__ __forceinline__ void fence_operands(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The 64 float32 accumulators of m64n128 as read-write asm operands %0 .. %63.
#define M3_WGMMA_D64(d)                                                                           \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), \
      "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), \
      "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), \
      "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// Accumulator fragment of m64nN (PTX "wgmma D fragment", f32): warp q of the warpgroup owns rows
// 16q .. 16q + 15; lane 4g + t holds d[4j + 0, 1] = (row 16q + g, columns 8j + 2t, + 1) and
// d[4j + 2, 3] = (row 16q + g + 8, same columns), j = 0 .. N/8 - 1.

// d[64] += A(64 x 16, desc a) · B(128 x 16, desc b)^T, bf16 in, f32 accumulate; both K-major
// (imm-trans-a = imm-trans-b = 0), scale-d = 1 (the accumulators start at zero).
__device__ __forceinline__ void m64n128k16_ss(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : M3_WGMMA_D64(d)
      : "l"(a), "l"(b), "r"(1));
}

// d[64] += A(64 x 16, registers) · B(128 x 16, desc b)^T, bf16 in, f32 accumulate; B K-major
// (imm-trans-b = 0), scale-d = 1. A is the warpgroup's register fragment: warp q holds rows
// 16q .. 16q + 15 as mma.m16n8k16's A operand, lane 4g + t: a[0] = (row g, k 2t, 2t + 1),
// a[1] = (row g + 8, k 2t, 2t + 1), a[2] = (row g, k 2t + 8, 2t + 9), a[3] = (row g + 8, same),
// each a bf16x2 with the lower k in the low half.
__device__ __forceinline__ void m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n"
      "}\n"
      : M3_WGMMA_D64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
}

}  // namespace m3::cuda::wgmma

#undef M3_WGMMA_D64
