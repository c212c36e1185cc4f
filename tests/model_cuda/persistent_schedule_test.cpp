// check_schedule (src/model/minimax_m3_cuda/persistent_schedule.h): lists that can finish are
// accepted with the counters they end at; lists that cannot are refused with the SM, op and
// condition that never holds; malformed lists are refused. The last tests build the batch-1 MoE
// block of M3.1-Flash as a persistent kernel would run it (docs/design/decode-kernels.md) on 132
// SMs and check it, and a variant with the router's top-k placed after the routed experts on its
// own SM, which deadlocks.
#include "model/minimax_m3_cuda/persistent_schedule.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace m3::minimax_m3::persistent {
namespace {

Op op(int32_t kind, std::vector<Wait> waits = {}, int32_t signal = -1, int32_t pages = 0,
      Wait load_wait = {}) {
  Op o;
  o.kind = kind;
  o.waits = std::move(waits);
  o.signal = signal;
  o.pages = pages;
  o.load_wait = load_wait;
  return o;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(PersistentSchedule, ChainAcrossSmsFinishes) {
  Schedule s;
  s.num_counters = 2;
  s.ring_pages = 2;
  // SM 1 needs SM 0's result, SM 0 then needs SM 1's: a valid ping-pong.
  s.sms = {{op(0, {}, 0, 2), op(1, {{1, 1}}, 0, 1)}, {op(2, {{0, 1}}, 1, 2)}};
  auto r = check_schedule(s);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->ops, 3);
  EXPECT_EQ(r->pages, 5);
  EXPECT_EQ(r->final_counts, (std::vector<uint32_t>{2, 1}));
}

TEST(PersistentSchedule, CrossWaitDeadlockIsNamed) {
  Schedule s;
  s.num_counters = 2;
  s.kind_names = {"norm", "gemv"};
  s.sms = {{op(0, {{1, 1}}, 0)}, {op(1, {{0, 1}}, 1)}};
  auto r = check_schedule(s);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  const std::string m = r.status().message();
  EXPECT_TRUE(contains(m, "deadlock")) << m;
  EXPECT_TRUE(contains(m, "SM 0 op 0 (norm)")) << m;
  EXPECT_TRUE(contains(m, "counter 1 >= 1 (stays at 0)")) << m;
}

TEST(PersistentSchedule, LoaderWaitingOnItsOwnLaterOpDeadlocks) {
  // The loader of SM 0 cannot stream op 0's weights before counter 0 is signalled, and only op 1
  // of the same SM signals it: its consumer never gets past op 0.
  Schedule s;
  s.num_counters = 1;
  s.ring_pages = 4;
  s.sms = {{op(0, {}, -1, 2, Wait{0, 1}), op(1, {}, 0)}};
  auto r = check_schedule(s);
  ASSERT_FALSE(r.is_ok());
  const std::string m = r.status().message();
  EXPECT_TRUE(contains(m, "SM 0 op 0")) << m;
  EXPECT_TRUE(contains(m, "its weights, whose loader waits for counter 0 >= 1")) << m;
  // Signalled from another SM instead, the same op finishes.
  s.sms = {{op(0, {}, -1, 2, Wait{0, 1})}, {op(1, {}, 0)}};
  auto ok = check_schedule(s);
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(ok->final_counts, (std::vector<uint32_t>{1}));
}

TEST(PersistentSchedule, RingOnlyDelaysWhileEveryOpFits) {
  // Ten ops of two pages each through a two-page ring: each waits for the previous to be run.
  Schedule s;
  s.num_counters = 1;
  s.ring_pages = 2;
  s.sms.resize(1);
  for (int i = 0; i < 10; ++i) s.sms[0].push_back(op(0, {}, 0, 2));
  auto r = check_schedule(s);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->final_counts[0], 10u);
  EXPECT_EQ(r->pages, 20);
}

TEST(PersistentSchedule, RefusesMalformedLists) {
  const auto message = [](const Schedule& s) {
    auto r = check_schedule(s);
    return r.is_ok() ? std::string("accepted") : r.status().message();
  };
  Schedule s;
  EXPECT_TRUE(contains(message(s), "no SMs"));
  s.sms = {{op(0)}};
  s.ring_pages = 0;
  EXPECT_TRUE(contains(message(s), "ring of 0 pages"));
  s.ring_pages = 2;
  s.sms = {{op(0, {}, -1, 3)}};
  EXPECT_TRUE(contains(message(s), "reads 3 pages; the ring holds 2"));
  s.num_counters = 1;
  s.sms = {{op(0, {}, 1)}};
  EXPECT_TRUE(contains(message(s), "outside 0 .. 0"));
  s.sms = {{op(0, {{2, 1}})}};
  EXPECT_TRUE(contains(message(s), "waits on a counter outside"));
  s.sms = {{op(0, {}, -1, 0, Wait{-2, 0})}};
  EXPECT_TRUE(contains(message(s), "outside"));
  // Two signals of counter 0, a wait for three: refused before any simulation.
  s.sms = {{op(0, {}, 0), op(0, {}, 0)}, {op(1, {{0, 3}})}};
  EXPECT_TRUE(contains(message(s), "signals it only 2 times")) << message(s);
  EXPECT_TRUE(contains(message(s), "[model.persistent_schedule]")) << message(s);
}

// The batch-1 MoE block of M3.1-Flash on 132 SMs (16-KB pages; weight bytes per 16-row tile in
// the comments): router rows, the top-k on one SM, the shared expert's gate|up and down, the four
// routed experts' gate|up and down (their weights need the expert ids: load_wait on the top-k),
// and a combine op per SM once every down tile is done. Ops are dealt round-robin in list order,
// so every SM streams the shared expert while the router finishes.
enum Kind : int32_t { kRouterRow, kTopk, kSharedGu, kSharedDown, kRoutedGu, kRoutedDown, kCombine };
enum Counter : int32_t {
  kRouterRows,
  kRouted,
  kSharedGuDone,
  kSharedDownDone,
  kRoutedDownDone,
  kCombined,
  kRoutedGuDone0  // + expert slot
};
constexpr int kSms = 132, kExperts = 4, kTilesGu = 384, kTilesDown = 384, kRouterRowsN = 128;

Schedule moe_block(bool topk_late) {
  Schedule s;
  s.sms.resize(kSms);
  s.ring_pages = 12;
  s.num_counters = kRoutedGuDone0 + kExperts;
  s.kind_names = {"router row",     "top-k",       "shared gate|up", "shared down",
                  "routed gate|up", "routed down", "combine"};
  int next = 0;
  const auto deal = [&](const Op& o) { s.sms[static_cast<size_t>(next++ % kSms)].push_back(o); };
  for (int i = 0; i < kRouterRowsN; ++i) deal(op(kRouterRow, {}, kRouterRows, 1));  // 12 KB
  const Op topk = op(kTopk, {{kRouterRows, kRouterRowsN}}, kRouted);
  if (!topk_late) s.sms[0].push_back(topk);
  for (int i = 0; i < kTilesGu; ++i) deal(op(kSharedGu, {}, kSharedGuDone, 6));  // 98 KB
  for (int i = 0; i < kTilesDown; ++i)
    deal(op(kSharedDown, {{kSharedGuDone, kTilesGu}}, kSharedDownDone, 3));  // 49 KB
  for (int e = 0; e < kExperts; ++e)
    for (int i = 0; i < kTilesGu; ++i)  // NVFP4 + scales: ~52 KB
      deal(op(kRoutedGu, {{kRouted, 1}}, kRoutedGuDone0 + e, 4, Wait{kRouted, 1}));
  if (topk_late) s.sms[0].push_back(topk);  // after SM 0's routed tiles: their loads wait on it
  for (int e = 0; e < kExperts; ++e)
    for (int i = 0; i < kTilesDown; ++i)  // ~26 KB
      deal(op(kRoutedDown, {{kRoutedGuDone0 + e, kTilesGu}}, kRoutedDownDone, 2, Wait{kRouted, 1}));
  for (int sm = 0; sm < kSms; ++sm)
    s.sms[static_cast<size_t>(sm)].push_back(
        op(kCombine, {{kRoutedDownDone, kExperts * kTilesDown}, {kSharedDownDone, kTilesDown}},
           kCombined));
  return s;
}

TEST(PersistentSchedule, MoeBlockOn132SmsFinishes) {
  auto r = check_schedule(moe_block(false));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->ops,
            kRouterRowsN + 1 + kTilesGu + kTilesDown + kExperts * (kTilesGu + kTilesDown) + kSms);
  EXPECT_EQ(r->final_counts[kRouted], 1u);
  EXPECT_EQ(r->final_counts[kRoutedDownDone], uint32_t{kExperts * kTilesDown});
  EXPECT_EQ(r->final_counts[kCombined], uint32_t{kSms});
  for (int e = 0; e < kExperts; ++e)
    EXPECT_EQ(r->final_counts[kRoutedGuDone0 + e], uint32_t{kTilesGu});
}

TEST(PersistentSchedule, MoeBlockWithTheTopkBehindRoutedTilesDeadlocks) {
  auto r = check_schedule(moe_block(true));
  ASSERT_FALSE(r.is_ok());
  const std::string m = r.status().message();
  EXPECT_TRUE(contains(m, "deadlock")) << m;
  EXPECT_TRUE(
      contains(m, "(routed gate|up) waits for its weights, whose loader waits for counter " +
                      std::to_string(kRouted) + " >= 1"))
      << m;
}

}  // namespace
}  // namespace m3::minimax_m3::persistent
