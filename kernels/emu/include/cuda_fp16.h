/*
 * cuda_fp16.h — the emulator's __half: IEEE binary16 bits with the conversions of NVIDIA's
 * header, exact in software on every host (round to nearest even, like __float2half_rn and
 * the device's cvt.rn.f16.f32), and the arithmetic of sm_53+ computed in fp32 then rounded
 * (exact for +, -, *, /: fp32 has more than 2 * 11 + 2 significand bits).
 */
#ifndef PS_EMU_CUDA_FP16_H
#define PS_EMU_CUDA_FP16_H

#include "cuda_runtime.h"

namespace ps_emu {

inline uint16_t f32_to_f16_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u, mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u) return (uint16_t)(sign | (mag > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (mag >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
  if (mag < 0x38800000u) {                                    /* fp16 subnormal or zero */
    if (mag < 0x33000000u) return (uint16_t)sign;             /* below half the smallest */
    const uint32_t e = mag >> 23, m = (mag & 0x7fffffu) | 0x800000u, shift = 126u - e;
    uint32_t h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = (mag - 0x38000000u) >> 13;
  const uint32_t rem = mag & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

inline float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  uint32_t x;
  if (e == 0x1fu) {
    x = sign | 0x7f800000u | (m << 13); /* inf, NaN (payload kept) */
  } else if (e != 0) {
    x = sign | ((e + 112u) << 23) | (m << 13);
  } else if (m == 0) {
    x = sign;
  } else { /* subnormal: normalize */
    uint32_t mm = m, ee = 113u;
    while (!(mm & 0x400u)) mm <<= 1, ee--;
    x = sign | (ee << 23) | ((mm & 0x3ffu) << 13);
  }
  float f;
  memcpy(&f, &x, 4);
  return f;
}

}  // namespace ps_emu

struct __half_raw {
  unsigned short x;
};

struct __half {
  unsigned short __x;
  __half() = default;
  __half(const __half_raw &r) : __x(r.x) {}
  __half(float f) : __x(::ps_emu::f32_to_f16_bits(f)) {}
  __half(double d) : __half((float)d) {}
  __half(int i) : __half((float)i) {}
  operator float() const { return ::ps_emu::f16_bits_to_f32(__x); }
  operator __half_raw() const { return __half_raw{__x}; }
  __half &operator+=(const __half &o) { return *this = __half(float(*this) + float(o)); }
  __half &operator-=(const __half &o) { return *this = __half(float(*this) - float(o)); }
  __half &operator*=(const __half &o) { return *this = __half(float(*this) * float(o)); }
  __half &operator/=(const __half &o) { return *this = __half(float(*this) / float(o)); }
};
static_assert(sizeof(__half) == 2 && std::is_trivially_copyable_v<__half>, "__half is 2 bytes");

struct __align__(4) __half2 {
  __half x, y;
};

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __half2float(__half h) { return float(h); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short u) { return __half(__half_raw{u}); }
inline short __half_as_short(__half h) { return (short)h.__x; }
inline __half __short_as_half(short s) { return __half(__half_raw{(unsigned short)s}); }
inline __half2 __floats2half2_rn(float a, float b) { return __half2{__half(a), __half(b)}; }
inline __half2 __float2half2_rn(float a) { return __half2{__half(a), __half(a)}; }
inline float __low2float(__half2 h) { return float(h.x); }
inline float __high2float(__half2 h) { return float(h.y); }

inline __half __hadd(__half a, __half b) { return __half(float(a) + float(b)); }
inline __half __hsub(__half a, __half b) { return __half(float(a) - float(b)); }
inline __half __hmul(__half a, __half b) { return __half(float(a) * float(b)); }
inline __half __hdiv(__half a, __half b) { return __half(float(a) / float(b)); }
inline __half __hneg(__half a) { return __ushort_as_half((unsigned short)(a.__x ^ 0x8000u)); }
inline __half __habs(__half a) { return __ushort_as_half((unsigned short)(a.__x & 0x7fffu)); }
/* __hfma rounds once: the fp32 product of two halves is exact, and so is its sum with a half
 * in double. */
inline __half __hfma(__half a, __half b, __half c) {
  return __half((float)((double)float(a) * float(b) + float(c)));
}
inline bool __hisnan(__half a) { return (a.__x & 0x7fffu) > 0x7c00u; }
inline bool __hisinf(__half a) { return (a.__x & 0x7fffu) == 0x7c00u; }
inline bool __heq(__half a, __half b) { return float(a) == float(b); }
inline bool __hne(__half a, __half b) { return float(a) != float(b); }
inline bool __hlt(__half a, __half b) { return float(a) < float(b); }
inline bool __hle(__half a, __half b) { return float(a) <= float(b); }
inline bool __hgt(__half a, __half b) { return float(a) > float(b); }
inline bool __hge(__half a, __half b) { return float(a) >= float(b); }
inline __half __hmax(__half a, __half b) { return float(a) >= float(b) || __hisnan(b) ? a : b; }
inline __half __hmin(__half a, __half b) { return float(a) <= float(b) || __hisnan(b) ? a : b; }

inline __half operator+(__half a, __half b) { return __hadd(a, b); }
inline __half operator-(__half a, __half b) { return __hsub(a, b); }
inline __half operator*(__half a, __half b) { return __hmul(a, b); }
inline __half operator/(__half a, __half b) { return __hdiv(a, b); }
inline __half operator-(__half a) { return __hneg(a); }
inline bool operator==(__half a, __half b) { return __heq(a, b); }
inline bool operator!=(__half a, __half b) { return __hne(a, b); }
inline bool operator<(__half a, __half b) { return __hlt(a, b); }
inline bool operator<=(__half a, __half b) { return __hle(a, b); }
inline bool operator>(__half a, __half b) { return __hgt(a, b); }
inline bool operator>=(__half a, __half b) { return __hge(a, b); }

/* sm_70+: a 16-bit compare-and-swap loop; the fp32 sum rounded once is the fp16 sum. */
inline __half atomicAdd(__half *address, __half val) {
  ::ps_emu::maybe_yield();
  unsigned short *p = &address->__x;
  unsigned short old = __atomic_load_n(p, __ATOMIC_RELAXED), next;
  do {
    next = __half(float(__ushort_as_half(old)) + float(val)).__x;
  } while (!__atomic_compare_exchange_n(p, &old, next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return __ushort_as_half(old);
}

#endif /* PS_EMU_CUDA_FP16_H */
