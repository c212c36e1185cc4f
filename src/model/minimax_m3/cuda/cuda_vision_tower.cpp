#include "model/minimax_m3/cuda/cuda_vision_tower.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cuda/prefill/prefill_gemm.h"
#include "backend/cuda/runtime/caching_allocator.h"
#include "backend/cuda/runtime/device_memory.h"
#include "backend/cuda/runtime/stream.h"
#include "backend/cuda/vision/vision_kernels.h"
#include "core/dtype.h"

namespace m3 {

using cuda::QuantWeight;

namespace {

struct DevLinear {
  const uint16_t* w = nullptr;  // [out, in] bf16
  const float* b = nullptr;     // [out]
  int64_t out = 0, in = 0;
  QuantWeight q() const {
    QuantWeight qw;
    qw.format = cuda::QuantFormat::kBf16;
    qw.w = reinterpret_cast<const uint8_t*>(w);
    qw.n = out;
    qw.k = in;
    return qw;
  }
};

struct DevLayer {
  const float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
  DevLinear qkv, out, fc1, fc2;
};

// A per-call device buffer from the caching allocator, returned on scope exit.
class Scratch {
 public:
  Scratch(cuda::CachingAllocator* a, const cuda::Stream* s) : a_(a), s_(s) {}
  // After the stream's work (an error return may leave launches queued that use the buffers).
  ~Scratch() {
    (void)s_->synchronize();
    for (void* p : ptrs_) a_->free(p);
  }
  template <typename T>
  Result<T*> get(int64_t count) {
    M3_ASSIGN_OR_RETURN(void* p, a_->allocate(std::max<int64_t>(count, 1) * int64_t(sizeof(T))));
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }

 private:
  cuda::CachingAllocator* a_;
  const cuda::Stream* s_;
  std::vector<void*> ptrs_;
};

}  // namespace

struct CudaVisionTower::Impl {
  VisionConfig c;
  cuda::DeviceArena arena;
  cuda::CachingAllocator alloc;
  cuda::Stream stream;
  std::unique_ptr<cuda::PrefillGemm> gemm;
  DevLinear patch, proj1, proj2, merge1, merge2;
  const float *pre_w = nullptr, *pre_b = nullptr;
  std::vector<DevLayer> layers;

  Result<const float*> upload_f32(const std::vector<float>& v, const std::string& what) {
    M3_ASSIGN_OR_RETURN(float* d, arena.alloc<float>(int64_t(v.size()), what));
    M3_RETURN_IF_ERROR(cuda::copy_to_device(d, v.data(), v.size() * sizeof(float)));
    return static_cast<const float*>(d);
  }
  // Rows of the given matrices stacked, rounded to bf16.
  Result<DevLinear> upload(std::initializer_list<const VisionLinear*> parts, const std::string& what) {
    DevLinear l;
    l.in = (*parts.begin())->in;
    std::vector<uint16_t> w;
    std::vector<float> b;
    for (const VisionLinear* p : parts) {
      if (p->in != l.in) return invalid_argument("[vision.cuda] " + what + ": stacked widths differ");
      l.out += p->out;
      for (float v : p->weight) w.push_back(f32_to_bf16(v));
      if (p->bias.empty()) {
        b.insert(b.end(), size_t(p->out), 0.0f);
      } else {
        b.insert(b.end(), p->bias.begin(), p->bias.end());
      }
    }
    M3_ASSIGN_OR_RETURN(uint16_t* dw, arena.alloc<uint16_t>(int64_t(w.size()), what));
    M3_RETURN_IF_ERROR(cuda::copy_to_device(dw, w.data(), w.size() * sizeof(uint16_t)));
    l.w = dw;
    M3_ASSIGN_OR_RETURN(l.b, upload_f32(b, what + " bias"));
    return l;
  }

  // y (+)= x · W^T, float32 out.
  Status linear(const uint16_t* x, int64_t ldx, int64_t m, const DevLinear& l, float* y,
                int64_t ldy, bool accumulate) {
    cuda::PrefillLinearParams p;
    p.x = x;
    p.ldx = ldx;
    p.m = m;
    p.w = l.q();
    p.y = y;
    p.ldy = ldy;
    p.out = cuda::PrefillOut::kF32;
    p.accumulate = accumulate;
    return gemm->linear(p, stream.get());
  }

  Result<std::vector<std::vector<float>>> encode(std::span<const CudaVisionImage> images);
};

Result<std::unique_ptr<CudaVisionTower>> CudaVisionTower::create(const VisionConfig& config,
                                                                 const VisionWeights& w) {
  M3_RETURN_IF_ERROR(check_cuda_vision_config(config));
  if (int64_t(w.layers.size()) != config.num_hidden_layers) {
    return invalid_argument("[vision.cuda] " + std::to_string(w.layers.size()) +
                            " layers of weights for a config of " +
                            std::to_string(config.num_hidden_layers));
  }
  std::unique_ptr<CudaVisionTower> t(new CudaVisionTower());
  t->impl_ = std::make_unique<Impl>();
  Impl& m = *t->impl_;
  m.c = config;
  M3_ASSIGN_OR_RETURN(m.stream, cuda::Stream::create());
  M3_ASSIGN_OR_RETURN(m.gemm, cuda::PrefillGemm::create(&m.alloc, int64_t{8} << 20));
  M3_ASSIGN_OR_RETURN(m.patch, m.upload({&w.patch_embed}, "vision patch embedding"));
  M3_ASSIGN_OR_RETURN(m.pre_w, m.upload_f32(w.pre_ln_weight, "vision pre-LayerNorm"));
  M3_ASSIGN_OR_RETURN(m.pre_b, m.upload_f32(w.pre_ln_bias, "vision pre-LayerNorm"));
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const VisionLayerWeights& l = w.layers[i];
    const std::string name = "vision layer " + std::to_string(i);
    DevLayer d{};
    M3_ASSIGN_OR_RETURN(d.ln1_w, m.upload_f32(l.ln1_weight, name + " layer_norm1"));
    M3_ASSIGN_OR_RETURN(d.ln1_b, m.upload_f32(l.ln1_bias, name + " layer_norm1"));
    M3_ASSIGN_OR_RETURN(d.ln2_w, m.upload_f32(l.ln2_weight, name + " layer_norm2"));
    M3_ASSIGN_OR_RETURN(d.ln2_b, m.upload_f32(l.ln2_bias, name + " layer_norm2"));
    M3_ASSIGN_OR_RETURN(d.qkv, m.upload({&l.q, &l.k, &l.v}, name + " q|k|v"));
    M3_ASSIGN_OR_RETURN(d.out, m.upload({&l.out}, name + " out_proj"));
    M3_ASSIGN_OR_RETURN(d.fc1, m.upload({&l.fc1}, name + " fc1"));
    M3_ASSIGN_OR_RETURN(d.fc2, m.upload({&l.fc2}, name + " fc2"));
    m.layers.push_back(d);
  }
  M3_ASSIGN_OR_RETURN(m.proj1, m.upload({&w.proj1}, "multi_modal_projector.linear_1"));
  M3_ASSIGN_OR_RETURN(m.proj2, m.upload({&w.proj2}, "multi_modal_projector.linear_2"));
  M3_ASSIGN_OR_RETURN(m.merge1, m.upload({&w.merge1}, "patch_merge_mlp.linear_1"));
  M3_ASSIGN_OR_RETURN(m.merge2, m.upload({&w.merge2}, "patch_merge_mlp.linear_2"));
  const int64_t merge = config.spatial_merge_size * config.spatial_merge_size;
  if (m.merge1.in != merge * config.projector_hidden_size ||
      m.merge2.out != config.text_hidden_size || m.patch.in != config.patch_values()) {
    return invalid_argument("[vision.cuda] projector / patch embedding shapes do not match the config");
  }
  M3_RETURN_IF_ERROR(cuda::synchronize_device());
  return t;
}

CudaVisionTower::~CudaVisionTower() = default;

const VisionConfig& CudaVisionTower::config() const { return impl_->c; }
int64_t CudaVisionTower::weight_bytes() const { return impl_->arena.bytes(); }

Result<std::vector<std::vector<float>>> CudaVisionTower::encode(
    std::span<const CudaVisionImage> images) {
  return impl_->encode(images);
}

Result<std::vector<std::vector<float>>> CudaVisionTower::Impl::encode(
    std::span<const CudaVisionImage> images) {
  std::vector<VisionImageGrid> grids;
  for (const CudaVisionImage& im : images) grids.push_back(im.grid);
  M3_ASSIGN_OR_RETURN(const VisionBatchPlan plan, plan_vision_batch(c, grids));
  const int64_t pv = c.patch_values();
  for (size_t i = 0; i < images.size(); ++i) {
    if (int64_t(images[i].patches.size()) != images[i].grid.patches() * pv) {
      return invalid_argument("[vision.cuda] image " + std::to_string(i) + ": " +
                              std::to_string(images[i].patches.size()) + " patch values for " +
                              std::to_string(images[i].grid.patches()) + " patches of " +
                              std::to_string(pv));
    }
  }
  const int64_t N = plan.total_patches, H = c.hidden_size, F = c.intermediate_size;
  const int64_t P = c.projector_hidden_size, T = c.text_hidden_size;
  const int64_t heads = c.num_attention_heads, D = c.head_dim();
  const int64_t W = plan.total_outputs, merge = N / W;
  CUstream_st* s = stream.get();
  Scratch sc(&alloc, &stream);
  // Host inputs: patches (float32, converted on the GPU), RoPE tables, the image table.
  M3_ASSIGN_OR_RETURN(float* patches_f32, sc.get<float>(N * pv));
  for (size_t i = 0; i < images.size(); ++i) {
    M3_RETURN_IF_ERROR(cuda::copy_to_device(patches_f32 + plan.images[i].patch_start * pv,
                                            images[i].patches.data(),
                                            images[i].patches.size() * sizeof(float)));
  }
  M3_ASSIGN_OR_RETURN(float* cos_d, sc.get<float>(int64_t(plan.rope_cos.size())));
  M3_ASSIGN_OR_RETURN(float* sin_d, sc.get<float>(int64_t(plan.rope_sin.size())));
  M3_ASSIGN_OR_RETURN(int32_t* img_d, sc.get<int32_t>(N));
  std::vector<int64_t> table;
  for (const VisionBatchImage& im : plan.images) table.push_back(im.patch_start);
  for (const VisionBatchImage& im : plan.images) table.push_back(im.keys_padded);
  for (const VisionBatchImage& im : plan.images) table.push_back(im.kv_offset);
  M3_ASSIGN_OR_RETURN(int64_t* table_d, sc.get<int64_t>(int64_t(table.size())));
  M3_RETURN_IF_ERROR(cuda::copy_to_device(cos_d, plan.rope_cos.data(), plan.rope_cos.size() * 4));
  M3_RETURN_IF_ERROR(cuda::copy_to_device(sin_d, plan.rope_sin.data(), plan.rope_sin.size() * 4));
  M3_RETURN_IF_ERROR(cuda::copy_to_device(img_d, plan.patch_image.data(), size_t(N) * 4));
  M3_RETURN_IF_ERROR(cuda::copy_to_device(table_d, table.data(), table.size() * 8));
  // The copies above ran on the legacy stream; the tower's stream does not wait for it.
  M3_RETURN_IF_ERROR(cuda::synchronize_device());

  const int64_t wide = std::max({3 * H, F, P, T, merge * P});
  M3_ASSIGN_OR_RETURN(float* x, sc.get<float>(N * H));          // residual stream
  M3_ASSIGN_OR_RETURN(float* y, sc.get<float>(N * wide));       // GEMM outputs
  M3_ASSIGN_OR_RETURN(uint16_t* a, sc.get<uint16_t>(N * std::max(wide, pv)));  // GEMM inputs
  M3_ASSIGN_OR_RETURN(uint16_t* q, sc.get<uint16_t>(N * H));
  M3_ASSIGN_OR_RETURN(uint16_t* k, sc.get<uint16_t>(plan.kv_elements));
  M3_ASSIGN_OR_RETURN(uint16_t* vt, sc.get<uint16_t>(plan.kv_elements));
  M3_ASSIGN_OR_RETURN(float* scores, sc.get<float>(plan.max_patches * plan.max_keys_padded));
  M3_ASSIGN_OR_RETURN(uint16_t* probs, sc.get<uint16_t>(plan.max_patches * plan.max_keys_padded));
  M3_ASSIGN_OR_RETURN(float* att, sc.get<float>(N * H));
  // The padding keys are never written: zero (V^T's padding meets a zero probability, and
  // 0 · NaN would not be zero).
  M3_RETURN_IF_ERROR(cuda::fill_zero(k, size_t(plan.kv_elements) * 2));
  M3_RETURN_IF_ERROR(cuda::fill_zero(vt, size_t(plan.kv_elements) * 2));
  M3_RETURN_IF_ERROR(cuda::synchronize_device());

  const float eps = float(c.layer_norm_eps);
  auto layer_norm = [&](const float* in, const float* w, const float* b, float* out_f32,
                        uint16_t* out_bf16) {
    cuda::VisionLayerNormParams p;
    p.x = in;
    p.w = w;
    p.b = b;
    p.y_f32 = out_f32;
    p.y_bf16 = out_bf16;
    p.rows = N;
    p.dim = H;
    p.eps = eps;
    return cuda::launch_vision_layer_norm(p, s);
  };

  M3_RETURN_IF_ERROR(cuda::launch_f32_to_bf16(patches_f32, a, N * pv, s));
  M3_RETURN_IF_ERROR(linear(a, pv, N, patch, y, H, false));
  M3_RETURN_IF_ERROR(layer_norm(y, pre_w, pre_b, x, nullptr));
  const float scale = 1.0f / std::sqrt(float(D));
  for (const DevLayer& l : layers) {
    M3_RETURN_IF_ERROR(layer_norm(x, l.ln1_w, l.ln1_b, nullptr, a));
    M3_RETURN_IF_ERROR(linear(a, H, N, l.qkv, y, 3 * H, false));
    cuda::VisionQkvParams qp;
    qp.qkv = y;
    qp.bias = l.qkv.b;
    qp.rope_cos = cos_d;
    qp.rope_sin = sin_d;
    qp.patch_image = img_d;
    qp.image_start = table_d;
    qp.image_keys = table_d + plan.images.size();
    qp.image_kv = table_d + 2 * plan.images.size();
    qp.q = q;
    qp.k = k;
    qp.vt = vt;
    qp.n = N;
    qp.heads = heads;
    qp.head_dim = D;
    qp.rope_half = plan.rope_half;
    M3_RETURN_IF_ERROR(cuda::launch_vision_qkv(qp, s));
    for (const VisionBatchImage& im : plan.images) {
      const int64_t n = im.patches, kp = im.keys_padded;
      for (int64_t h = 0; h < heads; ++h) {
        DevLinear kh{k + im.kv_offset + h * kp * D, nullptr, kp, D};
        M3_RETURN_IF_ERROR(linear(q + im.patch_start * H + h * D, H, n, kh, scores, kp, false));
        M3_RETURN_IF_ERROR(cuda::launch_vision_softmax_bf16(scores, n, n, kp, scale, probs, s));
        DevLinear vh{vt + im.kv_offset + h * D * kp, nullptr, D, kp};
        M3_RETURN_IF_ERROR(linear(probs, kp, n, vh, att + im.patch_start * H + h * D, H, false));
      }
    }
    M3_RETURN_IF_ERROR(cuda::launch_f32_to_bf16(att, a, N * H, s));
    M3_RETURN_IF_ERROR(linear(a, H, N, l.out, x, H, true));
    M3_RETURN_IF_ERROR(cuda::launch_vision_add_bias(x, l.out.b, N, H, s));
    M3_RETURN_IF_ERROR(layer_norm(x, l.ln2_w, l.ln2_b, nullptr, a));
    M3_RETURN_IF_ERROR(linear(a, H, N, l.fc1, y, F, false));
    M3_RETURN_IF_ERROR(cuda::launch_vision_bias_act_bf16(y, l.fc1.b, N, F, true, a, s));
    M3_RETURN_IF_ERROR(linear(a, F, N, l.fc2, x, H, true));
    M3_RETURN_IF_ERROR(cuda::launch_vision_add_bias(x, l.fc2.b, N, H, s));
  }
  // Projector per patch, then the merge MLP over each window's consecutive patches: the bf16
  // [N, P] rows are the [N / merge, merge · P] rows of the merge MLP's input.
  M3_RETURN_IF_ERROR(cuda::launch_f32_to_bf16(x, a, N * H, s));
  M3_RETURN_IF_ERROR(linear(a, H, N, proj1, y, P, false));
  M3_RETURN_IF_ERROR(cuda::launch_vision_bias_act_bf16(y, proj1.b, N, P, true, a, s));
  M3_RETURN_IF_ERROR(linear(a, P, N, proj2, y, P, false));
  M3_RETURN_IF_ERROR(cuda::launch_vision_bias_act_bf16(y, proj2.b, N, P, false, a, s));
  M3_RETURN_IF_ERROR(linear(a, merge * P, W, merge1, y, T, false));
  M3_RETURN_IF_ERROR(cuda::launch_vision_bias_act_bf16(y, merge1.b, W, T, true, a, s));
  M3_RETURN_IF_ERROR(linear(a, T, W, merge2, y, T, false));
  M3_RETURN_IF_ERROR(cuda::launch_vision_add_bias(y, merge2.b, W, T, s));
  std::vector<float> host(size_t(W * T));
  M3_RETURN_IF_ERROR(cuda::copy_to_host_async(host.data(), y, host.size() * 4, s));
  M3_RETURN_IF_ERROR(stream.synchronize());
  std::vector<std::vector<float>> out;
  for (const VisionBatchImage& im : plan.images) {
    out.emplace_back(host.begin() + im.output_start * T,
                     host.begin() + (im.output_start + im.outputs) * T);
  }
  return out;
}

}  // namespace m3
