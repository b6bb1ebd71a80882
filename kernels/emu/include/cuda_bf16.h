/*
 * cuda_bf16.h — the emulator's __nv_bfloat16: the top 16 bits of an fp32, with the conversions
 * of NVIDIA's header (round to nearest even; NaN becomes 0x7fff, as __float2bfloat16_rn does).
 * The backend converts through rules.h's ps_bf16_from_f32 instead, whose NaN keeps its sign;
 * these conversions serve code that names the CUDA functions (and wmma's fragments).
 */
#ifndef PS_EMU_CUDA_BF16_H
#define PS_EMU_CUDA_BF16_H

#include "cuda_runtime.h"

namespace ps_emu {

inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float bf16_bits_to_f32(uint16_t h) {
  const uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

}  // namespace ps_emu

struct __nv_bfloat16_raw {
  unsigned short x;
};

struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(const __nv_bfloat16_raw &r) : __x(r.x) {}
  __nv_bfloat16(float f) : __x(::ps_emu::f32_to_bf16_bits(f)) {}
  __nv_bfloat16(double d) : __nv_bfloat16((float)d) {}
  __nv_bfloat16(int i) : __nv_bfloat16((float)i) {}
  operator float() const { return ::ps_emu::bf16_bits_to_f32(__x); }
  operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
};
static_assert(sizeof(__nv_bfloat16) == 2 && std::is_trivially_copyable_v<__nv_bfloat16>,
              "__nv_bfloat16 is 2 bytes");

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return float(h); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) {
  return __nv_bfloat16(__nv_bfloat16_raw{u});
}

#endif /* PS_EMU_CUDA_BF16_H */
