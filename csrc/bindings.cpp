// pybind11 module gradsweep._C: thin checked wrappers over the launchers of gradsweep.h.
//
// Built by the host compiler (no CUDA header needed). Argument errors raise ValueError; a CUDA error from
// a launch raises RuntimeError carrying the CUDA error name and text.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "gradsweep.h"

namespace py = pybind11;

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
  m.def("build_info", []() {
    py::dict d;
    int rt = 0, drv = 0;
    d["cudart_version"] = gs::runtime_version(&rt) == 0 ? rt : -1;
    d["driver_version"] = gs::driver_version(&drv) == 0 ? drv : -1;
    d["arch_list"] = gs::build_arch_list();
#ifdef GS_BUILD_FLAGS
    d["nvcc_flags"] = GS_BUILD_FLAGS;
#endif
    d["cudart"] = "static";
    return d;
  });
  m.attr("RMS_MAX_HIDDEN") = gs::kRmsMaxHidden;
  m.attr("ROPE_MAX_HEAD_DIM") = gs::kRopeMaxHeadDim;

  m.def("rms_norm_fwd", [](uintptr_t x, uintptr_t w, uintptr_t y, uintptr_t rstd, int64_t rows, int64_t hidden,
                           float eps, int device, uintptr_t stream) {
    check_rows(rows, "rms_norm_fwd");
    require(hidden >= 0 && hidden <= gs::kRmsMaxHidden, "rms_norm_fwd: hidden must be in [0, 32768]");
    check(gs::rms_norm_fwd(x, w, y, rstd, rows, hidden, eps, device, stream), "rms_norm_fwd");
  }, py::arg("x"), py::arg("w"), py::arg("y"), py::arg("rstd"), py::arg("rows"), py::arg("hidden"),
     py::arg("eps"), py::arg("device"), py::arg("stream"));
  m.def("rms_norm_bwd_dx", [](uintptr_t dy, uintptr_t x, uintptr_t w, uintptr_t rstd, uintptr_t dx, int64_t rows,
                              int64_t hidden, int device, uintptr_t stream) {
    check_rows(rows, "rms_norm_bwd_dx");
    require(hidden >= 0 && hidden <= gs::kRmsMaxHidden, "rms_norm_bwd_dx: hidden must be in [0, 32768]");
    check(gs::rms_norm_bwd_dx(dy, x, w, rstd, dx, rows, hidden, device, stream), "rms_norm_bwd_dx");
  }, py::arg("dy"), py::arg("x"), py::arg("w"), py::arg("rstd"), py::arg("dx"), py::arg("rows"),
     py::arg("hidden"), py::arg("device"), py::arg("stream"));
  m.def("rms_norm_dw_tiles", [](uintptr_t plan, int64_t n_tiles, int64_t tile, uintptr_t dy, uintptr_t x,
                                uintptr_t rstd, uintptr_t partial, int64_t hidden, int device, uintptr_t stream) {
    check_rows(n_tiles, "rms_norm_dw_tiles");
    require(tile > 0, "rms_norm_dw_tiles: tile must be positive");
    require(hidden >= 0 && (hidden + 7) / 8 <= 65535LL * 128, "rms_norm_dw_tiles: hidden too large");
    check(gs::rms_norm_dw_tiles(plan, n_tiles, tile, dy, x, rstd, partial, hidden, device, stream),
          "rms_norm_dw_tiles");
  }, py::arg("plan"), py::arg("n_tiles"), py::arg("tile"), py::arg("dy"), py::arg("x"), py::arg("rstd"),
     py::arg("partial"), py::arg("hidden"), py::arg("device"), py::arg("stream"));
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
}
