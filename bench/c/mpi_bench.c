/* mpi_bench.c - the MPI side of bench/compare_mpi.sh, printing the same lines as mutirao's
 * examples so the two can be compared row by row.
 *   mpi_bench pingpong   -> "BYTES ONE_WAY_LATENCY_US MB_PER_S" per size (ranks 0 and 1)
 *   mpi_bench allreduce  -> "8 LATENCY_US" (slowest rank's median, 8-byte MPI_SUM)
 *   mpi_bench init       -> MPI_Init + MPI_Finalize only
 * Timing: median over batches of round trips after a warm-up, as in pingpong.rs. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp);
    return v[n / 2];
}

static void pingpong(int rank, double scale) {
    static const long sizes[] = {0, 1, 8, 64, 512, 4096, 32768, 65536, 262144, 1 << 20, 4 << 20};
    char *buf = malloc(4 << 20), *out = malloc(4 << 20);
    if (!buf || !out) MPI_Abort(MPI_COMM_WORLD, 2);
    memset(out, 7, 4 << 20);
    if (rank == 0) printf("# BYTES ONE_WAY_LATENCY_US MB_PER_S\n");
    for (unsigned i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        long size = sizes[i];
        int per = (int)(2000.0 / (1.0 + size / 4096.0) * scale);
        if (per < 1) per = 1;
        int batches = 40, warm = per / 4 < 2 ? 2 : per / 4;
        double t[64];
        for (int b = -1; b < batches; b++) {
            int n = b < 0 ? warm : per;
            double t0 = MPI_Wtime();
            for (int k = 0; k < n; k++) {
                if (rank == 0) {
                    MPI_Send(out, size, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
                    MPI_Recv(buf, size, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else if (rank == 1) {
                    MPI_Recv(buf, size, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    MPI_Send(buf, size, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
                }
            }
            if (b >= 0) t[b] = (MPI_Wtime() - t0) / (2.0 * n);
        }
        double m = median(t, batches);
        if (rank == 0) printf("%ld %.3f %.1f\n", size, m * 1e6, m > 0 ? size / m / 1e6 : 0.0);
    }
    free(buf);
    free(out);
}

static void allreduce(int rank, int size) {
    long in = rank, res = 0;
    double t[21];
    for (int b = -1; b < 21; b++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int k = 0; k < 2000; k++) MPI_Allreduce(&in, &res, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (b >= 0) t[b] = (MPI_Wtime() - t0) / 2000;
    }
    if (res != (long)size * (size - 1) / 2) MPI_Abort(MPI_COMM_WORLD, 1);
    double m = median(t, 21), worst;
    MPI_Reduce(&m, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("# ranks=%d BYTES LATENCY_US\n8 %.3f\n", size, worst * 1e6);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *mode = argc > 1 ? argv[1] : "pingpong";
    double scale = getenv("BENCH_SCALE") ? atof(getenv("BENCH_SCALE")) : 1.0;
    if (!strcmp(mode, "pingpong") && size >= 2) pingpong(rank, scale);
    else if (!strcmp(mode, "allreduce")) allreduce(rank, size);
    MPI_Finalize();
    return 0;
}
