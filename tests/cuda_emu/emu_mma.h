// Emulated warp-level helpers of gs::mma (they replace the inline-PTX ones of mma_gemm.cuh in the emulated build).
// The fragment layouts follow the PTX ISA's description of ldmatrix and mma.m16n8k16, written independently of the
// kernels' own address arithmetic, so a kernel that mis-addresses a fragment computes wrong numbers here.
#pragma once

namespace gs {
namespace mma {

inline uint32_t smem_addr(const void*) { return 0; }
inline void cp_async16(void* dst, const void* src) { std::memcpy(dst, src, 16); }
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}

inline uint16_t emu_bits(const bf16* p) {
  uint16_t u;
  std::memcpy(&u, p, 2);
  return u;
}

// ldmatrix.x4: lanes 8i..8i+7 give the row addresses of matrix i; lane l receives row l/4, columns 2(l%4), +1.
inline void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  const int l = emu_lane();
  std::memcpy(emu_slot(l), &p, sizeof(p));
  emu_warp_sync();
  for (int i = 0; i < 4; ++i) {
    const bf16* row;
    std::memcpy(&row, emu_slot(8 * i + l / 4), sizeof(row));
    r[i] = emu_bits(row + 2 * (l % 4)) | (static_cast<uint32_t>(emu_bits(row + 2 * (l % 4) + 1)) << 16);
  }
  emu_warp_sync();
}

// .trans: lane l receives column l/4 of rows 2(l%4) and 2(l%4) + 1 of matrix i.
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
  const int l = emu_lane();
  std::memcpy(emu_slot(l), &p, sizeof(p));
  emu_warp_sync();
  for (int i = 0; i < 4; ++i) {
    const bf16 *r0, *r1;
    std::memcpy(&r0, emu_slot(8 * i + 2 * (l % 4)), sizeof(r0));
    std::memcpy(&r1, emu_slot(8 * i + 2 * (l % 4) + 1), sizeof(r1));
    r[i] = emu_bits(r0 + l / 4) | (static_cast<uint32_t>(emu_bits(r1 + l / 4)) << 16);
  }
  emu_warp_sync();
}

inline float emu_bf16(uint32_t reg, int half) {
  const uint32_t bits = (half ? (reg >> 16) : (reg & 0xffffu)) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// m16n8k16 row.col bf16 -> f32 (PTX ISA fragment layout, g = lane / 4, t = lane % 4):
//   A regs: 0 (row g, k 2t..2t+1), 1 (row g+8, k 2t..), 2 (row g, k 2t+8..), 3 (row g+8, k 2t+8..)
//   B regs: 0 (k 2t..2t+1, n g), 1 (k 2t+8.., n g);  C / D: 0, 1 (row g, n 2t, 2t+1), 2, 3 (row g+8, ..)
// Model: products exact in double, summed in k order in double, added to C, rounded to float once.
inline void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const int l = emu_lane();
  uint32_t* mine = reinterpret_cast<uint32_t*>(emu_slot(l));
  for (int i = 0; i < 4; ++i) mine[i] = a[i];
  mine[4] = b0;
  mine[5] = b1;
  emu_warp_sync();
  auto A = [&](int row, int k) {
    const uint32_t* s = reinterpret_cast<const uint32_t*>(emu_slot((row % 8) * 4 + (k % 8) / 2));
    return emu_bf16(s[(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k % 2);
  };
  auto B = [&](int k, int n) {
    const uint32_t* s = reinterpret_cast<const uint32_t*>(emu_slot(n * 4 + (k % 8) / 2));
    return emu_bf16(s[4 + (k >= 8 ? 1 : 0)], k % 2);
  };
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int row = l / 4 + 8 * (e >> 1);
    const int col = 2 * (l % 4) + (e & 1);
    double acc = 0.0;
    for (int k = 0; k < 16; ++k) acc += static_cast<double>(A(row, k)) * static_cast<double>(B(k, col));
    out[e] = static_cast<float>(static_cast<double>(d[e]) + acc);
  }
  emu_warp_sync();
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}

}  // namespace mma
}  // namespace gs
