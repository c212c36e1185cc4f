// The one-shot all-reduce (backend/cuda/comm/one_shot_all_reduce.h) against the sum taken on the
// host in rank order: exact, and the same bits on every rank. Ranks run on their own threads and
// streams, several on one GPU (always: the flags and staging logic without NVLink) and one per
// GPU where there are several (peer memory). Messages of every shape the kernel distinguishes
// (scalar and float4, one CTA and the most), many launches in a row (the epochs and the two
// alternating staging buffers), replays of captured CUDA graphs, and a rank that never arrives
// (the others time out and report it instead of hanging).
//
// The fused all-reduce + residual add + RMSNorm (all_reduce_add_rms_norm) against the unfused
// path: all_reduce of the delta, then launch_add_rms_norm's one-CTA norm (cluster_rows 0), whose
// arithmetic it repeats: the residual, the bf16 output, its f16 copy and the row factors must be
// equal bit for bit, at rows that give each CTA one row and several (more rows than CTAs), eager
// and replayed from a graph, interleaved with plain all-reduces of the same group (one epoch
// sequence). Against the cluster norm (the unfused decode path at up to 16 rows), whose sum of
// squares runs in another order: relative difference of the sum ~hidden·2^-24, so each bf16
// output within one bf16 unit in the last place (2^-7 relative) of the other.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cuda/comm/one_shot_all_reduce.h"
#include "backend/cuda/norm/add_rms_norm.h"
#include "core/dtype.h"

namespace m3::cuda {
namespace {

int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// Runs fn(rank) on one thread per rank and waits.
void on_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> t;
  for (int r = 0; r < n; ++r) t.emplace_back(fn, r);
  for (std::thread& x : t) x.join();
}

std::vector<float> message(int rank, int launch, int64_t count) {
  std::mt19937 rng(static_cast<uint32_t>(1000 * rank + launch));
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = nd(rng);
  return v;
}

// Every rank all-reduces `launches` messages of each count, eagerly or through a captured graph
// replayed once per message; each result must be the host's rank-order sum, bit for bit.
// Graphs are captured and instantiated for every count before any rank launches, and destroyed
// after every rank is done: instantiating or destroying a graph may wait for the whole device to
// go idle, which on one GPU shared by several ranks would wait for another rank's kernel that is
// itself waiting for this rank (ranks on separate GPUs do not share that wait).
void check_group(const std::vector<int>& devices, bool graphs) {
  const int n = static_cast<int>(devices.size());
  OneShotOptions o;
  o.max_elements = 1 << 16;
  auto g = OneShotAllReduce::create(devices, o);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  const std::vector<int64_t> counts = {1, 3, 4, 6144, 8 * 6144, 1 << 16};
  const int launches = 7;
  std::vector<int> bad(static_cast<size_t>(n), 0);
  std::barrier sync_point(n);
  on_ranks(n, [&](int r) {
    cudaSetDevice(devices[r]);
    cudaStream_t st = nullptr;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    float* buf = nullptr;
    cudaMalloc(&buf, sizeof(float) << 16);
    std::vector<cudaGraphExec_t> execs(counts.size(), nullptr);
    if (graphs) {
      for (size_t c = 0; c < counts.size(); ++c) {
        cudaGraph_t graph = nullptr;
        cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
        const Status s = (*g)->all_reduce(r, buf, counts[c], st);
        cudaStreamEndCapture(st, &graph);
        if (!s.is_ok() || cudaGraphInstantiate(&execs[c], graph, 0) != cudaSuccess) {
          ++bad[static_cast<size_t>(r)];
          execs[c] = nullptr;
        }
        if (graph) cudaGraphDestroy(graph);
      }
    }
    sync_point.arrive_and_wait();
    for (size_t c = 0; c < counts.size(); ++c) {
      const int64_t count = counts[c];
      if (graphs && execs[c] == nullptr) continue;  // counted above; the others skip it too
      for (int l = 0; l < launches; ++l) {
        const std::vector<float> mine = message(r, l, count);
        cudaMemcpyAsync(buf, mine.data(), count * 4, cudaMemcpyHostToDevice, st);
        if (graphs) {
          cudaGraphLaunch(execs[c], st);
        } else if (!(*g)->all_reduce(r, buf, count, st).is_ok()) {
          ++bad[static_cast<size_t>(r)];
        }
        std::vector<float> got(static_cast<size_t>(count));
        cudaMemcpyAsync(got.data(), buf, count * 4, cudaMemcpyDeviceToHost, st);
        cudaStreamSynchronize(st);
        std::vector<float> want(static_cast<size_t>(count), 0.f);
        for (int q = 0; q < n; ++q) {
          const std::vector<float> m = message(q, l, count);
          for (int64_t i = 0; i < count; ++i) want[i] += m[i];
        }
        if (std::memcmp(got.data(), want.data(), count * 4) != 0) ++bad[static_cast<size_t>(r)];
      }
    }
    sync_point.arrive_and_wait();
    for (cudaGraphExec_t e : execs) {
      if (e) cudaGraphExecDestroy(e);
    }
    if (cudaGetLastError() != cudaSuccess) ++bad[static_cast<size_t>(r)];
    cudaFree(buf);
    cudaStreamDestroy(st);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(bad[static_cast<size_t>(r)], 0) << "rank " << r;
    EXPECT_TRUE((*g)->error(r).is_ok());
  }
}

TEST(OneShotAllReduce, TwoRanksOnOneGpu) {
  ASSERT_GE(gpu_count(), 1);
  check_group({0, 0}, false);
}

TEST(OneShotAllReduce, FourRanksOnOneGpuThroughGraphs) {
  ASSERT_GE(gpu_count(), 1);
  check_group({0, 0, 0, 0}, true);
}

TEST(OneShotAllReduce, OneRankPerGpuOverPeerMemory) {
  const int n = std::min(gpu_count(), OneShotAllReduce::kMaxRanks);
  if (n < 2) GTEST_SKIP() << "needs two GPUs (tools/device/run-all.sh runs it there)";
  std::vector<int> devices;
  for (int d = 0; d < n; ++d) devices.push_back(d);
  check_group(devices, false);
  check_group(devices, true);
}

// Rank 1 never calls: rank 0's launch gives up after the timeout and says so.
TEST(OneShotAllReduce, AMissingRankTimesOutInsteadOfHanging) {
  ASSERT_GE(gpu_count(), 1);
  OneShotOptions o;
  o.max_elements = 1024;
  o.timeout = std::chrono::milliseconds(300);
  auto g = OneShotAllReduce::create({0, 0}, o);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  cudaSetDevice(0);
  float* buf = nullptr;
  cudaMalloc(&buf, 4096);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE((*g)->all_reduce(0, buf, 1024, nullptr).is_ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 5.0);
  const Status e = (*g)->error(0);
  ASSERT_FALSE(e.is_ok());
  EXPECT_EQ(e.code(), StatusCode::kUnavailable);
  EXPECT_NE(e.message().find("rank 0 of 2"), std::string::npos) << e.message();
  EXPECT_FALSE((*g)->all_reduce(0, buf, 1024, nullptr).is_ok()) << "the group is unusable";
  cudaFree(buf);
}

TEST(OneShotAllReduce, RefusesBadArguments) {
  ASSERT_GE(gpu_count(), 1);
  EXPECT_FALSE(OneShotAllReduce::create({0}).is_ok());
  OneShotOptions o;
  o.max_elements = 6;
  EXPECT_FALSE(OneShotAllReduce::create({0, 0}, o).is_ok());
  o.max_elements = 64;
  auto g = OneShotAllReduce::create({0, 0}, o);
  ASSERT_TRUE(g.is_ok());
  EXPECT_FALSE((*g)->all_reduce(0, nullptr, 65, nullptr).is_ok());
  EXPECT_FALSE((*g)->all_reduce(2, nullptr, 4, nullptr).is_ok());
}

// One rank's buffers for the fused and the unfused path of one (rows, hidden).
struct NormBuffers {
  int64_t rows = 0, hidden = 0;
  float *delta = nullptr, *sum = nullptr, *res_fused = nullptr, *res_plain = nullptr,
        *res_cluster = nullptr;
  uint16_t *weight = nullptr, *out_fused = nullptr, *out_plain = nullptr, *out_cluster = nullptr,
           *f16_fused = nullptr, *f16_plain = nullptr;
  float *inv_fused = nullptr, *inv_plain = nullptr;

  NormBuffers(int64_t r, int64_t h) : rows(r), hidden(h) {
    const size_t n = static_cast<size_t>(r * h);
    for (float** p : {&delta, &sum, &res_fused, &res_plain, &res_cluster}) cudaMalloc(p, n * 4);
    cudaMalloc(&weight, static_cast<size_t>(h) * 2);
    for (uint16_t** p : {&out_fused, &out_plain, &out_cluster, &f16_fused, &f16_plain})
      cudaMalloc(p, n * 2);
    cudaMalloc(&inv_fused, static_cast<size_t>(r) * 4);
    cudaMalloc(&inv_plain, static_cast<size_t>(r) * 4);
  }
  ~NormBuffers() {
    for (void* p : std::initializer_list<void*>{delta, sum, res_fused, res_plain, res_cluster,
                                                weight, out_fused, out_plain, out_cluster,
                                                f16_fused, f16_plain, inv_fused, inv_plain})
      cudaFree(p);
  }
  AddRmsNormParams fused() const {
    AddRmsNormParams p{res_fused, nullptr, weight, out_fused, rows, hidden, 1e-6f};
    p.out_f16 = f16_fused;
    p.out_inv_scale = inv_fused;
    return p;
  }
  AddRmsNormParams plain() const {
    AddRmsNormParams p{res_plain, sum, weight, out_plain, rows, hidden, 1e-6f};
    p.out_f16 = f16_plain;
    p.out_inv_scale = inv_plain;
    p.cluster_rows = 0;
    return p;
  }
  AddRmsNormParams cluster() const {
    AddRmsNormParams p{res_cluster, sum, weight, out_cluster, rows, hidden, 1e-6f};
    p.cluster_rows = 16;
    return p;
  }
};

template <typename T>
std::vector<T> to_host(const T* d, int64_t n) {
  std::vector<T> v(static_cast<size_t>(n));
  cudaMemcpy(v.data(), d, static_cast<size_t>(n) * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

// Per (rows, hidden), `launches` rounds on every rank of a group on `devices`: fused (eager, or a
// graph captured once and replayed) and unfused from the same inputs; the results compared.
void check_fused_norm(const std::vector<int>& devices, bool graphs) {
  const int n = static_cast<int>(devices.size());
  OneShotOptions o;
  o.max_elements = 40 * 6144;
  auto g = OneShotAllReduce::create(devices, o);
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 6144}, {3, 1024}, {16, 6144},
                                                          {40, 6144}, {33, 4096}};
  const int launches = 3;
  std::vector<int> bad(static_cast<size_t>(n), 0), near_bad(static_cast<size_t>(n), 0);
  std::vector<std::string> why(static_cast<size_t>(n));
  // Every rank sets up a shape (allocation, capture, instantiation) and tears it down between two
  // barriers, while no rank's kernel is in flight: those calls may wait for the whole device,
  // which on one shared GPU could be another rank's kernel waiting for this rank.
  std::barrier sync_point(n);
  on_ranks(n, [&](int r) {
    cudaSetDevice(devices[r]);
    cudaStream_t st = nullptr;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    for (auto [rows, hidden] : shapes) {
      NormBuffers b(rows, hidden);
      const int64_t count = rows * hidden;
      std::vector<uint16_t> w(static_cast<size_t>(hidden));
      const std::vector<float> wf = message(77, 0, hidden);
      for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(0.05f * wf[i]);
      cudaMemcpy(b.weight, w.data(), w.size() * 2, cudaMemcpyHostToDevice);
      cudaGraphExec_t exec = nullptr;
      if (graphs) {
        cudaGraph_t graph = nullptr;
        cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
        const Status s = (*g)->all_reduce_add_rms_norm(r, b.delta, b.fused(), st);
        cudaStreamEndCapture(st, &graph);
        if (!s.is_ok() || cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
          ++bad[static_cast<size_t>(r)];
          why[static_cast<size_t>(r)] = "capture: " + s.to_string();
          exec = nullptr;
        }
        if (graph) cudaGraphDestroy(graph);
      }
      sync_point.arrive_and_wait();
      for (int l = 0; l < launches && !(graphs && exec == nullptr); ++l) {
        // The residual is replicated over the ranks (as in the model); the deltas differ.
        const std::vector<float> res = message(99, l, count), mine = message(r, 10 + l, count);
        for (float* dst : {b.res_fused, b.res_plain, b.res_cluster})
          cudaMemcpyAsync(dst, res.data(), count * 4, cudaMemcpyHostToDevice, st);
        cudaMemcpyAsync(b.delta, mine.data(), count * 4, cudaMemcpyHostToDevice, st);
        cudaMemcpyAsync(b.sum, mine.data(), count * 4, cudaMemcpyHostToDevice, st);
        Status s = graphs ? (cudaGraphLaunch(exec, st) == cudaSuccess
                                 ? Status::ok()
                                 : internal_error("graph launch"))
                          : (*g)->all_reduce_add_rms_norm(r, b.delta, b.fused(), st);
        if (s.is_ok()) s = (*g)->all_reduce(r, b.sum, count, st);  // the unfused path
        if (s.is_ok()) s = launch_add_rms_norm(b.plain(), st);
        if (s.is_ok()) s = launch_add_rms_norm(b.cluster(), st);
        if (!s.is_ok() || cudaStreamSynchronize(st) != cudaSuccess) {
          ++bad[static_cast<size_t>(r)];
          why[static_cast<size_t>(r)] = "run: " + s.to_string();
          continue;
        }
        const auto same = [&](const void* a, const void* c, size_t bytes) {
          std::vector<uint8_t> x(bytes), y(bytes);
          cudaMemcpy(x.data(), a, bytes, cudaMemcpyDeviceToHost);
          cudaMemcpy(y.data(), c, bytes, cudaMemcpyDeviceToHost);
          return x == y;
        };
        const size_t n4 = static_cast<size_t>(count) * 4, n2 = static_cast<size_t>(count) * 2;
        if (!same(b.res_fused, b.res_plain, n4) || !same(b.out_fused, b.out_plain, n2) ||
            !same(b.f16_fused, b.f16_plain, n2) ||
            !same(b.inv_fused, b.inv_plain, static_cast<size_t>(rows) * 4)) {
          ++bad[static_cast<size_t>(r)];
          why[static_cast<size_t>(r)] = "fused != unfused at rows " + std::to_string(rows) +
                                        " hidden " + std::to_string(hidden);
        }
        if (to_host(b.delta, count) != mine) {
          ++bad[static_cast<size_t>(r)];
          why[static_cast<size_t>(r)] = "the fused path changed its message";
        }
        const std::vector<uint16_t> f = to_host(b.out_fused, count);
        const std::vector<uint16_t> c = to_host(b.out_cluster, count);
        for (int64_t i = 0; i < count; ++i) {
          const float x = bf16_to_f32(f[static_cast<size_t>(i)]);
          const float y = bf16_to_f32(c[static_cast<size_t>(i)]);
          if (!(std::abs(x - y) <= 0x1p-7f * std::max(std::abs(x), std::abs(y))))
            ++near_bad[static_cast<size_t>(r)];
        }
      }
      sync_point.arrive_and_wait();
      if (exec != nullptr) cudaGraphExecDestroy(exec);
    }
    cudaStreamDestroy(st);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(bad[static_cast<size_t>(r)], 0) << "rank " << r << ": " << why[static_cast<size_t>(r)];
    EXPECT_EQ(near_bad[static_cast<size_t>(r)], 0) << "rank " << r << " against the cluster norm";
    EXPECT_TRUE((*g)->error(r).is_ok());
  }
}

TEST(OneShotAllReduceAddRmsNorm, EqualsAllReduceThenNormOnOneGpu) {
  ASSERT_GE(gpu_count(), 1);
  check_fused_norm({0, 0}, /*graphs=*/false);
  check_fused_norm({0, 0, 0}, /*graphs=*/true);
}

TEST(OneShotAllReduceAddRmsNorm, EqualsAllReduceThenNormOverPeerMemory) {
  const int n = gpu_count();
  if (n < 2) GTEST_SKIP() << "needs two GPUs (tools/device/run-all.sh runs it there)";
  std::vector<int> devices;
  for (int d = 0; d < std::min(n, OneShotAllReduce::kMaxRanks); ++d) devices.push_back(d);
  check_fused_norm(devices, /*graphs=*/true);
}

TEST(OneShotAllReduceAddRmsNorm, RefusesBadArguments) {
  ASSERT_GE(gpu_count(), 1);
  OneShotOptions o;
  o.max_elements = 4096;
  auto g = OneShotAllReduce::create({0, 0}, o);
  ASSERT_TRUE(g.is_ok());
  NormBuffers b(1, 1024);
  AddRmsNormParams p = b.fused();
  p.t = 5;  // 5 x 1024 > 4096
  EXPECT_FALSE((*g)->all_reduce_add_rms_norm(0, b.delta, p, nullptr).is_ok());
  p = b.fused();
  p.delta = b.sum;  // the message is the delta
  EXPECT_FALSE((*g)->all_reduce_add_rms_norm(0, b.delta, p, nullptr).is_ok());
  p = b.fused();
  p.hidden = 1022;
  EXPECT_FALSE((*g)->all_reduce_add_rms_norm(0, b.delta, p, nullptr).is_ok());
  p = b.fused();
  p.out_inv_scale = nullptr;
  EXPECT_FALSE((*g)->all_reduce_add_rms_norm(0, b.delta, p, nullptr).is_ok());
  EXPECT_FALSE((*g)->all_reduce_add_rms_norm(2, b.delta, b.fused(), nullptr).is_ok());
}

}  // namespace
}  // namespace m3::cuda
