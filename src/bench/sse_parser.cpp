#include "bench/sse_parser.h"

namespace m3::bench {

std::vector<std::string> SseParser::feed(std::string_view bytes) {
  std::vector<std::string> out;
  for (char c : bytes) {
    if (last_was_cr_) {
      last_was_cr_ = false;
      if (c == '\n') continue;  // the LF of a CRLF split across pieces or read together
    }
    if (c == '\r') {
      last_was_cr_ = true;
      on_line(out);
    } else if (c == '\n') {
      on_line(out);
    } else {
      line_.push_back(c);
    }
  }
  return out;
}

void SseParser::on_line(std::vector<std::string>& out) {
  if (line_.empty()) {  // a blank line dispatches the event, if it has data
    if (has_data_) out.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line_[0] == ':') {  // comment (keep-alive)
    line_.clear();
    return;
  }
  const size_t colon = line_.find(':');
  std::string_view field(line_);
  std::string_view value;
  if (colon != std::string::npos) {
    field = std::string_view(line_).substr(0, colon);
    value = std::string_view(line_).substr(colon + 1);
    if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    if (has_data_) data_.push_back('\n');
    data_.append(value);
    has_data_ = true;
  }
  line_.clear();
}

}  // namespace m3::bench
