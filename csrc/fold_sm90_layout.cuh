// Byte offset of a 16-byte chunk in the Hopper fold's shared-memory operand tiles (gemm_fold_sm90.cu).
//
// The tiles are CuTe's tile_to_shape(GMMA::Layout_MN_SW128_Atom<bf16>, (ROWS, BK, stages)): 64 x 8 atoms of
// 1 KiB, the M-mode atoms first, then the slot's atom, then the stage; inside an atom, slot t is the 128-byte
// row t % 8, whose 16-byte chunks are XOR-swizzled by t % 8. The producer computes chunk addresses with this
// formula (cheaper than evaluating the CuTe layout per chunk); tests/test_audit_kernels.py compiles it on
// the host beside the CuTe layout and requires the two to agree on every element.
#pragma once

#include <cstdint>

namespace gs {
namespace fold90 {

constexpr int kFoldSlotsPerStage = 64;

// Offset from the tile's base of chunk c (elements 8c .. 8c + 7 of the ROWS) of token slot t in stage `stage`.
template <int ROWS, int BK>
__host__ __device__ __forceinline__ uint32_t swizzled_offset(int stage, int c, int t) {
  static_assert(ROWS % 64 == 0 && BK % 8 == 0, "whole 64 x 8 atoms");
  constexpr int kAtomsM = ROWS / 64;
  const int r = t & 7;
  return static_cast<uint32_t>(stage * ROWS * BK * 2 + (c >> 3) * 1024 + kAtomsM * 1024 * (t >> 3) + 128 * r +
                               16 * ((c & 7) ^ r));
}

}  // namespace fold90
}  // namespace gs
