/*
 * stand_in_hooks.h: how a stand-in library for the CUDA emulator (nccl_stand_in.c,
 * nvjpeg_stand_in.c) finds the loaded emulator: by the two calls it exports, since its CUDA API
 * is hidden inside the emulated cuda backend, which is opened with local symbols. Included by
 * each stand-in once; the includer defines _GNU_SOURCE before its system headers.
 */
#ifndef PINSTREAM_STAND_IN_HOOKS_H
#define PINSTREAM_STAND_IN_HOOKS_H

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>

/* Queues fn(data) on an emulated stream, at its place in the stream's order. */
static int (*launch_host_func)(void *stream, void (*fn)(void *), void *data);
/* Whether [p, p + bytes) is emulated device memory. */
static int (*device_accessible)(const void *p, size_t bytes);

static int collect_name(struct dl_phdr_info *info, size_t size, void *out) {
  (void)size;
  char(*names)[PATH_MAX] = out;
  for (int i = 0; i < 256; i++) {
    if (names[i][0] == 0) {
      if (info->dlpi_name && info->dlpi_name[0])
        snprintf(names[i], PATH_MAX, "%s", info->dlpi_name);
      return 0;
    }
  }
  return 1;
}

/* Finds the loaded emulator's hooks (once); 0 when no emulator is loaded. */
static int find_emulator(void) {
  if (launch_host_func) return 1;
  char(*names)[PATH_MAX] = calloc(256, PATH_MAX);
  if (!names) return 0;
  dl_iterate_phdr(collect_name, names);
  for (int i = 0; i < 256 && names[i][0]; i++) {
    void *h = dlopen(names[i], RTLD_LAZY | RTLD_NOLOAD);
    if (!h) continue;
    void *launch = dlsym(h, "ps_emu_launch_host_func");
    void *access = dlsym(h, "ps_emu_device_accessible");
    if (launch && access) {
      *(void **)&launch_host_func = launch;
      *(void **)&device_accessible = access;
      break;
    }
    dlclose(h);
  }
  free(names);
  return launch_host_func != NULL;
}

#endif
