#include "backend/cuda/runtime/graph.h"

#include <cuda_runtime.h>

#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {

Event::~Event() {
  if (e_ != nullptr) cudaEventDestroy(e_);
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (e_ != nullptr) cudaEventDestroy(e_);
    e_ = o.e_;
    o.e_ = nullptr;
  }
  return *this;
}

Result<Event> Event::create() {
  Event e;
  M3_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e.e_, cudaEventDisableTiming));
  return e;
}

Result<Event> Event::create_timed() {
  Event e;
  M3_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e.e_));
  return e;
}

Status Event::synchronize() const {
  M3_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(e_));
  return Status::ok();
}

Result<bool> Event::reached() const {
  const cudaError_t e = cudaEventQuery(e_);
  if (e == cudaErrorNotReady) return false;  // not an error (and not kept as the last one)
  M3_CUDA_RETURN_IF_ERROR(e);
  return true;
}

Result<float> Event::elapsed_ms(const Event& from, const Event& to) {
  float ms = 0.0f;
  M3_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, from.e_, to.e_));
  return ms;
}

Status Event::record(CUstream_st* stream) {
  M3_CUDA_RETURN_IF_ERROR(cudaEventRecord(e_, stream));
  return Status::ok();
}

Status Event::make_wait(CUstream_st* stream) const {
  M3_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, e_, 0));
  return Status::ok();
}

GraphExec::~GraphExec() {
  if (g_ != nullptr) cudaGraphExecDestroy(g_);
}

GraphExec& GraphExec::operator=(GraphExec&& o) noexcept {
  if (this != &o) {
    if (g_ != nullptr) cudaGraphExecDestroy(g_);
    g_ = o.g_;
    o.g_ = nullptr;
  }
  return *this;
}

Status GraphExec::launch(CUstream_st* stream) const {
  M3_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(g_, stream));
  return Status::ok();
}

Result<GraphExec> capture_graph(CUstream_st* stream, const std::function<Status()>& body) {
  M3_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  Status s = body();
  cudaGraph_t graph = nullptr;
  cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (!s.is_ok() || end != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();  // an invalidated capture leaves an error state behind
    if (!s.is_ok()) return s;
    return cuda_error(end, "cudaStreamEndCapture", __FILE__, __LINE__);
  }
  GraphExec exec;
  cudaError_t inst =
      cudaGraphInstantiate(&exec.g_, graph, cudaGraphInstantiateFlagUseNodePriority);
  cudaGraphDestroy(graph);
  if (inst != cudaSuccess) return cuda_error(inst, "cudaGraphInstantiate", __FILE__, __LINE__);
  return exec;
}

}  // namespace m3::cuda
