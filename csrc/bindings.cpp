// pybind11 module gradsweep._C: thin checked wrappers over the launchers of gradsweep.h.
//
// Built by the host compiler (no CUDA header needed). Argument errors raise ValueError; a CUDA error from
// a launch raises RuntimeError carrying the CUDA error name and text.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "gradsweep.h"

namespace py = pybind11;

void bind_attention_rl(py::module_& m);  // bindings_attention_rl.cpp: attention and RL launchers

namespace {

void check(int code, const char* what) {
  if (code != 0) throw std::runtime_error(std::string("gradsweep._C.") + what + ": " + gs::error_string(code));
}

void require(bool ok, const std::string& msg) {
  if (!ok) throw py::value_error(msg);
}

constexpr int64_t kMaxGrid = 2147483647;  // gridDim.x limit

void check_rows(int64_t rows, const char* what) {
  require(rows >= 0 && rows <= kMaxGrid, std::string(what) + ": rows must be in [0, 2^31-1]");
}

// The carried rows of a fold (n_stage of them, read in place through the stage_* bases): a base for each row
// tensor whenever any row is carried (0 bases and n_stage 0: the call's rows alone).
void check_stage(int64_t n_stage, std::initializer_list<uintptr_t> bases, const char* what) {
  require(n_stage >= 0 && n_stage <= kMaxGrid, std::string(what) + ": n_stage must be in [0, 2^31-1]");
  if (n_stage == 0) return;
  for (const uintptr_t b : bases) {
    require(b != 0, std::string(what) + ": n_stage > 0 needs every stage_* base (the carried rows' tensors)");
  }
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "gradsweep CUDA kernels (raw device pointers, sizes, device index, stream handle)";

  m.def("device_count", []() {
    int count = 0;
    const int err = gs::device_count(&count);
    return py::make_tuple(err, count);
  }, "(cudaError code, device count); never raises");
  m.def("device_info", [](int device) {
    std::string name;
    int major = 0, minor = 0, sms = 0;
    check(gs::device_info(device, &name, &major, &minor, &sms), "device_info");
    return py::make_tuple(name, major, minor, sms);
  }, py::arg("device"), "(name, major, minor, multiprocessor count)");
  m.def("error_string", &gs::error_string, py::arg("code"));
  m.def("tma_encode_error", []() { return gs::kTmaEncodeError; });
  m.def("_fail_next_tma_encodes", &gs::fail_next_tma_encodes, py::arg("n"),
        "tests only: the next n TMA descriptor encodes fail (the GEMM must refuse to launch)");
  m.def("build_info", []() {
    py::dict d;
    int rt = 0, drv = 0;
    d["cudart_version"] = gs::runtime_version(&rt) == 0 ? rt : -1;
    d["driver_version"] = gs::driver_version(&drv) == 0 ? drv : -1;
    d["arch_list"] = gs::build_arch_list();
#ifdef GS_BUILD_FLAGS
    d["nvcc_flags"] = GS_BUILD_FLAGS;
#endif
#ifdef GS_TOOLCHAIN
    d["toolchain"] = GS_TOOLCHAIN;  // what rebuilds these bytes (setup.py: the build is reproducible per toolchain)
#endif
    d["cudart"] = "static";
    d["sm90_gemm"] = gs::sm90_gemm_built();
    return d;
  });
  // Whether the Hopper kernels run on `device` (a build with them and a CC 9.0 device): callers size scratch by it.
  m.def("hopper_gemm", [](int device) { return gs::hopper_gemm(device); }, py::arg("device"));
  m.attr("RMS_MAX_HIDDEN") = gs::kRmsMaxHidden;
  m.attr("ROPE_MAX_HEAD_DIM") = gs::kRopeMaxHeadDim;
  m.attr("LLP_VCHUNK") = gs::kLlpVChunk;

  m.def("rms_norm_fwd", [](uintptr_t x, uintptr_t w, uintptr_t y, uintptr_t rstd, int64_t rows, int64_t hidden,
                           float eps, int device, uintptr_t stream, int warp_rows) {
    check_rows(rows, "rms_norm_fwd");
    require(hidden >= 0 && hidden <= gs::kRmsMaxHidden, "rms_norm_fwd: hidden must be in [0, 32768]");
    check(gs::rms_norm_fwd(x, w, y, rstd, rows, hidden, eps, device, stream, warp_rows), "rms_norm_fwd");
  }, py::arg("x"), py::arg("w"), py::arg("y"), py::arg("rstd"), py::arg("rows"), py::arg("hidden"),
     py::arg("eps"), py::arg("device"), py::arg("stream"), py::arg("warp_rows") = -1);
  m.def("rms_norm_bwd_dx", [](uintptr_t dy, uintptr_t x, uintptr_t w, uintptr_t rstd, uintptr_t dx, int64_t rows,
                              int64_t hidden, int device, uintptr_t stream, int warp_rows) {
    check_rows(rows, "rms_norm_bwd_dx");
    require(hidden >= 0 && hidden <= gs::kRmsMaxHidden, "rms_norm_bwd_dx: hidden must be in [0, 32768]");
    check(gs::rms_norm_bwd_dx(dy, x, w, rstd, dx, rows, hidden, device, stream, warp_rows), "rms_norm_bwd_dx");
  }, py::arg("dy"), py::arg("x"), py::arg("w"), py::arg("rstd"), py::arg("dx"), py::arg("rows"),
     py::arg("hidden"), py::arg("device"), py::arg("stream"), py::arg("warp_rows") = -1);
  m.def("rms_norm_dw_tiles", [](uintptr_t plan, int64_t n_tiles, int64_t tile, uintptr_t dy, uintptr_t x,
                                uintptr_t rstd, uintptr_t partial, int64_t hidden, int device, uintptr_t stream,
                                uintptr_t stage_dy, uintptr_t stage_x, uintptr_t stage_rstd, int64_t n_stage) {
    check_rows(n_tiles, "rms_norm_dw_tiles");
    require(tile > 0, "rms_norm_dw_tiles: tile must be positive");
    require(hidden >= 0 && (hidden + 7) / 8 <= 65535LL * 128, "rms_norm_dw_tiles: hidden too large");
    check_stage(n_stage, {stage_dy, stage_x, stage_rstd}, "rms_norm_dw_tiles");
    check(gs::rms_norm_dw_tiles(plan, n_tiles, tile, dy, x, rstd, partial, hidden, device, stream, stage_dy, stage_x,
                                stage_rstd, n_stage),
          "rms_norm_dw_tiles");
  }, py::arg("plan"), py::arg("n_tiles"), py::arg("tile"), py::arg("dy"), py::arg("x"), py::arg("rstd"),
     py::arg("partial"), py::arg("hidden"), py::arg("device"), py::arg("stream"), py::arg("stage_dy") = 0,
     py::arg("stage_x") = 0, py::arg("stage_rstd") = 0, py::arg("n_stage") = 0);
  m.def("fold_tiles", [](uintptr_t partial, int64_t n_tiles, uintptr_t main_grad, int64_t cols, int device,
                         uintptr_t stream) {
    require(n_tiles >= 0 && cols >= 0 && cols <= kMaxGrid, "fold_tiles: bad sizes");
    check(gs::fold_tiles(partial, n_tiles, main_grad, cols, device, stream), "fold_tiles");
  }, py::arg("partial"), py::arg("n_tiles"), py::arg("main_grad"), py::arg("cols"), py::arg("device"),
     py::arg("stream"));

  auto check_n = [](int64_t n, const char* what) {
    require(n >= 0 && n / 8 / 1024 < kMaxGrid, std::string(what) + ": bad element count");
  };
  m.def("silu_fwd", [check_n](uintptr_t x, uintptr_t y, int64_t n, int device, uintptr_t stream) {
    check_n(n, "silu_fwd");
    check(gs::silu_fwd(x, y, n, device, stream), "silu_fwd");
  }, py::arg("x"), py::arg("y"), py::arg("n"), py::arg("device"), py::arg("stream"));
  m.def("silu_bwd", [check_n](uintptr_t x, uintptr_t dy, uintptr_t dx, int64_t n, int device, uintptr_t stream) {
    check_n(n, "silu_bwd");
    check(gs::silu_bwd(x, dy, dx, n, device, stream), "silu_bwd");
  }, py::arg("x"), py::arg("dy"), py::arg("dx"), py::arg("n"), py::arg("device"), py::arg("stream"));
  m.def("swiglu_fwd", [check_n](uintptr_t gate, uintptr_t up, uintptr_t y, int64_t n, int device,
                                uintptr_t stream) {
    check_n(n, "swiglu_fwd");
    check(gs::swiglu_fwd(gate, up, y, n, device, stream), "swiglu_fwd");
  }, py::arg("gate"), py::arg("up"), py::arg("y"), py::arg("n"), py::arg("device"), py::arg("stream"));
  m.def("swiglu_bwd", [check_n](uintptr_t gate, uintptr_t up, uintptr_t dy, uintptr_t dgate, uintptr_t dup,
                                int64_t n, int device, uintptr_t stream) {
    check_n(n, "swiglu_bwd");
    check(gs::swiglu_bwd(gate, up, dy, dgate, dup, n, device, stream), "swiglu_bwd");
  }, py::arg("gate"), py::arg("up"), py::arg("dy"), py::arg("dgate"), py::arg("dup"), py::arg("n"),
     py::arg("device"), py::arg("stream"));
  m.def("rope", [](uintptr_t x, uintptr_t positions, uintptr_t y, int64_t rows, int64_t heads, int64_t head_dim,
                   float theta, bool inverse, int device, uintptr_t stream) {
    check_rows(rows, "rope");
    require(heads >= 0 && head_dim >= 0 && head_dim % 2 == 0 && head_dim <= gs::kRopeMaxHeadDim,
            "rope: head_dim must be even and <= 8192");
    check(gs::rope(x, positions, y, rows, heads, head_dim, theta, inverse, device, stream), "rope");
  }, py::arg("x"), py::arg("positions"), py::arg("y"), py::arg("rows"), py::arg("heads"), py::arg("head_dim"),
     py::arg("theta"), py::arg("inverse"), py::arg("device"), py::arg("stream"));
  m.def("qk_norm_dw_tiles", [](uintptr_t plan, int64_t n_tiles, int64_t tile, uintptr_t dy, uintptr_t x,
                               uintptr_t rstd, uintptr_t partial, int64_t heads, int64_t head_dim, int device,
                               uintptr_t stream, uintptr_t stage_dy, uintptr_t stage_x, uintptr_t stage_rstd,
                               int64_t n_stage) {
    check_rows(n_tiles, "qk_norm_dw_tiles");
    require(tile > 0 && heads > 0, "qk_norm_dw_tiles: tile and heads must be positive");
    require(head_dim >= 0 && (head_dim + 7) / 8 <= 65535LL * 128, "qk_norm_dw_tiles: head_dim too large");
    check_stage(n_stage, {stage_dy, stage_x, stage_rstd}, "qk_norm_dw_tiles");
    check(gs::qk_norm_dw_tiles(plan, n_tiles, tile, dy, x, rstd, partial, heads, head_dim, device, stream, stage_dy,
                               stage_x, stage_rstd, n_stage),
          "qk_norm_dw_tiles");
  }, py::arg("plan"), py::arg("n_tiles"), py::arg("tile"), py::arg("dy"), py::arg("x"), py::arg("rstd"),
     py::arg("partial"), py::arg("heads"), py::arg("head_dim"), py::arg("device"), py::arg("stream"),
     py::arg("stage_dy") = 0, py::arg("stage_x") = 0, py::arg("stage_rstd") = 0, py::arg("n_stage") = 0);

  auto check_cols = [](int64_t cols, const char* what) {
    require(cols >= 0 && (cols + 7) / 8 <= 65535LL * 128, std::string(what) + ": row length too large");
  };
  m.def("embedding_fwd", [check_cols](uintptr_t ids, uintptr_t weight, uintptr_t y, int64_t rows, int64_t vocab,
                                      int64_t hidden, int device, uintptr_t stream) {
    check_rows(rows, "embedding_fwd");
    check_cols(hidden, "embedding_fwd");
    require(vocab >= 0, "embedding_fwd: vocab must be >= 0");
    check(gs::embedding_fwd(ids, weight, y, rows, vocab, hidden, device, stream), "embedding_fwd");
  }, py::arg("ids"), py::arg("weight"), py::arg("y"), py::arg("rows"), py::arg("vocab"), py::arg("hidden"),
     py::arg("device"), py::arg("stream"));
  m.def("embedding_fold", [check_cols](uintptr_t sorted_ids, uintptr_t src, int64_t n, uintptr_t dy,
                                       uintptr_t main_grad, int64_t vocab, int64_t hidden, int device,
                                       uintptr_t stream) {
    check_rows(n, "embedding_fold");
    check_cols(hidden, "embedding_fold");
    check(gs::embedding_fold(sorted_ids, src, n, dy, main_grad, vocab, hidden, device, stream), "embedding_fold");
  }, py::arg("sorted_ids"), py::arg("src"), py::arg("n"), py::arg("dy"), py::arg("main_grad"), py::arg("vocab"),
     py::arg("hidden"), py::arg("device"), py::arg("stream"));
  m.def("pack_rows", [check_cols](uintptr_t src, uintptr_t dst, uintptr_t meta, int64_t n_samples, int64_t max_len,
                                  int64_t hidden, bool unpack, int device, uintptr_t stream) {
    require(n_samples >= 0 && max_len >= 0 && (max_len == 0 || n_samples <= kMaxGrid / max_len),
            "pack_rows: n_samples * max_len must be in [0, 2^31-1]");
    check_cols(hidden, "pack_rows");
    check(gs::pack_rows(src, dst, meta, n_samples, max_len, hidden, unpack, device, stream), "pack_rows");
  }, py::arg("src"), py::arg("dst"), py::arg("meta"), py::arg("n_samples"), py::arg("max_len"), py::arg("hidden"),
     py::arg("unpack"), py::arg("device"), py::arg("stream"));

  m.def("copy_pieces", [](uintptr_t pieces, uintptr_t src, uintptr_t dst, int64_t n_pieces, int64_t longest,
                          int64_t src_stride_bytes, int64_t row_bytes, int device, uintptr_t stream) {
    require(n_pieces >= 0 && n_pieces <= kMaxGrid, "copy_pieces: n_pieces must be in [0, 2^31-1]");
    require(longest >= 0 && row_bytes >= 0 && src_stride_bytes >= row_bytes,
            "copy_pieces: longest and row_bytes must be >= 0, and source rows at least row_bytes apart");
    check(gs::copy_pieces(pieces, src, dst, n_pieces, longest, src_stride_bytes, row_bytes, device, stream),
          "copy_pieces");
  }, py::arg("pieces"), py::arg("src"), py::arg("dst"), py::arg("n_pieces"), py::arg("longest"),
     py::arg("src_stride_bytes"), py::arg("row_bytes"), py::arg("device"), py::arg("stream"));

  m.def("logp_fwd", [](uintptr_t logits, uintptr_t targets, uintptr_t out, uintptr_t lse, int64_t rows,
                       int64_t vocab, int64_t ld, int device, uintptr_t stream) {
    check_rows(rows, "logp_fwd");
    require(vocab > 0 && ld >= vocab, "logp_fwd: vocab must be positive and ld >= vocab");
    check(gs::logp_fwd(logits, targets, out, lse, rows, vocab, ld, device, stream), "logp_fwd");
  }, py::arg("logits"), py::arg("targets"), py::arg("out"), py::arg("lse"), py::arg("rows"), py::arg("vocab"),
     py::arg("ld"), py::arg("device"), py::arg("stream"));
  m.def("logp_bwd", [check_cols](uintptr_t logits, uintptr_t targets, uintptr_t lse, uintptr_t g, uintptr_t d,
                                 int64_t rows, int64_t vocab, int64_t ld, int64_t ldd, int device, uintptr_t stream) {
    check_rows(rows, "logp_bwd");
    check_cols(vocab, "logp_bwd");
    require(ld >= vocab && ldd >= vocab, "logp_bwd: ld and ldd must be >= vocab");
    check(gs::logp_bwd(logits, targets, lse, g, d, rows, vocab, ld, ldd, device, stream), "logp_bwd");
  }, py::arg("logits"), py::arg("targets"), py::arg("lse"), py::arg("g"), py::arg("d"), py::arg("rows"),
     py::arg("vocab"), py::arg("ld"), py::arg("ldd"), py::arg("device"), py::arg("stream"));

  auto check_gemm = [](int64_t M, int64_t N, int64_t K, const char* what) {
    require(M >= 0 && N >= 0 && K >= 0 && M < (1LL << 40) && N < (1LL << 40) && K < (1LL << 40),
            std::string(what) + ": sizes must be non-negative");
  };
  m.def("gemm_nt", [check_gemm](uintptr_t a, uintptr_t b, uintptr_t c, int64_t M, int64_t N, int64_t K, int64_t lda,
                                int64_t ldb, int64_t ldc, int device, uintptr_t stream, int path) {
    check_gemm(M, N, K, "gemm_nt");
    require(lda >= K && ldb >= K && ldc >= N, "gemm_nt: leading dimensions too small");
    require(path >= gs::kGemmAuto && path <= gs::kGemmSm90, "gemm_nt: path must be 0 (auto), 1 or 2");
    check(gs::gemm_nt(a, b, c, M, N, K, lda, ldb, ldc, device, stream, path), "gemm_nt");
  }, py::arg("a"), py::arg("b"), py::arg("c"), py::arg("M"), py::arg("N"), py::arg("K"), py::arg("lda"),
     py::arg("ldb"), py::arg("ldc"), py::arg("device"), py::arg("stream"), py::arg("path") = gs::kGemmAuto);
  m.def("gemm_nn", [check_gemm](uintptr_t a, uintptr_t b, uintptr_t c, int64_t M, int64_t N, int64_t K, int64_t lda,
                                int64_t ldb, int64_t ldc, int out, int device, uintptr_t stream, int path) {
    check_gemm(M, N, K, "gemm_nn");
    require(lda >= K && ldb >= N && ldc >= N, "gemm_nn: leading dimensions too small");
    require(path >= gs::kGemmAuto && path <= gs::kGemmSm90, "gemm_nn: path must be 0 (auto), 1 or 2");
    require(out >= gs::kNnBf16 && out <= gs::kNnF32Add,
            "gemm_nn: out must be 0 (bf16), 1 (fp32 chain) or 2 (fp32 add)");
    check(gs::gemm_nn(a, b, c, M, N, K, lda, ldb, ldc, out, device, stream, path), "gemm_nn");
  }, py::arg("a"), py::arg("b"), py::arg("c"), py::arg("M"), py::arg("N"), py::arg("K"), py::arg("lda"),
     py::arg("ldb"), py::arg("ldc"), py::arg("out"), py::arg("device"), py::arg("stream"),
     py::arg("path") = gs::kGemmAuto);
  m.def("gemm_dw_fold", [check_gemm](uintptr_t plan, int64_t n_tiles, int64_t tile, uintptr_t dy, uintptr_t x,
                                     uintptr_t grad, int64_t rows, int64_t N, int64_t K, int64_t ldy, int64_t ldx,
                                     int64_t ldg, int device, uintptr_t stream, int path, uintptr_t stage_dy,
                                     uintptr_t stage_x, int64_t n_stage, int64_t stage_ldy, int64_t stage_ldx) {
    check_gemm(N, K, n_tiles, "gemm_dw_fold");
    require(rows >= 0, "gemm_dw_fold: rows (of dY and X) must be >= 0");
    // A fold tile of 16k tokens keeps every call's 16-token mma steps on the same canonical slots.
    require(tile > 0 && tile % 16 == 0, "gemm_dw_fold: tile must be a positive multiple of 16");
    require(ldy >= N && ldx >= K && ldg >= K, "gemm_dw_fold: leading dimensions too small");
    require(n_tiles <= (1LL << 40) / tile, "gemm_dw_fold: n_tiles * tile too large");
    require(path >= gs::kGemmAuto && path <= gs::kGemmSm90, "gemm_dw_fold: path must be 0 (auto), 1 or 2");
    check_stage(n_stage, {stage_dy, stage_x}, "gemm_dw_fold");
    require(n_stage == 0 || (stage_ldy >= N && stage_ldx >= K),
            "gemm_dw_fold: stage_ldy / stage_ldx (the carried rows' leading dimensions) too small");
    check(gs::gemm_dw_fold(plan, n_tiles, tile, dy, x, grad, rows, N, K, ldy, ldx, ldg, device, stream, path,
                           stage_dy, stage_x, n_stage, stage_ldy, stage_ldx),
          "gemm_dw_fold");
  }, py::arg("plan"), py::arg("n_tiles"), py::arg("tile"), py::arg("dy"), py::arg("x"), py::arg("grad"),
     py::arg("rows"), py::arg("N"), py::arg("K"), py::arg("ldy"), py::arg("ldx"), py::arg("ldg"), py::arg("device"),
     py::arg("stream"), py::arg("path") = gs::kGemmAuto, py::arg("stage_dy") = 0, py::arg("stage_x") = 0,
     py::arg("n_stage") = 0, py::arg("stage_ldy") = 0, py::arg("stage_ldx") = 0);

  m.def("llp_forward", [check_gemm](uintptr_t hidden, uintptr_t weight, uintptr_t targets, uintptr_t part,
                                    uintptr_t out, uintptr_t lse, int64_t rows, int64_t vocab, int64_t K,
                                    int64_t ldh, int64_t ldw, uintptr_t logits, int64_t ldl, int device,
                                    uintptr_t stream, int path) {
    check_gemm(rows, vocab, K, "llp_forward");
    require(vocab > 0 && ldh >= K && ldw >= K, "llp_forward: vocab must be positive, ldh and ldw >= K");
    require(logits == 0 || (ldl > 0 && ldl % gs::kLlpVChunk == 0),
            "llp_forward: ldl (the logits scratch's columns) must be a positive multiple of LLP_VCHUNK");
    require(path >= gs::kGemmAuto && path <= gs::kGemmSm90, "llp_forward: path must be 0 (auto), 1 or 2");
    check(gs::llp_forward(hidden, weight, targets, part, out, lse, rows, vocab, K, ldh, ldw, logits, ldl, device,
                          stream, path),
          "llp_forward");
  }, py::arg("hidden"), py::arg("weight"), py::arg("targets"), py::arg("part"), py::arg("out"), py::arg("lse"),
     py::arg("rows"), py::arg("vocab"), py::arg("K"), py::arg("ldh"), py::arg("ldw"), py::arg("logits"),
     py::arg("ldl"), py::arg("device"), py::arg("stream"), py::arg("path") = gs::kGemmAuto);
  m.def("llp_dlogits", [check_gemm](uintptr_t hidden, uintptr_t weight, uintptr_t targets, uintptr_t lse,
                                    uintptr_t g, uintptr_t d, int64_t M, int64_t N, int64_t K, int64_t v0,
                                    int64_t vocab, int64_t ldh, int64_t ldw, int64_t ldd, uintptr_t logits,
                                    int64_t ldl, int device, uintptr_t stream, int path) {
    check_gemm(M, N, K, "llp_dlogits");
    require(ldh >= K && ldw >= K && ldd >= N && v0 >= 0, "llp_dlogits: bad leading dimensions or v0");
    require(logits == 0 || ldl >= N, "llp_dlogits: ldl (the logits scratch's columns) must be >= N");
    require(path >= gs::kGemmAuto && path <= gs::kGemmSm90, "llp_dlogits: path must be 0 (auto), 1 or 2");
    check(gs::llp_dlogits(hidden, weight, targets, lse, g, d, M, N, K, v0, vocab, ldh, ldw, ldd, logits, ldl,
                          device, stream, path),
          "llp_dlogits");
  }, py::arg("hidden"), py::arg("weight"), py::arg("targets"), py::arg("lse"), py::arg("g"), py::arg("d"),
     py::arg("M"), py::arg("N"), py::arg("K"), py::arg("v0"), py::arg("vocab"), py::arg("ldh"), py::arg("ldw"),
     py::arg("ldd"), py::arg("logits"), py::arg("ldl"), py::arg("device"), py::arg("stream"),
     py::arg("path") = gs::kGemmAuto);

  bind_attention_rl(m);
}
