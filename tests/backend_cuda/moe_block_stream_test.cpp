// The persistent batch-1 MoE block (moe/moe_block_stream.h) against the per-kernel path and the
// CPU backend, on random weights in the model's storage formats (MXFP8 shared expert and NVFP4
// routed experts, both repacked into the mma layouts on the GPU):
//  * the router's logits, top-k ids and weights and the grouping: bitwise those of
//    launch_moe_route (the same dot order and top-k code);
//  * the shared and routed SwiGLU activations against the CPU's gate|up + SwiGLU of the same
//    row (quant_matrix.h's bound: the f32 summation bound propagated through SwiGLU, plus the
//    bf16 rounding), and the down products against the CPU's product of the activations the GPU
//    stored (the summation bound 3·gamma_{K+2} + 4u of quant_gemv_mma_test.cpp);
//  * a second launch gives the same bits (deterministic; the counters are back at zero).
#include "backend/cuda/moe/moe_block_stream.h"

#include <algorithm>

#include "backend/cuda/gemm/mxfp8_repack.h"
#include "backend/cuda/gemm/nvfp4_repack.h"
#include "backend/cuda/gemm/x_f16.h"
#include "backend/cuda/moe/moe_route.h"
#include "cuda_test_util.h"
#include "quant/mxfp8_mma_layout.h"
#include "quant/nvfp4_mma_layout.h"
#include "quant_matrix.h"

namespace m3::cuda_test {
namespace {

double bound_factor(int64_t k) {
  return (3 * gamma(k + 2) + 4 * kU) * 1.01;
}

struct Shape {
  int64_t hidden, shared_inter, inter, experts, top_k;
};

std::string name_of(const Shape& s) {
  return "H" + std::to_string(s.hidden) + " S" + std::to_string(s.shared_inter) + " I" +
         std::to_string(s.inter) + " E" + std::to_string(s.experts) + " K" +
         std::to_string(s.top_k);
}

// CPU product of one row a [k] through w [n, k], with the bound factor·Σ|a||w| per output.
void down_reference(const std::vector<float>& a, const QMatrix& w, int64_t n, int64_t k,
                    std::vector<float>* want, std::vector<double>* bound) {
  want->assign(n, 0.0f);
  bound->assign(n, 0.0);
  const auto aa = abs_of(a), aw = abs_of(w.deq);
  std::vector<float> mg(n);
  cpu()->linear({a.data(), w.deq.data(), want->data(), 1, n, k, false});
  cpu()->linear({aa.data(), aw.data(), mg.data(), 1, n, k, false});
  for (int64_t j = 0; j < n; ++j) (*bound)[j] = bound_factor(k) * mg[j] + 1e-30;
}

void run_block(const Shape& s, uint32_t seed) {
  const std::string name = name_of(s);
  const int64_t H = s.hidden, E = s.experts, K = s.top_k, I = s.inter, SI = s.shared_inter;
  // One token: bf16 x, its f16 form, the router (bf16 weights, a bias).
  std::vector<float> xf;
  std::vector<uint16_t> xb;
  bf16_randn(H, seed, 1.0f, &xf, &xb);
  Dev<uint16_t> dx(xb);
  auto xh = Dev<uint16_t>::poisoned(H);
  auto xinv = Dev<float>::poisoned(1);
  ASSERT_TRUE(
      cuda::launch_x_to_f16({dx.ptr(), H, 1, H, xh.ptr(), H, xinv.ptr()}, stream()).is_ok());
  std::vector<float> wr_f;
  std::vector<uint16_t> wr_b;
  bf16_randn(E * H, seed + 1, 0.05f, &wr_f, &wr_b);
  Dev<uint16_t> dwr(wr_b);
  Dev<float> dbias(randn(E, seed + 2, 0.1f));

  // Weights: the routed experts (NVFP4) and the shared expert (MXFP8), repacked on the GPU.
  const ExpertSet ex = make_experts(QuantFormat::kNvfp4, E, I, H, seed + 100, seed + 300);
  DevExperts dev(ex);
  auto eup = Dev<uint8_t>::poisoned(static_cast<int64_t>(ex.up_w.size()));
  auto edown = Dev<uint8_t>::poisoned(static_cast<int64_t>(ex.down_w.size()));
  ASSERT_TRUE(cuda::launch_nvfp4_mma_repack(dev.up_w.ptr(), eup.ptr(), E, 2 * I, H,
                                            nvfp4_mma::Tiling::kSwigluPairs, stream())
                  .is_ok());
  ASSERT_TRUE(cuda::launch_nvfp4_mma_repack(dev.down_w.ptr(), edown.ptr(), E, H, I,
                                            nvfp4_mma::Tiling::kRows16, stream())
                  .is_ok());
  QMatrix sgu, sdn;
  if (SI > 0) {
    sgu = make_matrix(QuantFormat::kMxfp8, 2 * SI, H, seed + 500);
    sdn = make_matrix(QuantFormat::kMxfp8, H, SI, seed + 501);
  } else {
    sgu.data.assign(16, 0), sgu.scale.assign(16, 0), sdn.data.assign(16, 0),
        sdn.scale.assign(16, 0);
  }
  Dev<uint8_t> sgu_rm(sgu.data), sdn_rm(sdn.data), sgu_s(sgu.scale), sdn_s(sdn.scale);
  auto sgu_pk = Dev<uint8_t>::poisoned(static_cast<int64_t>(sgu.data.size()));
  auto sdn_pk = Dev<uint8_t>::poisoned(static_cast<int64_t>(sdn.data.size()));
  if (SI > 0) {
    ASSERT_TRUE(cuda::launch_mxfp8_mma_repack(sgu_rm.ptr(), sgu_pk.ptr(), 1, 2 * SI, H,
                                              mxfp8_mma::Tiling::kSwigluPairs, stream())
                    .is_ok());
    ASSERT_TRUE(cuda::launch_mxfp8_mma_repack(sdn_rm.ptr(), sdn_pk.ptr(), 1, H, SI,
                                              mxfp8_mma::Tiling::kRows16, stream())
                    .is_ok());
  }

  // Outputs of the per-kernel router (reference) and of the block.
  struct Route {
    Dev<float> logits, tw;
    Dev<int32_t> ids, offs, sorted, active;
    explicit Route(int64_t E, int64_t K)
        : logits(Dev<float>::poisoned(E)),
          tw(Dev<float>::poisoned(K)),
          ids(Dev<int32_t>::poisoned(K)),
          offs(Dev<int32_t>::poisoned(E + 1)),
          sorted(Dev<int32_t>::poisoned(K)),
          active(Dev<int32_t>::poisoned(std::min(E, K))) {}
  };
  auto route_params = [&](Route& o) {
    cuda::MoeRouteParams rp;
    rp.x = dx.ptr();
    rp.ldx = H;
    rp.rows = 1;
    rp.hidden = H;
    rp.w = dwr.ptr();
    rp.num_experts = E;
    rp.bias = dbias.ptr();
    rp.top_k = K;
    rp.scaling = 2.5f;
    rp.logits = o.logits.ptr();
    rp.topk_ids = o.ids.ptr();
    rp.topk_w = o.tw.ptr();
    rp.group_offsets = o.offs.ptr();
    rp.sorted_rows = o.sorted.ptr();
    rp.active_groups = o.active.ptr();
    return rp;
  };
  Route ref(E, K), got(E, K);
  Dev<uint32_t> route_counter(std::vector<uint32_t>{0u});
  cuda::MoeRouteParams rref = route_params(ref);
  rref.counter = route_counter.ptr();
  ASSERT_TRUE(cuda::launch_moe_route(rref, stream()).is_ok()) << name;

  auto act_s = Dev<uint16_t>::poisoned(std::max<int64_t>(SI, 1));
  auto shared_y = Dev<float>::poisoned(H);
  auto act_r = Dev<uint16_t>::poisoned(K * I);
  auto contrib = Dev<float>::poisoned(K * H);
  Dev<uint32_t> counters(std::vector<uint32_t>(cuda::kMoeBlockCounters, 0u));
  cuda::MoeBlockParams p;
  p.route = route_params(got);
  p.counters = counters.ptr();
  // One matrix of one activation row (dense) or of the routed rows (routed, below).
  auto dense = [&](cuda::QuantGemvParams& q, uint8_t* w, uint8_t* sc, int64_t n, int64_t k,
                   const uint16_t* in, const float* inv, int layout) {
    q.format = QuantFormat::kMxfp8;
    q.w = w;
    q.w_scale = sc;
    q.w_layout = layout;
    q.n = n;
    q.k = k;
    q.xh = in;
    q.ldx = k;
    q.x_inv_scale = inv;
    q.x_inv_const = inv ? 1.0f : 1.0f / 256.0f;
    q.num_rows = 1;
  };
  if (SI > 0) {
    dense(p.shared_gu, sgu_pk.ptr(), sgu_s.ptr(), 2 * SI, H, xh.ptr(), xinv.ptr(), 2);
    p.shared_gu.epilogue.kind = cuda::GemvEpilogue::kSwigluF16;
    p.shared_gu.epilogue.act = act_s.ptr();
    dense(p.shared_down, sdn_pk.ptr(), sdn_s.ptr(), H, SI, act_s.ptr(), nullptr, 1);
    p.shared_down.epilogue.y = shared_y.ptr();
    p.shared_down.epilogue.ldy = H;
  }
  auto routed = [&](cuda::QuantGemvParams& q, uint8_t* w, uint8_t* sc, float* gl, int64_t n,
                    int64_t k, const uint16_t* in, const float* inv, int layout, int64_t div) {
    dense(q, w, sc, n, k, in, inv, layout);
    q.format = QuantFormat::kNvfp4;
    q.w_global = gl;
    q.num_groups = E;
    q.group_offsets = got.offs.ptr();
    q.sorted_rows = got.sorted.ptr();
    q.active_groups = got.active.ptr();
    q.num_slots = std::min(E, K);
    q.num_rows = K;
    q.max_group_rows = 1;
    q.x_row_div = div;
  };
  routed(p.experts_gu, eup.ptr(), dev.up_s.ptr(), dev.up_g.ptr(), 2 * I, H, xh.ptr(), xinv.ptr(), 2,
         K);
  p.experts_gu.epilogue.kind = cuda::GemvEpilogue::kSwigluF16;
  p.experts_gu.epilogue.act = act_r.ptr();
  routed(p.experts_down, edown.ptr(), dev.down_s.ptr(), dev.down_g.ptr(), H, I, act_r.ptr(),
         nullptr, 1, 1);
  p.experts_down.epilogue.y = contrib.ptr();
  p.experts_down.epilogue.ldy = H;
  std::string why;
  ASSERT_TRUE(cuda::moe_block_stream_fits(p, &why)) << name << ": " << why;
  ASSERT_TRUE(cuda::launch_moe_block_stream(p, stream()).is_ok()) << name;

  // Routing: bitwise the per-kernel router's.
  const auto logits = got.logits.host();
  const auto ids = got.ids.host();
  const auto tw = got.tw.host();
  EXPECT_EQ(0, std::memcmp(logits.data(), ref.logits.host().data(), logits.size() * 4)) << name;
  EXPECT_EQ(ids, ref.ids.host()) << name;
  EXPECT_EQ(0, std::memcmp(tw.data(), ref.tw.host().data(), tw.size() * 4)) << name;
  EXPECT_EQ(got.offs.host(), ref.offs.host()) << name;
  EXPECT_EQ(got.sorted.host(), ref.sorted.host()) << name;
  EXPECT_EQ(got.active.host(), ref.active.host()) << name;
  EXPECT_EQ(counters.host(), std::vector<uint32_t>(cuda::kMoeBlockCounters, 0u)) << name;

  // Routed experts: slot j of the token went through expert ids[j].
  const auto act_r_h = act_r.host();
  std::vector<float> a_got(K * I), a_want(K * I);
  std::vector<double> a_bound(K * I);
  for (int64_t j = 0; j < K; ++j) {
    ASSERT_GE(ids[j], 0);
    ASSERT_LT(ids[j], E);
    swiglu_row_reference(xf.data(), ex.up[ids[j]], I, H, bound_factor(H), a_want.data() + j * I,
                         a_bound.data() + j * I);
  }
  for (int64_t i = 0; i < K * I; ++i) a_got[i] = f16_to_f32(act_r_h[i]) / 256.0f;
  expect_close(a_got, a_want, a_bound, name + " routed gate|up + swiglu");
  std::vector<float> y_want;
  std::vector<double> y_bound;
  down_rows_reference(a_got, ids, ex, I, H, bound_factor(I), &y_want, &y_bound);
  const auto contrib_h = contrib.host();
  expect_close(contrib_h, y_want, y_bound, name + " routed down");

  std::vector<float> shared_h;
  std::vector<uint16_t> act_s_h;
  if (SI > 0) {
    act_s_h = act_s.host();
    std::vector<float> s_got(SI), s_want(SI);
    std::vector<double> s_bound(SI);
    swiglu_row_reference(xf.data(), sgu, SI, H, bound_factor(H), s_want.data(), s_bound.data());
    for (int64_t i = 0; i < SI; ++i) s_got[i] = f16_to_f32(act_s_h[i]) / 256.0f;
    expect_close(s_got, s_want, s_bound, name + " shared gate|up + swiglu");
    std::vector<float> d_want;
    std::vector<double> d_bound;
    down_reference(s_got, sdn, H, SI, &d_want, &d_bound);
    shared_h = shared_y.host();
    expect_close(shared_h, d_want, d_bound, name + " shared down");
  }

  // Again: the same bits everywhere (fixed summation orders; the counters were reset).
  ASSERT_TRUE(cuda::launch_moe_block_stream(p, stream()).is_ok()) << name;
  EXPECT_EQ(0, std::memcmp(got.logits.host().data(), logits.data(), logits.size() * 4)) << name;
  EXPECT_EQ(act_r.host(), act_r_h) << name << ": second launch differs";
  const auto contrib2 = contrib.host();
  EXPECT_EQ(0, std::memcmp(contrib2.data(), contrib_h.data(), contrib_h.size() * 4)) << name;
  if (SI > 0) {
    EXPECT_EQ(act_s.host(), act_s_h) << name;
    const auto shared2 = shared_y.host();
    EXPECT_EQ(0, std::memcmp(shared2.data(), shared_h.data(), shared_h.size() * 4)) << name;
  }
  EXPECT_EQ(counters.host(), std::vector<uint32_t>(cuda::kMoeBlockCounters, 0u)) << name;

  // What it refuses, with a reason and without launching.
  cuda::MoeBlockParams bad = p;
  bad.route.rows = 2;
  EXPECT_FALSE(cuda::moe_block_stream_fits(bad, &why));
  EXPECT_FALSE(cuda::launch_moe_block_stream(bad, stream()).is_ok());
  bad = p;
  bad.experts_gu.w_layout = 0;
  EXPECT_FALSE(cuda::moe_block_stream_fits(bad, &why));
  EXPECT_NE(why.find("experts gate|up"), std::string::npos) << why;
  bad = p;
  bad.counters = nullptr;
  EXPECT_FALSE(cuda::launch_moe_block_stream(bad, stream()).is_ok());
}

TEST(MoeBlockStream, MatchesRouterBitwiseAndCpuWithinBound) {
  // The M3 layout at a smaller hidden size; no shared expert; many experts with a wide top-k;
  // an expert K that is not a whole number of 2048-element stages (768).
  run_block({2048, 1024, 1024, 16, 4}, 11);
  run_block({1024, 0, 512, 40, 6}, 23);
  run_block({1024, 1024, 768, 64, 8}, 37);
}

// M3.1-Flash's MoE shapes (hidden 6144, shared and expert intermediate 3072, top-4) with 4
// experts instead of 128 (the host quantises every expert; routing is covered above).
TEST(MoeBlockStream, M3FlashShapes) {
  run_block({6144, 3072, 3072, 4, 4}, 51);
}

}  // namespace
}  // namespace m3::cuda_test
