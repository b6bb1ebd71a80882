/*
 * launch.cuh — the two CUDA constructs that are not C++, written so that the same sources build
 * with nvcc for a GPU and with the host C++ compiler for the CUDA emulator (kernels/emu, built
 * with PS_CUDA_EMULATOR=1). Every kernel launch and every __shared__ declaration of the CUDA
 * backend goes through these macros; the emulator's headers make a bare `__shared__` a compile
 * error, and `<<<` is not C++, so nothing slips past.
 *
 *   PS_LAUNCH(kernel, grid, block, smem, stream, args...)
 *       kernel<<<grid, block, smem, stream>>>(args...). A template kernel whose arguments
 *       contain commas goes in parentheses: PS_LAUNCH((k<T, 2>), grid, block, 0, st, x).
 *   PS_SHARED(type, name, dims)                 __shared__ type name dims;
 *   PS_SHARED_ALIGNED(align, type, name, dims)  __shared__ __align__(align) type name dims;
 *   PS_EXTERN_SHARED(type, name)                extern __shared__ type name[];
 *
 * e.g. PS_SHARED(float, sh, [32][2]);  PS_SHARED_ALIGNED(32, __half, tile, [16][24]);
 *
 * Under the emulator a launch evaluates its arguments once, on the host, and every CUDA thread
 * calls the kernel with its own copies (the generic lambda deduces a template kernel's
 * arguments); a __shared__ variable is the block's one instance, allocated and poisoned by the
 * first thread that reaches it (the lambda's type identifies the declaration).
 */
#ifndef PINSTREAM_CUDA_LAUNCH_CUH
#define PINSTREAM_CUDA_LAUNCH_CUH

#if defined(PS_CUDA_EMULATOR) && PS_CUDA_EMULATOR

#define PS_LAUNCH(kernel, grid, block, smem, stream, ...)                                     \
  ::ps_emu::launch(::ps_emu::Site{#kernel, __FILE__, __LINE__},                               \
                   ::ps_emu::Config((grid), (block), (smem), (stream)),                      \
                   [](auto... ps_emu_a) { kernel(ps_emu_a...); }, ##__VA_ARGS__)
#define PS_SHARED_ALIGNED(align, type, name, dims) \
  auto &name = ::ps_emu::shared_var<type dims, (align)>([] {})
#define PS_SHARED(type, name, dims) PS_SHARED_ALIGNED(0, type, name, dims)
#define PS_EXTERN_SHARED(type, name) type *const name = ::ps_emu::dynamic_shared<type>()

#else

#define PS_LAUNCH(kernel, grid, block, smem, stream, ...) \
  kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#define PS_SHARED_ALIGNED(align, type, name, dims) __shared__ __align__(align) type name dims
#define PS_SHARED(type, name, dims) __shared__ type name dims
#define PS_EXTERN_SHARED(type, name) extern __shared__ type name[]

#endif

#endif /* PINSTREAM_CUDA_LAUNCH_CUH */
