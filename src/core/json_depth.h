// Nesting depth of JSON text, measured before any value is built. A JSON document is a tree, and
// everything that walks a nlohmann::json (copies, dump(), comparisons, the Jinja engine's value
// conversion, schema walkers) recurses once per level; 50,000 levels of '[' overflow an 8 MiB
// thread stack. Callers that parse untrusted text refuse it when it nests deeper than a fixed
// limit, so no accepted document can be deep enough to exhaust a stack anywhere downstream.
#pragma once

#include <cstddef>
#include <string_view>

namespace m3 {

// The nesting limit for JSON that comes from outside: request bodies, tool-call arguments sent as
// strings, model output parsed as JSON, checkpoint metadata. Tool schemas in real use nest a few
// tens of levels; the Jinja engine's own value limit (512) and every recursive walker have room
// for several times this many.
inline constexpr int kMaxJsonDepth = 128;

// The deepest nesting of arrays and objects in `text` (0 for a scalar), counting brackets outside
// strings. The scan is iterative and stops as soon as the depth passes `stop_after`, returning
// stop_after + 1. For malformed text the result is an upper bound of what a parser would build
// before it fails, which is what a caller checking a limit needs.
int json_nesting_depth(std::string_view text, int stop_after = kMaxJsonDepth);

// True when `text` nests deeper than `max_depth`.
inline bool json_too_deep(std::string_view text, int max_depth = kMaxJsonDepth) {
  return json_nesting_depth(text, max_depth) > max_depth;
}

}  // namespace m3
