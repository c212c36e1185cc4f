// The fused MoE router (launch_moe_route: router GEMV + sigmoid top-k + grouping by expert in one
// launch) against
//  * a double-precision dot product for the logits: x bf16, w bf16 or float32 (products exact in
//    double), and any float32 summation order of the K products is within gamma_K·Σ|x||w| of the
//    exact value (K = hidden), so the bound per element is gamma_K·Σ|x||w|;
//  * launch_router_topk + launch_group_by_expert run on the kernel's own logits output: topk_ids,
//    topk_w, group_offsets, sorted_rows and active_groups bitwise equal;
//  * a host grouping (plain loops) of the kernel's topk_ids, since both CUDA paths share the
//    grouping code (moe/routing_device.cuh);
// plus determinism (a second launch gives the same bits), the counter left at zero, a CUDA-graph
// capture replayed 3 times, refused arguments, and an informational timing print; each with the
// bf16 and the float32 router weight (and bf16 values passed as float32: bitwise the bf16 path).
// The router-logits launch (launch_router_logits, the unfused path) against the fused router:
// bitwise the same logits, ids and weights at 1 to 4096 rows (the fused router in launches of at
// most 256 rows), with the float32 weight also against the double logits and the float32 CPU
// top-k rule; near ties that the bf16 rounding of the weight flips and the float32 weight keeps.
// Expert parallelism (MoeRoute.GroupsOnlyTheRanksExperts): with group_base / group_experts the
// fused router's logits and top-k are the unsharded launch's bit for bit and its grouping is the
// host grouping of the rank's local slots (other ranks' experts dropped), as launch_group_by_expert
// with expert_base gives it; launch_moe_combine with the rank's expert range sums only its slots,
// so the ranks' combines add up to the unsharded combine (integer-valued terms: exact).
#include "backend/cuda/moe/moe_route.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "backend/cuda/f32_ops.h"
#include "backend/cuda/gemm/quant_gemv.h"
#include "backend/cuda/moe/moe_combine.h"
#include "backend/cuda/moe/router_logits.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace m3::cuda_test {
namespace {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

constexpr int32_t kIntPoison = 0x5A5A5A5A;

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Host grouping: the contract of GroupByExpertParams (quant_gemv.h).
void group_ref(const std::vector<int32_t>& ids, int64_t E, std::vector<int32_t>* offs,
               std::vector<int32_t>* sorted, std::vector<int32_t>* active) {
  const int64_t n = static_cast<int64_t>(ids.size());
  offs->assign(E + 1, 0);
  sorted->clear();
  active->clear();
  for (int64_t e = 0; e < E; ++e) {
    (*offs)[e] = static_cast<int32_t>(sorted->size());
    for (int64_t r = 0; r < n; ++r)
      if (ids[r] == e) sorted->push_back(static_cast<int32_t>(r));
    if (static_cast<int64_t>(sorted->size()) > (*offs)[e])
      active->push_back(static_cast<int32_t>(e));
  }
  (*offs)[E] = static_cast<int32_t>(sorted->size());
  active->resize(std::min(E, n), -1);
}

// The problem data of one (rows, E, hidden, ldx): bf16 x, the router weight, optional bias, the
// exact logits and Σ|x||w| (double). The weight is bf16 (`f32` false: wf holds its values) or
// float32 (`f32` true: wf holds the float32 weight and wb its bf16 rounding, which the bf16 path
// then routes with). `with_exact` false leaves exact / mag empty (large problems check sampled
// rows with exact_row).
struct Problem {
  int64_t rows, E, hidden, ldx;
  bool f32;
  std::vector<float> xf, wf;  // the values of x and of the weight the launches read
  std::vector<uint16_t> xb, wb;
  std::vector<float> bias;
  std::vector<double> exact, mag;
  Problem(int64_t rows_, int64_t E_, int64_t hidden_, int64_t ldx_, uint32_t seed,
          bool f32_ = false, bool with_exact = true)
      : rows(rows_), E(E_), hidden(hidden_), ldx(ldx_), f32(f32_) {
    bf16_randn(rows * ldx, seed, 1.0f, &xf, &xb);
    const float wscale = 1.0f / std::sqrt(static_cast<float>(hidden));
    if (f32) {
      wf = randn(E * hidden, seed + 1, wscale);
      std::vector<float> rounded = wf;
      wb = to_bf16(&rounded);
    } else {
      bf16_randn(E * hidden, seed + 1, wscale, &wf, &wb);
    }
    bias = randn(E, seed + 2, 0.05f);
    if (!with_exact) return;
    exact.assign(rows * E, 0.0);
    mag.assign(rows * E, 0.0);
    for (int64_t r = 0; r < rows; ++r) exact_row(r, exact.data() + r * E, mag.data() + r * E);
  }
  // Row r: exact[e] = Σ x·w and mag[e] = Σ|x||w| in double (the products of a bf16 and a
  // float32 value are exact in double).
  void exact_row(int64_t r, double* ex, double* mg) const {
    for (int64_t e = 0; e < E; ++e) {
      double s = 0, a = 0;
      const float* xr = xf.data() + r * ldx;
      const float* wr = wf.data() + e * hidden;
      for (int64_t k = 0; k < hidden; ++k) {
        const double p = static_cast<double>(xr[k]) * wr[k];
        s += p;
        a += std::abs(p);
      }
      ex[e] = s;
      mg[e] = a;
    }
  }
};

// Outputs of one launch, read back.
struct Outputs {
  std::vector<float> logits, w;
  std::vector<int32_t> ids, offs, sorted, active;
  bool operator==(const Outputs& o) const {
    return same_bits(logits, o.logits) && same_bits(w, o.w) && ids == o.ids && offs == o.offs &&
           sorted == o.sorted && active == o.active;
  }
};

// Device buffers and parameters of one (problem, top_k, bias) case; outputs poisoned by poison().
struct DevRoute {
  int64_t rows, E, K, slots;
  Dev<uint16_t> x, w;
  Dev<float> w32, bias, logits, tw;
  Dev<int32_t> ids, offs, sorted, active;
  Dev<uint32_t> counter;
  cuda::MoeRouteParams p;
  DevRoute(const Problem& pr, int64_t top_k, bool with_bias)
      : rows(pr.rows),
        E(pr.E),
        K(top_k),
        slots(std::min(pr.E, pr.rows * top_k)),
        x(pr.xb),
        w(pr.wb),
        w32(pr.wf),
        bias(pr.bias),
        logits(std::vector<float>(pr.rows * pr.E)),
        tw(std::vector<float>(pr.rows * top_k)),
        ids(std::vector<int32_t>(pr.rows * top_k)),
        offs(std::vector<int32_t>(pr.E + 1)),
        sorted(std::vector<int32_t>(pr.rows * top_k)),
        active(std::vector<int32_t>(std::max<int64_t>(slots, 1))),
        counter(std::vector<uint32_t>{0u}) {
    p.x = x.ptr();
    p.ldx = pr.ldx;
    p.rows = pr.rows;
    p.hidden = pr.hidden;
    use_f32(pr.f32);
    p.num_experts = pr.E;
    p.bias = with_bias ? bias.ptr() : nullptr;
    p.top_k = top_k;
    p.scaling = 2.5f;
    p.logits = logits.ptr();
    p.topk_ids = ids.ptr();
    p.topk_w = tw.ptr();
    p.group_offsets = offs.ptr();
    p.sorted_rows = sorted.ptr();
    p.active_groups = active.ptr();
    p.counter = counter.ptr();
  }
  // Routes with the float32 weight (p.w_f32) or its bf16 rounding (p.w).
  void use_f32(bool f32) {
    p.w = f32 ? nullptr : w.ptr();
    p.w_f32 = f32 ? w32.ptr() : nullptr;
  }
  template <typename T>
  static void fill(Dev<T>& d, T v) {
    std::vector<T> h(static_cast<size_t>(d.buf.size()), v);
    gpu()->copy_to_device(d.ptr(), h.data(), static_cast<int64_t>(h.size() * sizeof(T)));
  }
  void poison() {
    fill(logits, std::numeric_limits<float>::quiet_NaN());
    fill(tw, std::numeric_limits<float>::quiet_NaN());
    fill(ids, kIntPoison);
    fill(offs, kIntPoison);
    fill(sorted, kIntPoison);
    fill(active, kIntPoison);
  }
  Outputs read() {
    gpu()->synchronize();
    Outputs o{logits.host(), tw.host(), ids.host(), offs.host(), sorted.host(), active.host()};
    o.active.resize(slots);
    return o;
  }
  uint32_t counter_value() { return counter.host()[0]; }
};

// The unfused kernels on `logits` (the fused kernel's own output).
Outputs reference_path(const DevRoute& d, const std::vector<float>& logits_host,
                       const float* bias) {
  Dev<float> dl(logits_host), dw(std::vector<float>(d.rows * d.K));
  Dev<int32_t> di(std::vector<int32_t>(d.rows * d.K)), doffs(std::vector<int32_t>(d.E + 1)),
      dsorted(std::vector<int32_t>(d.rows * d.K)),
      dactive(std::vector<int32_t>(std::max<int64_t>(d.slots, 1)));
  RouterTopkParams rp{dl.ptr(), bias, di.ptr(), dw.ptr(), d.rows, d.E, d.K, d.p.scaling};
  EXPECT_TRUE(cuda::launch_router_topk(rp, stream()).is_ok());
  const cuda::GroupByExpertParams gp{di.ptr(),    d.rows * d.K,  d.E,
                                     doffs.ptr(), dsorted.ptr(), dactive.ptr()};
  EXPECT_TRUE(cuda::launch_group_by_expert(gp, stream()).is_ok());
  gpu()->synchronize();
  Outputs o{logits_host, dw.host(), di.host(), doffs.host(), dsorted.host(), dactive.host()};
  o.active.resize(d.slots);
  return o;
}

TEST(MoeRoute, MatchesDotProductsTopkAndGrouping) {
  double worst_ratio = 0.0;
  int64_t cases = 0;
  uint32_t seed = 100;
  // hidden 10240: more than the 2 · 512 chunks a thread loads before the wait (later chunks
  // through L2); only small shapes, for the host reference's sake.
  for (int64_t hidden : {6144, 1024, 520, 10240})
    for (int64_t E : {128, 96, 77, 512})
      for (int64_t rows : {1, 2, 5, 8, 33, 128, 256})
        for (bool f32 : {false, true}) {
          if (hidden > 8192 && (rows > 8 || E == 512)) continue;
          // A padded row stride for some shapes (x is then a strided view).
          const int64_t ldx = (rows == 5 || rows == 33) ? hidden + 24 : hidden;
          const Problem pr(rows, E, hidden, ldx, seed += 3, f32);
          std::vector<double> bound(rows * E);
          std::vector<float> want(rows * E);
          for (int64_t i = 0; i < rows * E; ++i) {
            bound[i] = gamma(static_cast<double>(hidden)) * pr.mag[i];
            want[i] = static_cast<float>(pr.exact[i]);  // the float rounding of exact: +u|exact|
            bound[i] += kU * std::abs(pr.exact[i]);     // covered here
          }
          for (int64_t top_k : {1, 4, 8})
            for (bool with_bias : {false, true}) {
              const std::string what = "moe_route rows " + std::to_string(rows) + " E " +
                                       std::to_string(E) + " K " + std::to_string(top_k) +
                                       " hidden " + std::to_string(hidden) +
                                       (with_bias ? " bias" : "") + (f32 ? " w fp32" : " w bf16");
              SCOPED_TRACE(what);
              DevRoute d(pr, top_k, with_bias);
              d.poison();
              ASSERT_TRUE(cuda::launch_moe_route(d.p, stream()).is_ok());
              const Outputs got = d.read();
              ASSERT_EQ(d.counter_value(), 0u);
              // (1) logits within the designed bound (printed once per problem).
              if (top_k == 1 && !with_bias) {
                expect_close(got.logits, want, bound, what);
                for (int64_t i = 0; i < rows * E; ++i)
                  worst_ratio = std::max(
                      worst_ratio, std::abs(static_cast<double>(got.logits[i]) - pr.exact[i]) /
                                       (gamma(static_cast<double>(hidden)) * pr.mag[i]));
              }
              // (2) bitwise the unfused path on the same logits.
              const Outputs ref = reference_path(d, got.logits, d.p.bias);
              EXPECT_EQ(got.ids, ref.ids);
              EXPECT_TRUE(same_bits(got.w, ref.w)) << "topk weights differ";
              EXPECT_EQ(got.offs, ref.offs);
              EXPECT_EQ(got.sorted, ref.sorted);
              EXPECT_EQ(got.active, ref.active);
              // The grouping contract itself, on the host.
              std::vector<int32_t> offs, sorted, active;
              group_ref(got.ids, E, &offs, &sorted, &active);
              EXPECT_EQ(got.offs, offs);
              EXPECT_EQ(got.sorted, sorted);
              EXPECT_EQ(got.active, active);
              // Each row's ids distinct, ascending, in range.
              for (int64_t r = 0; r < rows; ++r)
                for (int64_t k = 0; k < top_k; ++k) {
                  const int32_t id = got.ids[r * top_k + k];
                  ASSERT_TRUE(id >= 0 && id < E) << "row " << r;
                  if (k > 0) {
                    ASSERT_LT(got.ids[r * top_k + k - 1], id) << "row " << r;
                  }
                }
              // (3) determinism: a second launch, as a programmatic dependent of the poisoning
              // (it waits before it reads or writes), same bits; the counter back at zero.
              d.poison();
              d.p.pdl = true;
              ASSERT_TRUE(cuda::launch_moe_route(d.p, stream()).is_ok());
              d.p.pdl = false;
              EXPECT_TRUE(d.read() == got) << "second launch differs";
              EXPECT_EQ(d.counter_value(), 0u);
              // (4) topk_only (one token's experts read the top-k itself): the same logits, ids
              // and weights, the grouping not written, the counter back at zero.
              d.poison();
              d.p.topk_only = true;
              ASSERT_TRUE(cuda::launch_moe_route(d.p, stream()).is_ok());
              d.p.topk_only = false;
              const Outputs only = d.read();
              EXPECT_TRUE(same_bits(only.logits, got.logits)) << "topk_only: logits differ";
              EXPECT_EQ(only.ids, got.ids) << "topk_only: ids differ";
              EXPECT_TRUE(same_bits(only.w, got.w)) << "topk_only: weights differ";
              EXPECT_TRUE(std::all_of(only.offs.begin(), only.offs.end(), [](int32_t v) {
                return v == kIntPoison;
              })) << "topk_only wrote the grouping";
              EXPECT_EQ(d.counter_value(), 0u);
              // (5) a bf16 weight passed as float32 (the same values) routes bitwise as the bf16
              // weight: the two dtypes share the summation order and the arithmetic.
              if (!f32) {
                d.poison();
                d.use_f32(true);
                ASSERT_TRUE(cuda::launch_moe_route(d.p, stream()).is_ok());
                d.use_f32(false);
                EXPECT_TRUE(d.read() == got) << "bf16 values as a float32 weight route differently";
              }
              ++cases;
              if (::testing::Test::HasFailure()) return;
            }
        }
  std::printf("moe_route: %lld cases, worst |gpu - exact| / (gamma_K·Σ|x||w|) = %.3g\n",
              static_cast<long long>(cases), worst_ratio);
}

TEST(MoeRoute, GroupsOnlyTheRanksExperts) {
  const int64_t E = 128, hidden = 1024, K = 8, ep = 4, per = E / ep;
  for (int64_t rows : {1, 5, 33}) {
    const Problem pr(rows, E, hidden, hidden, 900 + static_cast<uint32_t>(rows), /*f32=*/true,
                     /*with_exact=*/false);
    DevRoute whole(pr, K, true);
    ASSERT_TRUE(cuda::launch_moe_route(whole.p, stream()).is_ok());
    const Outputs all = whole.read();
    // Integer contributions and power-of-two weights: every sum below is exact in float32.
    std::vector<float> contrib(static_cast<size_t>(rows * K * 8)), weights(rows * K);
    for (size_t i = 0; i < contrib.size(); ++i)
      contrib[i] = static_cast<float>(static_cast<int>(i * 7 % 23) - 11);
    for (size_t i = 0; i < weights.size(); ++i) weights[i] = std::ldexp(1.0f, -int(i % 4));
    Dev<float> dc(contrib), dw(weights), dout(std::vector<float>(rows * 8));
    Dev<int32_t> dids(all.ids);
    cuda::MoeCombineParams cp{dc.ptr(), dw.ptr(), nullptr, dout.ptr(), rows, K, 8};
    ASSERT_TRUE(cuda::launch_moe_combine(cp, stream()).is_ok());
    const std::vector<float> unsharded = dout.host();
    std::vector<float> summed(unsharded.size(), 0.0f);
    for (int64_t r = 0; r < ep; ++r) {
      SCOPED_TRACE("rows " + std::to_string(rows) + " ep rank " + std::to_string(r));
      DevRoute d(pr, K, true);
      d.p.group_base = r * per;
      d.p.group_experts = per;
      d.poison();
      ASSERT_TRUE(cuda::launch_moe_route(d.p, stream()).is_ok());
      Outputs got = d.read();
      EXPECT_TRUE(same_bits(got.logits, all.logits));
      EXPECT_TRUE(same_bits(got.w, all.w));
      EXPECT_EQ(got.ids, all.ids) << "global ids";
      std::vector<int32_t> local(all.ids.size());
      for (size_t i = 0; i < local.size(); ++i) {
        const int32_t e = all.ids[i] - static_cast<int32_t>(r * per);
        local[i] = e >= 0 && e < per ? e : -1;
      }
      std::vector<int32_t> offs, sorted, active;
      group_ref(local, per, &offs, &sorted, &active);
      got.offs.resize(per + 1);
      got.active.resize(std::min<int64_t>(per, rows * K));
      got.sorted.resize(sorted.size());
      EXPECT_EQ(got.offs, offs);
      EXPECT_EQ(got.sorted, sorted);
      EXPECT_EQ(got.active, active);
      // launch_group_by_expert with the same range: the same grouping.
      Dev<int32_t> goffs(std::vector<int32_t>(per + 1)), gsorted(std::vector<int32_t>(rows * K)),
          gactive(std::vector<int32_t>(std::min<int64_t>(per, rows * K)));
      cuda::GroupByExpertParams gp{dids.ptr(), rows * K, per, goffs.ptr(), gsorted.ptr(),
                                   gactive.ptr(), r * per};
      ASSERT_TRUE(cuda::launch_group_by_expert(gp, stream()).is_ok());
      gpu()->synchronize();
      EXPECT_EQ(goffs.host(), offs);
      std::vector<int32_t> gs = gsorted.host();
      gs.resize(sorted.size());
      EXPECT_EQ(gs, sorted);
      EXPECT_EQ(gactive.host(), active);
      // This rank's combine: only its slots.
      cuda::MoeCombineParams rp = cp;
      rp.topk_ids = dids.ptr();
      rp.expert_begin = r * per;
      rp.expert_end = (r + 1) * per;
      ASSERT_TRUE(cuda::launch_moe_combine(rp, stream()).is_ok());
      const std::vector<float> part = dout.host();
      for (size_t i = 0; i < summed.size(); ++i) summed[i] += part[i];
    }
    EXPECT_TRUE(same_bits(summed, unsharded)) << "rows " << rows;
  }
  // A range outside the experts is refused.
  const Problem pr(1, E, hidden, hidden, 7, true, false);
  DevRoute d(pr, K, false);
  d.p.group_base = 120;
  d.p.group_experts = 16;
  EXPECT_FALSE(cuda::launch_moe_route(d.p, stream()).is_ok());
}

TEST(MoeRoute, GraphReplays) {
  for (int64_t rows : {1, 8, 128}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    // The float32 weight at 8 rows.
    const Problem pr(rows, 128, 6144, 6144, 900 + static_cast<uint32_t>(rows), rows == 8);
    DevRoute d(pr, 8, true);
    d.poison();
    ASSERT_TRUE(cuda::launch_moe_route(d.p, stream()).is_ok());
    const Outputs eager = d.read();
    cudaStream_t s = stream();
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    const Status st = cuda::launch_moe_route(d.p, s);
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 3; ++rep) {
      d.poison();
      CUDA_OK(cudaGraphLaunch(exec, s));
      EXPECT_TRUE(d.read() == eager) << "replay " << rep;
      EXPECT_EQ(d.counter_value(), 0u) << "replay " << rep;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}

TEST(MoeRoute, RefusesBadArguments) {
  const Problem pr(2, 16, 64, 64, 7);
  DevRoute d(pr, 4, true);
  ASSERT_TRUE(cuda::launch_moe_route(d.p, stream()).is_ok());
  gpu()->synchronize();
  const auto refused = [&](const char* what, auto mutate) {
    cuda::MoeRouteParams q = d.p;
    mutate(q);
    const Status st = cuda::launch_moe_route(q, stream());
    EXPECT_FALSE(st.is_ok()) << what;
    EXPECT_NE(st.message().find("moe_route"), std::string::npos) << what << ": " << st.message();
  };
  refused("rows 257", [](cuda::MoeRouteParams& q) { q.rows = 257; });
  refused("rows -1", [](cuda::MoeRouteParams& q) { q.rows = -1; });
  refused("E 0", [](cuda::MoeRouteParams& q) { q.num_experts = 0; });
  refused("E 513", [](cuda::MoeRouteParams& q) { q.num_experts = 513; });
  refused("top_k 0", [](cuda::MoeRouteParams& q) { q.top_k = 0; });
  refused("top_k 17", [](cuda::MoeRouteParams& q) { q.top_k = 17; });
  refused("top_k > E", [](cuda::MoeRouteParams& q) { q.num_experts = 3; });
  refused("hidden 0", [](cuda::MoeRouteParams& q) { q.hidden = 0; });
  refused("hidden 60", [](cuda::MoeRouteParams& q) { q.hidden = 60; });
  refused("ldx < hidden", [](cuda::MoeRouteParams& q) { q.ldx = 56; });
  refused("ldx % 8", [](cuda::MoeRouteParams& q) { q.ldx = 68; });
  refused("x null", [](cuda::MoeRouteParams& q) { q.x = nullptr; });
  refused("w null", [](cuda::MoeRouteParams& q) { q.w = nullptr; });
  refused("w and w_f32 both set", [&](cuda::MoeRouteParams& q) { q.w_f32 = d.w32.ptr(); });
  refused("w_f32 misaligned", [&](cuda::MoeRouteParams& q) {
    q.w = nullptr;
    q.w_f32 = d.w32.ptr() + 2;
  });
  refused("logits null", [](cuda::MoeRouteParams& q) { q.logits = nullptr; });
  refused("ids null", [](cuda::MoeRouteParams& q) { q.topk_ids = nullptr; });
  refused("weights null", [](cuda::MoeRouteParams& q) { q.topk_w = nullptr; });
  refused("offsets null", [](cuda::MoeRouteParams& q) { q.group_offsets = nullptr; });
  refused("sorted null", [](cuda::MoeRouteParams& q) { q.sorted_rows = nullptr; });
  refused("active null", [](cuda::MoeRouteParams& q) { q.active_groups = nullptr; });
  refused("counter null", [](cuda::MoeRouteParams& q) { q.counter = nullptr; });
  refused("x misaligned", [](cuda::MoeRouteParams& q) { q.x += 1; });
  refused("w misaligned", [](cuda::MoeRouteParams& q) { q.w += 4; });
  EXPECT_EQ(d.counter_value(), 0u);
}

// Informational: median device time per launch at E = 128, hidden 6144, top_k 8 (the
// MiniMax-M3.1-Flash router), eager (events around each launch) and inside a graph of 20 launches
// (what a captured decode step sees, inter-kernel gaps included). No assertion.
TEST(MoeRoute, TimingInformational) {
  for (int64_t rows : {1, 128})
    for (bool f32 : {false, true}) {
      const Problem pr(rows, 128, 6144, 6144, 500 + static_cast<uint32_t>(rows), f32);
      DevRoute d(pr, 8, true);
      cudaStream_t s = stream();
      cudaEvent_t a, b;
      CUDA_OK(cudaEventCreate(&a));
      CUDA_OK(cudaEventCreate(&b));
      for (int i = 0; i < 20; ++i) ASSERT_TRUE(cuda::launch_moe_route(d.p, s).is_ok());
      std::vector<float> t;
      for (int i = 0; i < 300; ++i) {
        CUDA_OK(cudaEventRecord(a, s));
        ASSERT_TRUE(cuda::launch_moe_route(d.p, s).is_ok());
        CUDA_OK(cudaEventRecord(b, s));
        CUDA_OK(cudaEventSynchronize(b));
        float ms = 0;
        CUDA_OK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
      }
      std::sort(t.begin(), t.end());
      const double eager_us = 1e3 * t[t.size() / 2];
      constexpr int kPerGraph = 20;
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < kPerGraph; ++i) (void)cuda::launch_moe_route(d.p, s);
      CUDA_OK(cudaStreamEndCapture(s, &graph));
      CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      CUDA_OK(cudaGraphLaunch(exec, s));
      CUDA_OK(cudaStreamSynchronize(s));
      t.clear();
      for (int i = 0; i < 100; ++i) {
        CUDA_OK(cudaEventRecord(a, s));
        CUDA_OK(cudaGraphLaunch(exec, s));
        CUDA_OK(cudaEventRecord(b, s));
        CUDA_OK(cudaEventSynchronize(b));
        float ms = 0;
        CUDA_OK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
      }
      std::sort(t.begin(), t.end());
      const double graph_us = 1e3 * t[t.size() / 2] / kPerGraph;
      std::printf(
          "moe_route timing rows %3lld E 128 hidden 6144 top_k 8 w %s: eager %.2f us/launch "
          "(median of 300), in a graph %.2f us/launch (median of 100 x %d)\n",
          static_cast<long long>(rows), f32 ? "fp32" : "bf16", eager_us, graph_us, kPerGraph);
      EXPECT_EQ(d.counter_value(), 0u);
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
}

// ---- launch_router_logits (router_logits.h): the unfused path, bitwise the fused router ------

// The first element where two float vectors differ bitwise, for the failure message.
std::string first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size())
    return "sizes " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      char buf[128];
      std::snprintf(buf, sizeof buf, "element %zu: %.9g vs %.9g", i, a[i], b[i]);
      return buf;
    }
  return "none";
}

// The unfused path on d's inputs and weight: launch_router_logits over all rows in one launch,
// then launch_router_topk.
struct Unfused {
  std::vector<float> logits, w;
  std::vector<int32_t> ids;
};
Unfused unfused_path(const DevRoute& d) {
  auto dl = Dev<float>::poisoned(d.rows * d.E);
  auto dw = Dev<float>::poisoned(d.rows * d.K);
  auto di = Dev<int32_t>::poisoned(d.rows * d.K);
  cuda::RouterLogitsParams lp;
  lp.x = d.p.x;
  lp.ldx = d.p.ldx;
  lp.rows = d.rows;
  lp.hidden = d.p.hidden;
  lp.w = d.p.w;
  lp.w_f32 = d.p.w_f32;
  lp.num_experts = d.E;
  lp.logits = dl.ptr();
  const Status st = cuda::launch_router_logits(lp, stream());
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  const RouterTopkParams rp{dl.ptr(), d.p.bias, di.ptr(), dw.ptr(), d.rows, d.E, d.K, d.p.scaling};
  EXPECT_TRUE(cuda::launch_router_topk(rp, stream()).is_ok());
  gpu()->synchronize();
  return {dl.host(), dw.host(), di.host()};
}

// The fused router over all rows of d in launches of at most 256 rows (its limit), top-k only.
Outputs fused_in_launches(DevRoute& d) {
  d.poison();
  for (int64_t r0 = 0; r0 < d.rows; r0 += 256) {
    cuda::MoeRouteParams q = d.p;
    q.rows = std::min<int64_t>(256, d.rows - r0);
    q.x += r0 * q.ldx;
    q.logits += r0 * d.E;
    q.topk_ids += r0 * d.K;
    q.topk_w += r0 * d.K;
    q.topk_only = true;
    const Status st = cuda::launch_moe_route(q, stream());
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }
  return d.read();
}

// The float32-weight outputs of d against the CPU, on sampled rows (all up to 64 rows, else 64
// spread over the batch):
//  * logits within gamma_K·Σ|x||w| + u·|exact| of the double-precision dot product (any float32
//    summation order of the K exact products, then the rounding of exact itself);
//  * the top-k rule: CpuBackend::router_topk (RouterTopkParams, float32) on the same logits gives
//    the same ids unless the double choice scores at the selection boundary are within 8u (a
//    rounding tie; at most one per case), and weights within (14u + 2·gamma_topk)·|w| (the
//    sigmoid, the top_k-term denominator, the division and the scaling; cuda_ops_test's bound).
void expect_cpu_reference(const Problem& pr, const DevRoute& d, const Outputs& got,
                          const std::string& what) {
  const int64_t E = pr.E, K = d.K, step = std::max<int64_t>(1, pr.rows / 64);
  const float* bias = d.p.bias != nullptr ? pr.bias.data() : nullptr;
  std::vector<float> want_l, got_l, want_w, got_w;
  std::vector<double> bound_l, bound_w, ex(E), mg(E);
  int64_t ties = 0;
  for (int64_t r = 0; r < pr.rows; r += step) {
    pr.exact_row(r, ex.data(), mg.data());
    const float* lr = got.logits.data() + r * E;
    for (int64_t e = 0; e < E; ++e) {
      want_l.push_back(static_cast<float>(ex[e]));
      got_l.push_back(lr[e]);
      bound_l.push_back(gamma(static_cast<double>(pr.hidden)) * mg[e] + kU * std::abs(ex[e]));
    }
    std::vector<int32_t> ids(K);
    std::vector<float> wts(K);
    cpu()->router_topk({lr, bias, ids.data(), wts.data(), 1, E, K, d.p.scaling});
    std::vector<double> choice(E);
    for (int64_t e = 0; e < E; ++e)
      choice[e] = 1.0 / (1.0 + std::exp(-double(lr[e]))) + (bias ? bias[e] : 0.0f);
    std::sort(choice.begin(), choice.end(), std::greater<>());
    if (K < E && choice[K - 1] - choice[K] <= 8 * kU * std::abs(choice[K])) {
      ++ties;
      continue;
    }
    for (int64_t k = 0; k < K; ++k) {
      ASSERT_EQ(got.ids[r * K + k], ids[k]) << what << ": row " << r << " slot " << k;
      want_w.push_back(wts[k]);
      got_w.push_back(got.w[r * K + k]);
      bound_w.push_back((14 * kU + 2 * gamma(static_cast<double>(K))) * std::abs(wts[k]) + 1e-37);
    }
  }
  EXPECT_LE(ties, 1) << what << ": more near-ties than random inputs should give";
  expect_close(got_l, want_l, bound_l, what + " logits vs double");
  expect_close(got_w, want_w, bound_w, what + " top-k weights vs CPU");
}

// For each shape and row count: the fused router (launches of <= 256 rows) and the unfused path
// (launch_router_logits over all rows + launch_router_topk) give bitwise the same logits, ids and
// weights, with the float32 weight and with its bf16 rounding; with the float32 weight the
// outputs also match the CPU (expect_cpu_reference). The shapes: MiniMax-M3.1-Flash's router
// (E 128, hidden 6144: 768 chunks, so lanes own 2 or 1), an odd E with fewer chunks than lanes
// (65), the largest E and hidden (512, 8192), and one without bias.
TEST(RouterLogits, BitwiseTheFusedRouterAtAnyRowCount) {
  struct Shape {
    int64_t E, hidden, top_k;
    bool bias;
  };
  uint32_t seed = 3000;
  for (const Shape sh : {Shape{128, 6144, 4, true}, Shape{77, 520, 5, true},
                         Shape{512, 8192, 16, true}, Shape{256, 1024, 8, false}})
    for (int64_t rows : {1, 7, 32, 33, 256, 4096}) {
      const int64_t ldx = (rows == 7 || rows == 33) ? sh.hidden + 24 : sh.hidden;
      const Problem pr(rows, sh.E, sh.hidden, ldx, seed += 3, /*f32=*/true, /*with_exact=*/false);
      DevRoute d(pr, sh.top_k, sh.bias);
      for (bool f32 : {true, false}) {
        const std::string what = "router_logits rows " + std::to_string(rows) + " E " +
                                 std::to_string(sh.E) + " hidden " + std::to_string(sh.hidden) +
                                 " K " + std::to_string(sh.top_k) + (f32 ? " w fp32" : " w bf16");
        SCOPED_TRACE(what);
        d.use_f32(f32);
        const Outputs fused = fused_in_launches(d);
        const Unfused un = unfused_path(d);
        EXPECT_TRUE(same_bits(un.logits, fused.logits))
            << "logits differ, first at " << first_difference(un.logits, fused.logits);
        EXPECT_EQ(un.ids, fused.ids);
        EXPECT_TRUE(same_bits(un.w, fused.w))
            << "weights differ, first at " << first_difference(un.w, fused.w);
        if (f32) expect_cpu_reference(pr, d, fused, what);
        if (::testing::Test::HasFailure()) return;
      }
    }
}

// Near ties that the bf16 rounding of the weight flips and the float32 weight does not. x rows
// are s·(+1 on the first half of K, -1 on the second), s a power of two per row; g = 2^-7, whose
// bf16 spacing is u16 = 2^-14; every other expert's weight is 0 (logit 0).
//   expert a_i: g + 0.49·u16 on the first half, g on the second: exact logit s·(K/2)·0.49·u16,
//               bf16 (rounds down to g) 0;
//   expert b_i: g + 0.51·u16 on the even positions of the first half, g elsewhere: exact logit
//               s·(K/2)·0.255·u16, bf16 (0.51 rounds up to g + u16) s·(K/2)·0.5·u16.
// With K = 6144, s = 1: a 0.0919, b 0.0478 (float32) against a 0, b 0.0938 (bf16). The float32
// error bound gamma_K·Σ|x||w| ≈ 0.0176·s is below half of the margin 0.044·s, so the float32
// weight must choose the a_i (top_k = the number of pairs), as the double and the float32 CPU
// references do, on both CUDA paths; the bf16 weight chooses the b_i (the flip this guards
// against).
TEST(RouterLogits, NearTiesFollowTheFloat32Weight) {
  constexpr int64_t E = 128, hidden = 6144, half = hidden / 2;
  const std::vector<int32_t> a_ids = {3, 40, 77, 120}, b_ids = {2, 41, 70, 127};
  const std::vector<float> scales = {1.0f, 0.5f, 2.0f, 0.25f, 1.0f, 4.0f, 0.5f};
  const int64_t rows = static_cast<int64_t>(scales.size()), K = 4;
  Problem pr(rows, E, hidden, hidden, 1, /*f32=*/true, /*with_exact=*/false);
  const float g = std::ldexp(1.0f, -7), u16 = std::ldexp(1.0f, -14);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < hidden; ++k) pr.xf[r * hidden + k] = k < half ? scales[r] : -scales[r];
  std::fill(pr.wf.begin(), pr.wf.end(), 0.0f);
  for (int i = 0; i < K; ++i)
    for (int64_t k = 0; k < hidden; ++k) {
      pr.wf[a_ids[i] * hidden + k] = k < half ? g + 0.49f * u16 : g;
      pr.wf[b_ids[i] * hidden + k] = k < half && k % 2 == 0 ? g + 0.51f * u16 : g;
    }
  pr.xb = to_bf16(&pr.xf);  // exact: powers of two
  std::vector<float> rounded = pr.wf;
  pr.wb = to_bf16(&rounded);
  ASSERT_EQ(bf16_to_f32(pr.wb[a_ids[0] * hidden]), g);
  ASSERT_EQ(bf16_to_f32(pr.wb[b_ids[0] * hidden]), g + u16);
  DevRoute d(pr, K, /*with_bias=*/false);
  std::vector<int32_t> a_rows, b_rows;
  for (int64_t r = 0; r < rows; ++r) {
    a_rows.insert(a_rows.end(), a_ids.begin(), a_ids.end());
    b_rows.insert(b_rows.end(), b_ids.begin(), b_ids.end());
  }
  // The references: the double top-k (margins checked against the float32 error bound) and the
  // float32 CPU path (host float32 dot products, CpuBackend::router_topk).
  std::vector<double> ex(E), mg(E);
  std::vector<float> cpu_logits(rows * E);
  for (int64_t r = 0; r < rows; ++r) {
    pr.exact_row(r, ex.data(), mg.data());
    for (int i = 0; i < K; ++i) {
      const double err = gamma(static_cast<double>(hidden)) * std::max(mg[a_ids[i]], mg[b_ids[i]]);
      ASSERT_GT(ex[a_ids[i]] - ex[b_ids[i]], 2 * err) << "row " << r << ": no float32 margin";
      ASSERT_GT(ex[a_ids[i]], 2 * err) << "row " << r << ": a not above the zero logits";
    }
    for (int64_t e = 0; e < E; ++e) {
      float s = 0.0f;
      for (int64_t k = 0; k < hidden; ++k) s += pr.xf[r * hidden + k] * pr.wf[e * hidden + k];
      cpu_logits[r * E + e] = s;
    }
  }
  std::vector<int32_t> cpu_ids(rows * K);
  std::vector<float> cpu_w(rows * K);
  cpu()->router_topk({cpu_logits.data(), nullptr, cpu_ids.data(), cpu_w.data(), rows, E, K, 2.5f});
  EXPECT_EQ(cpu_ids, a_rows) << "the float32 CPU path";
  // float32 weight: both CUDA paths choose the a_i, bitwise alike.
  d.use_f32(true);
  const Outputs fused = fused_in_launches(d);
  const Unfused un = unfused_path(d);
  EXPECT_EQ(fused.ids, a_rows) << "fused router, float32 weight";
  EXPECT_EQ(un.ids, a_rows) << "router_logits + router_topk, float32 weight";
  EXPECT_TRUE(same_bits(un.logits, fused.logits)) << first_difference(un.logits, fused.logits);
  EXPECT_TRUE(same_bits(un.w, fused.w)) << first_difference(un.w, fused.w);
  // bf16 weight: the rounding flips every pair.
  d.use_f32(false);
  EXPECT_EQ(fused_in_launches(d).ids, b_rows) << "fused router, bf16 weight";
  EXPECT_EQ(unfused_path(d).ids, b_rows) << "router_logits + router_topk, bf16 weight";
}

// ld_logits > E: columns [E, ld_logits) are left as they were; rows = 0 launches nothing.
TEST(RouterLogits, WritesOnlyItsColumns) {
  const Problem pr(40, 21, 64, 72, 11, /*f32=*/true);
  DevRoute d(pr, 2, false);
  constexpr int64_t ld = 24;
  auto dl = Dev<float>::poisoned(pr.rows * ld);
  cuda::RouterLogitsParams lp;
  lp.x = d.p.x;
  lp.ldx = pr.ldx;
  lp.rows = pr.rows;
  lp.hidden = pr.hidden;
  lp.w_f32 = d.w32.ptr();
  lp.num_experts = pr.E;
  lp.logits = dl.ptr();
  lp.ld_logits = ld;
  ASSERT_TRUE(cuda::launch_router_logits(lp, stream()).is_ok());
  const std::vector<float> strided = dl.host();
  const Unfused dense = unfused_path(d);
  for (int64_t r = 0; r < pr.rows; ++r)
    for (int64_t c = 0; c < ld; ++c) {
      const float v = strided[r * ld + c];
      if (c < pr.E) {
        ASSERT_EQ(std::memcmp(&v, &dense.logits[r * pr.E + c], sizeof v), 0) << r << "," << c;
      } else {
        ASSERT_TRUE(std::isnan(v)) << "column " << c << " of row " << r << " written";
      }
    }
  auto untouched = Dev<float>::poisoned(4);
  lp.rows = 0;
  lp.logits = untouched.ptr();
  ASSERT_TRUE(cuda::launch_router_logits(lp, stream()).is_ok());
  for (float v : untouched.host()) EXPECT_TRUE(std::isnan(v)) << "rows 0 wrote logits";
}

TEST(RouterLogits, RefusesBadArguments) {
  const Problem pr(2, 16, 64, 64, 7, /*f32=*/true);
  DevRoute d(pr, 4, false);
  cuda::RouterLogitsParams lp;
  lp.x = d.p.x;
  lp.ldx = 64;
  lp.rows = 2;
  lp.hidden = 64;
  lp.w_f32 = d.w32.ptr();
  lp.num_experts = 16;
  lp.logits = d.logits.ptr();
  ASSERT_TRUE(cuda::launch_router_logits(lp, stream()).is_ok());
  const auto refused = [&](const char* what, auto mutate) {
    cuda::RouterLogitsParams q = lp;
    mutate(q);
    const Status st = cuda::launch_router_logits(q, stream());
    EXPECT_FALSE(st.is_ok()) << what;
    EXPECT_NE(st.message().find("router_logits"), std::string::npos)
        << what << ": " << st.message();
  };
  using P = cuda::RouterLogitsParams;
  refused("rows -1", [](P& q) { q.rows = -1; });
  refused("rows 2^31", [](P& q) { q.rows = int64_t{1} << 31; });
  refused("E 0", [](P& q) { q.num_experts = 0; });
  refused("E 513", [](P& q) { q.num_experts = 513; });
  refused("hidden 0", [](P& q) { q.hidden = 0; });
  refused("hidden 60", [](P& q) { q.hidden = 60; });
  refused("ldx < hidden", [](P& q) { q.ldx = 56; });
  refused("ldx % 8", [](P& q) { q.ldx = 68; });
  refused("ld_logits < E", [](P& q) { q.ld_logits = 15; });
  refused("no weight", [](P& q) { q.w_f32 = nullptr; });
  refused("both weights", [&](P& q) { q.w = d.w.ptr(); });
  refused("x null", [](P& q) { q.x = nullptr; });
  refused("logits null", [](P& q) { q.logits = nullptr; });
  refused("x misaligned", [](P& q) { q.x += 1; });
  refused("w_f32 misaligned", [](P& q) { q.w_f32 += 2; });
  refused("w misaligned", [&](P& q) {
    q.w_f32 = nullptr;
    q.w = d.w.ptr() + 4;
  });
}

// Informational: median device time of launch_router_logits at E = 128, hidden 6144 (the
// MiniMax-M3.1-Flash router) for decode and prefill row counts, both weight dtypes. No assertion.
TEST(RouterLogits, TimingInformational) {
  for (int64_t rows : {256, 4096, 16384}) {
    const Problem pr(rows, 128, 6144, 6144, 700 + static_cast<uint32_t>(rows), true, false);
    DevRoute d(pr, 4, true);
    for (bool f32 : {false, true}) {
      d.use_f32(f32);
      cuda::RouterLogitsParams lp;
      lp.x = d.p.x;
      lp.ldx = pr.ldx;
      lp.rows = rows;
      lp.hidden = pr.hidden;
      lp.w = d.p.w;
      lp.w_f32 = d.p.w_f32;
      lp.num_experts = pr.E;
      lp.logits = d.logits.ptr();
      cudaStream_t s = stream();
      cudaEvent_t a, b;
      CUDA_OK(cudaEventCreate(&a));
      CUDA_OK(cudaEventCreate(&b));
      for (int i = 0; i < 5; ++i) ASSERT_TRUE(cuda::launch_router_logits(lp, s).is_ok());
      std::vector<float> t;
      for (int i = 0; i < 30; ++i) {
        CUDA_OK(cudaEventRecord(a, s));
        ASSERT_TRUE(cuda::launch_router_logits(lp, s).is_ok());
        CUDA_OK(cudaEventRecord(b, s));
        CUDA_OK(cudaEventSynchronize(b));
        float ms = 0;
        CUDA_OK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
      }
      std::sort(t.begin(), t.end());
      const double us = 1e3 * t[t.size() / 2];
      std::printf(
          "router_logits timing rows %5lld E 128 hidden 6144 w %s: %.1f us (%.1f TFLOP/s)\n",
          static_cast<long long>(rows), f32 ? "fp32" : "bf16", us,
          2.0 * rows * 128 * 6144 / (us * 1e6));
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
  }
}

}  // namespace
}  // namespace m3::cuda_test
