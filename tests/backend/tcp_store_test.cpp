// The multi-process rendezvous (backend/comm/tcp_store.h) over loopback: values cross between
// clients, a read waits for a later write or times out, an unreachable address fails with an
// error naming it, and three Gloo ranks, each with its own connection, form a group through it.
#include "backend/comm/tcp_store.h"

#include <gtest/gtest.h>

#include <thread>

#include "backend/comm/gloo_communicator.h"

namespace m3::comm {
namespace {

using namespace std::chrono_literals;

TEST(TcpStore, SetGetWaitAndTimeout) {
  auto server = TcpStoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.is_ok()) << server.status().to_string();
  const uint16_t port = (*server)->port();
  ASSERT_GT(port, 0);
  auto a = TcpStore::connect("127.0.0.1", port, 5s);
  auto b = TcpStore::connect("127.0.0.1", port, 5s);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  ASSERT_TRUE((*a)->set("id", {'x', '\0', 'y'}).is_ok());
  auto v = (*b)->get("id", 1s);
  ASSERT_TRUE(v.is_ok()) << v.status().to_string();
  EXPECT_EQ(*v, (std::vector<char>{'x', '\0', 'y'}));
  // A read waits for a write that comes later.
  std::thread later([&] {
    std::this_thread::sleep_for(200ms);
    EXPECT_TRUE((*a)->set("late", {'1'}).is_ok());
  });
  auto w = (*b)->get("late", 10s);
  later.join();
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_EQ(*w, std::vector<char>{'1'});
  // A key nobody writes times out, naming it.
  auto t = (*b)->get("never", 300ms);
  EXPECT_EQ(t.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(t.status().message().find("'never'"), std::string::npos);
}

TEST(TcpStore, ALeaseIsReleasedWhenItsConnectionCloses) {
  auto server = TcpStoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.is_ok()) << server.status().to_string();
  const uint16_t port = (*server)->port();
  auto watcher = TcpStore::connect("127.0.0.1", port, 5s);
  ASSERT_TRUE(watcher.is_ok());
  {
    auto holder = TcpStore::connect("127.0.0.1", port, 5s);
    ASSERT_TRUE(holder.is_ok());
    ASSERT_TRUE((*holder)->hold_lease("node1").is_ok());
    // Held: nothing published.
    EXPECT_FALSE((*watcher)->get("left/node1", 200ms).is_ok());
  }  // the holder's connection closes, as when its process dies
  EXPECT_TRUE((*watcher)->get("left/node1", 5s).is_ok());
  EXPECT_FALSE((*watcher)->get("left/node2", 100ms).is_ok());
}

TEST(TcpStore, UnreachableRendezvousIsNamed) {
  // A port that was free a moment ago, with nothing listening.
  uint16_t port = 0;
  {
    auto s = TcpStoreServer::start("127.0.0.1", 0);
    ASSERT_TRUE(s.is_ok());
    port = (*s)->port();
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto c = TcpStore::connect("127.0.0.1", port, 300ms);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("--dist-init-addr"), std::string::npos);
}

TEST(TcpStore, GlooRanksRendezvousThroughIt) {
  auto server = TcpStoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(server.is_ok());
  const int n = 3;
  std::vector<std::unique_ptr<Communicator>> comms(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto store = TcpStore::connect("127.0.0.1", (*server)->port(), 5s);
      ASSERT_TRUE(store.is_ok());
      GlooOptions o;
      o.timeout = 10s;
      auto c = create_gloo_communicator(r, n, (*store)->gloo_store(10s), o);
      ASSERT_TRUE(c.is_ok()) << c.status().to_string();
      std::vector<int32_t> v(4, r + 1);
      ASSERT_TRUE((*c)->all_reduce(v.data(), 4, DataType::kI32, ReduceOp::kSum).is_ok());
      for (int32_t x : v) EXPECT_EQ(x, 6);
      comms[r] = std::move(c).value();
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace
}  // namespace m3::comm
