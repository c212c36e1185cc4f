// The Gloo communicator on CPU ranks in this process: every collective of communicator.h against
// the values computed directly, for groups of 1 to 4 ranks, and a rank that stops calling makes
// the others fail within the timeout instead of hanging.
#include "backend/comm/gloo_communicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <numeric>
#include <thread>

#include "core/dtype.h"

namespace m3::comm {
namespace {

using Group = std::vector<std::unique_ptr<Communicator>>;

Group make_group(int n, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  GlooOptions o;
  o.timeout = timeout;
  auto g = create_local_gloo_group(n, o);
  EXPECT_TRUE(g.is_ok()) << g.status().to_string();
  return g.is_ok() ? std::move(g).value() : Group{};
}

// Runs body(rank, communicator) on one thread per rank.
void on_every_rank(Group& g, const std::function<void(int, Communicator&)>& body) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < g.size(); ++r) threads.emplace_back([&, r] { body(int(r), *g[r]); });
  for (std::thread& t : threads) t.join();
}

class GlooGroup : public ::testing::TestWithParam<int> {};

TEST_P(GlooGroup, EveryCollectiveMatchesDirectComputation) {
  const int n = GetParam();
  Group g = make_group(n);
  ASSERT_EQ(static_cast<int>(g.size()), n);
  on_every_rank(g, [&](int rank, Communicator& c) {
    EXPECT_EQ(c.rank(), rank);
    EXPECT_EQ(c.size(), n);
    EXPECT_EQ(c.name(), "gloo");
    // all_reduce, f32 sum and max, i32 sum, bf16 sum (small integers: exact in bf16).
    const int64_t count = 1000;
    std::vector<float> f(count);
    for (int64_t i = 0; i < count; ++i) f[i] = float(rank * 1000 + i) * 0.5f;
    ASSERT_TRUE(c.all_reduce(f.data(), count, DataType::kF32, ReduceOp::kSum).is_ok());
    for (int64_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += float(r * 1000 + i) * 0.5f;
      ASSERT_EQ(f[i], want) << i;
    }
    std::vector<float> m(count);
    for (int64_t i = 0; i < count; ++i) m[i] = float((i * 7 + rank * 13) % 101);
    ASSERT_TRUE(c.all_reduce(m.data(), count, DataType::kF32, ReduceOp::kMax).is_ok());
    for (int64_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want = std::max(want, float((i * 7 + r * 13) % 101));
      ASSERT_EQ(m[i], want);
    }
    std::vector<uint16_t> b(count);
    for (int64_t i = 0; i < count; ++i) b[i] = f32_to_bf16(float(i % 17 + rank));
    ASSERT_TRUE(c.all_reduce(b.data(), count, DataType::kBF16, ReduceOp::kSum).is_ok());
    for (int64_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += float(i % 17 + r);
      ASSERT_EQ(bf16_to_f32(b[i]), want);
    }
    // all_gather: rank order.
    std::vector<int32_t> mine(5), all(5 * n);
    for (int i = 0; i < 5; ++i) mine[i] = rank * 100 + i;
    ASSERT_TRUE(c.all_gather(mine.data(), all.data(), 5, DataType::kI32).is_ok());
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < 5; ++i) ASSERT_EQ(all[r * 5 + i], r * 100 + i);
    // reduce_scatter: this rank's chunk of the sum, equal to all_reduce's.
    std::vector<float> send(7 * n), recv(7);
    for (int i = 0; i < 7 * n; ++i) send[i] = float(i + rank) * 0.25f;
    ASSERT_TRUE(c.reduce_scatter(send.data(), recv.data(), 7, DataType::kF32, ReduceOp::kSum).is_ok());
    std::vector<float> whole = send;
    ASSERT_TRUE(c.all_reduce(whole.data(), 7 * n, DataType::kF32, ReduceOp::kSum).is_ok());
    for (int i = 0; i < 7; ++i) ASSERT_EQ(recv[i], whole[rank * 7 + i]);
    // all_to_all_v: rank s sends (s + d) % 3 elements to rank d (some zero), value s*1000+d*10+k.
    std::vector<int64_t> sc(n), rc(n);
    for (int d = 0; d < n; ++d) sc[d] = (rank + d) % 3;
    for (int s = 0; s < n; ++s) rc[s] = (s + rank) % 3;
    std::vector<int64_t> out, in(std::accumulate(rc.begin(), rc.end(), int64_t{0}));
    for (int d = 0; d < n; ++d)
      for (int64_t k = 0; k < sc[d]; ++k) out.push_back(rank * 1000 + d * 10 + k);
    ASSERT_TRUE(c.all_to_all_v(out.data(), sc, in.data(), rc, DataType::kI64).is_ok());
    size_t at = 0;
    for (int s = 0; s < n; ++s)
      for (int64_t k = 0; k < rc[s]; ++k) ASSERT_EQ(in[at++], s * 1000 + rank * 10 + k);
    // Wrong count vectors are refused before any communication.
    EXPECT_EQ(c.all_to_all_v(out.data(), std::span<const int64_t>(sc).first(0), in.data(), rc,
                             DataType::kI64).code(),
              StatusCode::kInvalidArgument);
    // broadcast from every root.
    for (int root = 0; root < n; ++root) {
      std::vector<uint8_t> v(33, uint8_t(rank));
      if (rank == root) std::iota(v.begin(), v.end(), uint8_t(root * 40));
      ASSERT_TRUE(c.broadcast(v.data(), 33, DataType::kU8, root).is_ok());
      for (int i = 0; i < 33; ++i) ASSERT_EQ(v[i], uint8_t(root * 40 + i));
    }
    EXPECT_EQ(c.broadcast(nullptr, 1, DataType::kU8, n).code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE(c.barrier().is_ok());
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, GlooGroup, ::testing::Values(1, 2, 3, 4));

TEST(GlooCommunicator, ARankThatStopsCallingFailsTheOthersWithinTheTimeout) {
  Group g = make_group(2, std::chrono::milliseconds(800));
  ASSERT_EQ(g.size(), 2u);
  std::vector<float> v(16, 1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  // Rank 1 never joins this all_reduce.
  Status s = g[0]->all_reduce(v.data(), 16, DataType::kF32, ReduceOp::kSum);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("rank 0 of 2"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("all_reduce"), std::string::npos) << s.message();
  EXPECT_LT(seconds, 10.0) << "bounded by the timeout";
  // The group is unusable from then on: later calls fail at once.
  EXPECT_EQ(g[0]->barrier().code(), StatusCode::kUnavailable);
}

TEST(GlooCommunicator, BadGroupsAreRefused) {
  EXPECT_EQ(create_local_gloo_group(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(create_gloo_communicator(2, 2, nullptr).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace m3::comm
