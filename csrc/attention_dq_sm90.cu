// The wide attention dQ on Hopper tensor cores (sm_90a): dq_kernel's wide program (attention_dq.cu, 64 rows on 4
// warps) as one warpgroup issuing warpgroup MMAs, for head_dim 65 .. 128.
//
// Why: after the forward moved to wgmma (attention_fwd_sm90.cu), dQ is the CUDA family's largest attention kernel
// (kernel census of 2026-12-06 at 2 x 8192, GQA 32 / 8 x 128, causal: 7.27 ms against the Triton family's 3.50 ms).
// Per key block each of the mma.sync program's warps issues 96 mma.sync plus the ldmatrix loads of Q, dO, K (twice)
// and V; here the warpgroup issues 20 wgmma and no fragment loads.
//
// Why the bits are dq_kernel's: the programs, their rows on each warp, their key blocks (kBlockN keys from position
// 0) and the loop order are the same; an S or dP element receives head_dim's eight k16 steps in order from zero, a dQ
// element the block's four key k16 steps in order on top of the previous blocks', and wgmma's FP32 accumulation of a
// k16 step equals mma.sync's (the forward, the GEMM fold and the dK / dV fold showed it; the GPU test compares this
// kernel's dq and delta bits with dq_kernel's). The element work (p, dS, the exact delta's sums), the rows' state,
// the kept dq of rows a block lies wholly after and the store are attention_dq.cuh's, on the same accumulator
// layout. So which kernel runs is a speed choice made by head_dim and the GPU, never by a layout.
//
// Shared memory: the program's Q and dO tiles (64 rows each, by cp.async, once), lse and delta_o per row, and
// kStages stages of one K and one V block (64 keys), each a 128-byte-swizzled tile (attention_sm90.cuh). A whole
// block of written keys comes by TMA (one thread, two boxes a tensor, completing on the stage's barrier: the
// forward's measured lesson), the block holding the program's last row by cp.async with zero rows past it. Per
// block: dP = dO V^T and S = Q K^T (m64n64k16 x 8 each, from shared memory) in one batch, the element work in
// registers, then dq += dS K (m64n128k16 x 4, dS from registers, K read MN-major from its K-major tile).
#include <cstdint>
#include <utility>

#include "attention_dq.cuh"
#include "attention_sm90.cuh"

namespace gs {
namespace attn {
namespace {

namespace gmma = cute::SM90::GMMA;
using sm90::fence_regs;
using sm90::kDP;
using sm90::kmajor;
using sm90::mnmajor;

constexpr int kBM = kWideWarps * 16 * kDqMI;  // 64 rows: dq_kernel's wide program, one warpgroup's m64
constexpr int kBN = kBlockN;                  // 64 keys a block
constexpr int kThreads = kWideWarps * 32;     // one warpgroup
constexpr int kStages = 2;
constexpr int kNJ = kBN / 8, kND = kDP / 8, kKS = kDP / 16;
constexpr int kTileBytes = kBM * kDP * 2;
using Blocks = sm90::KeyBlocks<kBN, kStages, kThreads>;
// + alignment slack; Q, dO, the key blocks' stages and barriers, lse and delta_o: 98 KB, two programs an SM
constexpr int kSmem = 1024 + 2 * kTileBytes + Blocks::kSmem + 2 * kBM * 4;
static_assert(kWideWarps == 4 && kDqMI == 1 && kBN == 64 && kDP == 128, "the wgmma shapes below assume these");

template <size_t... I>
__device__ __forceinline__ void wgmma_s(uint64_t a, uint64_t b, float (&d)[kNJ][4], std::index_sequence<I...>) {
  gmma::MMA_64x64x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>::fma(a, b, d[I / 4][I % 4]...,
                                                                       gmma::ScaleOut::One);
}
template <size_t... I>
__device__ __forceinline__ void wgmma_dq(const uint32_t (&a)[4], uint64_t b, float (&d)[kND][4],
                                         std::index_sequence<I...>) {
  gmma::MMA_64x128x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::MN>::fma(a[0], a[1], a[2], a[3], b,
                                                                         d[I / 4][I % 4]..., gmma::ScaleOut::One);
}

// One key block (keys n0 ..) into the program's 64 rows: dq_kernel's row_products (dP, S) and dq_block_k.
template <bool MASKED>
__device__ __forceinline__ void block_step(const unsigned char* q_s, const unsigned char* o_s,
                                           const unsigned char* k_s, const unsigned char* v_s, int n0,
                                           const int (&pos)[1][2], const float (&lse)[1][2],
                                           const float (&del)[1][2], float (&dsum)[1][2], float (&dq)[1][kND][4],
                                           float scale, bool exact) {
  float s[1][kNJ][4], dp[1][kNJ][4];
#pragma unroll
  for (int j = 0; j < kNJ; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[0][j][e] = 0.0f;
      dp[0][j][e] = 0.0f;
    }
  fence_regs(s[0]);
  fence_regs(dp[0]);
  cute::warpgroup_arrive();
#pragma unroll
  for (int kk = 0; kk < kKS; ++kk)
    wgmma_s(kmajor<kBM>(o_s, kk), kmajor<kBN>(v_s, kk), dp[0], std::make_index_sequence<kNJ * 4>{});
#pragma unroll
  for (int kk = 0; kk < kKS; ++kk)
    wgmma_s(kmajor<kBM>(q_s, kk), kmajor<kBN>(k_s, kk), s[0], std::make_index_sequence<kNJ * 4>{});
  cute::warpgroup_commit_batch();
  cute::warpgroup_wait<0>();
  fence_regs(s[0]);
  fence_regs(dp[0]);

  bool active[1][2];
  dq_elements<kNJ, 1, MASKED>(s, dp, n0, pos, lse, del, dsum, scale, exact, active);
  uint32_t da[kNJ / 2][4];
  c_to_a<kNJ>(da, s[0]);

  float keep[MASKED ? kND : 1][4];  // a row the block lies wholly after gets its dq back exactly
  if constexpr (MASKED) {
#pragma unroll
    for (int j = 0; j < kND; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) keep[j][e] = dq[0][j][e];
  }
  fence_regs(dq[0]);
  cute::warpgroup_arrive();
#pragma unroll
  for (int c = 0; c < kNJ / 2; ++c)
    wgmma_dq(da[c], mnmajor<kBN>(k_s, c), dq[0], std::make_index_sequence<kND * 4>{});
  cute::warpgroup_commit_batch();
  cute::warpgroup_wait<0>();
  fence_regs(dq[0]);
  if constexpr (MASKED) {
#pragma unroll
    for (int j = 0; j < kND; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (!active[0][e >> 1]) dq[0][j][e] = keep[j][e];
  }
}

__global__ void __launch_bounds__(kThreads, 2) dq_sm90_kernel(DqParams p, bool tma,
                                                              const __grid_constant__ CUtensorMap tma_k,
                                                              const __grid_constant__ CUtensorMap tma_v) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* sQ = sm90::align1024(smem_raw);
  unsigned char* sO = sQ + kTileBytes;      // dO
  unsigned char* blocks = sO + kTileBytes;  // the key blocks' stages (1024-byte-aligned tiles), their barriers
  float* sLse = reinterpret_cast<float*>(blocks + Blocks::kSmem);
  float* sDel = sLse + kBM;

  const int64_t pid = blockIdx.x / p.n_hb;
  const int hb = static_cast<int>(blockIdx.x - pid * p.n_hb);
  const Program pr(p.progs, pid);
  const int pack = p.pack;
  const int64_t hk = (static_cast<int64_t>(hb) * pack) / p.G;
  const int64_t kv_tok = pr.kv_tok();
  const int pmax = static_cast<int>(pr.pmax());

  sm90::load_sw128<kBM, kThreads>(sQ, [&](int r) -> const bf16* {
    const int64_t off = dq_row_offset(p, pr, hb, r);
    return off >= 0 ? p.q + off : nullptr;
  }, p.D, p.vec_q);
  sm90::load_sw128<kBM, kThreads>(sO, [&](int r) -> const bf16* {
    const int64_t off = dq_row_offset(p, pr, hb, r);
    return off >= 0 ? p.dout + off : nullptr;
  }, p.D, p.vec_o);
  const Blocks kb{blocks, &tma_k, &tma_v, tma, p.k, p.v, kv_tok, hk, p.HKV, p.D, pmax, p.vec_kv};
  if (threadIdx.x == 0) kb.init();
  __syncthreads();  // the stages' barriers initialised

  const int nb = pmax / kBN + 1;                                 // blocks [0, nb) hold every key some row sees
  const int nb_full = (static_cast<int>(pr.pos0) + 1) / kBN;  // blocks [0, nb_full) are seen whole by all rows
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {  // Q and dO join block 0's group
    if (st < nb) kb.load(st, st);
    mma::cp_async_commit();
  }
  dq_row_stats<kBM, kThreads>(p, pr, hb, sLse, sDel);
  __syncthreads();

  const int wrow = static_cast<int>(threadIdx.x >> 5) * 16;  // dq_kernel's rows of this warp
  int pos[1][2];
  float lse[1][2], del[1][2], dsum[1][2], dq[1][kND][4];
  dq_row_state<kND, 1>(pr, pack, wrow, sLse, sDel, pos, lse, del, dsum, dq);

  for (int b = 0; b < nb; ++b) {
    kb.wait(b);
    __syncthreads();  // block b is in shared memory; every warp is done with block b - 1 (its stage is free)
    if (b + kStages - 1 < nb) kb.load((b + kStages - 1) % kStages, b + kStages - 1);
    mma::cp_async_commit();
    const int st = b % kStages;
    const unsigned char* k_s = kb.k_stage(st);
    const unsigned char* v_s = kb.v_stage(st);
    if (b < nb_full) {
      block_step<false>(sQ, sO, k_s, v_s, b * kBN, pos, lse, del, dsum, dq, p.qk_scale, p.exact);
    } else {
      block_step<true>(sQ, sO, k_s, v_s, b * kBN, pos, lse, del, dsum, dq, p.qk_scale, p.exact);
    }
  }
  dq_store<kND, 1>(p, pr, hb, wrow, pos, dq, dsum, del);
}

}  // namespace

int launch_dq_sm90(const DqParams& p, int64_t n_progs, cudaStream_t stream) {
  if (n_progs == 0) return 0;
  const int64_t grid = n_progs * p.n_hb;
  if (grid > 2147483647LL) return static_cast<int>(cudaErrorInvalidConfiguration);
  GS_TRY(dynamic_smem_once<dq_sm90_kernel>(kSmem));
  CUtensorMap tma_k{}, tma_v{};
  const bool tma = sm90::encode_kv(&tma_k, &tma_v, p.k, p.v, p.T, p.HKV, p.D, kBN);  // the stores: [T, HKV, D]
  dq_sm90_kernel<<<static_cast<unsigned>(grid), kThreads, kSmem, stream>>>(p, tma, tma_k, tma_v);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace attn
}  // namespace gs
