// A stand-in for libnvjpeg.so on machines without a GPU: the nvJPEG calls ffi/nvjpeg.ts makes,
// decoding with libjpeg-turbo (libturbojpeg.so.0, opened with dlopen) into the CUDA emulator's
// device memory, so the device-decode path (handle and state lifetimes, the fall back from the
// hardware backend, image info, batched decode, stream ordering) runs in CI. Selected with
// PINSTREAM_NVJPEG_LIB=<this library>; it needs the emulated cuda backend loaded in the process.
//
// Like nvJPEG's hybrid backend, a decode parses and decodes the file on the host during the
// call (so a corrupt file fails there) and writes the pixels at the call's position in the
// stream: a host function on the emulated stream (ps_emu_launch_host_func) copies them into the
// destination, so in deferred-stream mode nothing lands before the host waits for the stream.
// The pixels are TurboJPEG's, with the flags the workers' decoder uses, so both paths agree to
// the byte; nvJPEG's own IDCT rounds differently. There is no hardware decoder here: asking for
// NVJPEG_BACKEND_HARDWARE fails as it does on a GPU without one.

#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum {
  NVJPEG_STATUS_SUCCESS = 0,
  NVJPEG_STATUS_NOT_INITIALIZED = 1,
  NVJPEG_STATUS_INVALID_PARAMETER = 2,
  NVJPEG_STATUS_BAD_JPEG = 3,
  NVJPEG_STATUS_JPEG_NOT_SUPPORTED = 4,
  NVJPEG_STATUS_ALLOCATOR_FAILURE = 5,
  NVJPEG_STATUS_EXECUTION_FAILED = 6,
  NVJPEG_STATUS_ARCH_MISMATCH = 7,
  NVJPEG_STATUS_INTERNAL_ERROR = 8,
  NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED = 9,
} nvjpegStatus_t;

enum { NVJPEG_BACKEND_DEFAULT = 0, NVJPEG_BACKEND_HYBRID = 1, NVJPEG_BACKEND_HARDWARE = 3 };
enum { NVJPEG_OUTPUT_RGBI = 5 };
enum {
  NVJPEG_CSS_444 = 0,
  NVJPEG_CSS_422 = 1,
  NVJPEG_CSS_420 = 2,
  NVJPEG_CSS_440 = 3,
  NVJPEG_CSS_411 = 4,
  NVJPEG_CSS_GRAY = 6,
  NVJPEG_CSS_UNKNOWN = -1,
};
#define NVJPEG_MAX_COMPONENT 4

typedef struct {
  unsigned char *channel[NVJPEG_MAX_COMPONENT];
  size_t pitch[NVJPEG_MAX_COMPONENT];
} nvjpegImage_t;

// ---- libjpeg-turbo's TurboJPEG 2.x API, declared here so that only the runtime library is needed

typedef void *tjhandle;
enum { TJPF_RGB = 0, TJSAMP_444 = 0, TJSAMP_422, TJSAMP_420, TJSAMP_GRAY, TJSAMP_440, TJSAMP_411 };
enum { TJFLAG_STOPONWARNING = 8192, TJERR_WARNING = 0 };

static struct {
  tjhandle (*init)(void);
  int (*header)(tjhandle, const unsigned char *, unsigned long, int *, int *, int *, int *);
  int (*decompress)(tjhandle, const unsigned char *, unsigned long, unsigned char *, int, int, int,
                    int, int);
  char *(*error_str)(tjhandle);
  int (*error_code)(tjhandle);
  int (*destroy)(tjhandle);
} tj;

static int load_turbojpeg(void) {
  if (tj.init) return 1;
  void *h = dlopen("libturbojpeg.so.0", RTLD_NOW | RTLD_LOCAL);
  if (!h) return 0;
  *(void **)&tj.header = dlsym(h, "tjDecompressHeader3");
  *(void **)&tj.decompress = dlsym(h, "tjDecompress2");
  *(void **)&tj.error_str = dlsym(h, "tjGetErrorStr2");
  *(void **)&tj.error_code = dlsym(h, "tjGetErrorCode");
  *(void **)&tj.destroy = dlsym(h, "tjDestroy");
  void *init = dlsym(h, "tjInitDecompress");
  if (!tj.header || !tj.decompress || !tj.error_str || !tj.error_code || !tj.destroy || !init) {
    return 0;
  }
  *(void **)&tj.init = init;
  return 1;
}

// ---- the emulator's hooks

#include "stand_in_hooks.h"

// ---- handles and states

#define HANDLE_MAGIC 0x6e766a68u
#define STATE_MAGIC 0x6e766a73u

typedef struct {
  unsigned magic;
  pthread_mutex_t mu;  // nvJPEG's handle may be shared by threads; TurboJPEG's may not
  tjhandle tj;
} handle_t;

typedef struct {
  unsigned magic;
  handle_t *handle;
  int batch_size;
  int format;
} state_t;

// Marks this library as the emulator's stand-in for ffi/nvjpeg.ts.
int ps_nvjpeg_stand_in(void) { return 1; }

nvjpegStatus_t nvjpegGetProperty(int type, int *value) {
  if (!value) return NVJPEG_STATUS_INVALID_PARAMETER;
  // The API version the stand-in follows (nvJPEG of CUDA 12.0).
  switch (type) {
    case 0: *value = 12; return NVJPEG_STATUS_SUCCESS;
    case 1: *value = 0; return NVJPEG_STATUS_SUCCESS;
    case 2: *value = 0; return NVJPEG_STATUS_SUCCESS;
    default: return NVJPEG_STATUS_INVALID_PARAMETER;
  }
}

nvjpegStatus_t nvjpegCreateEx(int backend, void *dev_allocator, void *pinned_allocator,
                              unsigned flags, handle_t **out) {
  (void)flags;
  if (!out || dev_allocator || pinned_allocator) return NVJPEG_STATUS_INVALID_PARAMETER;
  if (backend == NVJPEG_BACKEND_HARDWARE) return NVJPEG_STATUS_ARCH_MISMATCH;
  if (backend != NVJPEG_BACKEND_DEFAULT && backend != NVJPEG_BACKEND_HYBRID) {
    return NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED;
  }
  if (!find_emulator() || !load_turbojpeg()) return NVJPEG_STATUS_NOT_INITIALIZED;
  handle_t *h = calloc(1, sizeof *h);
  if (!h) return NVJPEG_STATUS_ALLOCATOR_FAILURE;
  h->tj = tj.init();
  if (!h->tj) {
    free(h);
    return NVJPEG_STATUS_INTERNAL_ERROR;
  }
  pthread_mutex_init(&h->mu, NULL);
  h->magic = HANDLE_MAGIC;
  *out = h;
  return NVJPEG_STATUS_SUCCESS;
}

nvjpegStatus_t nvjpegCreateSimple(handle_t **out) {
  return nvjpegCreateEx(NVJPEG_BACKEND_DEFAULT, NULL, NULL, 0, out);
}

static int valid_handle(handle_t *h) { return h && h->magic == HANDLE_MAGIC; }
static int valid_state(state_t *s, handle_t *h) {
  return s && s->magic == STATE_MAGIC && s->handle == h;
}

nvjpegStatus_t nvjpegDestroy(handle_t *h) {
  if (!valid_handle(h)) return NVJPEG_STATUS_INVALID_PARAMETER;
  h->magic = 0;
  if (h->tj) tj.destroy(h->tj);
  pthread_mutex_destroy(&h->mu);
  free(h);
  return NVJPEG_STATUS_SUCCESS;
}

nvjpegStatus_t nvjpegJpegStateCreate(handle_t *h, state_t **out) {
  if (!valid_handle(h) || !out) return NVJPEG_STATUS_INVALID_PARAMETER;
  state_t *s = calloc(1, sizeof *s);
  if (!s) return NVJPEG_STATUS_ALLOCATOR_FAILURE;
  s->magic = STATE_MAGIC;
  s->handle = h;
  *out = s;
  return NVJPEG_STATUS_SUCCESS;
}

nvjpegStatus_t nvjpegJpegStateDestroy(state_t *s) {
  if (!s || s->magic != STATE_MAGIC) return NVJPEG_STATUS_INVALID_PARAMETER;
  s->magic = 0;
  free(s);
  return NVJPEG_STATUS_SUCCESS;
}

static int css_of(int tjsamp) {
  switch (tjsamp) {
    case TJSAMP_444: return NVJPEG_CSS_444;
    case TJSAMP_422: return NVJPEG_CSS_422;
    case TJSAMP_420: return NVJPEG_CSS_420;
    case TJSAMP_GRAY: return NVJPEG_CSS_GRAY;
    case TJSAMP_440: return NVJPEG_CSS_440;
    case TJSAMP_411: return NVJPEG_CSS_411;
    default: return NVJPEG_CSS_UNKNOWN;
  }
}

// After a file that fails, the next header read on the same decompressor can fail too (seen with
// a file cut inside its tables): each failure gets a fresh decompressor. Called with h->mu held.
static void reset_locked(handle_t *h) {
  if (h->tj) tj.destroy(h->tj);
  h->tj = tj.init();
}

// Called with h->mu held.
static nvjpegStatus_t header_locked(handle_t *h, const unsigned char *data, size_t length, int *w,
                                    int *ht, int *samp) {
  int cs = 0;
  *w = *ht = 0;
  if (!h->tj) return NVJPEG_STATUS_INTERNAL_ERROR;
  if (tj.header(h->tj, data, (unsigned long)length, w, ht, samp, &cs) != 0 || *w <= 0 || *ht <= 0) {
    reset_locked(h);
    return NVJPEG_STATUS_BAD_JPEG;
  }
  return NVJPEG_STATUS_SUCCESS;
}

nvjpegStatus_t nvjpegGetImageInfo(handle_t *h, const unsigned char *data, size_t length,
                                  int *n_components, int *subsampling, int *widths, int *heights) {
  if (!valid_handle(h) || !data || !n_components || !subsampling || !widths || !heights) {
    return NVJPEG_STATUS_INVALID_PARAMETER;
  }
  int w, ht, samp;
  pthread_mutex_lock(&h->mu);
  nvjpegStatus_t r = header_locked(h, data, length, &w, &ht, &samp);
  pthread_mutex_unlock(&h->mu);
  if (r != NVJPEG_STATUS_SUCCESS) return r;
  *n_components = samp == TJSAMP_GRAY ? 1 : 3;
  *subsampling = css_of(samp);
  // Chroma planes as the sampling factors shrink them (rounded up, as JPEG does).
  int cw = w, ch = ht;
  if (samp == TJSAMP_422 || samp == TJSAMP_420) cw = (w + 1) / 2;
  if (samp == TJSAMP_411) cw = (w + 3) / 4;
  if (samp == TJSAMP_420 || samp == TJSAMP_440) ch = (ht + 1) / 2;
  for (int c = 0; c < NVJPEG_MAX_COMPONENT; c++) {
    int present = c < *n_components;
    widths[c] = present ? (c == 0 ? w : cw) : 0;
    heights[c] = present ? (c == 0 ? ht : ch) : 0;
  }
  return NVJPEG_STATUS_SUCCESS;
}

typedef struct {
  unsigned char *pixels;  // width * 3 bytes a row, malloc'd
  int width, height;
  unsigned char *dst;
  size_t pitch;
} write_t;

static void write_rows(void *p) {
  write_t *w = p;
  for (int y = 0; y < w->height; y++) {
    memcpy(w->dst + (size_t)y * w->pitch, w->pixels + (size_t)y * w->width * 3,
           (size_t)w->width * 3);
  }
  free(w->pixels);
  free(w);
}

// A truncated file or corrupt data is a warning to libjpeg, which fills the rest grey: refused,
// like every error. Other warnings leave good pixels and are decoded through (as the workers do).
static int refused(const char *message) {
  return strcasestr(message, "premature end") || strcasestr(message, "corrupt") ||
         strcasestr(message, "bad huffman");
}

static nvjpegStatus_t decode_one(handle_t *h, const unsigned char *data, size_t length,
                                 const nvjpegImage_t *dst, void *stream) {
  if (!data || !dst || !dst->channel[0]) return NVJPEG_STATUS_INVALID_PARAMETER;
  int w, ht, samp;
  pthread_mutex_lock(&h->mu);
  nvjpegStatus_t r = header_locked(h, data, length, &w, &ht, &samp);
  if (r != NVJPEG_STATUS_SUCCESS) {
    pthread_mutex_unlock(&h->mu);
    return r;
  }
  if (dst->pitch[0] < (size_t)w * 3 ||
      !device_accessible(dst->channel[0], dst->pitch[0] * (size_t)(ht - 1) + (size_t)w * 3)) {
    pthread_mutex_unlock(&h->mu);
    return NVJPEG_STATUS_INVALID_PARAMETER;
  }
  unsigned char *pixels = malloc((size_t)w * ht * 3);
  write_t *job = malloc(sizeof *job);
  if (!pixels || !job) {
    pthread_mutex_unlock(&h->mu);
    free(pixels);
    free(job);
    return NVJPEG_STATUS_ALLOCATOR_FAILURE;
  }
  int rc = tj.decompress(h->tj, data, (unsigned long)length, pixels, w, 0, ht, TJPF_RGB,
                         TJFLAG_STOPONWARNING);
  if (rc != 0) {
    char first[256];
    snprintf(first, sizeof first, "%s", tj.error_str(h->tj));
    int warning = tj.error_code(h->tj) == TJERR_WARNING;
    if (!warning || refused(first)) {
      rc = -1;
    } else {
      rc = tj.decompress(h->tj, data, (unsigned long)length, pixels, w, 0, ht, TJPF_RGB, 0);
      if (rc != 0 && tj.error_code(h->tj) == TJERR_WARNING && !strcmp(first, tj.error_str(h->tj)))
        rc = 0;
    }
  }
  if (rc != 0) reset_locked(h);
  pthread_mutex_unlock(&h->mu);
  if (rc != 0) {
    free(pixels);
    free(job);
    return NVJPEG_STATUS_BAD_JPEG;
  }
  *job = (write_t){pixels, w, ht, dst->channel[0], dst->pitch[0]};
  if (launch_host_func(stream, write_rows, job) != 0) {
    free(pixels);
    free(job);
    return NVJPEG_STATUS_EXECUTION_FAILED;
  }
  return NVJPEG_STATUS_SUCCESS;
}

nvjpegStatus_t nvjpegDecode(handle_t *h, state_t *s, const unsigned char *data, size_t length,
                            int output_format, nvjpegImage_t *destination, void *stream) {
  if (!valid_handle(h) || !valid_state(s, h)) return NVJPEG_STATUS_INVALID_PARAMETER;
  if (output_format != NVJPEG_OUTPUT_RGBI) return NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED;
  return decode_one(h, data, length, destination, stream);
}

nvjpegStatus_t nvjpegDecodeBatchedInitialize(handle_t *h, state_t *s, int batch_size,
                                             int max_cpu_threads, int output_format) {
  (void)max_cpu_threads;
  if (!valid_handle(h) || !valid_state(s, h) || batch_size <= 0) {
    return NVJPEG_STATUS_INVALID_PARAMETER;
  }
  if (output_format != NVJPEG_OUTPUT_RGBI) return NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED;
  s->batch_size = batch_size;
  s->format = output_format;
  return NVJPEG_STATUS_SUCCESS;
}

nvjpegStatus_t nvjpegDecodeBatched(handle_t *h, state_t *s, const unsigned char *const *data,
                                   const size_t *lengths, nvjpegImage_t *destinations,
                                   void *stream) {
  if (!valid_handle(h) || !valid_state(s, h) || !data || !lengths || !destinations) {
    return NVJPEG_STATUS_INVALID_PARAMETER;
  }
  if (s->batch_size <= 0) return NVJPEG_STATUS_NOT_INITIALIZED;
  for (int i = 0; i < s->batch_size; i++) {
    nvjpegStatus_t r = decode_one(h, data[i], lengths[i], &destinations[i], stream);
    if (r != NVJPEG_STATUS_SUCCESS) return r;
  }
  return NVJPEG_STATUS_SUCCESS;
}
