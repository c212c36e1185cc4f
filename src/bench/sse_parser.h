// Incremental Server-Sent Events parser (the WHATWG event-stream format): bytes arrive in arbitrary
// pieces (a TCP read can end inside a `data:` line or inside a multi-byte UTF-8 character), and
// only complete events come out. The parser works on bytes and never splits a line, so UTF-8
// survives any split.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace m3::bench {

class SseParser {
 public:
  // Consumes `bytes` and returns the data of every event completed by them (the `data:` lines of
  // an event joined with '\n', as the spec says). Lines end with LF, CRLF or CR; `:` lines are
  // comments; other fields (event, id, retry) are ignored since OpenAI streams do not use them.
  std::vector<std::string> feed(std::string_view bytes);

  // Bytes held back: an unfinished line, or the data of an event without its blank line yet.
  bool has_partial() const { return !line_.empty() || has_data_; }

 private:
  void on_line(std::vector<std::string>& out);

  std::string line_;
  std::string data_;
  bool has_data_ = false;
  bool last_was_cr_ = false;  // a CR ended the previous piece: a leading LF now belongs to it
};

}  // namespace m3::bench
