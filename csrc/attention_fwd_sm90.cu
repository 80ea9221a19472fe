// The wide attention forward on Hopper tensor cores (sm_90a): fwd_kernel's wide program (attention_fwd.cu, 128
// rows on 8 warps) with its products issued as warpgroup MMAs, for head_dim 65 .. 128.
//
// Why: the mma.sync forward is twice the Triton family's on the same H100 (kernel census of 2026-12-06 at 2 x 8192,
// GQA 32 / 8 x 128, causal: 4.72 ms against 2.28 ms, bench/results/resign_2026-12-06b_h100/): per key block each
// warp issues 64 mma.sync plus the ldmatrix fragment loads of Q, K and V; here a warpgroup issues 12 wgmma and no
// fragment loads.
//
// Why the bits are fwd_kernel's: the programs, their rows on each warp, their key blocks (kBlockN keys from
// position 0) and the loop order are the same; a score element receives head_dim's eight k16 steps in order from
// zero, an output element acc * alpha then the block's four key k16 steps in order, and wgmma's FP32 accumulation
// of a k16 step equals mma.sync's (the GEMM fold and the dK / dV fold showed it; the GPU test compares this kernel's
// bits with fwd_kernel's on every program shape). The softmax, the masks, the kept state of rows a block lies wholly
// after and the store are attention_fwd.cuh's, on the same accumulator layout. So which kernel runs is a speed
// choice made by head_dim and the GPU, never by a layout.
//
// Shared memory: the program's Q tile (128 rows, by cp.async, once) and kStages stages of one K and one V block (64
// keys), each a 128-byte-swizzled tile (attention_sm90.cuh). A whole block of written keys comes by TMA (one thread
// issues two boxes a tensor that complete on the stage's barrier); the block holding the program's last row by
// cp.async with zero rows past it (a KV cache's unwritten slots are never read): the same bytes either way. The
// first version loaded every block by cp.async and ran no faster than mma.sync (2 x 8192: 4.65 against 4.45 ms;
// notes/kernels_cuda.md, thirty-third session): 256 threads issuing 32 KB a block was the bound, as in the dK / dV
// fold. Two warpgroups of 64 rows each: S = Q K^T (m64n64k16 x 8, both operands from shared memory), the softmax
// in registers, then acc = acc * alpha + P V (m64n128k16 x 4, P from registers, V read MN-major from its K-major
// tile).
#include <cstdint>
#include <utility>

#include "attention_fwd.cuh"
#include "attention_sm90.cuh"

namespace gs {
namespace attn {
namespace {

namespace gmma = cute::SM90::GMMA;
using sm90::fence_regs;
using sm90::kDP;
using sm90::kmajor;
using sm90::mnmajor;

constexpr int kBM = kFwdWarps * 16 * kFwdMI;  // 128 rows: fwd_kernel's wide program
constexpr int kBN = kBlockN;                  // 64 keys a block
constexpr int kThreads = kFwdWarps * 32;      // two warpgroups
constexpr int kStages = 3;
constexpr int kNJ = kBN / 8, kND = kDP / 8, kKS = kDP / 16;
constexpr int kQBytes = kBM * kDP * 2;
using Blocks = sm90::KeyBlocks<kBN, kStages, kThreads>;
constexpr int kSmem = 1024 + kQBytes + Blocks::kSmem;  // + alignment slack; Q, then the key blocks' stages
static_assert(kFwdWarps == 8 && kFwdMI == 1 && kBN == 64 && kDP == 128, "the wgmma shapes below assume these");

template <size_t... I>
__device__ __forceinline__ void wgmma_s(uint64_t a, uint64_t b, float (&d)[kNJ][4], std::index_sequence<I...>) {
  gmma::MMA_64x64x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>::fma(a, b, d[I / 4][I % 4]...,
                                                                       gmma::ScaleOut::One);
}
template <size_t... I>
__device__ __forceinline__ void wgmma_pv(const uint32_t (&a)[4], uint64_t b, float (&d)[kND][4],
                                         std::index_sequence<I...>) {
  gmma::MMA_64x128x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::MN>::fma(a[0], a[1], a[2], a[3], b,
                                                                         d[I / 4][I % 4]..., gmma::ScaleOut::One);
}

// One key block (keys n0 ..) folded into this warpgroup's 64 rows: fwd_kernel's fwd_scores and fwd_pv.
template <bool MASKED>
__device__ __forceinline__ void block_step(const unsigned char* q_wg, const unsigned char* k_s,
                                           const unsigned char* v_s, int n0, const int (&pos)[1][2],
                                           float (&m)[1][2], float (&l)[1][2], float (&acc)[1][kND][4],
                                           float scale) {
  float s[1][kNJ][4];
#pragma unroll
  for (int j = 0; j < kNJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[0][j][e] = 0.0f;
  fence_regs(s[0]);
  cute::warpgroup_arrive();
#pragma unroll
  for (int kk = 0; kk < kKS; ++kk)
    wgmma_s(kmajor<kBM>(q_wg, kk), kmajor<kBN>(k_s, kk), s[0], std::make_index_sequence<kNJ * 4>{});
  cute::warpgroup_commit_batch();
  cute::warpgroup_wait<0>();
  fence_regs(s[0]);

  float alpha[1][2];
  bool active[1][2];
  fwd_softmax<kNJ, 1, MASKED>(s, n0, pos, m, l, scale, alpha, active);
  uint32_t pa[kNJ / 2][4];
  c_to_a<kNJ>(pa, s[0]);

  float keep[MASKED ? kND : 1][4];  // a row the block lies wholly after gets its accumulator back exactly
#pragma unroll
  for (int j = 0; j < kND; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (MASKED) keep[j][e] = acc[0][j][e];
      acc[0][j][e] = __fmul_rn(acc[0][j][e], alpha[0][e >> 1]);
    }
  fence_regs(acc[0]);
  cute::warpgroup_arrive();
#pragma unroll
  for (int c = 0; c < kNJ / 2; ++c)
    wgmma_pv(pa[c], mnmajor<kBN>(v_s, c), acc[0], std::make_index_sequence<kND * 4>{});
  cute::warpgroup_commit_batch();
  cute::warpgroup_wait<0>();
  fence_regs(acc[0]);
  if constexpr (MASKED) {
#pragma unroll
    for (int j = 0; j < kND; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (!active[0][e >> 1]) acc[0][j][e] = keep[j][e];
  }
}

__global__ void __launch_bounds__(kThreads, 1) fwd_sm90_kernel(FwdParams p, bool tma,
                                                               const __grid_constant__ CUtensorMap tma_k,
                                                               const __grid_constant__ CUtensorMap tma_v) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* sQ = sm90::align1024(smem_raw);
  const int64_t pid = blockIdx.x / p.n_hb;
  const int hb = static_cast<int>(blockIdx.x - pid * p.n_hb);
  const Program pr(p.progs, pid);
  const int pack = p.pack;
  const int64_t hk = (static_cast<int64_t>(hb) * pack) / p.G;
  const int64_t kv_tok = pr.kv_tok();
  const int pmax = static_cast<int>(pr.pmax());

  sm90::load_sw128<kBM, kThreads>(sQ, [&](int r) -> const bf16* {
    const int t = r / pack;
    return t < pr.cnt ? p.q + ((pr.row0 + t) * p.HQ + hb * pack + (r - t * pack)) * p.D : nullptr;
  }, p.D, p.vec_q);
  const Blocks kb{sQ + kQBytes, &tma_k, &tma_v, tma, p.k, p.v, kv_tok, hk, p.HKV, p.D, pmax, p.vec_kv};
  if (threadIdx.x == 0) kb.init();

  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int wrow = warp * 16;                                // fwd_kernel's rows of this warp
  const unsigned char* q_wg = sQ + (warp >> 2) * 64 * 128;  // this warpgroup's 64 rows of the Q tile
  int pos[1][2];
  fwd_positions<1>(pr, pack, wrow, true, pos);
  float m[1][2] = {{-INFINITY, -INFINITY}}, l[1][2] = {{0.0f, 0.0f}}, acc[1][kND][4];
#pragma unroll
  for (int j = 0; j < kND; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][j][e] = 0.0f;

  const int nb = pmax / kBN + 1;                                 // blocks [0, nb) hold every key some row sees
  const int nb_full = (static_cast<int>(pr.pos0) + 1) / kBN;  // blocks [0, nb_full) are seen whole by all rows
  __syncthreads();  // the stages' barriers initialised
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {  // Q joins block 0's group
    if (st < nb) kb.load(st, st);
    mma::cp_async_commit();
  }
  for (int b = 0; b < nb; ++b) {
    kb.wait(b);
    __syncthreads();  // block b is in shared memory; every warp is done with block b - 1 (its stage is free)
    if (b + kStages - 1 < nb) kb.load((b + kStages - 1) % kStages, b + kStages - 1);
    mma::cp_async_commit();
    const int st = b % kStages;
    if (b < nb_full) {
      block_step<false>(q_wg, kb.k_stage(st), kb.v_stage(st), b * kBN, pos, m, l, acc, p.qk_scale);
    } else {
      block_step<true>(q_wg, kb.k_stage(st), kb.v_stage(st), b * kBN, pos, m, l, acc, p.qk_scale);
    }
  }
  fwd_store<kND, 1>(p, pr, hb, wrow, pos, acc, m, l);
}

}  // namespace

int launch_fwd_sm90(const FwdParams& p, int64_t n_progs, cudaStream_t stream) {
  if (n_progs == 0) return 0;
  const int64_t grid = n_progs * p.n_hb;
  if (grid > 2147483647LL) return static_cast<int>(cudaErrorInvalidConfiguration);
  GS_TRY(dynamic_smem_once<fwd_sm90_kernel>(kSmem));
  CUtensorMap tma_k{}, tma_v{};
  const bool tma = sm90::encode_kv(&tma_k, &tma_v, p.k, p.v, p.T, p.HKV, p.D, kBN);  // the stores: [T, HKV, D]
  fwd_sm90_kernel<<<static_cast<unsigned>(grid), kThreads, kSmem, stream>>>(p, tma, tma_k, tma_v);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace attn
}  // namespace gs
