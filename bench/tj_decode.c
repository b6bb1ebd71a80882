/* libjpeg-turbo's own decode rate, one thread: every file named in LIST (one path a line) is
 * read into memory, then decoded in full to packed RGB with TurboJPEG's defaults (accurate
 * integer IDCT, fancy upsampling), the work pinstream's ImageDecoder does per file. Prints
 * {"imagesPerSecond": N} for a pass over the files after a warm-up pass.
 *
 * Build: cc -O2 -o tj_decode bench/tj_decode.c -lturbojpeg */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <turbojpeg.h>

typedef struct {
  unsigned char *data;
  unsigned long size;
} File;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int pass(tjhandle h, File *files, int n, unsigned char **out, size_t *cap) {
  for (int i = 0; i < n; i++) {
    int w, ht, ss, cs;
    if (tjDecompressHeader3(h, files[i].data, files[i].size, &w, &ht, &ss, &cs) != 0) return -1;
    size_t need = (size_t)w * ht * 3;
    if (need > *cap) {
      *out = realloc(*out, need);
      *cap = need;
    }
    if (tjDecompress2(h, files[i].data, files[i].size, *out, w, 0, ht, TJPF_RGB, 0) != 0) return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: tj_decode LIST\n");
    return 2;
  }
  FILE *list = fopen(argv[1], "r");
  if (!list) {
    perror(argv[1]);
    return 1;
  }
  File *files = NULL;
  int n = 0, capn = 0;
  char path[4096];
  while (fgets(path, sizeof path, list)) {
    path[strcspn(path, "\n")] = 0;
    if (!path[0]) continue;
    FILE *f = fopen(path, "rb");
    if (!f) {
      perror(path);
      return 1;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n == capn) files = realloc(files, sizeof(File) * (capn = capn ? 2 * capn : 256));
    files[n].data = malloc(size);
    files[n].size = (unsigned long)size;
    if (fread(files[n].data, 1, size, f) != (size_t)size) return 1;
    fclose(f);
    n++;
  }
  fclose(list);
  tjhandle h = tjInitDecompress();
  unsigned char *out = NULL;
  size_t cap = 0;
  if (pass(h, files, n < 20 ? n : 20, &out, &cap) != 0) {
    fprintf(stderr, "decode failed: %s\n", tjGetErrorStr2(h));
    return 1;
  }
  double t0 = now();
  if (pass(h, files, n, &out, &cap) != 0) {
    fprintf(stderr, "decode failed: %s\n", tjGetErrorStr2(h));
    return 1;
  }
  printf("{\"imagesPerSecond\": %.1f}\n", n / (now() - t0));
  return 0;
}
