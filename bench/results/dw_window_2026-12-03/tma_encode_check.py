"""Does the driver accept a 3-D tiled map whose dims 1 and 2 share one stride (a sliding row window)?"""
import ctypes

import torch

cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuInit(0)
t = torch.zeros(4096, 4096, dtype=torch.bfloat16, device="cuda")
tm = (ctypes.c_uint8 * 128)()
u64 = ctypes.c_uint64
u32 = ctypes.c_uint32
for window_stride in (4096 * 2, 4096 * 2 * 64):
    dims = (u64 * 3)(4096, 64, 4096)
    strides = (u64 * 2)(4096 * 2, window_stride)
    box = (u32 * 3)(64, 64, 1)
    unit = (u32 * 3)(1, 1, 1)
    # CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9, INTERLEAVE_NONE 0, SWIZZLE_128B 3, L2_PROMOTION_L2_256B 3, OOB_FILL_NONE 0
    r = cuda.cuTensorMapEncodeTiled(ctypes.byref(tm), 9, 3, ctypes.c_void_p(t.data_ptr()), dims, strides, box, unit,
                                    0, 3, 3, 0)
    print(f"3-D map, dim-2 stride {window_stride} bytes: CUresult {r}")
