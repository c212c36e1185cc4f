// An owned, non-blocking CUDA stream (RAII) and the device check done at start-up.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "core/status.h"

namespace m3::cuda {

class Stream {
 public:
  Stream() = default;
  ~Stream() { reset(); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  Stream(Stream&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  Stream& operator=(Stream&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = o.s_;
      o.s_ = nullptr;
    }
    return *this;
  }

  // priority: as cudaStreamCreateWithPriority (lower = higher priority; 0 = default; clamped
  // to the device's range). Kernels captured into a graph keep their stream's priority.
  static Result<Stream> create(int priority = 0);
  // The device's greatest (numerically lowest) and least stream priorities.
  static void priority_range(int* greatest, int* least);
  cudaStream_t get() const { return s_; }
  Status synchronize() const;
  void reset();

 private:
  cudaStream_t s_ = nullptr;
};

struct DeviceInfo {
  int device = 0;
  std::string name;
  int major = 0, minor = 0;
  int num_sms = 0;
  int64_t l2_bytes = 0;
  int64_t global_mem_bytes = 0;
  int64_t max_smem_optin = 0;
};

// The current device's SM count and opt-in shared memory per block, read once per process (the
// persistent launches size their grids and shared-memory rings by them); sm_90's 227 KB and one
// SM where the device cannot be read (host-side shape checks without a GPU).
struct LaunchLimits {
  int sms = 1;
  int smem_optin = 227 * 1024;
};
const LaunchLimits& launch_limits();

// Selects `device` and checks that it is compute capability 9.0 (the kernels are built for
// sm_90a only); failed_precondition-like errors come back as invalid_argument naming the device.
Result<DeviceInfo> select_device(int device);

}  // namespace m3::cuda
