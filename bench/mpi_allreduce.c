/* Raw MPI all-reduce bandwidth, the reference of bench/dist.ts: in-place MPI_SUM over floats
 * of each size given (MiB), timed per call after warm-up. Rank 0 prints one JSON line per
 * size: {"mib":S,"iters":N,"bestMs":..,"medianMs":..}.
 *
 *   mpicc -O2 -o mpi_allreduce bench/mpi_allreduce.c
 *   mpirun -n 2 ./mpi_allreduce 1 4 16 64
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int provided, rank;
  /* The same thread level as pinstream's process group asks for. */
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (int a = 1; a < argc; a++) {
    double mib = atof(argv[a]);
    int count = (int)(mib * 1024 * 1024 / 4);
    int iters = mib <= 4 ? 20 : mib <= 16 ? 10 : 5;
    float *buf = malloc((size_t)count * 4);
    double *ms = malloc(sizeof(double) * iters);
    if (!buf || !ms) MPI_Abort(MPI_COMM_WORLD, 1);
    for (int i = 0; i < count; i++) buf[i] = 1.0f;
    for (int w = 0; w < 2; w++) {
      MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    for (int i = 0; i < iters; i++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      ms[i] = (MPI_Wtime() - t0) * 1e3;
    }
    qsort(ms, iters, sizeof(double), cmp);
    if (rank == 0) {
      printf("{\"mib\":%g,\"iters\":%d,\"bestMs\":%.4f,\"medianMs\":%.4f}\n", mib, iters, ms[0],
             ms[iters / 2]);
      fflush(stdout);
    }
    free(buf);
    free(ms);
  }
  MPI_Finalize();
  return 0;
}
