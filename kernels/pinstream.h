/*
 * pinstream.h — the one C ABI of pinstream.
 *
 * Two implementations: kernels/cuda/ (nvcc, asynchronous on CUDA streams) and kernels/cpu/
 * (cc, synchronous; the numerical reference). ffi/symbols.ts mirrors this file one-to-one.
 *
 * Conventions (every function):
 *   - returns an int32 status: PS_OK (0) or one of PS_ERR_*;
 *   - writes results through out-parameters, never through the return value;
 *   - on failure records a message (the failing expression, file, line and the backend's
 *     own message) in a thread-local buffer read by ps_last_error();
 *   - never calls exit() and never lets a C++ exception cross the ABI.
 *
 * Handles (streams, events) are opaque pointers. Device pointers are opaque too: on the CPU
 * backend they are host memory, on CUDA they are device addresses; neither is for JS to read.
 * A NULL stream means the backend's default stream.
 *
 * Functions marked [wait] block until the device catches up. The FFI layer calls them as
 * `nonblocking` (on a Deno worker thread), where the thread-local message is out of reach of
 * the calling JS thread: so they take an explicit message buffer (msg, msg_cap) that receives
 * the message on failure (it may be NULL).
 */
#ifndef PINSTREAM_H
#define PINSTREAM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define PS_API __declspec(dllexport)
#else
#define PS_API __attribute__((visibility("default")))
#endif

/* Bumped on any change of a signature or a struct layout; ffi/ refuses a mismatch. */
#define PS_ABI_VERSION 10

/* ---- status codes ------------------------------------------------------------------- */
#define PS_OK 0
#define PS_ERR_INVALID_ARGUMENT 1 /* a null/zero/out-of-range argument */
#define PS_ERR_NO_DRIVER 2        /* CUDA driver missing or too old for the runtime */
#define PS_ERR_NO_DEVICE 3        /* driver present, no usable device */
#define PS_ERR_INVALID_DEVICE 4   /* device ordinal out of range */
#define PS_ERR_OUT_OF_MEMORY 5    /* device or pinned host allocation failed */
#define PS_ERR_NOT_READY 6        /* ps_event_query / ps_stream_query: work still pending */
#define PS_ERR_BACKEND 7          /* any other backend (CUDA) error; see the message */
#define PS_ERR_UNSUPPORTED 8      /* the backend does not implement this operation */

/* ---- library ------------------------------------------------------------------------- */

/* The ABI version the library was built with (PS_ABI_VERSION). */
PS_API int ps_abi_version(int32_t *out);

/* The backend: 0 = cpu, 1 = cuda. */
PS_API int ps_backend(int32_t *out);

/* The calling thread's last error message; never NULL, "" when none. Valid until the next
 * failing call on the same thread. (The only function that does not return a status.) */
PS_API const char *ps_last_error(void);

/* Number of live allocations made through this library (host pinned, host registered,
 * device) and of live streams and events: the leak tests read it. */
PS_API int ps_live_objects(int64_t *allocations, int64_t *streams, int64_t *events);

/* Number of memory allocations the backend made inside its calls since the library was loaded:
 * the scratch a call keeps for the next ones growing (CUDA: once per stream and larger size;
 * CPU: once per calling thread and larger size) and stream-ordered scratch for one call. A
 * steady training step adds none; the op-budget tests read it. The CPU thread pool's
 * per-worker caches are not counted (which worker runs which part varies from call to call). */
PS_API int ps_scratch_allocations(int64_t *out);

/* ---- devices ------------------------------------------------------------------------- */

typedef struct ps_device_props {
  char name[256];
  uint64_t total_memory;     /* bytes */
  int32_t major;             /* compute capability (0 on cpu) */
  int32_t minor;
  int32_t multiprocessors;   /* SMs (logical CPUs on cpu) */
  int32_t async_engines;     /* copy engines (0 on cpu) */
  int32_t unified_addressing;
  int32_t emulated;          /* 1: the CUDA backend built against the emulator (kernels/emu) */
  int32_t reserved[8];
} ps_device_props;

PS_API int ps_device_count(int32_t *out);
PS_API int ps_device_props_get(int32_t device, ps_device_props *out);
/* Makes `device` current for the calling thread (cudaSetDevice). */
PS_API int ps_device_set(int32_t device);
PS_API int ps_device_get(int32_t *out);
/* [wait] Waits for all work on `device`. The device is explicit because [wait] functions run
 * on a worker thread, whose current device is not the caller's. */
PS_API int ps_device_synchronize(int32_t device, char *msg, uint64_t msg_cap);
PS_API int ps_mem_info(uint64_t *free_bytes, uint64_t *total_bytes);

/* ---- host memory --------------------------------------------------------------------- */

/* Page-locked host memory (cudaHostAlloc, portable; page-aligned malloc on cpu). Zero bytes
 * allocate nothing: *out = NULL and PS_OK, like every allocator here; freeing NULL is PS_OK. */
PS_API int ps_host_alloc(uint64_t bytes, void **out);
PS_API int ps_host_free(void *ptr);
/* Page-locks existing host memory, e.g. a SharedArrayBuffer that workers write
 * (cudaHostRegister; bookkeeping only on cpu). */
PS_API int ps_host_register(void *ptr, uint64_t bytes);
PS_API int ps_host_unregister(void *ptr);

/* ---- device memory ------------------------------------------------------------------- */

PS_API int ps_device_alloc(uint64_t bytes, void **out);
/* cudaFree: waits for the device to finish work that may use the memory. */
PS_API int ps_device_free(void *ptr);
/* Copies and sets of 0 bytes are no-ops. Host memory that is not pinned (pageable) is copied
 * synchronously with respect to the host by CUDA. The cpu backend checks that the device
 * side lies inside one live allocation and fails with PS_ERR_INVALID_ARGUMENT otherwise;
 * d2d ranges must not overlap. */
PS_API int ps_memset_async(void *dst, int32_t value, uint64_t bytes, void *stream);
PS_API int ps_memcpy_h2d_async(void *dst, const void *src, uint64_t bytes, void *stream);
PS_API int ps_memcpy_d2h_async(void *dst, const void *src, uint64_t bytes, void *stream);
PS_API int ps_memcpy_d2d_async(void *dst, const void *src, uint64_t bytes, void *stream);

/* ---- streams ------------------------------------------------------------------------- */

/* Stream flags. PS_STREAM_DEFAULT: the stream synchronizes with the legacy default (NULL)
 * stream, as cudaStreamDefault: work queued on NULL waits for it and vice versa, so NULL is a
 * safe ordering point. PS_STREAM_NON_BLOCKING (cudaStreamNonBlocking): no implicit ordering
 * with NULL, so a copy stream overlaps compute queued on the default stream; the user orders
 * it with events. Streams created here always run concurrently with each other. */
#define PS_STREAM_DEFAULT 0
#define PS_STREAM_NON_BLOCKING 1
PS_API int ps_stream_create(int32_t flags, void **out);
PS_API int ps_stream_destroy(void *stream);
/* [wait] `device` is the ordinal the stream belongs to: waits run on a thread of their own,
 * whose current device is not the caller's, and the NULL stream means that device's. The
 * waiting thread sleeps (a blocking-sync event), it does not spin. */
PS_API int ps_stream_synchronize(int32_t device, void *stream, char *msg, uint64_t msg_cap);
/* PS_OK when all work is done, PS_ERR_NOT_READY otherwise. */
PS_API int ps_stream_query(void *stream);
/* Work queued on `stream` after this call waits for `event` (device-side; the host does not). */
PS_API int ps_stream_wait_event(void *stream, void *event);

/* ---- events -------------------------------------------------------------------------- */

/* Event flags, or-ed. PS_EVENT_DISABLE_TIMING (cudaEventDisableTiming): no timestamps, cheaper
 * to record and wait on. PS_EVENT_BLOCKING_SYNC (cudaEventBlockingSync): ps_event_synchronize
 * sleeps until the event fires instead of spinning a CPU core (the runtime spins by default
 * while the process has fewer contexts than cores); for waits that overlap host work. */
#define PS_EVENT_DEFAULT 0
#define PS_EVENT_DISABLE_TIMING 1
#define PS_EVENT_BLOCKING_SYNC 2
PS_API int ps_event_create(int32_t flags, void **out);
PS_API int ps_event_destroy(void *event);
PS_API int ps_event_record(void *event, void *stream);
/* PS_OK when the recorded work is done, PS_ERR_NOT_READY otherwise. */
PS_API int ps_event_query(void *event);
/* [wait] */
PS_API int ps_event_synchronize(void *event, char *msg, uint64_t msg_cap);
/* Milliseconds between two recorded, completed events. */
PS_API int ps_event_elapsed_ms(void *start, void *end, float *out_ms);

/* ---- graphs ----------------------------------------------------------------------------- */

/* A recorded sequence of device work replayed with one call (a CUDA graph): between
 * ps_graph_capture_begin and ps_graph_capture_end, work queued on `stream` (and on streams that
 * wait on events recorded there) is recorded, not run; ps_graph_launch queues all of it again,
 * with the same pointers and kernel arguments, for the cost of one enqueue. What a graph
 * cannot hold makes the call that queues it fail with PS_ERR_UNSUPPORTED and the capture with
 * it: a synchronous call on the capturing thread (an allocation, a wait, a copy from or to
 * pageable memory), work on the NULL stream while a stream made with PS_STREAM_DEFAULT
 * captures, a wait on an event recorded outside the capture. Calls from other threads are not
 * affected (CUDA's thread-local capture mode).
 *
 * The CPU backend runs each call as it is made: it has no queue to record, and
 * ps_graph_capture_begin fails with PS_ERR_UNSUPPORTED there (callers run the work eagerly). */

/* Starts recording `stream` (not NULL: the default stream cannot capture). */
PS_API int ps_graph_capture_begin(void *stream);
/* Stops recording `stream` and makes the recording launchable: *out is the graph, or NULL on
 * failure (a capture invalidated by a refused call, or work forked to another stream and not
 * joined back with an event). The capture ends either way. */
PS_API int ps_graph_capture_end(void *stream, void **out);
/* Queues the whole graph on `stream`, after the graph's previous launch. */
PS_API int ps_graph_launch(void *graph, void *stream);
/* Frees a graph; launches already queued still run. */
PS_API int ps_graph_destroy(void *graph);
/* Number of live graphs (the leak tests read it). */
PS_API int ps_graph_live(int64_t *out);

/* ---- benchmark helper ----------------------------------------------------------------- */

#define PS_MEMCPY_H2D 1
#define PS_MEMCPY_D2H 2
#define PS_MEMCPY_D2D 3
/* [wait] The raw bound for bench/transfer.ts: `iters` back-to-back copies of `bytes` on
 * `stream` (cudaMemcpyAsync; memcpy on cpu), timed from the first enqueue to the end of the
 * last copy (CUDA events), after one untimed warm-up copy on cuda. */
PS_API int ps_bench_memcpy_loop(int32_t device, void *dst, const void *src, uint64_t bytes,
                                int32_t kind, int32_t iters, void *stream, float *out_ms,
                                char *msg, uint64_t msg_cap);

/* ---- image kernels (pipeline/) -------------------------------------------------------- */
/* PS-SECTION image: declarations added by the pipeline work go here. */

/* Source layouts of ps_image_augment. */
#define PS_IMAGE_NHWC 0
#define PS_IMAGE_NCHW 1
/* Output element types of ps_image_augment. */
#define PS_IMAGE_F16 0
#define PS_IMAGE_F32 1
/* ps_image_augment's flags. PS_IMAGE_SERIAL: the CPU backend runs the batch on the calling
 * thread alone, for a caller whose other cores are busy (a loader's workers); without it a batch
 * of 64 KiB or more is split over the backend's threads, backing off while a helper stalls it.
 * CUDA ignores it. */
#define PS_IMAGE_SERIAL 1
/* PS_IMAGE_NO_CONTRAST (a bit of its own: ps_image_geometry's PS_IMAGE_ANTIALIAS is 2): the
 * records' contrast words are ignored (read as 1.0) on both backends,
 * for a caller whose records never carry contrast (a loader without the contrast option): CUDA
 * then skips the per-batch mean pre-pass, its scratch memory and its launch. */
#define PS_IMAGE_NO_CONTRAST 4
/* scale/bias are passed by value into the launch: at most this many channels. */
#define PS_IMAGE_MAX_CHANNELS 16

/* int32 words of one sample's ps_image_augment record (the loader's `augment` field). */
#define PS_IMAGE_PARAMS 11

/* One fused pass over a batch of uint8 images, queued on `stream`: per-sample crop from the
 * image zero-padded by `pad` on every side, optional horizontal and vertical flips (after the
 * crop, as torchvision's RandomCrop then RandomHorizontalFlip / RandomVerticalFlip),
 * ColorJitter's four steps in a fixed order (contrast, brightness, saturation, hue: one of the
 * orders torchvision's ColorJitter draws per call), per-channel normalize, cutout (a square of
 * zeros in the normalized output, as Cutout / RandomErasing after Normalize), cast; NCHW out.
 *
 *   out[i][ch][y][x] = 0 (+0.0) when (y, x) is inside sample i's cutout square, else
 *                      cast(fp32(fp32(t[ch] * scale[ch]) + bias[ch]))
 *   t = mix(u) for 3-channel images (saturation, hue: ps_image_mix in kernels/rules.h), else u
 *   u[ch] = clamp(fp32(a * br)),           a = clamp(fp32(fp32(v * ct) + cs))
 *   cs = fp32(fp32(1 - ct) * m),           clamp(x) = x < 0 ? 0 : x > 255 ? 255 : x
 *   m  = the sample's mean grey over its h x w crop window (after crop and flips, before any
 *        colour step), exact integer sums rounded once (ps_image_grey_mean): for c == 3 the
 *        mean of (2989 R + 5870 G + 1140 B) / 10000 (torchvision's rgb_to_grayscale weights),
 *        otherwise the mean of every byte of the window
 *   v = pixel (ch, ys + dy - pad, xs + dx - pad) of image j, 0 outside the image,
 *   j = indices != NULL ? indices[i] : i,
 *   xs = flip ? w - 1 - x : x,  ys = vflip ? h - 1 - y : y
 *
 * Every operation is one fp32 rounding (never a fused multiply-add; rules.h writes them once)
 * and the cast to fp16 rounds to nearest even, so both backends give the same bits for the
 * same inputs. With ct = br = sat = 1 and hue = 0 the colour steps are exact identities
 * (t = v), so they are skipped; so is each step whose factor is the identity. The caller
 * computes scale = 1 / (255 * std), bias = -mean / std in fp32. Contrast comes first so that
 * its mean is a sum of the source bytes, exact in integers: on CUDA a pre-pass per batch (one
 * block per sample with ct != 1) reduces each window into a mean, before the pixel pass.
 *
 * src:    device, uint8 images, contiguous; `layout` PS_IMAGE_NHWC or PS_IMAGE_NCHW. Without
 *         indices, the batch's n images (rows is ignored).
 * indices, rows: the batch gathered from a device-resident set in the same pass (no gathered
 *         copy in between): src holds `rows` images and sample i reads image indices[i].
 *         indices: device, n int32, each in [0, rows) (checked on the CPU backend; on CUDA a
 *         sample whose index is outside is skipped, its output left as it was, as the kernel
 *         cannot fail; ps_gather_rows has the same rule). NULL: sample i reads image i.
 * params: device, n records of PS_IMAGE_PARAMS int32, or NULL (dy = dx = pad, nothing else):
 *           [0] dy, [1] dx  the crop window's top-left corner in the padded image (0..2*pad
 *                           for a window inside it; any int32 value is memory-safe and exact,
 *                           dy - pad computed without overflow: pixels outside read as 0)
 *           [2] flip        != 0 mirrors left-right
 *           [3] vflip       != 0 mirrors top-bottom
 *           [4] cut_y, [5] cut_x  the cutout square's centre pixel as a fraction of the
 *                           height and width in 1/65536 units, clamped to 0..65535: centre row
 *                           cy = floor(cut_y * h / 65536) (so 0 <= cy < h), likewise cx
 *           [6] cut_size    the square's side in pixels: rows cy - floor(cut_size / 2) and the
 *                           cut_size - 1 below it, likewise columns, clipped to the image; a
 *                           value <= 0: no cutout
 *           [7] br, [8] ct  brightness and contrast factors, the bits of fp32 values (1.0f,
 *                           0x3f800000, leaves the image as it is)
 *           [9] sat         saturation factor, fp32 bits (1.0f: off; 3-channel images only)
 *           [10] hue        hue shift in turns, fp32 bits, torchvision's hue_factor in
 *                           [-0.5, 0.5] (0.0f, 0x00000000: off; 3-channel images only).
 * scale, bias: HOST, c floats each (copied into the launch; c <= PS_IMAGE_MAX_CHANNELS).
 * out:    device, n x c x h x w, fp16 (out_dtype PS_IMAGE_F16) or fp32 (PS_IMAGE_F32).
 * flags:  PS_IMAGE_SERIAL, PS_IMAGE_NO_CONTRAST, both or 0 (other bits are refused).
 * n == 0 is a no-op. src and out must not overlap. */
PS_API int ps_image_augment(const void *src, const int32_t *indices, int64_t rows, int32_t layout,
                            int32_t n, int32_t c, int32_t h, int32_t w, int32_t pad,
                            const void *params, const float *scale, const float *bias, void *out,
                            int32_t out_dtype, int32_t flags, void *stream);

/* ps_image_augment, and the batch's labels in the same launch: labels_out[i] = the label of
 * sample i's image (labels[indices[i]], or labels[i] without indices), widened to int32.
 * labels: device, one label of label_bytes (1: uint8, 2: uint16, 4: int32) per image of src.
 * labels_out: device, n int32 (on CUDA a skipped sample's label is left as it was too). */
PS_API int ps_image_augment_labeled(const void *src, const int32_t *indices, int64_t rows,
                                    int32_t layout, int32_t n, int32_t c, int32_t h, int32_t w,
                                    int32_t pad, const void *params, const float *scale,
                                    const float *bias, void *out, int32_t out_dtype,
                                    int32_t flags, const void *labels, int32_t label_bytes,
                                    int32_t *labels_out, void *stream);

/* Gathers rows of a device-resident dataset on the device: dst row k = src row indices[k], each
 * row_bytes bytes (dst[k * row_bytes ...] = src[indices[k] * row_bytes ...]), for n rows.
 * indices: device, n int32, each in [0, rows) (checked on the CPU backend; on CUDA an index
 * outside is skipped, its row left as it was, as the kernel cannot fail). src and dst must not
 * overlap. */
PS_API int ps_gather_rows(const void *src, int64_t rows, int64_t row_bytes, const int32_t *indices,
                          int32_t n, void *dst, void *stream);

/* Widens n labels to int32 on the device (src_bytes = 1: uint8, 2: uint16, 4: int32 copy;
 * the copy is a memmove: src and out may overlap). */
PS_API int ps_image_labels_i32(const void *src, int32_t src_bytes, int32_t n, void *out,
                               void *stream);

/* int32 words of one sample's ps_image_geometry record (augment/geometry.ts writes them). */
#define PS_IMAGE_GEOMETRY_PARAMS 8
/* ps_image_geometry's flags: PS_IMAGE_SERIAL as for ps_image_augment; PS_IMAGE_ANTIALIAS widens
 * the resize filter by the scale when shrinking (Pillow's bilinear; torchvision's antialias). */
#define PS_IMAGE_ANTIALIAS 2
/* Most channels ps_image_geometry takes (grey, RGB, RGBA). */
#define PS_IMAGE_GEOMETRY_MAX_CHANNELS 4
/* One sample's rotation cosine and sine are fixed point with this many fraction bits. */
#define PS_IMAGE_ROTATION_BITS 30

/* The geometric transforms, before ps_image_augment: per sample a crop box of the source
 * image resized to oh x ow (Resize, CenterCrop, RandomResizedCrop), then an optional rotation
 * about the centre (RandomRotation); uint8 HWC in, uint8 HWC out at oh x ow, queued on
 * `stream`. Integer arithmetic throughout, so both backends give the same bytes:
 *
 *   resize: Pillow's bilinear (ImagingResample) on the box: per axis, output position x has
 *           centre (x + 0.5) * in / out and taps [lo, lo + n) of the triangle filter widened by
 *           max(in / out, 1) with PS_IMAGE_ANTIALIAS (else 1), weights k_i / sum(k) as 22-bit
 *           fixed point computed in fp64 (rules.h, ps_geo_taps); the horizontal pass first,
 *           each sum + 2^21 shifted right 22 and clamped to a byte, then the vertical pass on
 *           those bytes likewise. An axis whose size does not change is copied.
 *   rotate: output pixel (y, x) reads the resized image at (yin, xin) =
 *           (sin * u + cos * v + oh, cos * u - sin * v + ow) / 2, u = 2x + 1 - ow,
 *           v = 2y + 1 - oh, with cos and sin the record's PS_IMAGE_ROTATION_BITS fixed point;
 *           outside [0, oh) x [0, ow) it is the fill; inside, Pillow's bilinear transform:
 *           the 2x2 neighbours of (yin - 0.5, xin - 0.5), edge-clamped, weights of 16 bits,
 *           the result truncated to a byte.
 *
 * src:    device, n slots of `src_stride` bytes; slot i holds an h x w x c image (row-major,
 *         rows of w * c bytes) of the sizes in its record: images of different sizes share
 *         one batch.
 * params: device, n records of PS_IMAGE_GEOMETRY_PARAMS int32:
 *           [0] h, [1] w      the source image's size: 1 <= h, w, h * w <= 2^28,
 *                             h * w * c <= src_stride
 *           [2] top, [3] left, [4] crop_h, [5] crop_w  the box, inside the image
 *           [6] cos, [7] sin  the rotation by angle a counter-clockwise: round(cos(a) *
 *                             2^PS_IMAGE_ROTATION_BITS) and likewise sin; (2^30, 0) is none.
 *         A record outside these bounds fails on the CPU backend; on CUDA (which cannot fail)
 *         that sample's output is left as it was.
 * fill:   the rotation's fill, one byte per channel, channel k in bits 8k..8k+7.
 * out:    device, n x oh x ow x c bytes; 1 <= oh, ow <= 2^14. Must not overlap src.
 * flags:  PS_IMAGE_SERIAL | PS_IMAGE_ANTIALIAS (other bits are refused).
 * n == 0 is a no-op. */
PS_API int ps_image_geometry(const void *src, int64_t src_stride, int32_t n, int32_t c,
                             const int32_t *params, int32_t oh, int32_t ow, int32_t fill, void *out,
                             int32_t flags, void *stream);

/* ---- nn kernels (nn/) ----------------------------------------------------------------- */
/* PS-SECTION nn: declarations added by the training work go here. */
/*
 * Layout NCHW; fp32 accumulation everywhere; fp32 parameters where named "f32". Every pointer
 * is a device pointer. `*_dtype` arguments take PS_NN_F32 / PS_NN_F16 / PS_NN_BF16; `dtype` is
 * the one element type of a kernel's activations, their gradients and (for matmul and the
 * convolutions) the weights it reads: fp16 or bf16 for mixed-precision training, fp32 for the
 * fp32 path. "act" below means elements of that dtype. Wherever fp16 is named below, bf16
 * works the same way ("half" means either). Every conversion from fp32 to fp16 or bf16
 * rounds to nearest even (bf16: rules.h ps_bf16_from_f32, which both backends call), so an
 * element-wise result has the same bits on both backends; sums (GEMM, convolutions, norms)
 * accumulate in fp32 in each backend's own order. "Overwrites" is the default; `accumulate` != 0 adds to the output.
 * Shapes are int64 element counts; convolution output size is
 * OH = (H + 2*pad - kh) / stride + 1 (floor), likewise OW.
 */
#define PS_NN_F32 0
#define PS_NN_F16 1
/* bfloat16: the top 16 bits of an fp32 (8 exponent bits, 7 fraction bits), fp32's range with
 * 8 significant bits; NaN becomes the quiet NaN 0x7fc0 with its sign. Code 3: 2 is
 * PS_FILL_I32. */
#define PS_NN_BF16 3

/* c[m,n] (+)= op(a) @ op(b). a: [m,k] row-major ([k,m] when trans_a), b: [k,n] ([n,k] when
 * trans_b), both act; c: [m,n] row-major, c_dtype. */
PS_API int ps_nn_matmul(const void *a, const void *b, int32_t dtype, void *c, int32_t c_dtype,
                        int64_t m, int64_t n, int64_t k, int32_t trans_a, int32_t trans_b,
                        int32_t accumulate, void *stream);

/* Activations an epilogue applies as it stores (PS_ACT_RELU is ps_nn_relu_forward's rule). */
#define PS_ACT_NONE 0
#define PS_ACT_RELU 1

/* c[m,n] = act(op(a) @ op(b) + bias[n]): a Linear layer's forward in one call, with the bits of
 * ps_nn_matmul (overwriting c), then ps_nn_bias_add over [m, n] (hw = 1), then, for act
 * PS_ACT_RELU, ps_nn_relu_forward. bias: [n] of bias_dtype. CUDA adds the bias and applies the
 * activation in the GEMM's epilogue, as it stores c. */
PS_API int ps_nn_matmul_bias_act(const void *a, const void *b, int32_t dtype, void *c,
                                 int32_t c_dtype, int64_t m, int64_t n, int64_t k,
                                 int32_t trans_a, int32_t trans_b, const void *bias,
                                 int32_t bias_dtype, int32_t act, void *stream);

/* y[n,co,OH,OW] = conv(x[n,c,h,w], w[co,c,kh,kw]) (cross-correlation, zero padding). All act. */
PS_API int ps_nn_conv2d_forward(const void *x, const void *w, void *y, int32_t dtype, int64_t n,
                                int64_t c, int64_t h, int64_t w_, int64_t co, int32_t kh,
                                int32_t kw, int32_t stride, int32_t pad, void *stream);
/* dx[n,c,h,w] = d(loss)/dx from dy[n,co,OH,OW] and w. All act; overwrites dx. */
PS_API int ps_nn_conv2d_backward_data(const void *dy, const void *w, void *dx, int32_t dtype,
                                      int64_t n, int64_t c, int64_t h, int64_t w_, int64_t co,
                                      int32_t kh, int32_t kw, int32_t stride, int32_t pad,
                                      void *stream);
/* dw[co,c,kh,kw] (+)= sum over the batch of dy (x) x; x, dy act; dw dw_dtype. */
PS_API int ps_nn_conv2d_backward_weight(const void *x, const void *dy, int32_t dtype, void *dw,
                                        int32_t dw_dtype, int64_t n, int64_t c, int64_t h,
                                        int64_t w_, int64_t co, int32_t kh, int32_t kw,
                                        int32_t stride, int32_t pad, int32_t accumulate,
                                        void *stream);

/* Max pooling without padding, OH = (h - kernel) / stride + 1. x, y act; indices int32
 * [n,c,OH,OW] = argmax position within the input plane (iy*w + ix), or NULL. */
PS_API int ps_nn_maxpool2d_forward(const void *x, void *y, int32_t dtype, int32_t *indices,
                                   int64_t n, int64_t c, int64_t h, int64_t w_, int32_t kernel,
                                   int32_t stride, void *stream);
/* dx[n,c,h,w] = scatter-add of dy[n,c,oh,ow] at indices; overwrites dx. act. An index
 * outside its plane fails (cpu) / is skipped (cuda, where it cannot fail without a host round
 * trip). */
PS_API int ps_nn_maxpool2d_backward(const void *dy, const int32_t *indices, void *dx,
                                    int32_t dtype, int64_t n, int64_t c, int64_t h, int64_t w_,
                                    int64_t oh, int64_t ow, void *stream);

/* Batch normalization over (n, hw) per channel c; x, y, dy, dx act [n,c,hw]; the rest f32 [c].
 * Train: normalizes with the batch statistics, writes save_mean / save_invstd (1/sqrt(var+eps),
 * biased var) and updates run_mean / run_var with `momentum` (PyTorch: unbiased var). */
PS_API int ps_nn_batchnorm_forward_train(const void *x, const float *gamma, const float *beta,
                                         void *y, int32_t dtype, float *save_mean,
                                         float *save_invstd, float *run_mean, float *run_var,
                                         int64_t n, int64_t c, int64_t hw, float momentum,
                                         float eps, void *stream);
PS_API int ps_nn_batchnorm_forward_eval(const void *x, const float *gamma, const float *beta,
                                        const float *run_mean, const float *run_var, void *y,
                                        int32_t dtype, int64_t n, int64_t c, int64_t hw,
                                        float eps, void *stream);
/* Overwrites dx (act), dgamma and dbeta (f32). */
PS_API int ps_nn_batchnorm_backward(const void *dy, const void *x, const float *gamma,
                                    const float *save_mean, const float *save_invstd, void *dx,
                                    int32_t dtype, float *dgamma, float *dbeta, int64_t n,
                                    int64_t c, int64_t hw, void *stream);

/* Batch norm with an activation fused in (act 0: none, PS_BN_RELU: y = relu(bn(x)), and the
 * backward masks dy by y > 0 first, as ps_nn_relu_backward would), reduced over a fixed
 * partition of each channel in a fixed order (rules.h ps_bn_groups): results are the same run
 * to run. `work` (f32, at least ps_nn_batchnorm_workspace floats, device memory) holds the
 * per-group partial statistics; NULL takes stream-ordered scratch on every call (CUDA), so a
 * training loop passes a workspace it keeps. The backward takes y (the forward's output) when
 * act is PS_BN_RELU (else it may be NULL). When run_backup (f32 [2c]) is not NULL the forward
 * first saves the running mean and variance it updates there (mean, then var), so a skipped
 * step can put them back (ps_nn_multi_copy_if) with no copy of its own. */
#define PS_BN_RELU 1
PS_API int ps_nn_batchnorm_workspace(int64_t n, int64_t c, int64_t hw, int64_t *floats);
PS_API int ps_nn_batchnorm_act_forward_train(const void *x, const float *gamma, const float *beta,
                                             void *y, int32_t dtype, float *save_mean,
                                             float *save_invstd, float *run_mean, float *run_var,
                                             float *run_backup, float *work, int64_t work_floats,
                                             int64_t n,
                                             int64_t c, int64_t hw, float momentum, float eps,
                                             int32_t act, void *stream);
PS_API int ps_nn_batchnorm_act_backward(const void *dy, const void *x, const void *y,
                                        const float *gamma, const float *save_mean,
                                        const float *save_invstd, void *dx, int32_t dtype,
                                        float *dgamma, float *dbeta, float *work,
                                        int64_t work_floats, int64_t n, int64_t c, int64_t hw,
                                        int32_t act, void *stream);

/* y[n,c,hw] += bias[c] (y act, bias bias_dtype); [N,F] is hw = 1. */
PS_API int ps_nn_bias_add(void *y, int32_t dtype, const void *bias, int32_t bias_dtype,
                          int64_t n, int64_t c, int64_t hw, void *stream);
/* dbias[c] (+)= sum over (n, hw) of dy (act); dbias dbias_dtype. */
PS_API int ps_nn_bias_grad(const void *dy, int32_t dtype, void *dbias, int32_t dbias_dtype,
                           int64_t n, int64_t c, int64_t hw, int32_t accumulate, void *stream);

/* act, count elements; in place allowed (y == x, dx == dy). ReLU decides on the sign bit:
 * -0 and negatives (not negative NaNs) become +0 (rules.h). */
PS_API int ps_nn_relu_forward(const void *x, void *y, int32_t dtype, int64_t count,
                              void *stream);
PS_API int ps_nn_relu_backward(const void *dy, const void *y, void *dx, int32_t dtype,
                               int64_t count, void *stream);

/* Softmax cross-entropy over logits[n,k] (act) with labels[n] int32 in [0,k):
 * *loss_sum += sum of per-sample losses (f32), *correct += count of argmax == label (int32),
 * and, when dlogits (act [n,k]) is not NULL, dlogits = s * (softmax - onehot) / n (the
 * gradient of s * mean loss) with s = scale * *device_scale, or s = scale when device_scale
 * is NULL. device_scale (f32, device memory) is read by the kernel: a loss scale that the
 * device updates (GradScaler) needs no host round trip. A label out of range fails (cpu) /
 * counts as wrong with zero gradient (cuda, where it cannot fail without a host round trip). */
PS_API int ps_nn_cross_entropy(const void *logits, const int32_t *labels, void *dlogits,
                               int32_t dtype, float *loss_sum, int32_t *correct, int64_t n,
                               int64_t k, float scale, const float *device_scale, void *stream);

/* dst = (dst_dtype) src, count elements; between any two of f32, f16 and bf16 (through
 * fp32, rounded once), and same-type copies with memmove's semantics: src and dst may
 * overlap. */
PS_API int ps_nn_cast(const void *src, int32_t src_dtype, void *dst, int32_t dst_dtype,
                      int64_t count, void *stream);

/* One part of a concatenation (cat, stack), elements of dtype: for o in [0, outer), the
 * part's row part[o * part_len, +part_len) is whole[o * whole_len + offset, +part_len).
 * split == 0 copies part into whole (forward); split != 0 copies whole into part (the
 * backward: the part's gradient). Needs offset + part_len <= whole_len. */
PS_API int ps_nn_concat(void *part, void *whole, int32_t dtype, int64_t outer, int64_t part_len,
                        int64_t whole_len, int64_t offset, int32_t split, void *stream);

/* y = a + b (op PS_BINARY_ADD) or a * b (PS_BINARY_MUL), count elements of dtype, computed in
 * fp32 and rounded once; y may be a or b. */
#define PS_BINARY_ADD 0
#define PS_BINARY_MUL 1
PS_API int ps_nn_binary(const void *a, const void *b, void *y, int32_t dtype, int64_t count,
                        int32_t op, void *stream);

/* ---- tensors born on the device ----------------------------------------------------------- */

#define PS_FILL_CONSTANT 0 /* a */
#define PS_FILL_ARANGE 1   /* a + i * b (in double, then rounded) */
#define PS_FILL_UNIFORM 2  /* a + (b - a) * u, u uniform in [0, 1) on a 2^-24 grid */
#define PS_FILL_NORMAL 3   /* a + b * z, z standard normal (Box-Muller) */
/* The dtype of an int32 fill (next to PS_NN_F32, PS_NN_F16 and PS_NN_BF16). */
#define PS_FILL_I32 2

/* Writes count elements of dtype (PS_NN_F32, PS_NN_F16, PS_NN_BF16 or PS_FILL_I32) computed on
 * the device:
 * element i is a function of (mode, a, b, seed, offset + i) only, the same bits on every
 * backend, so a tensor is created where it lives, with nothing built on the host. Random modes
 * draw from a counter-based generator (seed, offset + i): filling [0, n) at offset k equals
 * elements [k, k + n) of a fill at offset 0. int32 takes the constant and arange modes
 * (truncated toward zero, saturated to int32). */
PS_API int ps_tensor_fill(void *dst, int32_t dtype, int64_t count, int32_t mode, double a,
                          double b, uint64_t seed, uint64_t offset, void *stream);

/* GradScaler.unscale_: sets *found_inf = 1 if any grad element is inf/NaN (never clears it);
 * when in_place != 0 also multiplies grad by the inverse scale. The inverse scale is
 * 1 / *scale when scale != NULL (read on the device), else inv_scale. */
PS_API int ps_nn_unscale_check(void *grad, int32_t grad_dtype, int64_t count,
                               const float *scale, float inv_scale, int32_t in_place,
                               int32_t *found_inf, void *stream);

/* torch.optim.SGD for one parameter tensor, count elements, all on the device (lr and
 * momentum are hyper[0] and hyper[1], read on the device, when hyper != NULL: a scheduler
 * changes them without changing the launch, so a recorded step replays with the new values;
 * hyper[1] then applies only with a momentum_buf):
 *   g = grad * (1 / *scale if scale else 1) + weight_decay * param
 *   buf = (momentum_buf not yet used ? g : momentum * buf + (1 - dampening) * g)
 *   g = nesterov ? g + momentum * buf : buf            (when momentum != 0)
 *   param -= lr * g; param_half = (half_dtype) param  (param_half may be NULL)
 * Does nothing when found_inf != NULL and *found_inf != 0. "Not yet used" means
 * steps_done != NULL and *steps_done == 0 (PyTorch clones g into a fresh buffer); with
 * steps_done == NULL the buffer is taken as used (zero-initialized buffers give the same
 * result whenever dampening == 0). grad is grad_dtype; param, momentum_buf f32
 * (momentum_buf may be NULL when momentum == 0); param_half is half_dtype (PS_NN_F16 or
 * PS_NN_BF16; ignored when param_half is NULL). */
PS_API int ps_nn_sgd_step(float *param, const void *grad, int32_t grad_dtype,
                          float *momentum_buf, void *param_half, int32_t half_dtype,
                          int64_t count, float lr, float momentum, float dampening,
                          float weight_decay, int32_t nesterov, const float *scale,
                          const int32_t *found_inf, const int32_t *steps_done,
                          const float *hyper, void *stream);
/* *steps_done += 1 unless found_inf != NULL and *found_inf != 0 (after all sgd steps). */
PS_API int ps_nn_step_count(int32_t *steps_done, const int32_t *found_inf, void *stream);

/* GradScaler.update (torch._amp_update_scale_): on *found_inf: scale *= backoff_factor,
 * growth_tracker = 0; else growth_tracker += 1 and when it reaches growth_interval,
 * scale *= growth_factor (kept only if finite) and growth_tracker = 0. found_inf is read,
 * not cleared. */
PS_API int ps_nn_scaler_update(float *scale, int32_t *growth_tracker, const int32_t *found_inf,
                               float growth_factor, float backoff_factor,
                               int32_t growth_interval, void *stream);

/* ---- multi-tensor steps (one launch over every parameter) ------------------------------ */

/* A multi-tensor list is n entries of int64 fields in device memory (built once by the caller
 * and kept: the pointers do not change between steps). The CUDA backend cannot read it on the
 * host, so it trusts it; the CPU backend checks every entry. max_count (>= every entry's count)
 * only sizes the launch. A parameter entry has PS_MT_SGD_FIELDS fields: param (f32), grad
 * (grad_dtype), momentum_buf (f32 or 0), param_half (half_dtype or 0), count, grad_dtype,
 * half_dtype (PS_NN_F16 or PS_NN_BF16). */
#define PS_MT_SGD_FIELDS 7
/* ps_nn_unscale_check over the grads of every entry, into one found_inf. */
PS_API int ps_nn_multi_unscale_check(const int64_t *list, int32_t n, int64_t max_count,
                                     const float *scale, float inv_scale, int32_t in_place,
                                     int32_t *found_inf, void *stream);
/* ps_nn_sgd_step on every entry, with the same hyper-parameters (hyper as there: lr and
 * momentum read on the device when not NULL; the same bits as one call per entry). Skipped as
 * a whole when *found_inf != 0. */
PS_API int ps_nn_multi_sgd_step(const int64_t *list, int32_t n, int64_t max_count, float lr,
                                float momentum, float dampening, float weight_decay,
                                int32_t nesterov, const float *scale, const int32_t *found_inf,
                                const int32_t *steps_done, const float *hyper, void *stream);
/* A copy entry has PS_MT_COPY_FIELDS fields: dst (f32), src (f32), count. ps_nn_copy_if on
 * every entry (flag NULL: copy unconditionally). */
#define PS_MT_COPY_FIELDS 3
PS_API int ps_nn_multi_copy_if(const int64_t *list, int32_t n, int64_t max_count,
                               const int32_t *flag, void *stream);

/* ---- skipped-step rollback ------------------------------------------------------------ */

/* dst = src (count f32 elements) when *flag != 0, else nothing; flag (int32) is read on the
 * device. Undoes a step's side effects without a host round trip when the GradScaler skips
 * the step (flag = found_inf): batch norm restores its running statistics from a copy taken
 * before the forward. */
PS_API int ps_nn_copy_if(float *dst, const float *src, int64_t count, const int32_t *flag,
                         void *stream);

#ifdef __cplusplus
}
#endif

#endif /* PINSTREAM_H */
