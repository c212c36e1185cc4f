// libm3_cuda_trace.so: a CUPTI activity tracer loaded by the CUDA driver's injection hook, for
// machines without Nsight Systems. With CUDA_INJECTION64_PATH=/path/libm3_cuda_trace.so the
// driver dlopens it during cuInit and calls InitializeInjection(); from then on every kernel,
// memcpy and memset the process runs on the GPU is recorded, CUDA-graph kernel nodes one by one
// (CONCURRENT_KERNEL records carry graphId / graphNodeId; GRAPH_TRACE, which would give one
// record per graph launch, is not enabled). At exit it writes
//   M3_TRACE_OUT (default cuda_trace.csv): every record, start order (trace_summary.h: columns);
//   stderr: the last M3_TRACE_LAST (default 150) kernels with offset, duration and gap, per-name
//           totals, the window's span, kernel time and idle time.
// Any CUPTI failure prints one line and turns tracing off; the traced program runs on.
#include <cupti.h>
#include <cxxabi.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "trace_summary.h"

namespace {

using m3::trace::Kind;
using m3::trace::Record;

constexpr size_t kBufferBytes = 8u << 20;  // CUPTI fills one, hands it back, asks for the next
constexpr size_t kNameMax = 100;
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                         CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};

// Leaked on purpose: CUPTI's worker thread may still deliver a buffer while static destructors
// run at exit; a heap object that is never destroyed stays valid for it.
struct State {
  std::mutex mu;
  std::vector<Record> records;
  // Short names by mangled name: demangling once per kernel, not per record. Keyed by content,
  // not by CUPTI's pointer, which could be reused if a module were unloaded.
  std::unordered_map<std::string, std::string> names;
  size_t dropped = 0, incomplete = 0;
};
State& state() {
  static State* s = new State;
  return *s;
}
std::atomic<bool> g_on{false};       // records are being collected
std::atomic<bool> g_written{false};  // the exit report is done; later buffers are only freed

// stop_cupti: turn the activity kinds off too (best effort, we are already failing); not from
// inside a CUPTI buffer callback, where re-entering CUPTI is asking for a deadlock: there the
// records are only ignored from then on.
void disable(const char* why, bool stop_cupti) {
  if (g_on.exchange(false)) {
    std::fprintf(stderr, "cuda_trace: %s; tracing disabled\n", why);
    if (stop_cupti)
      for (CUpti_ActivityKind k : kKinds) cuptiActivityDisable(k);
  }
}

bool ok(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  const char* s = nullptr;
  if (cuptiGetResultString(r, &s) != CUPTI_SUCCESS || s == nullptr) s = "unknown CUPTI error";
  std::fprintf(stderr, "cuda_trace: %s failed: %s (%d)\n", what, s, static_cast<int>(r));
  return false;
}

// "void ns::(anonymous namespace)::gemv<5, true>(ns::Params)" -> "ns::gemv<5, true>": the
// template arguments tell variants apart, the return type and parameters only take room.
std::string short_name(const char* mangled) {
  if (mangled == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d != nullptr ? d : mangled;
  std::free(d);
  if (!s.empty() && s.back() == ')') {
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
      depth += s[i] == ')' ? 1 : s[i] == '(' ? -1 : 0;
      if (depth == 0) {
        s.resize(i);
        break;
      }
    }
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  for (size_t p; (p = s.find("(anonymous namespace)::")) != std::string::npos;) s.erase(p, 23);
  if (s.size() > kNameMax) s = s.substr(0, kNameMax - 3) + "...";
  return s;
}

const char* copy_kind(uint8_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
      return "memcpy HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "memcpy PtoP";
    default:
      return "memcpy (array)";
  }
}

// Called with state().mu held (the name cache).
void append(State& st, const CUpti_Activity* a) {
  Record r;
  if (a->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || a->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(a);
    const std::string mangled = k->name != nullptr ? k->name : "";
    auto it = st.names.find(mangled);
    if (it == st.names.end()) it = st.names.emplace(mangled, short_name(k->name)).first;
    r.kind = Kind::kKernel;
    r.name = it->second;
    r.start_ns = k->start, r.end_ns = k->end;
    r.device = k->deviceId, r.context = k->contextId, r.stream = k->streamId;
    r.correlation = k->correlationId, r.graph_id = k->graphId, r.graph_node_id = k->graphNodeId;
    r.grid[0] = k->gridX, r.grid[1] = k->gridY, r.grid[2] = k->gridZ;
    r.block[0] = k->blockX, r.block[1] = k->blockY, r.block[2] = k->blockZ;
  } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
    const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(a);
    r.kind = Kind::kMemcpy;
    r.name = copy_kind(m->copyKind);
    r.start_ns = m->start, r.end_ns = m->end;
    r.device = m->deviceId, r.context = m->contextId, r.stream = m->streamId;
    r.correlation = m->correlationId, r.graph_id = m->graphId, r.graph_node_id = m->graphNodeId;
    r.bytes = m->bytes;
  } else if (a->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
    const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(a);
    r.kind = Kind::kMemset;
    r.name = "memset";
    r.start_ns = m->start, r.end_ns = m->end;
    r.device = m->deviceId, r.context = m->contextId, r.stream = m->streamId;
    r.correlation = m->correlationId, r.graph_id = m->graphId, r.graph_node_id = m->graphNodeId;
    r.bytes = m->bytes;
  } else {
    return;
  }
  if (r.start_ns == 0 && r.end_ns == 0) {  // CUPTI could not time it (documented meaning of 0/0)
    ++st.incomplete;
    return;
  }
  st.records.push_back(std::move(r));
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  // CUPTI needs 8-byte alignment; on failure it drops records and counts them.
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t,
                               size_t valid) {
  if (g_written.load() || !g_on.load()) {
    std::free(buffer);
    return;
  }
  try {  // nothing may unwind into CUPTI's C code
    State& st = state();
    std::lock_guard<std::mutex> lock(st.mu);
    CUpti_Activity* a = nullptr;
    for (;;) {
      const CUptiResult r = cuptiActivityGetNextRecord(buffer, valid, &a);
      if (r == CUPTI_ERROR_MAX_LIMIT_REACHED) break;  // end of this buffer
      if (!ok(r, "cuptiActivityGetNextRecord")) {
        disable("a completed buffer could not be read", false);
        break;
      }
      append(st, a);
    }
    size_t dropped = 0;
    if (ok(cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped),
           "cuptiActivityGetNumDroppedRecords"))
      st.dropped += dropped;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_trace: %s while reading a buffer\n", e.what());
    disable("reading a buffer failed", false);
  }
  std::free(buffer);
}

void at_exit() {
  if (!g_on.load()) return;
  std::fflush(stdout);  // the program's own output before the report when both go to one file
  // Forced: also hands back partly filled buffers. The traced program has synchronised (the
  // bench reads its logits back), so the records in them are complete.
  if (!ok(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll"))
    std::fprintf(stderr, "cuda_trace: reporting what was delivered before the failed flush\n");
  g_on.store(false);
  std::vector<Record> recs;
  size_t dropped = 0, incomplete = 0;
  try {
    State& st = state();
    {
      std::lock_guard<std::mutex> lock(st.mu);
      recs.swap(st.records);
      dropped = st.dropped, incomplete = st.incomplete;
    }
    g_written.store(true);
    m3::trace::sort_by_start(recs);
    const char* out = std::getenv("M3_TRACE_OUT");
    if (out == nullptr || *out == '\0') out = "cuda_trace.csv";
    if (std::FILE* f = std::fopen(out, "w")) {
      m3::trace::write_csv(f, recs);
      std::fclose(f);
    } else {
      std::fprintf(stderr, "cuda_trace: cannot write %s: %s\n", out, std::strerror(errno));
    }
    size_t last = 150;
    if (const char* l = std::getenv("M3_TRACE_LAST")) {
      char* end = nullptr;
      const unsigned long long v = std::strtoull(l, &end, 10);
      if (end != l && *end == '\0') last = static_cast<size_t>(v);
    }
    std::fprintf(stderr,
                 "cuda_trace: %zu records -> %s (%zu dropped by CUPTI, %zu without timestamps)\n",
                 recs.size(), out, dropped, incomplete);
    m3::trace::print_summary(stderr, recs, m3::trace::summarize(recs, last));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_trace: report failed: %s\n", e.what());
  }
}

}  // namespace

// The driver's injection entry point, called once during cuInit. It returns 1 whatever happens
// to CUPTI: tracing is an observer and must not make the program's CUDA initialisation fail.
extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  static std::atomic<bool> called{false};
  if (called.exchange(true)) return 1;
  // The record structs below are those of the CUPTI headers built against; another libcupti may
  // lay them out differently (bundle.sh ships the matching one).
  uint32_t version = 0;
  if (ok(cuptiGetVersion(&version), "cuptiGetVersion") && version != CUPTI_API_VERSION)
    std::fprintf(stderr, "cuda_trace: warning: libcupti API %u, built against %d\n", version,
                 CUPTI_API_VERSION);
  if (!ok(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
          "cuptiActivityRegisterCallbacks")) {
    std::fprintf(stderr, "cuda_trace: tracing disabled\n");
    return 1;
  }
  g_on.store(true);
  for (CUpti_ActivityKind k : kKinds) {
    if (!ok(cuptiActivityEnable(k), "cuptiActivityEnable")) {
      disable("an activity kind could not be enabled", true);
      return 1;
    }
  }
  if (std::atexit(at_exit) != 0) {
    disable("atexit registration failed", true);
    return 1;
  }
  std::fprintf(
      stderr, "cuda_trace: CUPTI API %u tracing kernels (graph nodes one by one), memcpy, memset\n",
      version);
  return 1;
}
