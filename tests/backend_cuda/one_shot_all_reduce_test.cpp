// The one-shot all-reduce (backend/cuda/comm/one_shot_all_reduce.h) against the sum taken on the
// host in rank order: exact, and the same bits on every rank. Ranks run on their own threads and
// streams, several on one GPU (always: the flags and staging logic without NVLink) and one per
// GPU where there are several (peer memory). Messages of every shape the kernel distinguishes
// (scalar and float4, one CTA and the most), many launches in a row (the epochs and the two
// alternating staging buffers), replays of captured CUDA graphs, and a rank that never arrives
// (the others time out and report it instead of hanging).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <barrier>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "backend/cuda/comm/one_shot_all_reduce.h"

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

}  // namespace
}  // namespace m3::cuda
