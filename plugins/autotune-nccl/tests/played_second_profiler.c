/*
 * A second NCCL profiler plugin, as NVIDIA's NCCL Inspector or a user's own would be, for the
 * chained-profiler tests (test_profiler_chain.py builds it with cc). It asks NCCL for
 * collectives, proxy ops (which autotune does not ask for), kernel channels and, at v7, kernel
 * phases, and logs every call it receives with its own contexts and handles, which the test
 * reads back through second_log(). Built with -DONLY_V5 it exports ncclProfiler_v5 alone.
 * SECOND_FAIL_INIT=1 in the environment makes its init fail.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { LOG = 4096, EVENTS = 4096 };

typedef struct {
    int call;        /* 0 init, 1 start, 2 stop, 3 record, 4 finalize */
    int state;       /* record: the state */
    uint64_t type;   /* start: the event type */
    void *ctx;       /* init, start, finalize: the context */
    void *handle;    /* start: the handle it gave; stop, record: the handle it was given */
    void *parent;    /* start: the parent it was given */
    uint64_t timer;  /* record: the args' first uint64; start: the kernel channel's timer */
} second_entry;

static second_entry g_log[LOG];
static int g_n;
static char g_events[EVENTS]; /* its handles: addresses in here */
static int g_next_event;
static char g_contexts[16];
static int g_next_ctx;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static void note(second_entry e) {
    pthread_mutex_lock(&g_lock);
    if (g_n < LOG) g_log[g_n++] = e;
    pthread_mutex_unlock(&g_lock);
}

__attribute__((visibility("default"))) int second_log(second_entry *out, int max) {
    pthread_mutex_lock(&g_lock);
    int n = g_n < max ? g_n : max;
    memcpy(out, g_log, (size_t)n * sizeof(second_entry));
    pthread_mutex_unlock(&g_lock);
    return n;
}

static int init_common(void **ctx, int *mask, int version) {
    const char *fail = getenv("SECOND_FAIL_INIT");
    if (fail != NULL && strcmp(fail, "1") == 0) return 3; /* ncclInternalError */
    pthread_mutex_lock(&g_lock);
    *ctx = &g_contexts[g_next_ctx++ % 16];
    pthread_mutex_unlock(&g_lock);
    *mask = (1 << 1) | (1 << 3) | (1 << 6) | (version >= 7 ? 1 << 15 : 0);
    note((second_entry){.call = 0, .ctx = *ctx});
    return 0;
}

static int init_v5(void **ctx, uint64_t id, int *mask, const char *name, int nnodes, int nranks,
                   int rank, void *log) {
    (void)id, (void)name, (void)nnodes, (void)nranks, (void)rank, (void)log;
    return init_common(ctx, mask, 5);
}

__attribute__((unused)) static int init_v7(void **ctx, uint64_t id, int *mask, const char *name, int nnodes, int nranks,
                   int rank, void *log) {
    (void)id, (void)name, (void)nnodes, (void)nranks, (void)rank, (void)log;
    return init_common(ctx, mask, 7);
}

/* The descriptors' common head (v5 to v7), and the kernel channel's member. */
typedef struct {
    uint64_t type;
    void *parentObj;
    int rank;
    union {
        struct {
            uint8_t channelId;
            uint64_t pTimer;
        } kernelCh;
        char other[256];
    };
} descr;

static int start(void *ctx, void **handle, void *d) {
    descr *e = d;
    pthread_mutex_lock(&g_lock);
    *handle = &g_events[g_next_event++ % EVENTS];
    pthread_mutex_unlock(&g_lock);
    note((second_entry){.call = 1, .type = e->type, .ctx = ctx, .handle = *handle,
                        .parent = e->parentObj,
                        .timer = e->type == (1 << 6) ? e->kernelCh.pTimer : 0});
    return 0;
}

static int stop(void *handle) {
    note((second_entry){.call = 2, .handle = handle});
    return 0;
}

static int record(void *handle, int state, void *args) {
    note((second_entry){.call = 3, .state = state, .handle = handle,
                        .timer = args != NULL ? *(uint64_t *)args : 0});
    return 0;
}

static int finalize(void *ctx) {
    note((second_entry){.call = 4, .ctx = ctx});
    return 0;
}

typedef struct {
    const char *name;
    int (*init)(void **, uint64_t, int *, const char *, int, int, int, void *);
    int (*start)(void *, void **, void *);
    int (*stop)(void *);
    int (*record)(void *, int, void *);
    int (*finalize)(void *);
} api;

#ifndef ONLY_V5
__attribute__((visibility("default"))) const api ncclProfiler_v7 = {
    "second", init_v7, start, stop, record, finalize};
__attribute__((visibility("default"))) const api ncclProfiler_v6 = {
    "second", init_v5, start, stop, record, finalize};
#endif
__attribute__((visibility("default"))) const api ncclProfiler_v5 = {
    "second", init_v5, start, stop, record, finalize};
