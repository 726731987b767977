/*
 * A chained NCCL profiler that does nothing (benchmarks/profiler_cost.py): it asks for
 * collectives and kernel channels and returns one handle for every event, so that the cost
 * measured with it is what autotune's forwarding adds, not another profiler's own work.
 */
#include <stdint.h>

static char g_handle;

static int init(void **ctx, uint64_t id, int *mask, const char *name, int nnodes, int nranks,
                int rank, void *log) {
    (void)id, (void)name, (void)nnodes, (void)nranks, (void)rank, (void)log;
    *ctx = &g_handle;
    *mask = (1 << 1) | (1 << 6);
    return 0;
}

static int start(void *ctx, void **handle, void *descr) {
    (void)ctx, (void)descr;
    *handle = &g_handle;
    return 0;
}

static int stop(void *handle) { return handle == 0; }

static int record(void *handle, int state, void *args) {
    (void)state, (void)args;
    return handle == 0;
}

static int finalize(void *ctx) { return ctx == 0; }

typedef struct {
    const char *name;
    int (*init)(void **, uint64_t, int *, const char *, int, int, int, void *);
    int (*start)(void *, void **, void *);
    int (*stop)(void *);
    int (*record)(void *, int, void *);
    int (*finalize)(void *);
} api;

__attribute__((visibility("default"))) const api ncclProfiler_v5 = {
    "noop", init, start, stop, record, finalize};
