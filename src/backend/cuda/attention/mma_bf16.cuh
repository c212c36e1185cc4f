// mma.sync m16n8k16 with bf16 operands and float32 accumulators (d += a·b), shared by the
// tensor-core attention kernels (sparse_prefill_mma.cu, sparse_decode_mma.cu). Fragment layouts
// (PTX ISA), g = lane / 4, c = lane % 4:
//   A (16x16 row): a0 (g, 2c..2c+1), a1 (g+8, 2c..), a2 (g, 2c+8..), a3 (g+8, 2c+8..)
//   B (16x8 col):  b0 (k = 2c..2c+1, n = g), b1 (k = 2c+8.., n = g)
//   C (16x8):      c0,c1 (g, 2c..2c+1), c2,c3 (g+8, 2c..2c+1)
#pragma once

#include <cstdint>

namespace m3::cuda {

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ldmatrix x4 from shared memory (`addr`: this lane's row address, a shared-space address):
// lane l supplies row l % 8 of matrix l / 8 (8 consecutive bf16, 16-byte aligned), and receives
// in r[m] the elements (l / 4, 2(l % 4) .. +1) of matrix m; the .trans form receives
// (2(l % 4) .. +1, l / 4) instead (rows and columns exchanged). With rows = keys of a K tile and
// 8 consecutive dims per matrix, r[m] is a B fragment register of S = Q·K^T; with rows = keys
// of a V tile and .trans, a B fragment register of O = P·V.
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

}  // namespace m3::cuda
