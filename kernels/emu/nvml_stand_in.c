// A stand-in for libnvidia-ml.so.1 on machines without an NVIDIA driver: the few NVML entry
// points ffi/nvml.ts calls, answering for one GPU with fixed, plausible values, so the code
// that samples GPU utilisation runs in CI. Selected with PINSTREAM_NVML_LIB=<this library>.

#include <string.h>

typedef int nvmlReturn_t;
enum { NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2 };

typedef struct {
  unsigned int gpu;
  unsigned int memory;
} nvmlUtilization_t;

typedef struct {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;

static int initialized = 0;
static int device_token = 0;

nvmlReturn_t nvmlInit_v2(void) {
  initialized++;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void) {
  if (initialized == 0) return NVML_ERROR_UNINITIALIZED;
  initialized--;
  return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    default: return "Unknown Error";
  }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
  if (!initialized) return NVML_ERROR_UNINITIALIZED;
  if (!count) return NVML_ERROR_INVALID_ARGUMENT;
  *count = 1;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
  if (!initialized) return NVML_ERROR_UNINITIALIZED;
  if (index != 0 || !device) return NVML_ERROR_INVALID_ARGUMENT;
  *device = &device_token;
  return NVML_SUCCESS;
}

static int valid(void *device) { return initialized && device == &device_token; }

nvmlReturn_t nvmlDeviceGetName(void *device, char *name, unsigned int length) {
  static const char stand_in[] = "NVML stand-in GPU";
  if (!valid(device) || !name || length < sizeof stand_in) return NVML_ERROR_INVALID_ARGUMENT;
  memcpy(name, stand_in, sizeof stand_in);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(void *device, nvmlUtilization_t *u) {
  if (!valid(device) || !u) return NVML_ERROR_INVALID_ARGUMENT;
  u->gpu = 87;
  u->memory = 41;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *m) {
  if (!valid(device) || !m) return NVML_ERROR_INVALID_ARGUMENT;
  m->total = 80ULL << 30;
  m->used = 3ULL << 30;
  m->free = m->total - m->used;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(void *device, int sensor, unsigned int *temp) {
  if (!valid(device) || sensor != 0 || !temp) return NVML_ERROR_INVALID_ARGUMENT;
  *temp = 64;
  return NVML_SUCCESS;
}
