// Stream ordering across streams (Event) and captured CUDA graphs (GraphExec): a fork/join of a
// side stream and the replay of a captured step, for host code outside the kernels. This header
// includes no CUDA header.
#pragma once

#include <functional>

#include "core/status.h"

struct CUstream_st;
struct CUevent_st;
struct CUgraphExec_st;

namespace m3::cuda {

// An owned event, without timing (the cheapest kind; used to order streams) unless made with
// create_timed.
class Event {
 public:
  Event() = default;
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  Event& operator=(Event&& o) noexcept;

  static Result<Event> create();
  // An event that also keeps the time it is reached, for elapsed_ms (phase timing in benches).
  static Result<Event> create_timed();
  // Marks the point `stream` has reached (works under graph capture: it becomes an edge).
  Status record(CUstream_st* stream);
  // Work queued on `stream` after this call waits for the recorded point.
  Status make_wait(CUstream_st* stream) const;
  // Blocks the host until the recorded point is reached.
  Status synchronize() const;
  // Whether the recorded point has been reached, without blocking.
  Result<bool> reached() const;
  // Milliseconds between two reached timed events.
  static Result<float> elapsed_ms(const Event& from, const Event& to);

 private:
  CUevent_st* e_ = nullptr;
};

// An instantiated graph, replayed by launch().
class GraphExec {
 public:
  GraphExec() = default;
  ~GraphExec();
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  GraphExec(GraphExec&& o) noexcept : g_(o.g_) { o.g_ = nullptr; }
  GraphExec& operator=(GraphExec&& o) noexcept;

  Status launch(CUstream_st* stream) const;

 private:
  friend Result<GraphExec> capture_graph(CUstream_st*, const std::function<Status()>&);
  CUgraphExec_st* g_ = nullptr;
};

// Captures what `body` queues on `stream` (and on the streams it forks through events) into a
// graph and instantiates it with per-node priorities, copied from the capturing streams. The
// capture is thread-local: other threads' CUDA calls are not affected. A failing body, or a
// capture the driver refuses, returns its error and leaves no graph.
Result<GraphExec> capture_graph(CUstream_st* stream, const std::function<Status()>& body);

}  // namespace m3::cuda
