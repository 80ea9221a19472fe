// Host launchers of the batch-invariant attention kernels (gradsweep._C).
//
// Same conventions as gradsweep.h: raw device addresses, sizes, the device index and the stream handle; every
// launcher returns the cudaError_t of its CUDA calls as an int (0 = success). No CUDA header here, so the
// bindings build with the host compiler alone.
//
// Attention tensors (bf16 unless said): q / o / do / dq [R, HQ, D] (the call's physical rows), k / v stores
// [T, HKV, D] (logical token = sample start + position), lse / delta fp32 [HQ, T], dk / dv fp32 [T, HKV, D].
// Program tables: int32 [n, 4] rows (first physical row, first logical token, first position, tokens); a
// program holds its tokens x `pack` query heads (heads hb * pack .. of head block hb, HQ / pack blocks).
// Wide programs hold up to attn_rows(false) rows, narrow ones up to attn_rows(true).
#pragma once

#include <cstdint>

namespace gs {

int64_t attn_rows(bool narrow, bool dq);  // rows per program of the compiled kernels
int64_t attn_block_n();                   // keys per block of the forward and dQ walks
int64_t attn_fold_tile();                 // queries per canonical tile of the dK / dV fold
int64_t attn_fold_keys();                 // keys per dK / dV program
int64_t attn_max_head_dim();

// attention_fwd.cu. path: as attn_dkdv's (0 auto: the wide programs on wgmma on Hopper at head_dim 65 .. 128;
// 1 mma.sync; 2 wgmma, cudaErrorNotSupported where it does not apply). The same bits either way: tests compare them.
int attn_fwd(uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t lse, uintptr_t wide, int64_t n_wide,
             uintptr_t narrow, int64_t n_narrow, int64_t pack, int64_t HQ, int64_t HKV, int64_t D, int64_t T,
             float qk_scale, int device, uintptr_t stream, int path = 0);
// dst_a[toks[i]] = src_a[rows[i]] (and the same for b when src_b != 0), rows of row_elems 16-bit elements.
int attn_scatter(uintptr_t src_a, uintptr_t dst_a, uintptr_t src_b, uintptr_t dst_b, uintptr_t rows,
                 uintptr_t toks, int64_t n, int64_t row_elems, int device, uintptr_t stream);

// attention_dq.cu: dq of the programs' rows; delta[hq, token] = rowsum(P * dP) (exact) or rowsum(o * do). path: as
// attn_fwd's (the wide programs on wgmma on Hopper at head_dim 65 .. 128); the same bits either way.
int attn_dq(uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t dout, uintptr_t dq, uintptr_t lse,
            uintptr_t delta, uintptr_t wide, int64_t n_wide, uintptr_t narrow, int64_t n_narrow, int64_t pack,
            int64_t HQ, int64_t HKV, int64_t D, int64_t T, float qk_scale, float sm_scale, bool exact, int device,
            uintptr_t stream, int path = 0);

// attention_dkdv.cu: work int32 [n_work, 3] rows (token of the sample's start, first key, sample length).
// path: as gemm_nt's (0 auto: the wgmma fold on Hopper at head_dim 65 .. 128, else mma.sync; 1 the mma.sync fold;
// 2 the wgmma fold, cudaErrorNotSupported where it does not apply). Both give the same bits: tests compare them.
int attn_dkdv(uintptr_t k, uintptr_t v, uintptr_t q, uintptr_t dout, uintptr_t lse, uintptr_t delta, uintptr_t dk,
              uintptr_t dv, uintptr_t work, int64_t n_work, int64_t HQ, int64_t HKV, int64_t D, int64_t T,
              float qk_scale, float sm_scale, bool load_acc, bool fp32_grads, int device, uintptr_t stream,
              int path = 0);

}  // namespace gs
