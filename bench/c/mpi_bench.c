/* mpi_bench.c - the MPI side of bench/compare_mpi.sh, printing the same lines as mutirao's
 * examples (pingpong.rs, collbench.rs) so the two can be compared row by row.
 *   mpi_bench pingpong            -> "BYTES ONE_WAY_LATENCY_US MB_PER_S" per size (ranks 0 and 1)
 *   mpi_bench allreduce [B,B,..]  -> "BYTES LATENCY_US" per size (u64 MPI_SUM; default 8)
 *   mpi_bench bcast [B,..]        -> "BYTES LATENCY_US" per size (root 0)
 *   mpi_bench alltoall [B,..]     -> "BYTES LATENCY_US" per size (B bytes to every rank)
 *   mpi_bench init                -> MPI_Init + MPI_Finalize only
 * Timing: median over batches after a warm-up, as in pingpong.rs; collectives first settle
 * (0.5 s of untimed 8-byte allreduces, BENCH_WARM_S), then a collective reports the
 * slowest rank's median. Collective batches follow collbench.rs's rule exactly: at most
 * 20000 / (1 + bytes/1024) operations, fewer if one batch would take more than 20 ms (measured
 * on 5 operations): MPICH 4.0 (ch4:ucx) busy-polls without ever yielding, so with 4 ranks on
 * 2 cores one allreduce costs ~10 ms and the old fixed 44000 operations took minutes. */
#include <mpi.h>
#include <stdint.h>
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

enum coll { ALLREDUCE, BCAST, ALLTOALL };

/* One collective operation of `bytes` (per destination for alltoall). */
static void coll_op(enum coll c, long bytes, uint64_t *a, uint64_t *b, int nranks) {
    long count = bytes / 8 > 0 ? bytes / 8 : 1;
    switch (c) {
    case ALLREDUCE:
        MPI_Allreduce(a, b, (int)count, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
        break;
    case BCAST:
        MPI_Bcast(a, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
        break;
    case ALLTOALL:
        MPI_Alltoall(a, (int)bytes, MPI_BYTE, b, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
        break;
    }
    (void)nranks;
}

/* Settle: 8-byte allreduces for BENCH_WARM_S seconds (default 0.5, rank 0's clock), untimed,
 * before anything is measured. With more ranks than cores the kernel needs about a second to
 * settle where the ranks run; until then the same operation took 1.3-1.6x its steady time, on
 * both sides. collbench.rs does exactly the same. */
static void settle(void) {
    const char *w = getenv("BENCH_WARM_S");
    double warm = w ? atof(w) : 0.5, t0 = MPI_Wtime();
    uint64_t x = 1, y;
    for (long k = 1;; k++) {
        MPI_Allreduce(&x, &y, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
        if (k % 16 == 0) {
            int more = MPI_Wtime() - t0 < warm;
            MPI_Bcast(&more, 1, MPI_INT, 0, MPI_COMM_WORLD);
            if (!more) break;
        }
    }
}

static void collective(enum coll c, const char *list, int rank, int nranks) {
    if (rank == 0) printf("# ranks=%d BYTES LATENCY_US\n", nranks);
    settle();
    char *sizes = strdup(list);
    for (char *tok = strtok(sizes, ","); tok; tok = strtok(NULL, ",")) {
        long bytes = atol(tok);
        long count = bytes / 8 > 0 ? bytes / 8 : 1;
        size_t elems = c == ALLTOALL ? (size_t)count * nranks : (size_t)count;
        uint64_t *a = malloc(elems * 8), *b = malloc(elems * 8);
        if (!a || !b) MPI_Abort(MPI_COMM_WORLD, 2);
        for (size_t i = 0; i < elems; i++) a[i] = (uint64_t)rank * 1000 + i;
        coll_op(c, bytes, a, b, nranks);
        if (c == ALLREDUCE) {
            for (long i = 0; i < count; i++)
                if (b[i] != (uint64_t)nranks * (nranks - 1) / 2 * 1000 + (uint64_t)nranks * i)
                    MPI_Abort(MPI_COMM_WORLD, 1);
        }
        long per = 20000 / (1 + bytes / 1024);
        if (per < 3) per = 3;
        /* Calibrate: 5 operations, slowest rank; a batch takes at most ~20 ms. */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int k = 0; k < 5; k++) coll_op(c, bytes, a, b, nranks);
        double one = (MPI_Wtime() - t0) / 5, worst1;
        MPI_Allreduce(&one, &worst1, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (worst1 > 0 && per * worst1 > 0.020) per = (long)(0.020 / worst1);
        if (per < 1) per = 1;
        double t[21];
        for (int bt = 0; bt < 21; bt++) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
            for (long k = 0; k < per; k++) coll_op(c, bytes, a, b, nranks);
            t[bt] = (MPI_Wtime() - t0) / per;
        }
        double m = median(t, 21), worst;
        MPI_Reduce(&m, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0) printf("%ld %.3f\n", bytes, worst * 1e6);
        free(a);
        free(b);
    }
    free(sizes);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *mode = argc > 1 ? argv[1] : "pingpong";
    const char *list = argc > 2 ? argv[2] : "8";
    double scale = getenv("BENCH_SCALE") ? atof(getenv("BENCH_SCALE")) : 1.0;
    if (!strcmp(mode, "pingpong") && size >= 2) pingpong(rank, scale);
    else if (!strcmp(mode, "allreduce")) collective(ALLREDUCE, list, rank, size);
    else if (!strcmp(mode, "bcast")) collective(BCAST, list, rank, size);
    else if (!strcmp(mode, "alltoall")) collective(ALLTOALL, list, rank, size);
    MPI_Finalize();
    return 0;
}
