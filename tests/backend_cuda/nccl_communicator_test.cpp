// The NCCL communicator on this machine's GPUs (one rank per GPU, one thread per rank): every
// collective against the values computed on the host, as the Gloo test checks CPU ranks, and with
// two or more GPUs the watchdog: a rank that stops calling makes synchronize() fail within the
// timeout instead of hanging.
#include "backend/cuda/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <numeric>
#include <thread>
#include <vector>

namespace m3::comm {
namespace {

int gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

struct Rank {
  std::unique_ptr<Communicator> comm;
  cudaStream_t stream = nullptr;
};

// One rank per GPU 0..n-1, created together (ncclCommInitRank blocks until all have joined).
std::vector<Rank> make_ranks(int n, std::chrono::milliseconds timeout) {
  auto id = make_nccl_unique_id();
  EXPECT_TRUE(id.is_ok()) << id.status().to_string();
  std::vector<Rank> ranks(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(r);
      cudaStreamCreateWithFlags(&ranks[r].stream, cudaStreamNonBlocking);
      NcclOptions o;
      o.timeout = timeout;
      auto c = create_nccl_communicator(r, n, r, *id, ranks[r].stream, o);
      EXPECT_TRUE(c.is_ok()) << c.status().to_string();
      if (c.is_ok()) ranks[r].comm = std::move(c).value();
    });
  }
  for (std::thread& t : threads) t.join();
  return ranks;
}

template <typename T>
std::vector<T> round_trip(const std::vector<T>& host, const std::function<void(T*)>& on_device) {
  T* d = nullptr;
  cudaMalloc(&d, host.size() * sizeof(T));
  cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  on_device(d);
  std::vector<T> out(host.size());
  cudaMemcpy(out.data(), d, host.size() * sizeof(T), cudaMemcpyDeviceToHost);
  cudaFree(d);
  return out;
}

TEST(NcclCommunicator, EveryCollectiveOnEveryGpu) {
  const int n = gpus();
  if (n == 0) GTEST_SKIP() << "no GPU";
  std::vector<Rank> ranks = make_ranks(n, std::chrono::seconds(60));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      cudaSetDevice(r);
      Communicator& c = *ranks[r].comm;
      // all_reduce (f32 sum of small integers: exact in any order).
      std::vector<float> f(4096);
      for (size_t i = 0; i < f.size(); ++i) f[i] = float(r * 3 + int(i % 50));
      auto fs = round_trip<float>(f, [&](float* d) {
        ASSERT_TRUE(c.all_reduce(d, 4096, DataType::kF32, ReduceOp::kSum).is_ok());
        ASSERT_TRUE(c.synchronize().is_ok());
      });
      for (size_t i = 0; i < f.size(); ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += float(q * 3 + int(i % 50));
        ASSERT_EQ(fs[i], want);
      }
      // all_gather and all_to_all_v (rank s sends s + d + 1 elements to rank d).
      std::vector<int32_t> g(8 * n);
      auto gathered = round_trip<int32_t>(g, [&](int32_t* d) {
        std::vector<int32_t> mine(8, r + 1);
        cudaMemcpy(d + 8 * r, mine.data(), 32, cudaMemcpyHostToDevice);
        int32_t* src = nullptr;
        cudaMalloc(&src, 32);
        cudaMemcpy(src, mine.data(), 32, cudaMemcpyHostToDevice);
        ASSERT_TRUE(c.all_gather(src, d, 8, DataType::kI32).is_ok());
        ASSERT_TRUE(c.synchronize().is_ok());
        cudaFree(src);
      });
      for (int q = 0; q < n; ++q)
        for (int i = 0; i < 8; ++i) ASSERT_EQ(gathered[q * 8 + i], q + 1);
      std::vector<int64_t> sc(n), rc(n);
      for (int d = 0; d < n; ++d) sc[d] = r + d + 1;
      for (int s = 0; s < n; ++s) rc[s] = s + r + 1;
      std::vector<int64_t> out;
      for (int d = 0; d < n; ++d)
        for (int64_t k = 0; k < sc[d]; ++k) out.push_back(r * 1000 + d * 10 + k);
      std::vector<int64_t> in(std::accumulate(rc.begin(), rc.end(), int64_t{0}));
      auto got = round_trip<int64_t>(in, [&](int64_t* din) {
        int64_t* dout = nullptr;
        cudaMalloc(&dout, out.size() * 8);
        cudaMemcpy(dout, out.data(), out.size() * 8, cudaMemcpyHostToDevice);
        ASSERT_TRUE(c.all_to_all_v(dout, sc, din, rc, DataType::kI64).is_ok());
        ASSERT_TRUE(c.synchronize().is_ok());
        cudaFree(dout);
      });
      size_t at = 0;
      for (int s = 0; s < n; ++s)
        for (int64_t k = 0; k < rc[s]; ++k) ASSERT_EQ(got[at++], s * 1000 + r * 10 + k);
      ASSERT_TRUE(c.barrier().is_ok());
    });
  }
  for (std::thread& t : threads) t.join();
  std::printf("[ %-40s ] %d GPU ranks\n", "nccl collectives", n);
}

TEST(NcclCommunicator, WatchdogAbortsACollectiveARankNeverJoins) {
  const int n = gpus();
  if (n < 2) GTEST_SKIP() << "needs two GPUs";
  std::vector<Rank> ranks = make_ranks(2, std::chrono::milliseconds(2000));
  cudaSetDevice(0);
  float* d = nullptr;
  cudaMalloc(&d, 64);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(ranks[0].comm->all_reduce(d, 16, DataType::kF32, ReduceOp::kSum).is_ok());
  Status s = ranks[0].comm->synchronize();  // rank 1 never calls
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.to_string();
  EXPECT_LT(seconds, 30.0);
  EXPECT_EQ(ranks[0].comm->barrier().code(), StatusCode::kUnavailable);
  std::printf("[ %-40s ] aborted after %.1f s: %s\n", "nccl watchdog", seconds,
              s.message().c_str());
}

// A group whose other rank never joins (a node that died after the unique id was handed out):
// joining fails within the timeout instead of blocking in ncclCommInitRank for ever. One GPU is
// enough, since only rank 0 of the two ever joins.
TEST(NcclCommunicator, JoiningAGroupARankNeverJoinsTimesOut) {
  if (gpus() == 0) GTEST_SKIP() << "no GPU";
  auto id = make_nccl_unique_id();
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  cudaSetDevice(0);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  NcclOptions o;
  o.timeout = std::chrono::milliseconds(2000);
  const auto t0 = std::chrono::steady_clock::now();
  auto c = create_nccl_communicator(0, 2, 0, *id, stream, o);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable) << c.status().to_string();
  EXPECT_NE(c.status().message().find("never joined"), std::string::npos)
      << c.status().to_string();
  EXPECT_GE(seconds, 1.9);
  EXPECT_LT(seconds, 10.0);
  std::printf("[ %-40s ] gave up after %.1f s: %s\n", "nccl join timeout", seconds,
              c.status().message().c_str());
}

}  // namespace
}  // namespace m3::comm
