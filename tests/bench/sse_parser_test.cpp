// The SSE parser must give the same events however the stream is cut into reads: inside
// "data:", inside CRLF, inside a multi-byte UTF-8 character.
#include "bench/sse_parser.h"

#include <gtest/gtest.h>

#include <random>

namespace m3::bench {
namespace {

// LF, CRLF and CR line ends, a comment, a multi-line event, an event of other fields only (not
// dispatched: no data), 2-, 3- and 4-byte UTF-8, and "data" without a colon (an empty line of
// data).
const std::string kStream =
    ": keep-alive\n\n"
    "data: {\"text\":\"h\xC3\xA9llo\"}\n\n"
    "data: {\"text\":\"\xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x99\x82\"}\r\n\r\n"
    "event: ping\nid: 7\n\n"
    "data:no-space\rdata: second line\r\r"
    "data\ndata: x\n\n"
    "data: [DONE]\n\n";
const std::vector<std::string> kEvents = {
    "{\"text\":\"h\xC3\xA9llo\"}",
    "{\"text\":\"\xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x99\x82\"}",
    "no-space\nsecond line",
    "\nx",
    "[DONE]",
};

std::vector<std::string> parse_pieces(const std::vector<std::string_view>& pieces) {
  SseParser p;
  std::vector<std::string> out;
  for (std::string_view piece : pieces) {
    for (std::string& e : p.feed(piece)) out.push_back(std::move(e));
  }
  EXPECT_FALSE(p.has_partial());
  return out;
}

TEST(bench_sse, WholeStream) {
  EXPECT_EQ(parse_pieces({kStream}), kEvents);
}

TEST(bench_sse, EveryTwoAndThreeWaySplit) {
  const std::string_view s(kStream);
  for (size_t i = 0; i <= s.size(); ++i) {
    ASSERT_EQ(parse_pieces({s.substr(0, i), s.substr(i)}), kEvents) << "split at " << i;
    for (size_t j = i; j <= s.size(); j += 3) {
      ASSERT_EQ(parse_pieces({s.substr(0, i), s.substr(i, j - i), s.substr(j)}), kEvents)
          << "splits at " << i << ", " << j;
    }
  }
}

TEST(bench_sse, OneByteAtATimeAndRandomPieces) {
  const std::string_view s(kStream);
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < s.size(); ++i) bytes.push_back(s.substr(i, 1));
  EXPECT_EQ(parse_pieces(bytes), kEvents);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::string_view> pieces;
    for (size_t at = 0; at < s.size();) {
      const size_t n = std::min<size_t>(s.size() - at, 1 + rng() % 9);
      pieces.push_back(s.substr(at, n));
      at += n;
    }
    ASSERT_EQ(parse_pieces(pieces), kEvents) << "trial " << trial;
  }
}

TEST(bench_sse, UnfinishedEventIsHeldBack) {
  SseParser p;
  EXPECT_TRUE(p.feed("data: {\"a\":1}\n").empty());
  EXPECT_TRUE(p.has_partial());
  EXPECT_EQ(p.feed("\n"), std::vector<std::string>{"{\"a\":1}"});
}

}  // namespace
}  // namespace m3::bench
