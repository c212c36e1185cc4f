#include "engine/stop_strings.h"

#include <algorithm>

namespace m3 {

StopStringFilter::StopStringFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {}

size_t utf8_incomplete_tail(std::string_view s) {
  // Look back at most 3 bytes for the lead byte of the last character.
  const size_t n = s.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    size_t len = 1;
    if ((c & 0xE0) == 0xC0) len = 2;
    else if ((c & 0xF0) == 0xE0) len = 3;
    else if ((c & 0xF8) == 0xF0) len = 4;
    return len > back ? back : 0;
  }
  return 0;  // only continuation bytes (invalid UTF-8): do not hold back forever
}

const std::string& StopStringFilter::matched_string() const {
  static const std::string kEmpty;
  return matched_ ? stops_[*matched_] : kEmpty;
}

std::string StopStringFilter::push(std::string_view bytes) {
  if (matched_) return {};
  pending_.append(bytes);
  // Earliest match: every byte before pending_ was proven not to start a stop string.
  size_t best_pos = std::string::npos;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t pos = pending_.find(stops_[i]);
    if (pos < best_pos) {
      best_pos = pos;
      matched_ = i;
    }
  }
  if (matched_) {
    std::string out = pending_.substr(0, best_pos);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k) {
      if (std::string_view(pending_).substr(pending_.size() - k) ==
          std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  size_t emit = pending_.size() - hold;
  emit -= utf8_incomplete_tail(std::string_view(pending_).substr(0, emit));
  std::string out = pending_.substr(0, emit);
  pending_.erase(0, emit);
  return out;
}

std::string StopStringFilter::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace m3
