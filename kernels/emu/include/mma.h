/*
 * mma.h — the emulator's nvcuda::wmma for fp16 and bf16 operands (m16n16k16, m32n8k16,
 * m8n32k16) with fp32 or fp16 accumulators (bf16 operands: fp32, as on sm_80).
 *
 * Every *_sync function is a warp collective: all 32 lanes must call it with the same
 * pointer, ldm and layout. A fragment holds rows * cols / 32 elements per lane, and which
 * element of the tile a lane's x[i] is follows a permutation that changes per launch (the
 * mapping is unspecified in CUDA, and code that assumes one is wrong on some GPU).
 *
 * mma_sync: each element of D is C plus the dot product of a row of A and a column of B,
 * the fp16 or bf16 products summed exactly (in double) and the total rounded once to the accumulator
 * type. Tensor cores round differently (their fp32 accumulation truncates), so results
 * agree with a GPU to a few fp32 ulps, not bit for bit.
 */
#ifndef PS_EMU_MMA_H
#define PS_EMU_MMA_H

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K>
struct tile_shape;
template <int M, int N, int K>
struct tile_shape<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K>
struct tile_shape<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K>
struct tile_shape<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
 public:
  static_assert((M == 16 && N == 16 && K == 16) || (M == 32 && N == 8 && K == 16) ||
                    (M == 8 && N == 32 && K == 16),
                "the emulator has the fp16 wmma shapes m16n16k16, m32n8k16 and m8n32k16");
  using element_type = T;
  static constexpr int rows = tile_shape<Use, M, N, K>::rows;
  static constexpr int cols = tile_shape<Use, M, N, K>::cols;
  static constexpr int num_elements = rows * cols / 32;
  T x[num_elements];
};

template <class Use, int M, int N, int K, class T, class L, class V>
inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, const V &v) {
  for (int i = 0; i < f.num_elements; i++) f.x[i] = T(v);
}

}  // namespace wmma
}  // namespace nvcuda

namespace ps_emu {

/* The tile position of lane l's element i: perm[l * ne + i] = row * cols + col. */
template <class Frag>
inline unsigned tile_pos(const uint16_t *perm, unsigned lane, int i) {
  return perm[lane * Frag::num_elements + (unsigned)i];
}

template <class Frag, class T>
struct MatrixOp {
  static void load(const LaneIn *lanes, unsigned mask, uint64_t *, const void *) {
    const uint16_t *perm = fragment_layout(Frag::rows * Frag::cols);
    for (unsigned l = 0; l < 32; l++) {
      if (!(mask >> l & 1u)) continue;
      Frag &f = *static_cast<Frag *>(lanes[l].dst);
      const T *p = static_cast<const T *>(lanes[l].src);
      for (int i = 0; i < Frag::num_elements; i++) {
        unsigned pos = tile_pos<Frag>(perm, l, i), r = pos / Frag::cols, c = pos % Frag::cols;
        f.x[i] = lanes[l].layout == 0 ? p[r * lanes[l].ldm + c] : p[c * lanes[l].ldm + r];
      }
    }
  }
  static void store(const LaneIn *lanes, unsigned mask, uint64_t *, const void *) {
    const uint16_t *perm = fragment_layout(Frag::rows * Frag::cols);
    for (unsigned l = 0; l < 32; l++) {
      if (!(mask >> l & 1u)) continue;
      const Frag &f = *static_cast<const Frag *>(lanes[l].src);
      T *p = static_cast<T *>(lanes[l].dst);
      for (int i = 0; i < Frag::num_elements; i++) {
        unsigned pos = tile_pos<Frag>(perm, l, i), r = pos / Frag::cols, c = pos % Frag::cols;
        (lanes[l].layout == 0 ? p[r * lanes[l].ldm + c] : p[c * lanes[l].ldm + r]) = f.x[i];
      }
    }
  }
};

inline uint64_t matrix_key(const void *p, unsigned ldm, int layout) {
  return (uint64_t)(uintptr_t)p * 31u + ldm * 2u + (unsigned)layout;
}

template <class Frag, class T>
void matrix_collective(bool store, const void *src, void *dst, const void *mem, unsigned ldm,
                       int layout, const char *what, const char *file, int line) {
  check_matrix_pointer(mem, ldm, sizeof(T), what, file, line);
  LaneIn in{};
  in.src = src;
  in.dst = dst;
  in.ldm = ldm;
  in.layout = layout;
  (void)warp_collective(what, 0xffffffffu, matrix_key(mem, ldm, layout), in,
                        store ? MatrixOp<Frag, T>::store : MatrixOp<Frag, T>::load, nullptr,
                        file, line);
}

template <class FD, class FA, class FB, class FC>
struct MmaOp {
  static void run(const LaneIn *lanes, unsigned mask, uint64_t *, const void *) {
    constexpr int M = FD::rows, N = FD::cols, K = FA::cols;
    const uint16_t *pa = fragment_layout(M * K), *pb = fragment_layout(K * N),
                   *pc = fragment_layout(M * N);
    float a[M * K], b[K * N], c[M * N];
    for (unsigned l = 0; l < 32; l++) {
      const FA &fa = *static_cast<const FA *>(lanes[l].a);
      const FB &fb = *static_cast<const FB *>(lanes[l].b);
      const FC &fc = *static_cast<const FC *>(lanes[l].src);
      for (int i = 0; i < FA::num_elements; i++) a[tile_pos<FA>(pa, l, i)] = float(fa.x[i]);
      for (int i = 0; i < FB::num_elements; i++) b[tile_pos<FB>(pb, l, i)] = float(fb.x[i]);
      for (int i = 0; i < FC::num_elements; i++) c[tile_pos<FC>(pc, l, i)] = float(fc.x[i]);
    }
    (void)mask;
    for (unsigned l = 0; l < 32; l++) {
      FD &fd = *static_cast<FD *>(lanes[l].dst);
      for (int i = 0; i < FD::num_elements; i++) {
        unsigned pos = tile_pos<FD>(pc, l, i), r = pos / N, col = pos % N;
        double s = 0.0;
        for (int k = 0; k < K; k++) s += (double)a[r * K + k] * (double)b[k * N + col];
        fd.x[i] = typename FD::element_type((float)(s + (double)c[pos]));
      }
    }
  }
};

}  // namespace ps_emu

namespace nvcuda {
namespace wmma {

template <class Use, int M, int N, int K, class T, class L>
void load_matrix_sync(fragment<Use, M, N, K, T, L> &a, const T *p, unsigned ldm,
                      const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  static_assert(!std::is_same_v<Use, accumulator>, "an accumulator load names its layout");
  ::ps_emu::matrix_collective<fragment<Use, M, N, K, T, L>, T>(
      false, p, &a, p, ldm, std::is_same_v<L, col_major> ? 1 : 0, "wmma::load_matrix_sync", file,
      line);
}

template <int M, int N, int K, class T>
void load_matrix_sync(fragment<accumulator, M, N, K, T> &c, const T *p, unsigned ldm,
                      layout_t layout, const char *file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  ::ps_emu::matrix_collective<fragment<accumulator, M, N, K, T>, T>(
      false, p, &c, p, ldm, layout == mem_col_major ? 1 : 0, "wmma::load_matrix_sync", file, line);
}

template <int M, int N, int K, class T>
void store_matrix_sync(T *p, const fragment<accumulator, M, N, K, T> &c, unsigned ldm,
                       layout_t layout, const char *file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
  ::ps_emu::matrix_collective<fragment<accumulator, M, N, K, T>, T>(
      true, &c, p, p, ldm, layout == mem_col_major ? 1 : 0, "wmma::store_matrix_sync", file,
      line);
}

template <int M, int N, int K, class TD, class TAB, class LA, class LB, class TC>
void mma_sync(fragment<accumulator, M, N, K, TD> &d,
              const fragment<matrix_a, M, N, K, TAB, LA> &a,
              const fragment<matrix_b, M, N, K, TAB, LB> &b,
              const fragment<accumulator, M, N, K, TC> &c, bool satf = false,
              const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
  static_assert(std::is_same_v<TAB, __half> || std::is_same_v<TAB, __nv_bfloat16>,
                "the emulator's mma_sync takes fp16 or bf16 operands");
  static_assert(!std::is_same_v<TAB, __nv_bfloat16> || std::is_same_v<TD, float>,
                "bf16 operands accumulate in fp32");
  (void)satf;
  using FD = fragment<accumulator, M, N, K, TD>;
  using FA = fragment<matrix_a, M, N, K, TAB, LA>;
  using FB = fragment<matrix_b, M, N, K, TAB, LB>;
  using FC = fragment<accumulator, M, N, K, TC>;
  ::ps_emu::LaneIn in{};
  in.a = &a;
  in.b = &b;
  in.src = &c;
  in.dst = &d;
  (void)::ps_emu::warp_collective("wmma::mma_sync", 0xffffffffu, 0, in,
                                  ::ps_emu::MmaOp<FD, FA, FB, FC>::run, nullptr, file, line);
}

}  // namespace wmma
}  // namespace nvcuda

#endif /* PS_EMU_MMA_H */
