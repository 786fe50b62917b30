// C launcher for the megakernel: no torch headers here (they triple the build time).
#include <cuda_runtime.h>

#include "megakernel.cuh"
#include "tma_host.h"

namespace {
constexpr int kStaticSmem = sizeof(weave::SharedLayout);
}

// cooperative != 0: a cooperative launch (the driver checks that the whole grid is co-resident). 0: a plain launch,
// for several grids that must run at the same time on one GPU (virtual ranks, weave_kernel/virtual.py), which a
// cooperative launch does not promise; the kernel's spins time out if a CTA never starts.
// The kernel instantiation: with the shared expert's code only when the call has one, FP8 experts' tiles only
// for FP8 layers (megakernel.cuh). Instance = shared + 2 fp8.
constexpr int kInstances = 4;
static const void* kernel_for(bool shared, bool fp8) {
  if (fp8)
    return shared ? reinterpret_cast<const void*>(&weave::weave_moe_kernel<true, true>)
                  : reinterpret_cast<const void*>(&weave::weave_moe_kernel<false, true>);
  return shared ? reinterpret_cast<const void*>(&weave::weave_moe_kernel<true>)
                : reinterpret_cast<const void*>(&weave::weave_moe_kernel<false>);
}
static int instance_of(const weave::Params& p) { return (p.inter_shared > 0 ? 1 : 0) + (p.fp8 ? 2 : 0); }
extern "C" int weave_moe_instance(const weave::Params* p) { return instance_of(*p); }

// The TMA maps of the routed experts' weights (routed != 0: w13 [El][2I][H] as [2 El][I][H], z = 2 le + half;
// w2 [El][H][I]) and of the shared expert's (shared != 0: w13s [2 Is][H] as [2][Is][H], w2s [H][Is] as [1][H][Is]),
// written into *params. 0 or a cudaError_t code.
// FP8 weights (p->fp8): e4m3 bytes mapped as bf16 rows of K / 2, so a box of 64 "bf16" carries 128 of K.
extern "C" int weave_moe_encode_maps(weave::Params* p, int routed, int shared) {
  const uint64_t div = p->fp8 ? 2 : 1;
  const uint64_t H = p->hidden / div, I = p->inter / div, El = p->num_local_experts;
  int rc = 0;
  if (routed) {
    rc = weave::encode_weight_map(&p->tmap_w13, p->w13, H, p->inter, 2 * El);
    if (rc == 0) rc = weave::encode_weight_map(&p->tmap_w2, p->w2, I, p->hidden, El);
  }
  if (rc == 0 && shared && p->inter_shared > 0) {
    const uint64_t Is = p->inter_shared;
    rc = weave::encode_weight_map(&p->tmap_w13s, p->w13s, H, Is, 2);
    if (rc == 0) rc = weave::encode_weight_map(&p->tmap_w2s, p->w2s, Is / div, p->hidden, 1);
  }
  return rc;
}

// Launches with the maps already in *params; set_smem_attr: raise the instantiation's dynamic shared memory limit
// first (needed once per instantiation and device).
extern "C" int weave_moe_launch_encoded(const weave::Params* params, void* stream, int cooperative, int set_smem_attr) {
  const void* fn = kernel_for(params->inter_shared > 0, params->fp8 != 0);
  cudaError_t err = cudaSuccess;
  if (set_smem_attr) {
    err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, weave::Config::kSmemDynamic);
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  void* args[] = {const_cast<weave::Params*>(params)};
  // cudaLaunchKernelExC with the cooperative attribute: the same launch as cudaLaunchCooperativeKernel, and one
  // that stream capture records as a cooperative kernel node (the layer can be captured in a CUDA graph)
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = cooperative ? 1 : 0;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(params->num_ctas);
  cfg.blockDim = dim3(weave::Config::kThreads);
  cfg.dynamicSmemBytes = weave::Config::kSmemDynamic;
  cfg.stream = static_cast<cudaStream_t>(stream);
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  err = cudaLaunchKernelExC(&cfg, fn, args);
  return static_cast<int>(err);
}

// One launch: the maps encoded, the attribute set, then the launch.
extern "C" int weave_moe_launch(const weave::Params* params, void* stream, int cooperative) {
  weave::Params p = *params;
  const int rc = weave_moe_encode_maps(&p, 1, 1);
  if (rc != 0) return rc;
  return weave_moe_launch_encoded(&p, stream, cooperative, 1);
}

// CTAs that can be co-resident on `device` (the cooperative-launch limit): SM count if one fits per SM.
// (every instantiation must fit: the smallest count)
extern "C" int weave_moe_max_ctas(int device) {
  int per_sm = 1 << 30, sms = 0;
  for (int inst = 0; inst < kInstances; ++inst) {
    const void* fn = kernel_for(inst & 1, inst & 2);
    if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, weave::Config::kSmemDynamic) !=
        cudaSuccess)
      return -1;
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, weave::Config::kThreads, weave::Config::kSmemDynamic) !=
        cudaSuccess)
      return -1;
    per_sm = n < per_sm ? n : per_sm;
  }
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return -1;
  return per_sm >= 1 ? sms : 0;
}

extern "C" const char* weave_cuda_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

extern "C" int weave_static_smem_bytes() { return kStaticSmem; }
