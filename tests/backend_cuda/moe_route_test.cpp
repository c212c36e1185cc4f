// The fused MoE router (launch_moe_route: router GEMV + sigmoid top-k + grouping by expert in one
// launch) against
//  * a double-precision dot product for the logits: x and w are bf16 (products exact in double),
//    and any float32 summation order of the K products is within gamma_K·Σ|x||w| of the exact
//    value (K = hidden), so the bound per element is gamma_K·Σ|x||w|;
//  * launch_router_topk + launch_group_by_expert run on the kernel's own logits output: topk_ids,
//    topk_w, group_offsets, sorted_rows and active_groups bitwise equal;
//  * a host grouping (plain loops) of the kernel's topk_ids, since both CUDA paths share the
//    grouping code (moe/routing_device.cuh);
// plus determinism (a second launch gives the same bits), the counter left at zero, a CUDA-graph
// capture replayed 3 times, refused arguments, and an informational timing print.
#include "backend/cuda/moe/moe_route.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "backend/cuda/f32_ops.h"
#include "backend/cuda/gemm/quant_gemv.h"
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

// The problem data of one (rows, E, hidden, ldx): bf16 x and w, optional bias, the exact logits
// and Σ|x||w| (double).
struct Problem {
  int64_t rows, E, hidden, ldx;
  std::vector<uint16_t> xb, wb;
  std::vector<float> bias;
  std::vector<double> exact, mag;
  Problem(int64_t rows_, int64_t E_, int64_t hidden_, int64_t ldx_, uint32_t seed)
      : rows(rows_), E(E_), hidden(hidden_), ldx(ldx_) {
    std::vector<float> xf, wf;
    bf16_randn(rows * ldx, seed, 1.0f, &xf, &xb);
    bf16_randn(E * hidden, seed + 1, 1.0f / std::sqrt(static_cast<float>(hidden)), &wf, &wb);
    bias = randn(E, seed + 2, 0.05f);
    exact.assign(rows * E, 0.0);
    mag.assign(rows * E, 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t e = 0; e < E; ++e) {
        double s = 0, a = 0;
        const float* xr = xf.data() + r * ldx;
        const float* wr = wf.data() + e * hidden;
        for (int64_t k = 0; k < hidden; ++k) {
          const double p = static_cast<double>(xr[k]) * wr[k];
          s += p;
          a += std::abs(p);
        }
        exact[r * E + e] = s;
        mag[r * E + e] = a;
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
  Dev<float> bias, logits, tw;
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
    p.w = w.ptr();
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
      for (int64_t rows : {1, 2, 5, 8, 33, 128, 256}) {
        if (hidden > 8192 && (rows > 8 || E == 512)) continue;
        // A padded row stride for some shapes (x is then a strided view).
        const int64_t ldx = (rows == 5 || rows == 33) ? hidden + 24 : hidden;
        const Problem pr(rows, E, hidden, ldx, seed += 3);
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
                                     (with_bias ? " bias" : "");
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
                worst_ratio = std::max(worst_ratio,
                                       std::abs(static_cast<double>(got.logits[i]) - pr.exact[i]) /
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
            EXPECT_TRUE(std::all_of(only.offs.begin(), only.offs.end(),
                                    [](int32_t v) { return v == kIntPoison; }))
                << "topk_only wrote the grouping";
            EXPECT_EQ(d.counter_value(), 0u);
            ++cases;
            if (::testing::Test::HasFailure()) return;
          }
      }
  std::printf("moe_route: %lld cases, worst |gpu - exact| / (gamma_K·Σ|x||w|) = %.3g\n",
              static_cast<long long>(cases), worst_ratio);
}

TEST(MoeRoute, GraphReplays) {
  for (int64_t rows : {1, 8, 128}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    const Problem pr(rows, 128, 6144, 6144, 900 + static_cast<uint32_t>(rows));
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
  for (int64_t rows : {1, 128}) {
    const Problem pr(rows, 128, 6144, 6144, 500 + static_cast<uint32_t>(rows));
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
        "moe_route timing rows %3lld E 128 hidden 6144 top_k 8: eager %.2f us/launch "
        "(median of 300), in a graph %.2f us/launch (median of 100 x %d)\n",
        static_cast<long long>(rows), eager_us, graph_us, kPerGraph);
    EXPECT_EQ(d.counter_value(), 0u);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
}

}  // namespace
}  // namespace m3::cuda_test
