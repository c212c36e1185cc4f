// Speculative decoding's acceptance over a benchmark run, from the server's Prometheus /metrics
// read before and after it: m3serve exports the tokens committed per verify step as the histogram
// <prefix>:spec_accept_length (its _sum and _count) and the drafted and accepted draft tokens as
// <prefix>:spec_draft_tokens_total and <prefix>:spec_accepted_tokens_total. The difference of the
// two reads covers the run, the warm-up excluded; traffic from other clients in between counts
// too.
#pragma once

#include <cstdint>
#include <string_view>

namespace m3::bench {

// The series' values at one read, summed over their label sets (one series per DP rank).
struct SpecCounters {
  bool present = false;   // the server exports the speculative series
  double verify_steps = 0;     // spec_accept_length_count
  double committed_tokens = 0; // spec_accept_length_sum: accepted drafts + one target token each
  double draft_tokens = 0;
  double accepted_tokens = 0;
};

// Reads the four series from a /metrics body; any metric-name prefix ("m3serve:", "sglang:").
SpecCounters parse_spec_counters(std::string_view metrics_text);

// What the run did between two reads.
struct SpecSummary {
  bool present = false;  // both reads had the series and at least one verify step ran between
  int64_t verify_steps = 0;
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  double mean_accept_length = 0;  // committed tokens per verify step (accepted drafts + 1)
  double acceptance_rate = 0;     // accepted / drafted
};

SpecSummary spec_between(const SpecCounters& before, const SpecCounters& after);

}  // namespace m3::bench
