#include "model/minimax_m3_cuda/persistent_schedule.h"

#include <algorithm>

namespace m3::minimax_m3::persistent {
namespace {

Status bad(const std::string& what) {
  return invalid_argument("[model.persistent_schedule] " + what);
}

std::string op_name(const Schedule& s, size_t sm, size_t i) {
  const Op& op = s.sms[sm][i];
  std::string kind = std::to_string(op.kind);
  if (op.kind >= 0 && static_cast<size_t>(op.kind) < s.kind_names.size())
    kind = s.kind_names[static_cast<size_t>(op.kind)];
  return "SM " + std::to_string(sm) + " op " + std::to_string(i) + " (" + kind + ")";
}

std::string wait_text(const Wait& w, const std::vector<uint32_t>& counts) {
  return "counter " + std::to_string(w.counter) + " >= " + std::to_string(w.count) + " (stays at " +
         std::to_string(counts[static_cast<size_t>(w.counter)]) + ")";
}

// The agents of one SM while the schedule runs.
struct SmState {
  size_t load_op = 0;     // next op whose pages the loader streams
  int32_t load_page = 0;  // pages of load_op already in the ring
  size_t run_op = 0;      // next op the consumer runs
  int32_t ring_used = 0;  // slots holding pages of ops not yet run
};

}  // namespace

Result<ScheduleReport> check_schedule(const Schedule& s) {
  if (s.sms.empty()) return bad("no SMs");
  if (s.ring_pages < 1) return bad("ring of " + std::to_string(s.ring_pages) + " pages");
  if (s.num_counters < 0) return bad("negative counter count");
  const auto in_range = [&](const Wait& w) {
    return w.counter == -1 || (w.counter >= 0 && w.counter < s.num_counters);
  };
  // Signals per counter over the whole schedule: no wait may ask for more.
  std::vector<uint32_t> total(static_cast<size_t>(s.num_counters), 0);
  ScheduleReport report;
  for (size_t sm = 0; sm < s.sms.size(); ++sm)
    for (size_t i = 0; i < s.sms[sm].size(); ++i) {
      const Op& op = s.sms[sm][i];
      if (op.pages < 0 || op.pages > s.ring_pages)
        return bad(op_name(s, sm, i) + " reads " + std::to_string(op.pages) +
                   " pages; the ring holds " + std::to_string(s.ring_pages));
      if (op.signal < -1 || op.signal >= s.num_counters || !in_range(op.load_wait))
        return bad(op_name(s, sm, i) + " names a counter outside 0 .. " +
                   std::to_string(s.num_counters - 1));
      for (const Wait& w : op.waits)
        if (!in_range(w))
          return bad(op_name(s, sm, i) + " waits on a counter outside 0 .. " +
                     std::to_string(s.num_counters - 1));
      if (op.signal >= 0) ++total[static_cast<size_t>(op.signal)];
      ++report.ops;
      report.pages += op.pages;
    }
  for (size_t sm = 0; sm < s.sms.size(); ++sm)
    for (size_t i = 0; i < s.sms[sm].size(); ++i) {
      const Op& op = s.sms[sm][i];
      std::vector<Wait> all = op.waits;
      all.push_back(op.load_wait);
      for (const Wait& w : all)
        if (w.counter >= 0 && w.count > total[static_cast<size_t>(w.counter)])
          return bad(op_name(s, sm, i) + " waits for counter " + std::to_string(w.counter) +
                     " >= " + std::to_string(w.count) + " but the schedule signals it only " +
                     std::to_string(total[static_cast<size_t>(w.counter)]) + " times");
    }

  // Run every agent that can make progress until none can. Counters only grow, so an agent that
  // can advance stays able to: the order of the sweep does not change the outcome.
  std::vector<uint32_t> count(static_cast<size_t>(s.num_counters), 0);
  const auto holds = [&](const Wait& w) {
    return w.counter < 0 || count[static_cast<size_t>(w.counter)] >= w.count;
  };
  std::vector<SmState> st(s.sms.size());
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t sm = 0; sm < s.sms.size(); ++sm) {
      const std::vector<Op>& ops = s.sms[sm];
      SmState& a = st[sm];
      // Loader: pages of the ops ahead, in order, while there is room.
      while (a.load_op < ops.size()) {
        const Op& op = ops[a.load_op];
        if (a.load_page == op.pages) {  // every page in (or none): on to the next op
          ++a.load_op;
          a.load_page = 0;
          progress = true;
          continue;
        }
        if (!holds(op.load_wait) || a.ring_used == s.ring_pages) break;
        ++a.load_page;
        ++a.ring_used;
        progress = true;
      }
      // Consumer: ops whose conditions hold and whose pages are all in.
      while (a.run_op < ops.size()) {
        const Op& op = ops[a.run_op];
        const bool loaded = a.load_op > a.run_op;
        if (!loaded || !std::all_of(op.waits.begin(), op.waits.end(), holds)) break;
        a.ring_used -= op.pages;
        if (op.signal >= 0) ++count[static_cast<size_t>(op.signal)];
        ++a.run_op;
        progress = true;
      }
    }
  }
  for (size_t sm = 0; sm < s.sms.size(); ++sm) {
    const SmState& a = st[sm];
    if (a.run_op == s.sms[sm].size()) continue;
    // Name what the stuck consumer waits for: its own op's pages (and why the loader stopped) or
    // a counter.
    const Op& op = s.sms[sm][a.run_op];
    std::string why;
    if (a.load_op <= a.run_op) {
      const Op& lop = s.sms[sm][a.load_op];
      why = !holds(lop.load_wait)
                ? "its weights, whose loader waits for " + wait_text(lop.load_wait, count)
                : "its weights, with the ring full";
    } else {
      for (const Wait& w : op.waits)
        if (!holds(w)) {
          why = wait_text(w, count);
          break;
        }
    }
    return bad("deadlock: " + op_name(s, sm, a.run_op) + " waits for " + why);
  }
  report.final_counts = std::move(count);
  return report;
}

}  // namespace m3::minimax_m3::persistent
