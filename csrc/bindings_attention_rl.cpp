// pybind11 wrappers of the attention and RL launchers (attention.h, rl.h), added to gradsweep._C by
// bindings.cpp's module init. Same conventions: argument errors raise ValueError, CUDA errors RuntimeError.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "attention.h"
#include "gradsweep.h"
#include "rl.h"

namespace py = pybind11;

namespace {

void check(int code, const char* what) {
  if (code != 0) throw std::runtime_error(std::string("gradsweep._C.") + what + ": " + gs::error_string(code));
}

void require(bool ok, const std::string& msg) {
  if (!ok) throw py::value_error(msg);
}

constexpr int64_t kMaxGrid = 2147483647;

void check_attn_shape(int64_t pack, int64_t HQ, int64_t HKV, int64_t D, int64_t T, const char* what) {
  require(HQ > 0 && HKV > 0 && HQ % HKV == 0, std::string(what) + ": heads must be a positive multiple of kv_heads");
  require(pack > 0 && HQ % pack == 0, std::string(what) + ": pack must divide heads");
  require(D > 0 && D <= gs::attn_max_head_dim(),
          std::string(what) + ": head_dim must be in [1, " + std::to_string(gs::attn_max_head_dim()) + "]");
  require(T >= 0 && T < (1LL << 31), std::string(what) + ": total tokens must be in [0, 2^31)");
}

void check_dtype(int dtype, const char* what) {
  require(dtype == 0 || dtype == 1, std::string(what) + ": dtype code must be 0 (bfloat16) or 1 (float32)");
}

}  // namespace

void bind_attention_rl(py::module_& m) {
  m.attr("ATTN_BLOCK_N") = gs::attn_block_n();
  m.attr("ATTN_FOLD_TILE") = gs::attn_fold_tile();
  m.attr("ATTN_FOLD_KEYS") = gs::attn_fold_keys();
  m.attr("ATTN_FWD_ROWS") = gs::attn_rows(false, false);
  m.attr("ATTN_DQ_ROWS") = gs::attn_rows(false, true);
  m.attr("ATTN_NARROW_ROWS") = gs::attn_rows(true, false);
  m.attr("ATTN_MAX_HEAD_DIM") = gs::attn_max_head_dim();
  m.attr("RL_SEQ_THREADS") = gs::kRlSeqThreads;

  m.def("attn_fwd", [](uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t lse, uintptr_t wide,
                       int64_t n_wide, uintptr_t narrow, int64_t n_narrow, int64_t pack, int64_t HQ, int64_t HKV,
                       int64_t D, int64_t T, float qk_scale, int device, uintptr_t stream, int path) {
    check_attn_shape(pack, HQ, HKV, D, T, "attn_fwd");
    require(n_wide >= 0 && n_narrow >= 0 && n_wide * (HQ / pack) <= kMaxGrid && n_narrow * (HQ / pack) <= kMaxGrid,
            "attn_fwd: too many programs");
    require(path >= 0 && path <= 2, "attn_fwd: path must be 0 (auto), 1 (mma.sync) or 2 (wgmma)");
    check(gs::attn_fwd(q, k, v, o, lse, wide, n_wide, narrow, n_narrow, pack, HQ, HKV, D, T, qk_scale, device,
                       stream, path), "attn_fwd");
  }, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"), py::arg("lse"), py::arg("wide"), py::arg("n_wide"),
     py::arg("narrow"), py::arg("n_narrow"), py::arg("pack"), py::arg("HQ"), py::arg("HKV"), py::arg("D"),
     py::arg("T"), py::arg("qk_scale"), py::arg("device"), py::arg("stream"), py::arg("path") = 0);
  m.def("attn_dq", [](uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t dout, uintptr_t dq,
                      uintptr_t lse, uintptr_t delta, uintptr_t wide, int64_t n_wide, uintptr_t narrow,
                      int64_t n_narrow, int64_t pack, int64_t HQ, int64_t HKV, int64_t D, int64_t T, float qk_scale,
                      float sm_scale, bool exact, int device, uintptr_t stream, int path) {
    check_attn_shape(pack, HQ, HKV, D, T, "attn_dq");
    require(n_wide >= 0 && n_narrow >= 0 && n_wide * (HQ / pack) <= kMaxGrid && n_narrow * (HQ / pack) <= kMaxGrid,
            "attn_dq: too many programs");
    require(path >= 0 && path <= 2, "attn_dq: path must be 0 (auto), 1 (mma.sync) or 2 (wgmma)");
    check(gs::attn_dq(q, k, v, o, dout, dq, lse, delta, wide, n_wide, narrow, n_narrow, pack, HQ, HKV, D, T,
                      qk_scale, sm_scale, exact, device, stream, path), "attn_dq");
  }, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"), py::arg("dout"), py::arg("dq"), py::arg("lse"),
     py::arg("delta"), py::arg("wide"), py::arg("n_wide"), py::arg("narrow"), py::arg("n_narrow"), py::arg("pack"),
     py::arg("HQ"), py::arg("HKV"), py::arg("D"), py::arg("T"), py::arg("qk_scale"), py::arg("sm_scale"),
     py::arg("exact"), py::arg("device"), py::arg("stream"), py::arg("path") = 0);
  m.def("attn_dkdv", [](uintptr_t k, uintptr_t v, uintptr_t q, uintptr_t dout, uintptr_t lse, uintptr_t delta,
                        uintptr_t dk, uintptr_t dv, uintptr_t work, int64_t n_work, int64_t HQ, int64_t HKV,
                        int64_t D, int64_t T, float qk_scale, float sm_scale, bool load_acc, bool fp32_grads,
                        int device, uintptr_t stream, int path) {
    check_attn_shape(1, HQ, HKV, D, T, "attn_dkdv");
    require(path >= 0 && path <= 2, "attn_dkdv: path must be 0 (auto), 1 (mma.sync) or 2 (wgmma)");
    require(n_work >= 0 && n_work * HKV <= kMaxGrid, "attn_dkdv: too many programs");
    check(gs::attn_dkdv(k, v, q, dout, lse, delta, dk, dv, work, n_work, HQ, HKV, D, T, qk_scale, sm_scale,
                        load_acc, fp32_grads, device, stream, path), "attn_dkdv");
  }, py::arg("k"), py::arg("v"), py::arg("q"), py::arg("dout"), py::arg("lse"), py::arg("delta"), py::arg("dk"),
     py::arg("dv"), py::arg("work"), py::arg("n_work"), py::arg("HQ"), py::arg("HKV"), py::arg("D"), py::arg("T"),
     py::arg("qk_scale"), py::arg("sm_scale"), py::arg("load_acc"), py::arg("fp32_grads"), py::arg("device"),
     py::arg("stream"), py::arg("path") = 0);
  m.def("attn_scatter", [](uintptr_t src_a, uintptr_t dst_a, uintptr_t src_b, uintptr_t dst_b, uintptr_t rows,
                           uintptr_t toks, int64_t n, int64_t row_elems, int device, uintptr_t stream) {
    require(n >= 0 && row_elems >= 0, "attn_scatter: sizes must be non-negative");
    require((src_b == 0) == (dst_b == 0), "attn_scatter: give both src_b and dst_b, or neither");
    check(gs::attn_scatter(src_a, dst_a, src_b, dst_b, rows, toks, n, row_elems, device, stream), "attn_scatter");
  }, py::arg("src_a"), py::arg("dst_a"), py::arg("src_b"), py::arg("dst_b"), py::arg("rows"), py::arg("toks"),
     py::arg("n"), py::arg("row_elems"), py::arg("device"), py::arg("stream"));

  m.def("rl_ratio_fwd", [](uintptr_t lp, uintptr_t old, uintptr_t out, int64_t n, int dtype, int device,
                           uintptr_t stream) {
    check_dtype(dtype, "rl_ratio_fwd");
    check(gs::rl_ratio_fwd(lp, old, out, n, dtype, device, stream), "rl_ratio_fwd");
  }, py::arg("lp"), py::arg("old"), py::arg("out"), py::arg("n"), py::arg("dtype"), py::arg("device"),
     py::arg("stream"));
  m.def("rl_ratio_bwd", [](uintptr_t lp, uintptr_t old, uintptr_t g, uintptr_t d, int64_t n, int dtype, int gdtype,
                           int device, uintptr_t stream) {
    check_dtype(dtype, "rl_ratio_bwd");
    check_dtype(gdtype, "rl_ratio_bwd");
    check(gs::rl_ratio_bwd(lp, old, g, d, n, dtype, gdtype, device, stream), "rl_ratio_bwd");
  }, py::arg("lp"), py::arg("old"), py::arg("g"), py::arg("d"), py::arg("n"), py::arg("dtype"), py::arg("gdtype"),
     py::arg("device"), py::arg("stream"));
  m.def("rl_kl_fwd", [](uintptr_t lp, uintptr_t ref, uintptr_t k1, uintptr_t k2, uintptr_t k3, int64_t n, int dtype,
                        int device, uintptr_t stream) {
    check_dtype(dtype, "rl_kl_fwd");
    check(gs::rl_kl_fwd(lp, ref, k1, k2, k3, n, dtype, device, stream), "rl_kl_fwd");
  }, py::arg("lp"), py::arg("ref"), py::arg("k1"), py::arg("k2"), py::arg("k3"), py::arg("n"), py::arg("dtype"),
     py::arg("device"), py::arg("stream"));
  m.def("rl_kl_bwd", [](uintptr_t lp, uintptr_t ref, uintptr_t g1, uintptr_t g2, uintptr_t g3, uintptr_t d,
                        int64_t n, int dtype, int gdtype, int device, uintptr_t stream) {
    check_dtype(dtype, "rl_kl_bwd");
    check_dtype(gdtype, "rl_kl_bwd");
    check(gs::rl_kl_bwd(lp, ref, g1, g2, g3, d, n, dtype, gdtype, device, stream), "rl_kl_bwd");
  }, py::arg("lp"), py::arg("ref"), py::arg("g1"), py::arg("g2"), py::arg("g3"), py::arg("d"), py::arg("n"),
     py::arg("dtype"), py::arg("gdtype"), py::arg("device"), py::arg("stream"));
  m.def("rl_policy", [](uintptr_t lp, uintptr_t old, uintptr_t ref, uintptr_t adv, uintptr_t sample,
                        uintptr_t rewards, uintptr_t g, uintptr_t out, int64_t n, int64_t n_samples, int64_t group,
                        float clip_low, float clip_high, float beta, float adv_eps, bool grouped, bool kl, int dtype,
                        int gdtype, int device, uintptr_t stream) {
    check_dtype(dtype, "rl_policy");
    check_dtype(gdtype, "rl_policy");
    require(group >= 1 && n_samples >= 0, "rl_policy: group must be >= 1 and n_samples >= 0");
    check(gs::rl_policy(lp, old, ref, adv, sample, rewards, g, out, n, n_samples, group, clip_low, clip_high, beta,
                        adv_eps, grouped, kl, dtype, gdtype, device, stream), "rl_policy");
  }, py::arg("lp"), py::arg("old"), py::arg("ref"), py::arg("adv"), py::arg("sample"), py::arg("rewards"),
     py::arg("g"), py::arg("out"), py::arg("n"), py::arg("n_samples"), py::arg("group"), py::arg("clip_low"),
     py::arg("clip_high"), py::arg("beta"), py::arg("adv_eps"), py::arg("grouped"), py::arg("kl"), py::arg("dtype"),
     py::arg("gdtype"), py::arg("device"), py::arg("stream"));
  m.def("rl_seq_sum", [](uintptr_t a, uintptr_t b, uintptr_t mask, uintptr_t order, uintptr_t start, uintptr_t len,
                         uintptr_t out, int64_t n_samples, int dtype, int device, uintptr_t stream) {
    check_dtype(dtype, "rl_seq_sum");
    require(n_samples >= 0 && n_samples <= kMaxGrid, "rl_seq_sum: n_samples must be in [0, 2^31-1]");
    check(gs::rl_seq_sum(a, b, mask, order, start, len, out, n_samples, dtype, device, stream), "rl_seq_sum");
  }, py::arg("a"), py::arg("b"), py::arg("mask"), py::arg("order"), py::arg("start"), py::arg("len"), py::arg("out"),
     py::arg("n_samples"), py::arg("dtype"), py::arg("device"), py::arg("stream"));
  m.def("rl_dpo", [](uintptr_t seq, uintptr_t gseq, uintptr_t sample, uintptr_t mask, uintptr_t out, int64_t n,
                     int64_t n_samples, float beta, int gdtype, int device, uintptr_t stream) {
    check_dtype(gdtype, "rl_dpo");
    check(gs::rl_dpo(seq, gseq, sample, mask, out, n, n_samples, beta, gdtype, device, stream), "rl_dpo");
  }, py::arg("seq"), py::arg("gseq"), py::arg("sample"), py::arg("mask"), py::arg("out"), py::arg("n"),
     py::arg("n_samples"), py::arg("beta"), py::arg("gdtype"), py::arg("device"), py::arg("stream"));
}
