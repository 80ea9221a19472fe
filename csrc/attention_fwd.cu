// Batch-invariant causal attention forward (online softmax over key blocks from position 0) and the store
// scatter. Invariance argument: attention.cuh.
//
// A program holds `cnt` consecutive tokens of one sample times `pack` query heads of one K/V head (all its rows
// read the same keys). It walks key blocks [n0, n0 + kBlockN) for n0 = 0, kBlockN, .. up to its last row's
// position; blocks seen whole by every row run without the mask, the others with it. Per block and row:
//   m_new = max(m, rowmax(s) * scale); alpha = 2^(m - m_new); p = 2^(s * scale - m_new)   (fma)
//   l = l * alpha + rowsum(p) (fma); acc = acc * alpha + bf16(p) V
// and a row the block lies wholly after keeps (m, l, acc) as they were. o = acc / l (-0 stored as +0),
// lse = m + log2(l) (log2 units, scale folded in). The same code serves wide programs (8 warps x 16 rows) and
// narrow ones (16 rows on one warp, 4 warps loading; decode steps): a row's arithmetic depends on kBlockN and
// head_dim only.
#include "attention.h"
#include "attention_fwd.cuh"
#include "gradsweep.h"

namespace gs {
namespace attn {

// WARPS load; the first CW of them hold rows (CW x MI m-tiles of 16). SPLIT: one K and one V buffer, K of the next
// block loaded while this block's softmax and P V run, V of the next while its scores run (a narrow program then
// needs half the shared memory); else two stages of K and V.
template <int DP, int WARPS, int MI, int CW = WARPS, bool SPLIT = false>
struct FwdCfg {
  static constexpr int BN = kBlockN, LD = DP + 8, BM = CW * 16 * MI, THREADS = WARPS * 32;
  static constexpr int NJ = BN / 8, ND = DP / 8, KS = DP / 16;
  static constexpr int KV_BUFS = SPLIT ? 1 : 2;
  static constexpr int SMEM = (BM + 2 * KV_BUFS * BN) * LD * 2;  // Q, then K and V buffers
  // blocks per SM the shared memory allows, at most what 128 registers a thread allow: the register bound ptxas is
  // given. The wide program: two (128 registers; without the bound 135 and one)
  static constexpr int MIN_BLOCKS = blocks_per_sm(SMEM, THREADS, 128);
};

// The scores half of folding one key block into the warp's rows: S = Q K^T, the online softmax update of m and l,
// P as bf16 A operands. MASKED: keys after a row's position are masked and rows the block lies wholly after keep
// their state; for a row that sees the whole block both variants do the same operations.
template <class C, int MI>
struct BlockP {
  uint32_t pa[MI][C::NJ / 2][4];
  float alpha[MI][2];
  bool active[MI][2];
};

template <class C, int MI, bool MASKED>
__device__ __forceinline__ void fwd_scores(const bf16* sQ, const bf16* sK, int wrow, int n0, const int (&pos)[MI][2],
                                           float (&m)[MI][2], float (&l)[MI][2], float scale, BlockP<C, MI>& bp) {
  float s[MI][C::NJ][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < C::NJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][j][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < C::KS; ++kk) {
    uint32_t qa[MI][4];
#pragma unroll
    for (int i = 0; i < MI; ++i) frag_a(qa[i], sQ, C::LD, wrow + 16 * i, 16 * kk);
#pragma unroll
    for (int jp = 0; jp < C::NJ / 2; ++jp) {
      uint32_t b[4];
      frag_b_kmaj(b, sK, C::LD, 16 * jp, 16 * kk);
#pragma unroll
      for (int i = 0; i < MI; ++i) mma_pair(s[i][2 * jp], s[i][2 * jp + 1], qa[i], b);
    }
  }

  fwd_softmax<C::NJ, MI, MASKED>(s, n0, pos, m, l, scale, bp.alpha, bp.active);
#pragma unroll
  for (int i = 0; i < MI; ++i) c_to_a<C::NJ>(bp.pa[i], s[i]);
}

// The P V half: acc = acc * alpha + P V; a row the block lies wholly after gets its accumulator back exactly.
template <class C, int MI, bool MASKED>
__device__ __forceinline__ void fwd_pv(const bf16* sV, const BlockP<C, MI>& bp, float (&acc)[MI][C::ND][4]) {
#pragma unroll
  for (int jp = 0; jp < C::ND / 2; ++jp) {
    float keep[MI][2][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int x = 0; x < 2; ++x)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          keep[i][x][e] = acc[i][2 * jp + x][e];
          acc[i][2 * jp + x][e] = __fmul_rn(acc[i][2 * jp + x][e], bp.alpha[i][e >> 1]);
        }
#pragma unroll
    for (int c = 0; c < C::NJ / 2; ++c) {
      uint32_t b[4];
      frag_b_nmaj(b, sV, C::LD, 16 * c, 16 * jp);
#pragma unroll
      for (int i = 0; i < MI; ++i) mma_pair(acc[i][2 * jp], acc[i][2 * jp + 1], bp.pa[i][c], b);
    }
    if (MASKED) {
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int x = 0; x < 2; ++x)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (!bp.active[i][e >> 1]) acc[i][2 * jp + x][e] = keep[i][x][e];
    }
  }
}

template <int DP, int WARPS, int MI, int CW, bool SPLIT>
__global__ void __launch_bounds__(FwdCfg<DP, WARPS, MI, CW, SPLIT>::THREADS,
                                  FwdCfg<DP, WARPS, MI, CW, SPLIT>::MIN_BLOCKS) fwd_kernel(FwdParams p) {
  using C = FwdCfg<DP, WARPS, MI, CW, SPLIT>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = sQ + C::BM * C::LD;
  bf16* sV = sK + C::KV_BUFS * C::BN * C::LD;

  const int64_t pid = blockIdx.x / p.n_hb;
  const int hb = static_cast<int>(blockIdx.x - pid * p.n_hb);
  const Program pr(p.progs, pid);
  const int pack = p.pack;
  const int64_t hk = (static_cast<int64_t>(hb) * pack) / p.G;
  const int64_t kv_tok = pr.kv_tok();
  const int pmax = static_cast<int>(pr.pmax());

  load_tile<C::BM, DP, C::THREADS>(sQ, [&](int r) -> const bf16* {
    const int t = r / pack;
    return t < pr.cnt ? p.q + ((pr.row0 + t) * p.HQ + hb * pack + (r - t * pack)) * p.D : nullptr;
  }, p.D, p.vec_q);
  auto load_keys = [&](bf16* dst, const bf16* base, int n0) {
    load_tile<C::BN, DP, C::THREADS>(dst, [=](int r) -> const bf16* {
      return key_row(base, n0 + r, pmax, kv_tok, p.HKV, hk, p.D);
    }, p.D, p.vec_kv);
  };

  const int warp = static_cast<int>(threadIdx.x >> 5);
  const bool rows_here = warp < CW;  // warp-uniform: the other warps only load
  const int wrow = rows_here ? warp * 16 * MI : 0;
  int pos[MI][2];
  fwd_positions<MI>(pr, pack, wrow, rows_here, pos);
  float m[MI][2], l[MI][2], acc[MI][C::ND][4];
#pragma unroll
  for (int i = 0; i < MI; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m[i][h] = -INFINITY;
      l[i][h] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < C::ND; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
  }

  const int nb = pmax / C::BN + 1;                       // blocks [0, nb) hold every key some row sees
  const int nb_full = (static_cast<int>(pr.pos0) + 1) / C::BN;  // blocks [0, nb_full) are seen whole by all rows
  BlockP<C, MI> bp;
  auto scores = [&](const bf16* k_s, int b) {
    if (!rows_here) return;
    if (b < nb_full) {
      fwd_scores<C, MI, false>(sQ, k_s, wrow, b * C::BN, pos, m, l, p.qk_scale, bp);
    } else {
      fwd_scores<C, MI, true>(sQ, k_s, wrow, b * C::BN, pos, m, l, p.qk_scale, bp);
    }
  };
  auto pv = [&](const bf16* v_s, int b) {
    if (!rows_here) return;
    if (b < nb_full) {
      fwd_pv<C, MI, false>(v_s, bp, acc);
    } else {
      fwd_pv<C, MI, true>(v_s, bp, acc);
    }
  };
  load_keys(sK, p.k, 0);  // block 0 of both (SPLIT: as two cp.async groups, K0 then V0)
  if constexpr (SPLIT) mma::cp_async_commit();
  load_keys(sV, p.v, 0);
  mma::cp_async_commit();
  key_block_loop<C::BN, SPLIT>(nb, C::BN * C::LD, sK, sV, p.k, p.v, load_keys, scores, pv);
  if (!rows_here) return;

  fwd_store<C::ND, MI>(p, pr, hb, wrow, pos, acc, m, l);
}

template <int DP, int WARPS, int MI, int CW, bool SPLIT>
int launch_fwd(const FwdParams& p, int64_t n_progs, cudaStream_t stream) {
  using C = FwdCfg<DP, WARPS, MI, CW, SPLIT>;
  if (n_progs == 0) return 0;
  const int64_t grid = n_progs * p.n_hb;
  if (grid > 2147483647LL) return static_cast<int>(cudaErrorInvalidConfiguration);
  constexpr auto kernel = fwd_kernel<DP, WARPS, MI, CW, SPLIT>;
  GS_TRY(dynamic_smem_once<kernel>(C::SMEM));
  kernel<<<static_cast<unsigned>(grid), C::THREADS, C::SMEM, stream>>>(p);
  return static_cast<int>(cudaGetLastError());
}

// The wide programs (on wgmma where `sm90`: Hopper, head_dim 65 .. 128), then the narrow ones.
template <int DP>
int launch_fwd_both(FwdParams p, const int32_t* wide, int64_t n_wide, const int32_t* narrow, int64_t n_narrow,
                    bool sm90, cudaStream_t stream) {
  p.progs = wide;
  int err = 0;
  if (sm90) {
#ifndef GS_NO_SM90_GEMM
    err = launch_fwd_sm90(p, n_wide, stream);
#endif
  } else {
    err = launch_fwd<DP, kFwdWarps, kFwdMI, kFwdWarps, false>(p, n_wide, stream);
  }
  if (err != 0) return err;
  p.progs = narrow;
  return launch_fwd<DP, kNarrowWarps, 1, 1, true>(p, n_narrow, stream);
}

// ---------------------------------------------------------------------------------------------- scatter
__global__ void scatter_kernel(const uint16_t* src_a, uint16_t* dst_a, const uint16_t* src_b, uint16_t* dst_b,
                               const int32_t* rows, const int32_t* toks, int64_t n, int64_t row_elems, bool vec) {
  const int64_t chunks = (row_elems + 7) / 8;
  const int64_t total = n * chunks;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / chunks;
    const int64_t c = i - r * chunks;
    const int64_t src = static_cast<int64_t>(rows[r]) * row_elems + 8 * c;
    const int64_t dst = static_cast<int64_t>(toks[r]) * row_elems + 8 * c;
    const int64_t len = row_elems - 8 * c < 8 ? row_elems - 8 * c : 8;
    for (int pair = 0; pair < (src_b != nullptr ? 2 : 1); ++pair) {
      const uint16_t* s = pair == 0 ? src_a : src_b;
      uint16_t* d = pair == 0 ? dst_a : dst_b;
      if (vec) {
        *reinterpret_cast<uint4*>(d + dst) = *reinterpret_cast<const uint4*>(s + src);
      } else {
        for (int64_t e = 0; e < len; ++e) d[dst + e] = s[src + e];
      }
    }
  }
}

}  // namespace attn

int64_t attn_rows(bool narrow, bool dq) {
  if (narrow) return attn::kNarrowRows;
  return dq ? attn::kWideWarps * 16 * attn::kDqMI : attn::kFwdWarps * 16 * attn::kFwdMI;
}
int64_t attn_block_n() { return attn::kBlockN; }
int64_t attn_fold_tile() { return attn::kFoldTile; }
int64_t attn_fold_keys() { return attn::kFoldWarps * 16; }
int64_t attn_max_head_dim() { return attn::kMaxHeadDim; }

int attn_fwd(uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t lse, uintptr_t wide, int64_t n_wide,
             uintptr_t narrow, int64_t n_narrow, int64_t pack, int64_t HQ, int64_t HKV, int64_t D, int64_t T,
             float qk_scale, int device, uintptr_t stream, int path) {
  if (n_wide + n_narrow == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  attn::FwdParams p{};
  attn::set_row_params(p, q, k, v, pack, HQ, HKV, D, T, qk_scale);
  p.o = reinterpret_cast<bf16*>(o);
  p.lse = reinterpret_cast<float*>(lse);
  p.pair_o = D % 2 == 0 && (o & 3u) == 0;
  bool sm90 = false;
  GS_TRY(attn::wide_on_sm90(D, path, device, sm90));
  return attn::by_head_dim(D, sm90, [&](auto dp, bool wgmma) {
    return attn::launch_fwd_both<decltype(dp)::value>(p, reinterpret_cast<const int32_t*>(wide), n_wide,
                                                      reinterpret_cast<const int32_t*>(narrow), n_narrow, wgmma,
                                                      reinterpret_cast<cudaStream_t>(stream));
  });
}

int attn_scatter(uintptr_t src_a, uintptr_t dst_a, uintptr_t src_b, uintptr_t dst_b, uintptr_t rows,
                 uintptr_t toks, int64_t n, int64_t row_elems, int device, uintptr_t stream) {
  if (n == 0 || row_elems == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const bool vec = row_elems % 8 == 0 && aligned16(reinterpret_cast<void*>(src_a)) &&
                   aligned16(reinterpret_cast<void*>(dst_a)) && aligned16(reinterpret_cast<void*>(src_b)) &&
                   aligned16(reinterpret_cast<void*>(dst_b));
  const int64_t work = n * ((row_elems + 7) / 8);
  const int64_t blocks = (work + 255) / 256 < 65536 ? (work + 255) / 256 : 65536;
  attn::scatter_kernel<<<static_cast<unsigned>(blocks), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const uint16_t*>(src_a), reinterpret_cast<uint16_t*>(dst_a),
      reinterpret_cast<const uint16_t*>(src_b), reinterpret_cast<uint16_t*>(dst_b),
      reinterpret_cast<const int32_t*>(rows), reinterpret_cast<const int32_t*>(toks), n, row_elems, vec);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gs
