// Shared-memory operand tiles of the Hopper fold (gemm_fold_sm90.cu): their CuTe layout and the byte offset
// of a 16-byte chunk in them.
//
// A tile is ROWS output rows (columns of dY / X) x BK token slots x stages, bf16, MN-major with the 128-byte
// swizzle: CuTe's tile_to_shape(GMMA::Layout_MN_SW128_Atom<bf16>, (ROWS, BK, stages), Step<2, 1, 3>), atoms of
// 64 rows x 8 slots (1 KiB), the slot atoms first, then the 64-row atoms, then the stage (the order CUTLASS's
// MN-major TMA mainloops use). Why this order: the BK slots of one 64-row atom column are then 128-byte rows
// at consecutive addresses, exactly what one TMA box of 64 columns x BK token rows with the 128-byte swizzle
// writes (a tile of contiguous token rows costs ROWS / 64 TMA copies); inside an atom, slot t is the 128-byte
// row t % 8, whose 16-byte chunks are XOR-swizzled by t % 8 (TMA's swizzle, from the address bits).
// The producer computes cp.async chunk addresses with the formula below (cheaper than evaluating the CuTe
// layout per chunk); tests/test_audit_kernels.py compiles it on the host beside FoldSmemLayout and requires
// the two to agree on every element.
#pragma once

#include <cstdint>

#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "cute/layout.hpp"
#include "cutlass/numeric_types.h"

namespace gs {
namespace fold90 {

constexpr int kFoldSlotsPerStage = 64;

template <int ROWS, int BK, int STAGES>
using FoldSmemLayout =
    decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW128_Atom<cutlass::bfloat16_t>{},
                                 cute::make_shape(cute::Int<ROWS>{}, cute::Int<BK>{}, cute::Int<STAGES>{}),
                                 cute::Step<cute::_2, cute::_1, cute::_3>{}));

// Offset from the tile's base of chunk c (elements 8c .. 8c + 7 of the ROWS) of token slot t in stage `stage`.
template <int ROWS, int BK>
__host__ __device__ __forceinline__ uint32_t swizzled_offset(int stage, int c, int t) {
  static_assert(ROWS % 64 == 0 && BK % 8 == 0, "whole 64 x 8 atoms");
  return static_cast<uint32_t>(stage * ROWS * BK * 2 + (c >> 3) * (BK * 128) + 128 * t + 16 * ((c & 7) ^ (t & 7)));
}

// Offset of the TMA box (64 columns x BK slots) that fills 64-row atom column `atom` of stage `stage`.
template <int ROWS, int BK>
__host__ __device__ __forceinline__ uint32_t box_offset(int stage, int atom) {
  return swizzled_offset<ROWS, BK>(stage, atom * 8, 0);
}

}  // namespace fold90
}  // namespace gs
