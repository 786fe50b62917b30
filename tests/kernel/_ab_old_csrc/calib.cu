// C launchers of the calibration kernels (calib.cuh); no torch headers. Each returns a cudaError_t code.
#include <cuda_runtime.h>

#include "calib.cuh"
#include "tma_host.h"

namespace {

// One CTA per SM, as in the megakernel: every CTA asks for the megakernel's dynamic shared memory.
template <typename Args>
int launch_one_per_sm(void (*kernel)(Args), const Args* args, int num_ctas, bool cooperative, void* stream) {
  const void* fn = reinterpret_cast<const void*>(kernel);
  constexpr int kSmem = weave::Config::kSmemDynamic;
  cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return static_cast<int>(err);
  void* kargs[] = {const_cast<Args*>(args)};
  const auto s = static_cast<cudaStream_t>(stream);
  err = cooperative ? cudaLaunchCooperativeKernel(fn, dim3(num_ctas), dim3(weave::Config::kThreads), kargs, kSmem, s)
                    : cudaLaunchKernel(fn, dim3(num_ctas), dim3(weave::Config::kThreads), kargs, kSmem, s);
  return static_cast<int>(err);
}

}  // namespace

extern "C" int weave_calib_push(const weave::CalibPushArgs* args, int num_ctas, void* stream) {
  return launch_one_per_sm(weave::calib_push_kernel, args, num_ctas, false, stream);
}

// Tickets are zeroed on the stream first; K > 1 chunks need all CTAs co-resident (cooperative launch).
extern "C" int weave_calib_gemm(const weave::CalibGemmArgs* args, int num_ctas, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  weave::CalibGemmArgs a = *args;  // + the TMA descriptor of b [E][n][k]
  const int rc = weave::encode_weight_map(&a.tmap_b, a.b, a.k, a.n, a.num_experts);
  if (rc != 0) return rc;
  cudaError_t err = cudaMemsetAsync(a.tickets, 0, sizeof(uint32_t) * a.num_chunks, s);
  if (err != cudaSuccess) return static_cast<int>(err);
  return launch_one_per_sm(weave::calib_gemm_kernel, &a, num_ctas, a.num_chunks > 1, stream);
}

extern "C" int weave_calib_claim(const weave::CalibClaimArgs* args, int num_ctas, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaMemsetAsync(args->counter, 0, sizeof(uint32_t), s);
  if (err != cudaSuccess) return static_cast<int>(err);
  return launch_one_per_sm(weave::calib_claim_kernel, args, num_ctas, true, stream);
}

extern "C" int weave_calib_signal(const weave::CalibSignalArgs* args, int num_ctas, void* stream) {
  const void* fn = reinterpret_cast<const void*>(&weave::calib_signal_kernel);
  void* kargs[] = {const_cast<weave::CalibSignalArgs*>(args)};
  // cooperative: with two roles in one grid (one GPU), both CTAs must run at once
  return static_cast<int>(cudaLaunchCooperativeKernel(fn, dim3(num_ctas), dim3(32), kargs, 0,
                                                      static_cast<cudaStream_t>(stream)));
}
