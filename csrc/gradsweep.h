// Host-side launchers of the gradsweep CUDA family, shared by the .cu files and bindings.cpp.
//
// Why plain integers: the extension is not a torch extension (CPU-only torch on the build machines cannot
// link CUDA), so tensors cross as raw device addresses (tensor.data_ptr()), sizes, the device index and
// the CUDA stream handle (torch.cuda.current_stream().cuda_stream). Every launcher returns the
// cudaError_t of its CUDA calls as an int (0 = success); bindings.cpp turns non-zero into RuntimeError.
// This header includes no CUDA header, so bindings.cpp builds with the host compiler alone.
#pragma once

#include <cstdint>
#include <string>

namespace gs {

// Largest hidden size of the row-wise RMSNorm kernels (4 chunks of 8 per thread, 1024 threads).
constexpr int64_t kRmsMaxHidden = 32768;
// Largest head_dim of RoPE (cos/sin table of head_dim/2 floats each in shared memory).
constexpr int64_t kRopeMaxHeadDim = 8192;
// Vocabulary columns per CTA of the fused linear_logp forward (a constant: a row's log-sum-exp order follows it).
constexpr int64_t kLlpVChunk = 2048;

// An error code of this value plus a CUresult: the driver would not encode a TMA descriptor of a Hopper GEMM or
// dW fold, and nothing was launched (tensor_map.cuh, gemm_sm90.cuh, gemm_fold_sm90.cu); error_string names it.
constexpr int kTmaEncodeError = 1 << 20;

// runtime.cu
void fail_next_tma_encodes(int n);  // tests only: the next n TMA descriptor encodes fail (tensor_map.cuh)
int device_count(int* count);  // never throws: cudaGetDeviceCount's error code
int device_info(int device, std::string* name, int* major, int* minor, int* sm_count);
int runtime_version(int* version);
int driver_version(int* version);
std::string error_string(int code);  // "cudaErrorX (N): description" (or the TMA encode failure)
std::string build_arch_list();       // __CUDA_ARCH_LIST__ as compiled

// rms_norm.cu
// warp_rows: -1 picks the path (one warp per row for hidden <= 256), 0 / 1 force it (tests compare the bits).
int rms_norm_fwd(uintptr_t x, uintptr_t w, uintptr_t y, uintptr_t rstd, int64_t rows, int64_t hidden,
                 float eps, int device, uintptr_t stream, int warp_rows = -1);
int rms_norm_bwd_dx(uintptr_t dy, uintptr_t x, uintptr_t w, uintptr_t rstd, uintptr_t dx, int64_t rows,
                    int64_t hidden, int device, uintptr_t stream, int warp_rows = -1);
// dw_tiles / dw_fold: the plan indexes the fold's row space (common.cuh, FoldRows): rows [0, n_stage) of the
// stage_* tensors (carried rows, read in place), then the call's dy / x / rstd (n_stage 0: the call's alone).
int rms_norm_dw_tiles(uintptr_t plan, int64_t n_tiles, int64_t tile, uintptr_t dy, uintptr_t x,
                      uintptr_t rstd, uintptr_t partial, int64_t hidden, int device, uintptr_t stream,
                      uintptr_t stage_dy = 0, uintptr_t stage_x = 0, uintptr_t stage_rstd = 0, int64_t n_stage = 0);
int fold_tiles(uintptr_t partial, int64_t n_tiles, uintptr_t main_grad, int64_t cols, int device,
               uintptr_t stream);

// pointwise.cu
int silu_fwd(uintptr_t x, uintptr_t y, int64_t n, int device, uintptr_t stream);
int silu_bwd(uintptr_t x, uintptr_t dy, uintptr_t dx, int64_t n, int device, uintptr_t stream);
int swiglu_fwd(uintptr_t gate, uintptr_t up, uintptr_t y, int64_t n, int device, uintptr_t stream);
int swiglu_bwd(uintptr_t gate, uintptr_t up, uintptr_t dy, uintptr_t dgate, uintptr_t dup, int64_t n,
               int device, uintptr_t stream);
int rope(uintptr_t x, uintptr_t positions, uintptr_t y, int64_t rows, int64_t heads, int64_t head_dim,
         float theta, bool inverse, int device, uintptr_t stream);

// qk_norm.cu (forward and dx are rms_norm's kernels on [R * heads, head_dim])
int qk_norm_dw_tiles(uintptr_t plan, int64_t n_tiles, int64_t tile, uintptr_t dy, uintptr_t x, uintptr_t rstd,
                     uintptr_t partial, int64_t heads, int64_t head_dim, int device, uintptr_t stream,
                     uintptr_t stage_dy = 0, uintptr_t stage_x = 0, uintptr_t stage_rstd = 0, int64_t n_stage = 0);

// gather.cu
int embedding_fwd(uintptr_t ids, uintptr_t weight, uintptr_t y, int64_t rows, int64_t V, int64_t H, int device,
                  uintptr_t stream);
int embedding_fold(uintptr_t sorted_ids, uintptr_t src, int64_t n, uintptr_t dy, uintptr_t main_grad, int64_t V,
                   int64_t H, int device, uintptr_t stream);
int pack_rows(uintptr_t src, uintptr_t dst, uintptr_t meta, int64_t n_samples, int64_t max_len, int64_t H,
              bool unpack, int device, uintptr_t stream);
int copy_pieces(uintptr_t pieces, uintptr_t src, uintptr_t dst, int64_t n_pieces, int64_t longest,
                int64_t src_stride_bytes, int64_t row_bytes, int device, uintptr_t stream);

// logp.cu
int logp_fwd(uintptr_t logits, uintptr_t targets, uintptr_t out, uintptr_t lse, int64_t R, int64_t V, int64_t ld,
             int device, uintptr_t stream);
int logp_bwd(uintptr_t logits, uintptr_t targets, uintptr_t lse, uintptr_t g, uintptr_t d, int64_t R, int64_t V,
             int64_t ld, int64_t ldd, int device, uintptr_t stream);

// gemm.cu (tensor-core mainloop of mma_gemm.cuh; on a CC 9.0 device the CUTLASS kernels of gemm_sm90.cuh).
// path: kGemmAuto picks the Hopper kernels wherever they apply (sm90_gemm_applies), kGemmPortable forces the
// mma.sync kernels, kGemmSm90 requires the Hopper kernels (cudaErrorNotSupported where they do not apply).
// The two paths give the same bits (one chain of 16-wide k steps); the choice is speed and test coverage.
constexpr int kGemmAuto = 0, kGemmPortable = 1, kGemmSm90 = 2;
// gemm_nn's output: bf16 C = AB; fp32 C = the chain of AB's k steps started FROM C (the fold's rule; mma.sync
// only); fp32 C = C + AB, AB's chain from zero, one rounding (sums of GEMMs, e.g. linear_logp's dhidden).
constexpr int kNnBf16 = 0, kNnF32Chain = 1, kNnF32Add = 2;
bool sm90_gemm_built();
// Built with the Hopper kernels and a CC 9.0 device (the sm_90a image).
bool hopper_gemm(int device);
// Which kernels a GEMM-shaped launch runs: 1 = the Hopper kernels, 0 = mma.sync, < 0 = -(error code) where
// `path` is kGemmSm90 and they do not apply. `aligned`: every operand and output 16-byte aligned with leading
// dimensions of whole 16-byte chunks (TMA's rules).
int gemm_path(int path, bool aligned, int64_t M, int64_t N, int64_t K, int device);
int gemm_nt(uintptr_t a, uintptr_t b, uintptr_t c, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
            int64_t ldc, int device, uintptr_t stream, int path = kGemmAuto);
int gemm_nn(uintptr_t a, uintptr_t b, uintptr_t c, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
            int64_t ldc, int out, int device, uintptr_t stream, int path = kGemmAuto);
// gemm_nt_sm90.cu / gemm_nn_sm90.cu (CUTLASS; absent from a build without the nvidia-cutlass headers)
int gemm_sm90_nt(uintptr_t a, uintptr_t b, uintptr_t c, int64_t M, int64_t N, int64_t K, int64_t lda,
                 int64_t ldb, int64_t ldc, int device, uintptr_t stream);
int gemm_sm90_nn(uintptr_t a, uintptr_t b, uintptr_t c, int64_t M, int64_t N, int64_t K, int64_t lda,
                 int64_t ldb, int64_t ldc, int device, uintptr_t stream);
// (stage_dy [n_stage, N] and stage_x [n_stage, K] with leading dimensions stage_ldy / stage_ldx: the carried rows)
int gemm_dw_fold(uintptr_t plan, int64_t n_tiles, int64_t tile, uintptr_t dy, uintptr_t x, uintptr_t grad,
                 int64_t rows, int64_t N, int64_t K, int64_t ldy, int64_t ldx, int64_t ldg, int device,
                 uintptr_t stream, int path = kGemmAuto, uintptr_t stage_dy = 0, uintptr_t stage_x = 0,
                 int64_t n_stage = 0, int64_t stage_ldy = 0, int64_t stage_ldx = 0);
// llp_sm90.cu (CUTLASS, fp32 out: D = the accumulator; linear_logp's logits on Hopper)
int gemm_sm90_nt_f32(uintptr_t a, uintptr_t b, uintptr_t c, int64_t M, int64_t N, int64_t K, int64_t lda,
                     int64_t ldb, int64_t ldc, int device, uintptr_t stream);
// ... and C (fp32) += A B with B N-major (beta = 1: gemm_nn's kNnF32Add)
int gemm_sm90_nn_f32_add(uintptr_t a, uintptr_t b, uintptr_t c, int64_t M, int64_t N, int64_t K, int64_t lda,
                         int64_t ldb, int64_t ldc, int device, uintptr_t stream);
// gemm_fold_sm90.cu (CuTe wgmma; T = n_tiles * tile token slots; on the current device: gemm_dw_fold's guard set it)
int gemm_sm90_dw_fold(uintptr_t plan, int64_t T, uintptr_t dy, uintptr_t x, uintptr_t grad, int64_t rows,
                      int64_t N, int64_t K, int64_t ldy, int64_t ldx, int64_t ldg, uintptr_t stream,
                      uintptr_t stage_dy = 0, uintptr_t stage_x = 0, int64_t n_stage = 0, int64_t stage_ldy = 0,
                      int64_t stage_ldx = 0);

// linear_logp.cu (part: fp32 scratch of 3 * ceil(V / kLlpVChunk) * R floats). On Hopper the logits go through
// `logits`, an fp32 scratch of R x ldl (llp_forward: ldl a positive multiple of kLlpVChunk, the vocabulary
// slab of one GEMM; llp_dlogits: ldl >= N) that the CUTLASS GEMM writes and a row-local kernel reads; 0 = no
// scratch (the mma.sync kernels, which reduce in registers). path as for the GEMMs; the bits are the same.
int llp_forward(uintptr_t hidden, uintptr_t weight, uintptr_t targets, uintptr_t part, uintptr_t out, uintptr_t lse,
                int64_t R, int64_t V, int64_t K, int64_t ldh, int64_t ldw, uintptr_t logits, int64_t ldl, int device,
                uintptr_t stream, int path = kGemmAuto);
int llp_dlogits(uintptr_t hidden, uintptr_t weight, uintptr_t targets, uintptr_t lse, uintptr_t g, uintptr_t d,
                int64_t M, int64_t N, int64_t K, int64_t v0, int64_t V, int64_t ldh, int64_t ldw, int64_t ldd,
                uintptr_t logits, int64_t ldl, int device, uintptr_t stream, int path = kGemmAuto);

}  // namespace gs
