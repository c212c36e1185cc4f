// CpuBackend: memory and the element-wise / small ops. Matmul kernels: cpu_kernels.cpp;
// attention and the indexer: cpu_attention.cpp; routing and experts: cpu_moe.cpp.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

namespace m3 {

CpuBackend::CpuBackend(int num_threads) : pool_(num_threads) {}

std::string CpuBackend::name() const {
  return "cpu (" + std::to_string(pool_.num_threads()) + " threads)";
}

void* CpuBackend::alloc(int64_t bytes) {
  if (bytes <= 0) bytes = 1;
  return ::operator new(static_cast<size_t>(bytes), std::align_val_t{64}, std::nothrow);
}

void CpuBackend::free(void* p) {
  if (p != nullptr) ::operator delete(p, std::align_val_t{64});
}

void CpuBackend::copy_to_device(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
}

void CpuBackend::copy_to_host(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
}

void CpuBackend::fill_zero(void* p, int64_t bytes) {
  if (bytes > 0) std::memset(p, 0, static_cast<size_t>(bytes));
}

void CpuBackend::linear(const LinearParams& p) {
  M3_CHECK(p.m >= 0 && p.n >= 0 && p.k >= 0, "[cpu.linear] negative shape");
  if (p.m == 0 || p.n == 0) return;
  // Tiles of kMb rows x kNb output columns; each element's order is fixed by cpu::gemm_nt_serial.
  constexpr int64_t kMb = 32, kNb = 48;
  int64_t num_mb = (p.m + kMb - 1) / kMb, num_nb = (p.n + kNb - 1) / kNb;
  // At least ~256K multiply-adds per chunk so tiny matmuls stay on one thread.
  int64_t min_tiles = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, kMb * kNb * p.k));
  pool_.parallel_for(num_mb * num_nb, min_tiles, [&](int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; ++tile) {
      int64_t mb = tile / num_nb, nb = tile % num_nb;
      int64_t m0 = mb * kMb, n0 = nb * kNb;
      int64_t mm = std::min(kMb, p.m - m0), nn = std::min(kNb, p.n - n0);
      cpu::gemm_nt_serial(p.x + m0 * p.k, p.w + n0 * p.k, p.y + m0 * p.n + n0, mm, nn, p.k, p.n,
                          p.accumulate);
    }
  });
}

void CpuBackend::rms_norm(const RmsNormParams& p) {
  pool_.parallel_for(p.rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, p.dim)),
                     [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* x = p.x + r * p.dim;
      float* y = p.y + r * p.dim;
      double ss = 0.0;  // wider accumulation for the mean of squares
      for (int64_t i = 0; i < p.dim; ++i) ss += static_cast<double>(x[i]) * x[i];
      float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(p.dim) + p.eps));
      for (int64_t i = 0; i < p.dim; ++i) {
        float scale = p.unit_offset ? 1.0f + p.w[i] : p.w[i];
        y[i] = (x[i] * inv) * scale;
      }
    }
  });
}

void CpuBackend::rope(const RopeParams& p) {
  M3_CHECK(p.rot_width % 2 == 0 && p.rot_width <= p.d && p.rotary_dim % 2 == 0 &&
               p.rotary_dim > 0,
           "[cpu.rope] bad widths");
  const int64_t half_freq = p.rotary_dim / 2;
  const int64_t half = p.rot_width / 2;
  // inv_freq exactly as HF builds it in float32: 1 / theta^(float(2i) / float(rotary_dim)).
  std::vector<float> inv_freq(static_cast<size_t>(half_freq));
  for (int64_t i = 0; i < half_freq; ++i) {
    float e = static_cast<float>(2 * i) / static_cast<float>(p.rotary_dim);
    inv_freq[i] = 1.0f / static_cast<float>(std::pow(p.theta, static_cast<double>(e)));
  }
  pool_.parallel_for(p.t, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> c(static_cast<size_t>(p.rot_width)), s(static_cast<size_t>(p.rot_width));
    std::vector<float> tmp(static_cast<size_t>(p.rot_width));
    for (int64_t t = begin; t < end; ++t) {
      float pos = static_cast<float>(p.positions[t]);
      for (int64_t d = 0; d < p.rot_width; ++d) {
        float angle = inv_freq[d % half_freq] * pos;
        c[d] = static_cast<float>(std::cos(static_cast<double>(angle)));
        s[d] = static_cast<float>(std::sin(static_cast<double>(angle)));
      }
      for (int64_t h = 0; h < p.h; ++h) {
        float* x = p.x + (t * p.h + h) * p.d;
        for (int64_t d = 0; d < p.rot_width; ++d) {
          float rot = d < half ? -x[d + half] : x[d - half];
          tmp[d] = x[d] * c[d] + rot * s[d];
        }
        std::memcpy(x, tmp.data(), sizeof(float) * static_cast<size_t>(p.rot_width));
      }
    }
  });
}

void CpuBackend::swiglu_oai(const SwigluOaiParams& p) {
  pool_.parallel_for(p.m, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, p.inter)),
                     [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* g = p.gate_up + r * 2 * p.inter;
      const float* u = g + p.inter;
      float* o = p.out + r * p.inter;
      for (int64_t i = 0; i < p.inter; ++i) {
        float gc = std::min(g[i], p.limit);
        float uc = std::min(std::max(u[i], -p.limit), p.limit);
        float sig = 1.0f / (1.0f + std::exp(-(gc * p.alpha)));
        o[i] = (uc + 1.0f) * (gc * sig);
      }
    }
  });
}

void CpuBackend::kv_write(const KvWriteParams& p) {
  const KvLayerView& c = p.cache;
  const int64_t kv_row = c.num_kv_heads * c.head_dim;
  for (int64_t i = 0; i < p.t; ++i) {
    int64_t pos = p.positions[i];
    int64_t blk = pos / c.page_size;
    M3_CHECK(blk < p.num_blocks, "[cpu.kv_write] position beyond the block table");
    int64_t page = p.block_table[blk];
    M3_CHECK(page >= 0 && page < c.num_pages, "[cpu.kv_write] bad page id");
    if (c.quantised()) {
      // Rows of a page-head are appended in order (kv_append_row may re-encode earlier rows).
      const int64_t row = pos % c.page_size;
      for (int64_t h = 0; h < c.num_kv_heads; ++h) {
        const int64_t off = (i * c.num_kv_heads + h) * c.head_dim;
        kv_append_row(c.dtype, kv_page_head(c.dtype, c.kq, page, c.page_size, c.num_kv_heads, h,
                                            c.head_dim),
                      row, p.k + off, c.head_dim);
        kv_append_row(c.dtype, kv_page_head(c.dtype, c.vq, page, c.page_size, c.num_kv_heads, h,
                                            c.head_dim),
                      row, p.v + off, c.head_dim);
      }
      if (p.idx_k != nullptr) {
        M3_CHECK(c.has_index_keys(), "[cpu.kv_write] layer has no index-key cache");
        kv_append_row(c.dtype, kv_page_head(c.dtype, c.iq, page, c.page_size, 1, 0,
                                            c.index_head_dim),
                      row, p.idx_k + i * c.index_head_dim, c.index_head_dim);
      }
      continue;
    }
    int64_t slot = page * c.page_size + pos % c.page_size;
    std::memcpy(c.k + slot * kv_row, p.k + i * kv_row, sizeof(float) * kv_row);
    std::memcpy(c.v + slot * kv_row, p.v + i * kv_row, sizeof(float) * kv_row);
    if (p.idx_k != nullptr) {
      M3_CHECK(c.idx_k != nullptr, "[cpu.kv_write] layer has no index-key cache");
      std::memcpy(c.idx_k + slot * c.index_head_dim, p.idx_k + i * c.index_head_dim,
                  sizeof(float) * c.index_head_dim);
    }
  }
}

void CpuBackend::embedding(const EmbeddingParams& p) {
  for (int64_t i = 0; i < p.t; ++i) {
    M3_CHECK(p.ids[i] >= 0 && p.ids[i] < p.vocab, "[cpu.embedding] token id out of range");
    std::memcpy(p.out + i * p.dim, p.table + static_cast<int64_t>(p.ids[i]) * p.dim,
                sizeof(float) * p.dim);
  }
}

void CpuBackend::add(const AddParams& p) {
  for (int64_t i = 0; i < p.n; ++i) p.y[i] = p.a[i] + p.b[i];
}

void CpuBackend::gather_rows(const GatherRowsParams& p) {
  for (int64_t r = 0; r < p.num_rows; ++r)
    std::memcpy(p.out + r * p.dim, p.x + static_cast<int64_t>(p.rows[r]) * p.dim,
                sizeof(float) * p.dim);
}

}  // namespace m3
