#include "bench/spec_metrics.h"

#include <cmath>
#include <cstdlib>
#include <string>

namespace m3::bench {
namespace {

// The metric name of a sample line without its prefix ("m3serve:spec_draft_tokens_total{...} 5"
// -> "spec_draft_tokens_total"), and its value; false for comments and malformed lines.
bool sample(std::string_view line, std::string_view* name, double* value) {
  if (line.empty() || line[0] == '#') return false;
  size_t end = line.find_first_of("{ ");
  if (end == std::string_view::npos) return false;
  *name = line.substr(0, end);
  if (const size_t colon = name->rfind(':'); colon != std::string_view::npos) {
    *name = name->substr(colon + 1);
  }
  size_t at = end;
  if (line[at] == '{') {
    // Label values may hold '}' inside quotes: skip the quoted parts.
    bool quoted = false;
    for (++at; at < line.size(); ++at) {
      if (line[at] == '\\' && quoted) {
        ++at;
      } else if (line[at] == '"') {
        quoted = !quoted;
      } else if (line[at] == '}' && !quoted) {
        break;
      }
    }
    if (at >= line.size()) return false;
    ++at;
  }
  const std::string rest(line.substr(at));
  char* stop = nullptr;
  *value = std::strtod(rest.c_str(), &stop);
  return stop != rest.c_str() && std::isfinite(*value);
}

}  // namespace

SpecCounters parse_spec_counters(std::string_view text) {
  SpecCounters c;
  bool steps = false, committed = false;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    std::string_view name;
    double v = 0;
    if (!sample(line, &name, &v)) continue;
    if (name == "spec_accept_length_count") {
      c.verify_steps += v;
      steps = true;
    } else if (name == "spec_accept_length_sum") {
      c.committed_tokens += v;
      committed = true;
    } else if (name == "spec_draft_tokens_total") {
      c.draft_tokens += v;
    } else if (name == "spec_accepted_tokens_total") {
      c.accepted_tokens += v;
    }
  }
  c.present = steps && committed;
  return c;
}

SpecSummary spec_between(const SpecCounters& before, const SpecCounters& after) {
  SpecSummary s;
  if (!after.present) return s;
  // A server without a verify step before the run exports no series yet: zero, not absent.
  const SpecCounters b = before.present ? before : SpecCounters{};
  s.verify_steps = std::llround(after.verify_steps - b.verify_steps);
  s.draft_tokens = std::llround(after.draft_tokens - b.draft_tokens);
  s.accepted_tokens = std::llround(after.accepted_tokens - b.accepted_tokens);
  if (s.verify_steps <= 0) return SpecSummary{};
  s.present = true;
  s.mean_accept_length =
      (after.committed_tokens - b.committed_tokens) / static_cast<double>(s.verify_steps);
  s.acceptance_rate =
      s.draft_tokens > 0 ? static_cast<double>(s.accepted_tokens) / s.draft_tokens : 0.0;
  return s;
}

}  // namespace m3::bench
