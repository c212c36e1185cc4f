#include "backend/cuda/runtime/stream.h"

#include <mutex>

#include "backend/cuda/runtime/cuda_check.h"

namespace m3::cuda {

Result<Stream> Stream::create(int priority) {
  Stream s;
  M3_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&s.s_, cudaStreamNonBlocking, priority));
  return s;
}

void Stream::priority_range(int* greatest, int* least) {
  *greatest = *least = 0;
  if (cudaDeviceGetStreamPriorityRange(least, greatest) != cudaSuccess) {
    cudaGetLastError();
    *greatest = *least = 0;
  }
}

Status Stream::synchronize() const {
  M3_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s_));
  return Status::ok();
}

void Stream::reset() {
  if (s_ != nullptr) cudaStreamDestroy(s_);
  s_ = nullptr;
}

const LaunchLimits& launch_limits() {
  static LaunchLimits d;
  static std::once_flag once;
  std::call_once(once, [] {
    int dev = 0, sms = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
        sms > 0)
      d.sms = sms;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) ==
            cudaSuccess &&
        optin > 0)
      d.smem_optin = optin;
  });
  return d;
}

Result<DeviceInfo> select_device(int device) {
  int count = 0;
  M3_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count)
    return invalid_argument("[cuda] device " + std::to_string(device) + " does not exist (" +
                            std::to_string(count) + " devices)");
  M3_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaDeviceProp p{};
  M3_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&p, device));
  DeviceInfo info;
  info.device = device;
  info.name = p.name;
  info.major = p.major;
  info.minor = p.minor;
  info.num_sms = p.multiProcessorCount;
  info.l2_bytes = p.l2CacheSize;
  info.global_mem_bytes = static_cast<int64_t>(p.totalGlobalMem);
  info.max_smem_optin = static_cast<int64_t>(p.sharedMemPerBlockOptin);
  if (p.major != 9 || p.minor != 0)
    return invalid_argument("[cuda] device " + std::to_string(device) + " (" + info.name +
                            ") is compute capability " + std::to_string(p.major) + "." +
                            std::to_string(p.minor) + "; this build has sm_90a kernels only");
  return info;
}

}  // namespace m3::cuda
