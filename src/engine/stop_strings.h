// Stop-string matching across token boundaries with streaming hold-back. Text arrives in pieces;
// push() returns only bytes that can no longer be part of a stop string and that end on a UTF-8
// character boundary. When a stop string completes, the text before it is returned and the rest
// (the stop string and anything after it) is dropped, as OpenAI specifies.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace m3 {

class StopStringFilter {
 public:
  explicit StopStringFilter(std::vector<std::string> stops = {});

  // Appends bytes; returns the newly emittable text. After a match, returns "" forever.
  std::string push(std::string_view bytes);
  // Everything still held back (at the end of generation for another reason).
  std::string flush();

  // Index into the stop list of the stop string that matched (the earliest-starting one; ties:
  // the first listed).
  std::optional<size_t> matched() const { return matched_; }
  const std::string& matched_string() const;

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  std::optional<size_t> matched_;
};

// Length of the trailing incomplete UTF-8 sequence of `s` (0 if s ends on a boundary).
size_t utf8_incomplete_tail(std::string_view s);

}  // namespace m3
