/*
 * The chained profiler (_profiler_chain.h): AUTOTUNE_NCCL_PROFILER_CHAIN names another NCCL
 * profiler plugin (NCCL Inspector's, or the user's own); autotune's plugin dlopens it at the first
 * communicator and forwards each of NCCL's calls to it, with its own contexts and handles
 * (_profiler.c keeps the chained handle beside its own; a handle that is not autotune's is the
 * chained plugin's, passed on as it is).
 *
 * Versions. NCCL looks up one symbol per process (2.31: ncclProfiler_v7, 2.29-2.30: _v6, ...);
 * the chained plugin is asked for that one first, and from v5 on for the newest it exports down
 * to v5: v6 only adds copy-engine members to the descriptor's union and v7 appends fields to the
 * members it changes (the user tag, the kernel variant, the symmetric flag) and a kernel-phase
 * member, so a v7 descriptor read as v6 or v5 is that version's descriptor. What the older
 * version does not know is not passed on (kernel phases below v7, copy-engine events below v6),
 * as NCCL itself drops them for an older plugin (src/plugin/profiler/profiler_v6.cc). Below v5
 * (v3 and v4 descriptors have another layout) the chained plugin must export the same version.
 *
 * Failures (no such library, no usable symbol, its init failing, a call returning an error)
 * are counted and logged once (NCCL's logger where NCCL gave one, else stderr); autotune's own
 * profiling goes on either way.
 */
#include "_profiler_chain.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CH_EVENT_CE ((1u << 12) | (1u << 13) | (1u << 14)) /* ncclProfileCeColl/CeSync/CeBatch */
#define CH_EVENT_KERNEL_PHASE (1u << 15)                  /* ncclProfileKernelPhase (v7) */
#define CH_STATE_CE_FIRST 25                              /* ncclProfilerCeCollStart */
#define CH_STATE_CE_LAST 30                               /* ncclProfilerCeBatchComplete */
#define CH_STATE_KERNEL_PHASE_STOP 31                     /* ncclProfilerKernelPhaseStop */

typedef int (*init3_fn)(void **, int *);
typedef int (*init4_fn)(void **, int *, const char *, uint64_t, int, int, int, ap_logger_t);
typedef int (*init5_fn)(void **, uint64_t, int *, const char *, int, int, int, ap_logger_t);

/* Every version's struct: a name, then init (whose arguments differ), startEvent, stopEvent,
 * recordEventState and finalize, in that order. */
typedef struct {
    const char *name;
    void *init;
    int (*start)(void *ctx, void **handle, void *descr);
    int (*stop)(void *handle);
    int (*record)(void *handle, int state, void *args);
    int (*finalize)(void *ctx);
} chain_api;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_tried;          /* the library was looked at (once per process) */
static void *g_lib;          /* dlopen's handle */
static const chain_api *g_exported[8]; /* by version, what the library exports */
static int g_for_nccl;       /* the NCCL version bound first */
static const chain_api *g_api; /* the struct forwarded to */
static _Atomic int g_version; /* its version (0: no chain) */
static _Atomic uint64_t g_forwarded, g_failures;
static _Atomic int g_logged;
static _Atomic ap_logger_t g_log; /* NCCL's logger, from the first communicator that gave one */

__attribute__((format(printf, 2, 3))) static void complain(ap_logger_t log, const char *fmt,
                                                           ...) {
    atomic_fetch_add(&g_failures, 1);
    if (atomic_exchange(&g_logged, 1)) return;
    if (log == NULL) log = atomic_load(&g_log);
    char msg[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(msg, sizeof msg, fmt, args);
    va_end(args);
    if (log != NULL)
        log(2 /* NCCL_LOG_WARN */, 1 /* NCCL_INIT */, __FILE__, __LINE__,
            "autotune profiler: chained profiler: %s (autotune's profiling goes on)", msg);
    else
        fprintf(stderr,
                "autotune profiler: chained profiler: %s (autotune's profiling goes on)\n", msg);
}

static void open_library(ap_logger_t log) {
    const char *path = getenv("AUTOTUNE_NCCL_PROFILER_CHAIN");
    if (path == NULL || *path == '\0') return;
    g_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (g_lib == NULL) {
        const char *why = dlerror();
        complain(log, "AUTOTUNE_NCCL_PROFILER_CHAIN=%s cannot be loaded: %s", path,
                 why != NULL ? why : "dlopen failed");
        return;
    }
    char symbol[32];
    int any = 0;
    for (int v = 7; v >= 3; v--) { /* newest first */
        snprintf(symbol, sizeof symbol, "ncclProfiler_v%d", v);
        const chain_api *api = dlsym(g_lib, symbol);
        if (api != NULL && api->init != NULL && api->start != NULL && api->stop != NULL &&
            api->record != NULL && api->finalize != NULL) {
            g_exported[v] = api;
            any = 1;
        }
    }
    if (!any) complain(log, "%s exports no ncclProfiler_v3 to _v7 with every function set", path);
}

int chain_bind(int nccl_version, ap_logger_t log) {
    if (nccl_version < 3 || nccl_version > 7) return 0;
    pthread_mutex_lock(&g_lock);
    if (atomic_load(&g_log) == NULL) atomic_store(&g_log, log);
    if (!g_tried) {
        g_tried = 1;
        open_library(log);
        g_for_nccl = nccl_version;
        if (g_lib != NULL) {
            int at = g_exported[nccl_version] != NULL ? nccl_version : 0;
            for (int v = nccl_version - 1; at == 0 && nccl_version >= 5 && v >= 5; v--)
                if (g_exported[v] != NULL) at = v;
            if (at != 0) {
                g_api = g_exported[at];
                atomic_store(&g_version, at);
            } else {
                complain(log, "it exports no profiler that NCCL's v%d calls can be passed to%s",
                         nccl_version, nccl_version >= 5 ? " (v5 or newer, up to NCCL's)" : "");
            }
        }
    } else if (nccl_version != g_for_nccl && g_api != NULL) {
        pthread_mutex_unlock(&g_lock);
        return 0; /* one NCCL per process: a communicator of another version goes unchained */
    }
    pthread_mutex_unlock(&g_lock);
    return atomic_load(&g_version);
}

int chain_init(int nccl_version, void **ctx, int *mask, const chain_comm_args *a) {
    *ctx = NULL;
    *mask = 0;
    int v = chain_bind(nccl_version, a->log);
    if (v == 0) return -1;
    int rc;
    if (v == 3)
        rc = ((init3_fn)g_api->init)(ctx, mask);
    else if (v == 4)
        rc = ((init4_fn)g_api->init)(ctx, mask, a->name, a->comm_id, a->nnodes, a->nranks,
                                     a->rank, a->log);
    else
        rc = ((init5_fn)g_api->init)(ctx, a->comm_id, mask, a->name, a->nnodes, a->nranks,
                                     a->rank, a->log);
    if (rc != 0) {
        complain(a->log, "its init returned %d; this communicator goes on without it", rc);
        *ctx = NULL;
        *mask = 0;
        return -1;
    }
    return 0;
}

int chain_knows_type(uint64_t type) {
    int v = atomic_load_explicit(&g_version, memory_order_relaxed);
    if (v == 0) return 0;
    if ((type & CH_EVENT_KERNEL_PHASE) && v < 7) return 0;
    if ((type & CH_EVENT_CE) && v < 6) return 0;
    return 1;
}

int chain_knows_state(int state) {
    int v = atomic_load_explicit(&g_version, memory_order_relaxed);
    if (v == 0) return 0;
    if (state == CH_STATE_KERNEL_PHASE_STOP && v < 7) return 0;
    if (state >= CH_STATE_CE_FIRST && state <= CH_STATE_CE_LAST && v < 6) return 0;
    return 1;
}

static void counted(int rc, const char *call) {
    atomic_fetch_add_explicit(&g_forwarded, 1, memory_order_relaxed);
    if (rc != 0) complain(NULL, "its %s returned an error", call);
}

void *chain_start(void *ctx, void *descr, void **parent_slot, void *parent) {
    void *handle = NULL;
    void *saved = *parent_slot;
    *parent_slot = parent;
    counted(g_api->start(ctx, &handle, descr), "startEvent");
    *parent_slot = saved;
    return handle;
}

void chain_stop(void *handle) { counted(g_api->stop(handle), "stopEvent"); }

void chain_record(void *handle, int state, void *args) {
    counted(g_api->record(handle, state, args), "recordEventState");
}

void chain_finalize(void *ctx) { counted(g_api->finalize(ctx), "finalize"); }

int chain_version(void) { return atomic_load(&g_version); }

uint64_t chain_forwarded(void) { return atomic_load(&g_forwarded); }

uint64_t chain_failures(void) { return atomic_load(&g_failures); }
