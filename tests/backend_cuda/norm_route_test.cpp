// The batch-1 post-attention norm fused with the MoE router (launch_norm_route) against the two
// launches it replaces, run on the same inputs: launch_add_rms_norm (its cluster kernel at one
// token) and then launch_moe_route on the norm's output. Every output must be bitwise equal: the
// residual, the bf16 row, its f16 copy and factor, the logits, the top-k ids and weights, the
// group offsets, sorted rows and active groups. Both references are themselves checked against
// the CPU / exact arithmetic (sparse_decode_test's AddRmsNorm.*, moe_route_test), so equality
// here carries those bounds over. Cases: the M3.1-Flash shapes (hidden 6144, 128 experts, top-4)
// and smaller ones (8-96 experts, top-1 to top-16), each delta source (stored, split-K partials,
// the MoE combine, none), with and without the f16 copy and the router bias, ties between
// experts (duplicate router rows), the fused kernel as a programmatic dependent of the kernel
// that writes its delta, repeat launches, and refused parameters.
#include "backend/cuda/moe/norm_route.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <string>

#include "backend/cuda/gemm/quant_gemv.h"
#include "backend/cuda/moe/moe_combine.h"
#include "cuda_test_util.h"

namespace m3::cuda_test {
namespace {

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

enum class DeltaKind { kNone, kStored, kPartial, kMoe };
const char* name(DeltaKind k) {
  switch (k) {
    case DeltaKind::kNone: return "none";
    case DeltaKind::kStored: return "stored";
    case DeltaKind::kPartial: return "partial";
    case DeltaKind::kMoe: return "moe";
  }
  return "?";
}

struct Case {
  int64_t hidden, E, top_k;
  DeltaKind delta;
  bool f16, bias;
  int dup_rows;  // router rows 1 .. dup_rows copy row 0 (equal logits: ties)
};

// Inputs of one case (host), shared by both paths.
struct Inputs {
  std::vector<float> residual, delta, parts, moe_w, shared, bias;
  std::vector<uint16_t> norm_w, router_w;
  int64_t slices = 3, moe_k = 4;
  Inputs(const Case& c, uint32_t seed) {
    residual = randn(c.hidden, seed, 2.0f);
    delta = randn(c.hidden, seed + 1, 1.0f);
    parts = randn(std::max(slices, moe_k) * c.hidden, seed + 2, 0.7f);
    moe_w = randn(moe_k, seed + 3, 0.5f);
    shared = randn(c.hidden, seed + 4, 0.3f);
    bias = randn(c.E, seed + 5, 0.05f);
    std::vector<float> f;
    bf16_randn(c.hidden, seed + 6, 0.3f, &f, &norm_w);
    bf16_randn(c.E * c.hidden, seed + 7, 1.0f / std::sqrt(static_cast<float>(c.hidden)), &f,
               &router_w);
    for (int d = 1; d <= c.dup_rows && d < c.E; ++d)
      std::copy(router_w.begin(), router_w.begin() + c.hidden, router_w.begin() + d * c.hidden);
  }
};

// Device state of one path: its own residual copy and poisoned outputs.
struct Path {
  Dev<float> residual, delta, parts, moe_w, shared, bias;
  Dev<uint16_t> norm_w, router_w;
  Dev<uint16_t> out, out_f16;
  Dev<float> inv, logits, topk_w;
  Dev<int32_t> ids, offs, sorted, active;
  Dev<uint32_t> counter;
  cuda::NormRouteParams p;
  Path(const Case& c, const Inputs& in)
      : residual(in.residual),
        delta(in.delta),
        parts(in.parts),
        moe_w(in.moe_w),
        shared(in.shared),
        bias(in.bias),
        norm_w(in.norm_w),
        router_w(in.router_w),
        out(Dev<uint16_t>::poisoned(c.hidden)),
        out_f16(Dev<uint16_t>::poisoned(c.hidden)),
        inv(Dev<float>::poisoned(1)),
        logits(Dev<float>::poisoned(c.E)),
        topk_w(Dev<float>::poisoned(c.top_k)),
        ids(Dev<int32_t>::poisoned(c.top_k)),
        offs(Dev<int32_t>::poisoned(c.E + 1)),
        sorted(Dev<int32_t>::poisoned(c.top_k)),
        active(Dev<int32_t>::poisoned(std::min(c.E, c.top_k))),
        counter(std::vector<uint32_t>{0u}) {
    cuda::AddRmsNormParams& n = p.norm;
    n.residual = residual.ptr();
    n.weight = norm_w.ptr();
    n.out = out.ptr();
    n.t = 1;
    n.hidden = c.hidden;
    n.eps = 1e-6f;
    if (c.f16) n.out_f16 = out_f16.ptr(), n.out_inv_scale = inv.ptr();
    switch (c.delta) {
      case DeltaKind::kNone: break;
      case DeltaKind::kStored: n.delta = delta.ptr(); break;
      case DeltaKind::kPartial:
        n.delta_partial = parts.ptr();
        n.delta_slices = in.slices;
        break;
      case DeltaKind::kMoe:
        n.moe_contrib = parts.ptr();
        n.moe_weights = moe_w.ptr();
        n.moe_shared = shared.ptr();
        n.moe_top_k = in.moe_k;
        break;
    }
    cuda::MoeRouteParams& r = p.route;
    r.x = out.ptr();
    r.ldx = c.hidden;
    r.rows = 1;
    r.hidden = c.hidden;
    r.w = router_w.ptr();
    r.num_experts = c.E;
    r.bias = c.bias ? bias.ptr() : nullptr;
    r.top_k = c.top_k;
    r.scaling = 2.5f;
    r.logits = logits.ptr();
    r.topk_ids = ids.ptr();
    r.topk_w = topk_w.ptr();
    r.group_offsets = offs.ptr();
    r.sorted_rows = sorted.ptr();
    r.active_groups = active.ptr();
    r.counter = counter.ptr();
  }
  // The two launches the fused kernel replaces.
  void run_reference() {
    cuda::AddRmsNormParams n = p.norm;
    n.cluster_rows = 16;  // the cluster kernel at one token
    ASSERT_TRUE(cuda::launch_add_rms_norm(n, stream()).is_ok());
    ASSERT_TRUE(cuda::launch_moe_route(p.route, stream()).is_ok());
  }
  void run_fused() {
    const Status st = cuda::launch_norm_route(p, stream());
    ASSERT_TRUE(st.is_ok()) << st.message();
  }
  struct Host {
    std::vector<float> residual, inv, logits, topk_w;
    std::vector<uint16_t> out, out_f16;
    std::vector<int32_t> ids, offs, sorted, active;
  };
  Host read() {
    gpu()->synchronize();
    return {residual.host(), inv.host(),  logits.host(), topk_w.host(), out.host(),
            out_f16.host(),  ids.host(),  offs.host(),   sorted.host(), active.host()};
  }
};

void expect_same(const Path::Host& got, const Path::Host& want, const std::string& what) {
  EXPECT_TRUE(same_bits(got.residual, want.residual)) << "residual, " << what;
  EXPECT_TRUE(same_bits(got.out, want.out)) << "bf16 row, " << what;
  EXPECT_TRUE(same_bits(got.out_f16, want.out_f16)) << "f16 copy, " << what;
  EXPECT_TRUE(same_bits(got.inv, want.inv)) << "f16 factor, " << what;
  EXPECT_TRUE(same_bits(got.logits, want.logits)) << "logits, " << what;
  EXPECT_TRUE(same_bits(got.topk_w, want.topk_w)) << "top-k weights, " << what;
  EXPECT_EQ(got.ids, want.ids) << "top-k ids, " << what;
  EXPECT_EQ(got.offs, want.offs) << "group offsets, " << what;
  EXPECT_EQ(got.sorted, want.sorted) << "sorted rows, " << what;
  EXPECT_EQ(got.active, want.active) << "active groups, " << what;
}

std::string describe(const Case& c) {
  return "hidden " + std::to_string(c.hidden) + " E " + std::to_string(c.E) + " K " +
         std::to_string(c.top_k) + " delta " + name(c.delta) + (c.f16 ? " f16" : "") +
         (c.bias ? " bias" : "") + (c.dup_rows ? " ties " + std::to_string(c.dup_rows) : "");
}

TEST(NormRoute, EqualsClusterNormThenRouterBitwise) {
  std::vector<Case> cases;
  for (DeltaKind dk : {DeltaKind::kStored, DeltaKind::kPartial, DeltaKind::kMoe, DeltaKind::kNone})
    for (bool f16 : {true, false}) cases.push_back({6144, 128, 4, dk, f16, true, 0});
  cases.push_back({6144, 128, 4, DeltaKind::kStored, true, false, 0});
  cases.push_back({6144, 128, 8, DeltaKind::kStored, true, true, 5});  // ties at the boundary
  cases.push_back({8192, 64, 6, DeltaKind::kStored, true, true, 0});   // the largest row
  cases.push_back({1024, 8, 1, DeltaKind::kPartial, false, true, 0});  // one row per CTA
  cases.push_back({2048, 96, 16, DeltaKind::kMoe, true, true, 2});
  cases.push_back({256, 16, 16, DeltaKind::kStored, true, false, 0});  // every expert chosen
  cases.push_back({4096, 128, 4, DeltaKind::kNone, true, false, 127});  // every logit equal
  uint32_t seed = 500;
  for (const Case& c : cases) {
    const std::string what = describe(c);
    SCOPED_TRACE(what);
    const Inputs in(c, seed += 11);
    Path ref(c, in), fused(c, in);
    ref.run_reference();
    fused.run_fused();
    const Path::Host want = ref.read(), got = fused.read();
    expect_same(got, want, what);
    // Sanity of the reference itself: distinct ids in range, ascending; weights sum to scaling.
    std::set<int32_t> distinct(want.ids.begin(), want.ids.end());
    EXPECT_EQ(static_cast<int64_t>(distinct.size()), c.top_k);
    EXPECT_TRUE(std::is_sorted(want.ids.begin(), want.ids.end()));
    EXPECT_GE(*distinct.begin(), 0);
    EXPECT_LT(*distinct.rbegin(), c.E);
    double wsum = 0;
    for (float v : want.topk_w) wsum += v;
    EXPECT_NEAR(wsum, 2.5, 1e-5);
    if (c.dup_rows == 127) {  // all logits equal and no bias: the lowest ids win
      for (int64_t k = 0; k < c.top_k; ++k) EXPECT_EQ(want.ids[k], k);
    }
    // A second launch on the updated residual equals a second pass of the reference.
    ref.run_reference();
    fused.run_fused();
    expect_same(fused.read(), ref.read(), what + ", second launch");
  }
}

// The fused kernel launched as a programmatic dependent of the kernel that writes its delta (the
// MoE combine), repeatedly: it must wait for that kernel before it reads the delta, and its router
// rows (requested before the wait) do not depend on it.
TEST(NormRoute, WaitsForTheKernelBeforeIt) {
  const Case c{6144, 128, 4, DeltaKind::kStored, true, true, 0};
  const Inputs in(c, 900);
  Path ref(c, in), fused(c, in);
  auto want_delta = randn(c.hidden, 901, 1.0f);
  const int64_t k = 3;
  const auto contrib = randn(k * c.hidden, 902, 1.0f), wts = randn(k, 903, 1.0f);
  Dev<float> dc(contrib), dw(wts);
  for (int round = 0; round < 4; ++round) {
    for (Path* path : {&ref, &fused}) {
      // The delta is rewritten by a combine just before (poisoned first).
      auto poison = std::vector<float>(c.hidden, std::nanf(""));
      gpu()->copy_to_device(path->delta.ptr(), poison.data(), c.hidden * 4);
      ASSERT_TRUE(cuda::launch_moe_combine({dc.ptr(), dw.ptr(), nullptr, path->delta.ptr(), 1, k,
                                            c.hidden},
                                           stream())
                      .is_ok());
      if (path == &ref) {
        path->run_reference();
      } else {
        path->p.norm.pdl = true;
        path->run_fused();
      }
    }
    expect_same(fused.read(), ref.read(), "pdl round " + std::to_string(round));
  }
}

TEST(NormRoute, RefusesWhatItCannotRun) {
  const Case c{6144, 128, 4, DeltaKind::kStored, true, true, 0};
  const Inputs in(c, 950);
  Path ok(c, in);
  EXPECT_EQ(cuda::norm_route_problem(ok.p), "");
  auto refused = [&](auto mutate, const char* what) {
    cuda::NormRouteParams p = ok.p;
    mutate(p);
    EXPECT_NE(cuda::norm_route_problem(p), "") << what;
    const Status st = cuda::launch_norm_route(p, stream());
    EXPECT_FALSE(st.is_ok()) << what;
    EXPECT_NE(st.message().find("norm_route"), std::string::npos) << st.message();
  };
  refused([](cuda::NormRouteParams& p) { p.norm.t = 2, p.route.rows = 2; }, "two tokens");
  refused([](cuda::NormRouteParams& p) { p.route.num_experts = 256; }, "256 experts");
  refused([](cuda::NormRouteParams& p) { p.route.num_experts = 12; }, "E not a multiple of 8");
  refused([](cuda::NormRouteParams& p) { p.route.top_k = 0; }, "top_k 0");
  refused([](cuda::NormRouteParams& p) { p.route.top_k = 17; }, "top_k 17");
  refused([](cuda::NormRouteParams& p) { p.route.x = p.norm.out_f16; }, "router reads another row");
  refused([](cuda::NormRouteParams& p) { p.norm.hidden = p.route.hidden = 6160; }, "hidden % 32");
  refused([](cuda::NormRouteParams& p) { p.norm.hidden = p.route.hidden = p.route.ldx = 16384; },
          "hidden over the cluster norm's limit");
  refused([](cuda::NormRouteParams& p) { p.norm.delta_partial = p.norm.delta; p.norm.delta_slices = 1; },
          "two delta sources");
  refused([](cuda::NormRouteParams& p) { p.norm.out_inv_scale = nullptr; }, "f16 copy half set");
  refused([](cuda::NormRouteParams& p) { p.route.topk_ids = nullptr; }, "null output");
  // 8192 x 128 experts: 16 rows of 16 KB do not fit in one SM's shared memory.
  refused([](cuda::NormRouteParams& p) { p.norm.hidden = p.route.hidden = p.route.ldx = 8192; },
          "router rows too large for shared memory");
}

}  // namespace
}  // namespace m3::cuda_test
