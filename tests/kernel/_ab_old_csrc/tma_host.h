// Host side of the TMA weight loads (tma.cuh): encodes the 3-D tensor map of a bf16 tensor [z][y][x] (x
// contiguous) with the boxes the GEMM tiles load (64 x along k = one 128-byte swizzle row, Config::kBoxRows
// rows, 1 z) and the 128-byte swizzle the wgmma descriptors expect. Out-of-range rows (a last column block past
// I or H) are zero-filled by the copy engine. The driver function is looked up through the runtime, so the
// extension does not link libcuda. For the C launchers only (needs the CUDA headers).
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "config.cuh"
#include "params.h"

namespace weave {

static_assert(sizeof(CUtensorMap) == sizeof(TensorMapBytes) && alignof(CUtensorMap) <= alignof(TensorMapBytes),
              "TensorMapBytes must hold a CUtensorMap");

// Returns 0 or a cudaError_t code (cudaErrorInvalidValue when the driver rejects the map).
inline int encode_weight_map(TensorMapBytes* out, const void* base, uint64_t x, uint64_t y, uint64_t z) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
    if (err != cudaSuccess) return static_cast<int>(err);
    if (q != cudaDriverEntryPointSuccess || fn == nullptr) return static_cast<int>(cudaErrorNotSupported);
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  if (x == 0 || y == 0 || z == 0 || base == nullptr || reinterpret_cast<uintptr_t>(base) % 16 != 0 || (x * 2) % 16 != 0)
    return static_cast<int>(cudaErrorInvalidValue);
  const cuuint64_t dims[3] = {x, y, z};
  const cuuint64_t strides[2] = {x * 2, x * y * 2};  // bytes, dims 1 and 2
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(Config::kBlockK), static_cast<cuuint32_t>(Config::kBoxRows), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(reinterpret_cast<CUtensorMap*>(out->bytes), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3,
                            const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? 0 : static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace weave
