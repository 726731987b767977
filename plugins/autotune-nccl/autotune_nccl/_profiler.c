/*
 * autotune's NCCL profiler plugin, in the same library as its tuner (_tuner.c): NCCL loads it
 * through NCCL_PROFILER_PLUGIN=<the library>, autotune's Python side drains what it kept through
 * ctypes (autotune_nccl.Profiler). See docs/NCCL_PROFILER.md.
 *
 * It exports ncclProfiler_v7 down to _v3, so NCCL 2.26 to 2.31 each find the newest one they know
 * (2.26: v3; 2.27: v4; 2.28: v5; 2.29 and 2.30: v6; 2.31: v7). The layouts are written from
 * NCCL's headers of each release (src/include/plugin/profiler/profiler_v*.h); the parts read here:
 *  - v3: the descriptor's type is a uint8_t; the collective carries its communicator's name and
 *    hash; init(ctx, mask) has no communicator; the kernel-channel events carry no GPU timer, so
 *    a channel's time is taken on the host when NCCL's proxy thread starts and stops the event.
 *  - v4: init(ctx, mask, commName, commHash, nNodes, nranks, rank, logfn); kernel channels carry
 *    the GPU's globaltimer (ns) at start, and at stop through recordEventState(KernelChStop).
 *  - v5, v6: the type is a uint64_t, init(ctx, commId, mask, commName, nNodes, nranks, rank,
 *    logfn); the collective gains parentGroup; v6 adds copy-engine events (not asked for).
 *  - v7: the collective gains kernelVariant, isSymColl and userTag (ncclCollConfig_t's
 *    userProfilerTag) after parentGroup; kernel-phase events (ncclProfileKernelPhase, 1 << 15),
 *    children of a kernel channel, for symmetric kernels: phaseId 0 initial sync, 1 compute,
 *    2 final sync, the GPU timer at start in the descriptor and at stop through
 *    recordEventState(ncclProfilerKernelPhaseStop = 31) in the kernelCh member of the args; NCCL
 *    fires a channel's phases before it stops the channel (src/plugin/profiler.cc).
 *
 * It asks for collective and kernel-channel events only (the activation mask). Per collective it
 * keeps the communicator, sequence number, function, bytes, algorithm, protocol and channels, and
 * the kernel time: the first channel's start to the last channel's stop, on the GPU's timer where
 * NCCL gives one. A collective is complete when as many channels stopped as it announced; its
 * record then goes into a bounded ring. Nothing here takes a lock or calls into Python on NCCL's
 * threads: collectives live in a fixed pool claimed with compare-and-swap, channels in a fixed
 * array beside it, and the ring is a bounded multi-producer queue (one sequence number per cell).
 * A full ring, a full pool, an event whose handle or parent is not one of ours, and events after
 * finalize are each counted (ap_stats): nothing is dropped silently. Every 16th tracked
 * collective of a communicator (AP_COST_EVERY) carries the plugin's own time in NCCL's calls for
 * it, up to its record (cost_ns: what profiling costs NCCL's threads; timing every one reads the
 * clock in each call, and cost about half as much again per collective in
 * benchmarks/profiler_cost.py). AUTOTUNE_NCCL_PROFILER_SAMPLE=N records every Nth collective of
 * each communicator (default 1: all); the others are counted (sampled_out) and cost a counter.
 *
 * AUTOTUNE_NCCL_PROFILER_CHAIN=<another profiler plugin> loads that one too and forwards every
 * call to it (_profiler_chain.c): its events, contexts and handles are its own, its activation
 * mask is added to ours, and a failure of it is logged once and leaves this profiler running.
 *
 * The node's view: unless AUTOTUNE_NCCL_SHM=0, the library also keeps, in a file of its own in
 * AUTOTUNE_NCCL_SHM_DIR (default /dev/shm, name autotune-nccl.<pid>), cumulative sums per
 * (collective, size class, algorithm, protocol, ranks): count, bytes, kernel time and a
 * kernel-time histogram, updated with atomic adds. `autotune daemon` reads every such file on
 * the node, so any NCCL job's collectives become series with nothing but NCCL_PROFILER_PLUGIN
 * set (autotune_nccl.node). The file goes at exit; files of processes that are gone are
 * swept when the next process starts its own (and by the daemon).
 */
#include <dirent.h>
#include "_profiler_chain.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int ncclResult_t;

#define AP_SUCCESS 0
#define AP_EVENT_COLL (1 << 1)     /* ncclProfileColl */
#define AP_EVENT_KERNEL_CH (1 << 6) /* ncclProfileKernelCh */
#define AP_EVENT_KERNEL_PHASE (1 << 15) /* ncclProfileKernelPhase (v7) */
#define AP_STATE_KERNEL_CH_STOP 22 /* ncclProfilerKernelChStop (v4+) */
#define AP_STATE_KERNEL_PHASE_STOP 31 /* ncclProfilerKernelPhaseStop (v7) */
#define AP_PHASES 3                /* initial sync, compute, final sync */
#define AP_COST_EVERY 16 /* of a communicator's tracked collectives, those whose cost is timed */
#define AP_MAX_CHANNELS 64         /* MAXCHANNELS */
#define AP_POOL 1024               /* collectives in flight */
#define AP_RING 8192               /* completed records not yet drained (a power of two) */
#define AP_MAX_COMMS 256
#define AP_STALE_NS 10000000000ull /* a collective whose channels stopped coming, after 10 s */

enum { AP_CLOCK_NONE = 0, AP_CLOCK_GPU = 1, AP_CLOCK_HOST = 2 };
enum { AP_FLAG_INCOMPLETE = 1 }; /* reclaimed stale: fewer channels stopped than announced */

/* -- what Python reads (autotune_nccl/profiler.py mirrors these two structs) ---------------- */

typedef struct {
    uint64_t comm_id;
    uint64_t seq;
    uint64_t count;
    uint64_t bytes;
    uint64_t kernel_ns;  /* first channel start to last channel stop */
    uint64_t longest_ns; /* the longest single channel (NCCL Inspector's figure) */
    uint64_t end_ns;     /* host CLOCK_MONOTONIC when the record completed */
    int32_t rank, nranks, nnodes;
    int32_t channels;      /* announced by NCCL */
    int32_t channels_seen; /* channels that stopped */
    int32_t clock;         /* AP_CLOCK_* */
    int32_t version;       /* the profiler symbol NCCL loaded for this communicator */
    int32_t flags;
    char func[16], algo[16], proto[8], dtype[16];
    uint64_t user_tag;          /* v7: the call's userProfilerTag (0: none) */
    uint64_t phase_ns[AP_PHASES]; /* v7, symmetric kernels: each phase's longest channel */
    uint64_t cost_ns;           /* the plugin's own time in NCCL's calls for it, to the record
                                 * (every AP_COST_EVERY-th of a communicator; else 0) */
    int32_t symmetric;          /* v7: NCCL ran a symmetric kernel (1) or not (0); -1: not said */
    int32_t phases_seen;        /* v7: phase events that stopped */
    char variant[32];           /* v7: NCCL's kernel variant ("" where not said) */
} ap_record;

typedef struct {
    int32_t version;      /* the symbol of the last communicator NCCL initialised (0: none) */
    int32_t comms;        /* communicators initialised and not finalised */
    uint64_t comms_total; /* communicators initialised */
    uint64_t records;     /* records written into the ring */
    uint64_t drained;     /* records read out */
    uint64_t ring_full;   /* complete records dropped: the ring was full */
    uint64_t pool_full;   /* collectives not tracked: every slot was in flight */
    uint64_t stale;       /* collectives reclaimed after AP_STALE_NS (recorded, flagged) */
    uint64_t orphans;     /* events whose handle or parent was not a live collective of ours */
    uint64_t late;        /* events on a finalised communicator */
    uint64_t ignored;     /* events of a type not asked for */
    int32_t in_flight;    /* collectives started and not yet recorded */
    int32_t mask;         /* the events asked for (from v7 with kernel phases; a chained
                           * profiler's are added to what NCCL is given) */
    uint64_t sampled_out; /* collectives left out by AUTOTUNE_NCCL_PROFILER_SAMPLE */
    uint64_t chained;     /* calls forwarded to the chained profiler */
    uint64_t chain_failures; /* its library, symbol, init or calls failing (logged once) */
    int32_t chain_version; /* the chained profiler's version forwarded to (0: none) */
    int32_t sample_every; /* AUTOTUNE_NCCL_PROFILER_SAMPLE */
} ap_stats_t;

/* -- state ---------------------------------------------------------------------------------- */

typedef struct {
    _Atomic int state; /* 0 free, 1 live, 2 finalised */
    int version;
    uint64_t comm_id;
    int rank, nranks, nnodes;
    ap_logger_t log;
    _Atomic uint64_t colls; /* collectives started: every Nth is recorded */
    _Atomic uint64_t recorded; /* collectives tracked: every AP_COST_EVERY-th is timed */
    void *chain_ctx;        /* the chained profiler's context (NULL: none) */
    int chain_mask;         /* the events it asked for */
} ap_comm;

typedef struct {
    _Atomic uint64_t start, stop; /* GPU timer */
    void *chained;
} ap_phase;

typedef struct {
    _Atomic uint64_t start, stop;   /* GPU timer (v4+) */
    _Atomic uint64_t hstart, hstop; /* host clock */
    void *chained;                  /* the chained profiler's handle of this event */
} ap_chan;

typedef struct {
    ap_phase phase[AP_PHASES]; /* v7: handles of a channel's phase events */
} ap_phases;

typedef struct {
    _Atomic int refs; /* 0: free. Self (until NCCL stops it), completion, one per open channel */
    _Atomic int recorded;
    int comm; /* index in g_comms */
    ap_record rec;
    _Atomic int ch_started, ch_stopped;
    _Atomic uint64_t ch_used; /* bit per channel id started: what finish reads and clears */
    _Atomic uint64_t ph_used; /* bit per channel id with a phase started (v7) */
    _Atomic uint64_t touched; /* host clock of the last event */
    _Atomic int self_released;
    _Atomic uint64_t cost_ns; /* the plugin's time in NCCL's calls for it so far */
    int timed;                /* its cost is measured (every AP_COST_EVERY-th of a comm) */
    void *chained;            /* the chained profiler's handle of this event */
} ap_coll;

static ap_comm g_comms[AP_MAX_COMMS];
static ap_coll g_pool[AP_POOL];
static ap_chan g_chans[AP_POOL][AP_MAX_CHANNELS];
static ap_phases g_phases[AP_POOL][AP_MAX_CHANNELS]; /* beside g_chans: touched only from v7 */
static _Atomic unsigned g_next_slot;

typedef struct {
    _Atomic uint64_t seq;
    ap_record rec;
} ap_cell;
static ap_cell g_ring[AP_RING];
static _Atomic uint64_t g_head, g_tail;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static _Atomic int g_version, g_live_comms, g_in_flight;
static _Atomic uint64_t g_comms_total, g_records, g_drained, g_ring_full, g_pool_full, g_stale,
    g_orphans, g_late, g_ignored;
static _Atomic uint64_t g_sampled_out;
static int g_mask = AP_EVENT_COLL | AP_EVENT_KERNEL_CH;
static uint64_t g_sample = 1; /* AUTOTUNE_NCCL_PROFILER_SAMPLE */
/* The handle of a collective left out by sampling, and of its channels and phases. */
static char g_skip;
#define AP_SKIP ((void *)&g_skip)

#define RELAXED memory_order_relaxed
#define bump(counter) atomic_fetch_add_explicit(&(counter), 1, RELAXED)

static void shm_count_drop(int pool);
static void copy_name(char *dst, size_t n, const char *src);

static void ring_init(void) {
    for (uint64_t i = 0; i < AP_RING; i++) atomic_store_explicit(&g_ring[i].seq, i, RELAXED);
    const char *off = getenv("AUTOTUNE_NCCL_PROFILER");
    if (off != NULL && strcmp(off, "0") == 0) g_mask = 0; /* loaded, asks NCCL for nothing */
    const char *every = getenv("AUTOTUNE_NCCL_PROFILER_SAMPLE");
    if (every != NULL && atoll(every) > 1) g_sample = (uint64_t)atoll(every);
}

static uint64_t host_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Vyukov's bounded queue: a producer claims a cell by CAS on the head, writes, then publishes
 * the cell's sequence; a full ring is counted, never waited on. */
static void ring_push(const ap_record *r) {
    uint64_t pos = atomic_load_explicit(&g_head, RELAXED);
    for (;;) {
        ap_cell *cell = &g_ring[pos & (AP_RING - 1)];
        uint64_t seq = atomic_load_explicit(&cell->seq, memory_order_acquire);
        int64_t dif = (int64_t)seq - (int64_t)pos;
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(&g_head, &pos, pos + 1, RELAXED, RELAXED)) {
                cell->rec = *r;
                atomic_store_explicit(&cell->seq, pos + 1, memory_order_release);
                bump(g_records);
                return;
            }
        } else if (dif < 0) {
            bump(g_ring_full);
            shm_count_drop(0);
            return;
        } else {
            pos = atomic_load_explicit(&g_head, RELAXED);
        }
    }
}

static int ring_pop(ap_record *out) {
    uint64_t pos = atomic_load_explicit(&g_tail, RELAXED);
    for (;;) {
        ap_cell *cell = &g_ring[pos & (AP_RING - 1)];
        uint64_t seq = atomic_load_explicit(&cell->seq, memory_order_acquire);
        int64_t dif = (int64_t)seq - (int64_t)(pos + 1);
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(&g_tail, &pos, pos + 1, RELAXED, RELAXED)) {
                *out = cell->rec;
                atomic_store_explicit(&cell->seq, pos + AP_RING, memory_order_release);
                return 1;
            }
        } else if (dif < 0) {
            return 0;
        } else {
            pos = atomic_load_explicit(&g_tail, RELAXED);
        }
    }
}

/* -- the node's view: cumulative sums in a shared file ------------------------------------------ */

#define AS_MAGIC 0x434e5441u /* "ATNC" */
#define AS_LAYOUT 1
#define AS_CELLS 256
#define AS_BOUNDS 28 /* kernel-time bounds, ns: {1, 1.8, 3.2, 5.6} x 10^3..10^9 */

typedef struct {
    _Atomic uint64_t key; /* 0: empty; else the fields' hash (never 0) */
    _Atomic uint32_t ready;
    int32_t nranks;
    uint64_t size_class;
    char func[16], algo[16], proto[8];
    _Atomic uint64_t count, bytes, kernel_ns;
    _Atomic uint64_t buckets[AS_BOUNDS + 1]; /* per bound (le), then +Inf; not cumulative */
} as_cell;

typedef struct {
    uint32_t magic, layout;
    int32_t pid, rank, local_rank, version;
    _Atomic int32_t served; /* the port of a rank exporter that serves these sums (0: none) */
    int32_t spare;
    char job[64];
    uint64_t started_unix_ns;
    _Atomic uint64_t records, untimed, ring_full, pool_full, cells_full;
    as_cell cells[AS_CELLS];
} as_file;

static as_file *g_shm;
static char g_shm_path[512];
static pthread_once_t g_shm_once = PTHREAD_ONCE_INIT;
static uint64_t g_bounds[AS_BOUNDS];

static void shm_remove(void) {
    if (g_shm != NULL && g_shm->pid == (int32_t)getpid()) unlink(g_shm_path);
}

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v != NULL && *v != '\0' ? atoi(v) : dflt;
}

/* Remove the files of processes that are gone (killed, or ended by _exit before the exit handler
 * ran), so that a node without a daemon does not collect them. */
static void shm_sweep(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL) return;
    struct dirent *e;
    char path[512];
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "autotune-nccl.", 14) != 0) continue;
        char *end;
        long pid = strtol(e->d_name + 14, &end, 10);
        if (*end != '\0' || pid <= 0) continue;
        if (kill((pid_t)pid, 0) == -1 && errno == ESRCH) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    }
    closedir(d);
}

static void shm_init(void) {
    static const uint64_t mant[4] = {10, 18, 32, 56};
    uint64_t scale = 100; /* 10 x 100 = 1000 ns */
    for (int e = 0; e < AS_BOUNDS / 4; e++, scale *= 10)
        for (int m = 0; m < 4; m++) g_bounds[e * 4 + m] = mant[m] * scale;
    const char *off = getenv("AUTOTUNE_NCCL_SHM");
    if (off != NULL && strcmp(off, "0") == 0) return;
    const char *dir = getenv("AUTOTUNE_NCCL_SHM_DIR");
    if (dir == NULL || *dir == '\0') dir = "/dev/shm";
    shm_sweep(dir);
    snprintf(g_shm_path, sizeof g_shm_path, "%s/autotune-nccl.%d", dir, (int)getpid());
    int fd = open(g_shm_path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return; /* no node view; the ring and the rank's exporter still work */
    if (ftruncate(fd, sizeof(as_file)) != 0) {
        close(fd);
        unlink(g_shm_path);
        return;
    }
    void *m = mmap(NULL, sizeof(as_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        unlink(g_shm_path);
        return;
    }
    as_file *f = m;
    f->layout = AS_LAYOUT;
    f->pid = (int32_t)getpid();
    f->rank = env_int("RANK", -1);
    f->local_rank = env_int("LOCAL_RANK", -1);
    const char *job = getenv("AUTOTUNE_JOB");
    if (job == NULL || *job == '\0') job = getenv("SLURM_JOB_ID");
    if (job == NULL || *job == '\0') job = getenv("TORCHELASTIC_RUN_ID");
    copy_name(f->job, sizeof f->job, job);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    f->started_unix_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    atomic_thread_fence(memory_order_release);
    f->magic = AS_MAGIC; /* last: a reader ignores a file until it is set */
    g_shm = f;
    atexit(shm_remove);
}

static void shm_count_drop(int pool) {
    if (g_shm == NULL) return;
    if (pool)
        bump(g_shm->pool_full);
    else
        bump(g_shm->ring_full);
}

static uint64_t cell_hash(const ap_record *r, uint64_t size_class) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    const char *parts[3] = {r->func, r->algo, r->proto};
    for (int i = 0; i < 3; i++)
        for (const char *c = parts[i]; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
    h = (h ^ size_class) * 1099511628211ull;
    h = (h ^ (uint64_t)(uint32_t)r->nranks) * 1099511628211ull;
    return h | 1;
}

static int same_cell(const as_cell *c, const ap_record *r, uint64_t size_class) {
    return c->size_class == size_class && c->nranks == r->nranks &&
           strncmp(c->func, r->func, sizeof c->func) == 0 &&
           strncmp(c->algo, r->algo, sizeof c->algo) == 0 &&
           strncmp(c->proto, r->proto, sizeof c->proto) == 0;
}

static void shm_account(const ap_record *r) {
    as_file *f = g_shm;
    if (f == NULL) return;
    bump(f->records);
    if (r->clock == AP_CLOCK_NONE || r->kernel_ns == 0) {
        bump(f->untimed);
        return;
    }
    uint64_t cls = 1;
    while (cls < r->bytes) cls <<= 1;
    uint64_t key = cell_hash(r, cls);
    for (int i = 0; i < AS_CELLS; i++) {
        as_cell *c = &f->cells[(key + (uint64_t)i) % AS_CELLS];
        uint64_t k = atomic_load_explicit(&c->key, memory_order_acquire);
        if (k == 0) {
            uint64_t zero = 0;
            if (atomic_compare_exchange_strong(&c->key, &zero, key)) {
                c->nranks = r->nranks;
                c->size_class = cls;
                copy_name(c->func, sizeof c->func, r->func);
                copy_name(c->algo, sizeof c->algo, r->algo);
                copy_name(c->proto, sizeof c->proto, r->proto);
                atomic_store_explicit(&c->ready, 1, memory_order_release);
                k = key;
            } else {
                k = zero; /* another thread took it: look at what it holds */
            }
        }
        if (k != key) continue;
        while (!atomic_load_explicit(&c->ready, memory_order_acquire)) {
        } /* the claiming thread is writing four fields */
        if (!same_cell(c, r, cls)) continue;
        atomic_fetch_add_explicit(&c->count, 1, RELAXED);
        atomic_fetch_add_explicit(&c->bytes, r->bytes, RELAXED);
        atomic_fetch_add_explicit(&c->kernel_ns, r->kernel_ns, RELAXED);
        int b = 0;
        while (b < AS_BOUNDS && r->kernel_ns > g_bounds[b]) b++;
        atomic_fetch_add_explicit(&c->buckets[b], 1, RELAXED);
        return;
    }
    bump(f->cells_full);
}

/* -- collectives and channels --------------------------------------------------------------- */

static ap_coll *as_coll(void *h) {
    uintptr_t p = (uintptr_t)h, base = (uintptr_t)g_pool;
    if (p < base || p >= base + sizeof g_pool || (p - base) % sizeof(ap_coll) != 0) return NULL;
    return (ap_coll *)h;
}

static ap_chan *as_chan(void *h, ap_coll **coll) {
    uintptr_t p = (uintptr_t)h, base = (uintptr_t)g_chans;
    if (p < base || p >= base + sizeof g_chans || (p - base) % sizeof(ap_chan) != 0) return NULL;
    size_t i = (p - base) / sizeof(ap_chan);
    *coll = &g_pool[i / AP_MAX_CHANNELS];
    return (ap_chan *)h;
}

/* A phase event's handle: one of a channel's entries in g_phases. */
static ap_phase *as_phase(void *h, ap_coll **coll) {
    uintptr_t p = (uintptr_t)h, base = (uintptr_t)g_phases;
    if (p < base || p >= base + sizeof g_phases || (p - base) % sizeof(ap_phase) != 0) return NULL;
    *coll = &g_pool[(p - base) / sizeof(ap_phases) / AP_MAX_CHANNELS];
    return (ap_phase *)h;
}

/* Where one of our handles (a collective, channel or phase) keeps the chained profiler's handle
 * of the same event; NULL for a handle that is not ours. */
static void **chained_slot(void *h) {
    ap_coll *c;
    if ((c = as_coll(h)) != NULL) return &c->chained;
    ap_chan *k = as_chan(h, &c);
    if (k != NULL) return &k->chained;
    ap_phase *ph = as_phase(h, &c);
    return ph != NULL ? &ph->chained : NULL;
}

/* The chained profiler's handle for `h` (a handle that is not ours is its own already). */
static void *chained_of(void *h) {
    if (h == NULL || h == AP_SKIP) return NULL;
    void **slot = chained_slot(h);
    return slot != NULL ? *slot : h;
}

/* Add the time since `since` to a timed collective's cost (an untimed one reads no clock). */
static void charge(ap_coll *c, uint64_t since) {
    if (c->timed) atomic_fetch_add_explicit(&c->cost_ns, host_ns() - since, RELAXED);
}

/* The host clock at the start of a call for `c`, where its cost is timed (else 0: not read). */
static uint64_t clock_for(const ap_coll *c) { return c->timed ? host_ns() : 0; }

static void release(ap_coll *c) {
    if (atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) == 1)
        atomic_fetch_sub_explicit(&g_in_flight, 1, RELAXED);
}

/* The collective's kernel time, from its channels: the GPU's timer where every channel that
 * stopped has both stamps, else the host's; per phase (v7), the longest channel's. `since`: the
 * host clock when NCCL's call that completes it began (0: not in one of NCCL's calls). */
static void finish(ap_coll *c, int flags, uint64_t since) {
    if (atomic_exchange_explicit(&c->recorded, 1, memory_order_acq_rel)) return;
    size_t i = (size_t)(c - g_pool);
    uint64_t gfirst = 0, glast = 0, glong = 0, hfirst = 0, hlast = 0, hlong = 0;
    uint64_t phase_ns[AP_PHASES] = {0};
    int gpu = 1, seen = 0, phases = 0;
    uint64_t used = atomic_load(&c->ch_used), phased = atomic_load(&c->ph_used);
    /* Bounded by the count, not by `used >> ch`: shifting a uint64_t by 64 is undefined (x86
     * shifts by 0), and with channel 63 in use that loop ran off g_chans (seen on an H200). */
    for (int ch = 0; ch < AP_MAX_CHANNELS; ch++) {
        if (!(used >> ch & 1)) continue;
        ap_chan *k = &g_chans[i][ch];
        for (int ph = 0; ph < AP_PHASES && (phased >> ch & 1); ph++) {
            ap_phase *f = &g_phases[i][ch].phase[ph];
            uint64_t ps = atomic_load(&f->start), pe = atomic_load(&f->stop);
            if (ps == 0 || pe == 0) continue;
            phases++;
            if (pe > ps && pe - ps > phase_ns[ph]) phase_ns[ph] = pe - ps;
        }
        uint64_t s = atomic_load(&k->start), e = atomic_load(&k->stop);
        uint64_t hs = atomic_load(&k->hstart), he = atomic_load(&k->hstop);
        if (hs == 0 || he == 0) continue;
        seen++;
        if (s == 0 || e <= s) gpu = 0;
        else {
            if (gfirst == 0 || s < gfirst) gfirst = s;
            if (e > glast) glast = e;
            if (e - s > glong) glong = e - s;
        }
        if (hfirst == 0 || hs < hfirst) hfirst = hs;
        if (he > hlast) hlast = he;
        if (he > hs && he - hs > hlong) hlong = he - hs;
    }
    ap_record r = c->rec;
    r.channels_seen = seen;
    r.flags = flags;
    r.phases_seen = phases;
    memcpy(r.phase_ns, phase_ns, sizeof phase_ns);
    r.end_ns = host_ns();
    if (c->timed) r.cost_ns = atomic_load(&c->cost_ns) + (since != 0 ? r.end_ns - since : 0);
    if (seen > 0 && gpu) {
        r.clock = AP_CLOCK_GPU;
        r.kernel_ns = glast - gfirst;
        r.longest_ns = glong;
    } else if (seen > 0) {
        r.clock = AP_CLOCK_HOST;
        r.kernel_ns = hlast > hfirst ? hlast - hfirst : 0;
        r.longest_ns = hlong;
    } else {
        r.clock = AP_CLOCK_NONE;
    }
    ring_push(&r);
    shm_account(&r);
}

/* Reclaim collectives whose channels stopped coming (NCCL announced more than it ran), so the
 * pool never fills for good; each is recorded with what arrived, flagged incomplete. */
static void reclaim_stale(uint64_t now) {
    for (int i = 0; i < AP_POOL; i++) {
        ap_coll *c = &g_pool[i];
        if (atomic_load(&c->refs) != 1 || !atomic_load(&c->self_released)) continue;
        if (now - atomic_load(&c->touched) < AP_STALE_NS) continue;
        if (atomic_load(&c->ch_started) != atomic_load(&c->ch_stopped)) continue;
        int one = 1;
        if (!atomic_compare_exchange_strong(&c->refs, &one, 2)) continue;
        finish(c, AP_FLAG_INCOMPLETE, 0);
        bump(g_stale);
        release(c);
        release(c);
    }
}

static ap_coll *claim(void) {
    for (int pass = 0; pass < 2; pass++) {
        for (int tries = 0; tries < AP_POOL; tries++) {
            unsigned i = atomic_fetch_add_explicit(&g_next_slot, 1, RELAXED) % AP_POOL;
            int zero = 0;
            if (atomic_compare_exchange_strong(&g_pool[i].refs, &zero, 2)) return &g_pool[i];
        }
        if (pass == 0) reclaim_stale(host_ns());
    }
    return NULL;
}

static void copy_name(char *dst, size_t n, const char *src) {
    if (src == NULL) src = "";
    strncpy(dst, src, n - 1);
    dst[n - 1] = '\0';
}

static int dtype_size(const char *t) {
    if (t == NULL) return 0;
    static const struct {
        const char *name;
        int size;
    } sizes[] = {{"ncclInt8", 1},     {"ncclUint8", 1},     {"ncclFloat8e4m3", 1},
                 {"ncclFloat8e5m2", 1}, {"ncclFloat16", 2}, {"ncclBfloat16", 2},
                 {"ncclInt32", 4},    {"ncclUint32", 4},    {"ncclFloat32", 4},
                 {"ncclInt64", 8},    {"ncclUint64", 8},    {"ncclFloat64", 8}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (strcmp(t, sizes[i].name) == 0) return sizes[i].size;
    return 0;
}

/* What a collective's descriptor says, whatever the version. */
typedef struct {
    uint64_t comm_hash; /* v3 only (0: unknown) */
    uint64_t seq;
    const char *func, *dtype, *algo, *proto;
    size_t count;
    int channels;
    int rank;
    const char *variant; /* v7 (NULL before) */
    int symmetric;       /* v7; -1 before */
    uint64_t user_tag;   /* v7 */
} ap_coll_descr;

static ap_comm *live_comm(void *ctx) {
    uintptr_t p = (uintptr_t)ctx, base = (uintptr_t)g_comms;
    if (p < base || p >= base + sizeof g_comms || (p - base) % sizeof(ap_comm) != 0) {
        bump(g_orphans);
        return NULL;
    }
    ap_comm *c = ctx;
    if (atomic_load(&c->state) != 1) {
        bump(g_late);
        return NULL;
    }
    return c;
}

/* A collective starts: claimed in the pool (or left out by sampling: AP_SKIP). */
static void *start_coll(ap_comm *comm, const ap_coll_descr *d, uint64_t since) {
    if (g_sample > 1 && atomic_fetch_add_explicit(&comm->colls, 1, RELAXED) % g_sample != 0) {
        bump(g_sampled_out);
        return AP_SKIP;
    }
    ap_coll *c = claim();
    if (c == NULL) {
        bump(g_pool_full);
        shm_count_drop(1);
        return NULL;
    }
    atomic_fetch_add_explicit(&g_in_flight, 1, RELAXED);
    size_t i = (size_t)(c - g_pool);
    uint64_t used = atomic_exchange(&c->ch_used, 0); /* the channels the slot's last user set */
    uint64_t phased = atomic_exchange(&c->ph_used, 0);
    for (int ch = 0; ch < AP_MAX_CHANNELS; ch++) {
        if (used >> ch & 1) memset(&g_chans[i][ch], 0, sizeof(ap_chan));
        if (phased >> ch & 1) memset(&g_phases[i][ch], 0, sizeof(ap_phases));
    }
    if (comm->comm_id == 0 && d->comm_hash != 0) comm->comm_id = d->comm_hash; /* v3 */
    ap_record r = {0};
    r.comm_id = comm->comm_id;
    r.seq = d->seq;
    r.count = d->count;
    r.bytes = (uint64_t)d->count * (uint64_t)dtype_size(d->dtype);
    r.rank = comm->rank >= 0 ? comm->rank : d->rank;
    r.nranks = comm->nranks;
    r.nnodes = comm->nnodes;
    r.channels = d->channels;
    r.version = comm->version;
    r.symmetric = d->symmetric;
    r.user_tag = d->user_tag;
    copy_name(r.func, sizeof r.func, d->func);
    copy_name(r.algo, sizeof r.algo, d->algo);
    copy_name(r.proto, sizeof r.proto, d->proto);
    copy_name(r.dtype, sizeof r.dtype, d->dtype);
    copy_name(r.variant, sizeof r.variant, d->variant);
    c->rec = r;
    c->comm = (int)(comm - g_comms);
    c->chained = NULL;
    c->timed = atomic_fetch_add_explicit(&comm->recorded, 1, RELAXED) % AP_COST_EVERY == 0;
    atomic_store(&c->recorded, 0);
    atomic_store(&c->ch_started, 0);
    atomic_store(&c->ch_stopped, 0);
    atomic_store(&c->self_released, 0);
    atomic_store(&c->cost_ns, 0);
    atomic_store(&c->touched, since);
    if (d->channels <= 0) release(c); /* no channels to wait for: done when NCCL stops it */
    charge(c, since);
    return c;
}

/* A kernel channel of one of our collectives starts (AP_SKIP under a skipped one). */
static void *start_channel(void *parent, int channel, uint64_t gpu_start) {
    if (parent == AP_SKIP) return AP_SKIP;
    ap_coll *c = as_coll(parent);
    if (c == NULL || atomic_load(&c->refs) == 0 || atomic_load(&c->recorded) ||
        channel < 0 || channel >= AP_MAX_CHANNELS) {
        if (c != NULL || chain_version() == 0) bump(g_orphans); /* else: the chained one's */
        return NULL;
    }
    uint64_t now = host_ns(); /* the channel's host stamp, and the call's start */
    atomic_fetch_add(&c->refs, 1);
    ap_chan *k = &g_chans[c - g_pool][channel];
    atomic_store(&k->start, gpu_start);
    atomic_store(&k->hstart, now);
    k->chained = NULL;
    atomic_fetch_or(&c->ch_used, 1ull << channel);
    atomic_fetch_add(&c->ch_started, 1);
    atomic_store(&c->touched, now);
    charge(c, now);
    return k;
}

/* A kernel phase of one of our channels starts (v7). */
static void *start_phase(void *parent, int phase, uint64_t gpu_start) {
    if (parent == AP_SKIP) return AP_SKIP;
    ap_coll *c;
    ap_chan *k = as_chan(parent, &c);
    if (k == NULL || atomic_load(&c->refs) == 0 || phase < 0 || phase >= AP_PHASES) {
        if (k != NULL || chain_version() == 0) bump(g_orphans);
        return NULL;
    }
    uint64_t since = clock_for(c);
    size_t i = (size_t)(c - g_pool), ch = (size_t)(k - g_chans[i]);
    ap_phase *ph = &g_phases[i][ch].phase[phase];
    atomic_fetch_or(&c->ph_used, 1ull << ch);
    atomic_store(&ph->start, gpu_start);
    ph->chained = NULL;
    charge(c, since);
    return ph;
}

static ncclResult_t ap_stop(void *handle) {
    if (handle == NULL || handle == AP_SKIP) return AP_SUCCESS;
    uint64_t since = host_ns();
    void *chained = NULL;
    ap_coll *c = as_coll(handle);
    ap_chan *k = NULL;
    ap_phase *ph = NULL;
    if (c != NULL) {
        int zero = 0;
        if (atomic_load(&c->refs) == 0 ||
            !atomic_compare_exchange_strong(&c->self_released, &zero, 1)) {
            bump(g_orphans); /* stopped twice, or never started */
            return AP_SUCCESS;
        }
        chained = c->chained; /* read before the slot may go back to the pool */
        atomic_store(&c->touched, since);
        if (c->rec.channels <= 0) finish(c, 0, since);
        else charge(c, since);
        release(c);
    } else if ((k = as_chan(handle, &c)) != NULL) {
        if (atomic_load(&c->refs) == 0 || atomic_load(&k->hstart) == 0 ||
            atomic_load(&k->hstop) != 0) {
            bump(g_orphans);
            return AP_SUCCESS;
        }
        chained = k->chained;
        atomic_store(&k->hstop, since);
        atomic_store(&c->touched, since);
        int stopped = atomic_fetch_add(&c->ch_stopped, 1) + 1;
        if (stopped == c->rec.channels) {
            finish(c, 0, since);
            release(c); /* the completion reference */
        } else {
            charge(c, since);
        }
        release(c); /* this channel's */
    } else if ((ph = as_phase(handle, &c)) != NULL) {
        chained = ph->chained; /* the phase's time came with its stop state */
    } else if (chain_version() != 0) {
        chained = handle; /* an event only the chained profiler asked for */
    } else {
        bump(g_orphans);
        return AP_SUCCESS;
    }
    if (chained != NULL) chain_stop(chained);
    return AP_SUCCESS;
}

static ncclResult_t ap_record_state(void *handle, int state, void *args) {
    if (handle == NULL || handle == AP_SKIP) return AP_SUCCESS;
    ap_coll *c;
    ap_chan *k = NULL;
    ap_phase *ph = NULL;
    if ((k = as_chan(handle, &c)) != NULL) {
        if (atomic_load(&c->refs) == 0) {
            bump(g_orphans);
            return AP_SUCCESS;
        }
        if (state == AP_STATE_KERNEL_CH_STOP && args != NULL) {
            uint64_t since = clock_for(c);
            atomic_store(&k->stop, *(const uint64_t *)args); /* kernelCh.pTimer: the union's first */
            charge(c, since);
        }
    } else if ((ph = as_phase(handle, &c)) != NULL) {
        if (state == AP_STATE_KERNEL_PHASE_STOP && args != NULL) {
            uint64_t since = clock_for(c);
            atomic_store(&ph->stop, *(const uint64_t *)args); /* kernelCh.pTimer, shared (v7) */
            charge(c, since);
        }
    } else if (as_coll(handle) == NULL && chain_version() == 0) {
        if (state == AP_STATE_KERNEL_CH_STOP) bump(g_orphans);
        return AP_SUCCESS;
    }
    void *chained = chained_of(handle);
    if (chained != NULL && chain_knows_state(state)) chain_record(chained, state, args);
    return AP_SUCCESS;
}

/* -- init and finalize ---------------------------------------------------------------------- */

static ncclResult_t init_comm(void **ctx, int *mask, int version, const chain_comm_args *a) {
    pthread_once(&g_once, ring_init);
    if (g_mask != 0) pthread_once(&g_shm_once, shm_init);
    if (g_shm != NULL) g_shm->version = version;
    ap_comm *slot = NULL;
    for (int pass = 0; pass < 2 && slot == NULL; pass++) {
        for (int i = 0; i < AP_MAX_COMMS && slot == NULL; i++) {
            int want = pass == 0 ? 0 : 2; /* a free slot first, then a finalised one */
            if (atomic_compare_exchange_strong(&g_comms[i].state, &want, 3)) slot = &g_comms[i];
        }
    }
    int ours = g_mask != 0 && version >= 7 ? g_mask | AP_EVENT_KERNEL_PHASE : g_mask;
    if (mask != NULL) *mask = ours;
    if (slot == NULL) { /* 256 live communicators: this one goes unprofiled, not NCCL's load */
        *ctx = NULL;
        bump(g_orphans);
        return AP_SUCCESS;
    }
    slot->version = version;
    slot->comm_id = a->comm_id;
    slot->rank = a->rank;
    slot->nranks = a->nranks;
    slot->nnodes = a->nnodes;
    slot->log = a->log;
    atomic_store(&slot->colls, 0); /* a slot a finalised communicator left counts afresh */
    atomic_store(&slot->recorded, 0);
    slot->chain_ctx = NULL;
    slot->chain_mask = 0;
    if (chain_init(version, &slot->chain_ctx, &slot->chain_mask, a) == 0 && mask != NULL)
        *mask = ours | slot->chain_mask;
    atomic_store(&slot->state, 1);
    atomic_store(&g_version, version);
    atomic_fetch_add(&g_live_comms, 1);
    bump(g_comms_total);
    if (a->log != NULL)
        a->log(3 /* NCCL_LOG_INFO */, 1 /* NCCL_INIT */, __FILE__, __LINE__,
               "autotune profiler (v%d): communicator %llx, rank %d of %d, mask 0x%x%s", version,
               (unsigned long long)a->comm_id, a->rank, a->nranks, mask != NULL ? *mask : 0,
               slot->chain_ctx != NULL ? ", with a chained profiler" : "");
    *ctx = slot;
    return AP_SUCCESS;
}

static ncclResult_t ap_finalize(void *ctx) {
    ap_comm *c = live_comm(ctx);
    if (c == NULL) return AP_SUCCESS;
    int live = 1;
    if (atomic_compare_exchange_strong(&c->state, &live, 2)) {
        atomic_fetch_sub(&g_live_comms, 1);
        if (c->chain_ctx != NULL) chain_finalize(c->chain_ctx);
    }
    return AP_SUCCESS;
}

/* -- the descriptors, per version ----------------------------------------------------------- */

typedef struct {
    uint8_t type;
    void *parentObj;
    int rank;
    union {
        struct {
            const char *name;
            uint64_t commHash;
            uint64_t seqNumber;
            const char *func;
            void const *sendBuff;
            void *recvBuff;
            size_t count;
            int root;
            const char *datatype;
            uint8_t nMaxChannels;
            uint8_t nWarps;
            const char *algo;
            const char *proto;
        } coll;
        struct {
            uint8_t channelId;
        } kernelCh;
    };
} ap_descr_v3;

typedef struct {
    uint64_t seqNumber;
    const char *func;
    void const *sendBuff;
    void *recvBuff;
    size_t count;
    int root;
    const char *datatype;
    uint8_t nChannels;
    uint8_t nWarps;
    const char *algo;
    const char *proto;
} ap_coll_v4;

typedef struct {
    uint8_t channelId;
    uint64_t pTimer;
} ap_kernel_ch_v4;

typedef struct {
    uint8_t type;
    void *parentObj;
    int rank;
    union {
        ap_coll_v4 coll;
        ap_kernel_ch_v4 kernelCh;
    };
} ap_descr_v4;

typedef struct {
    uint64_t type;
    void *parentObj;
    int rank;
    union {
        struct {
            ap_coll_v4 base;
            void *parentGroup;
        } coll;
        ap_kernel_ch_v4 kernelCh;
    };
} ap_descr_v5; /* v6 adds members to the union, none before or inside these two */

typedef struct {
    uint64_t type;
    void *parentObj;
    int rank;
    union {
        struct {
            ap_coll_v4 base;
            void *parentGroup;
            const char *kernelVariant;
            bool isSymColl;
            uint64_t userTag;
        } coll;
        ap_kernel_ch_v4 kernelCh;
        struct {
            uint8_t channelId;
            uint8_t phaseId; /* 0 initial_sync, 1 compute, 2 final_sync */
            const char *phaseName;
            uint64_t pTimer; /* GPU timer at the phase's start */
        } kernelPhase;
    };
} ap_descr_v7; /* NCCL 2.31's profiler_v7.h; the union's other members are not read */

/* One start, whatever the version: ours for the events we asked for, then the chained
 * profiler's (its parent: its handle of our parent event). `parent_slot`: the descriptor's. */
static ncclResult_t start_event(void *ctx, void **handle, uint64_t type, void **parent_slot,
                                int rank, const ap_coll_descr *coll, int channel, uint64_t timer,
                                void *descr) {
    if (handle == NULL) return AP_SUCCESS;
    *handle = NULL;
    ap_comm *comm = live_comm(ctx);
    if (comm == NULL) return AP_SUCCESS;
    void *parent = *parent_slot, *ours = NULL;
    int mine = 1;
    if (type == AP_EVENT_COLL && coll != NULL && (g_mask & AP_EVENT_COLL)) {
        ap_coll_descr d = *coll;
        d.rank = rank;
        ours = start_coll(comm, &d, host_ns());
    } else if (type == AP_EVENT_KERNEL_CH && (g_mask & AP_EVENT_KERNEL_CH)) {
        ours = start_channel(parent, channel, timer);
    } else if (type == AP_EVENT_KERNEL_PHASE && g_mask != 0 && comm->version >= 7) {
        ours = start_phase(parent, channel, timer);
    } else {
        mine = 0;
    }
    void *theirs = NULL;
    if (comm->chain_ctx != NULL && (type & (uint64_t)comm->chain_mask) &&
        chain_knows_type(type))
        theirs = chain_start(comm->chain_ctx, descr, parent_slot, chained_of(parent));
    else if (!mine)
        bump(g_ignored);
    if (ours == NULL || ours == AP_SKIP) {
        *handle = theirs != NULL ? theirs : ours;
    } else {
        *chained_slot(ours) = theirs;
        *handle = ours;
    }
    return AP_SUCCESS;
}

static ncclResult_t ap_start_v3(void *ctx, void **handle, ap_descr_v3 *e) {
    if (e == NULL) return AP_SUCCESS;
    ap_coll_descr d = {.symmetric = -1};
    if (e->type == AP_EVENT_COLL)
        d = (ap_coll_descr){.comm_hash = e->coll.commHash, .seq = e->coll.seqNumber,
                            .func = e->coll.func, .dtype = e->coll.datatype,
                            .algo = e->coll.algo, .proto = e->coll.proto,
                            .count = e->coll.count, .channels = e->coll.nMaxChannels,
                            .symmetric = -1};
    return start_event(ctx, handle, e->type, &e->parentObj, e->rank, &d,
                       e->type == AP_EVENT_KERNEL_CH ? e->kernelCh.channelId : -1, 0, e);
}

static ap_coll_descr from_v4(const ap_coll_v4 *c) {
    return (ap_coll_descr){.seq = c->seqNumber, .func = c->func, .dtype = c->datatype,
                           .algo = c->algo, .proto = c->proto, .count = c->count,
                           .channels = c->nChannels, .symmetric = -1};
}

static ncclResult_t ap_start_v4(void *ctx, void **handle, ap_descr_v4 *e) {
    if (e == NULL) return AP_SUCCESS;
    ap_coll_descr d = e->type == AP_EVENT_COLL ? from_v4(&e->coll) : (ap_coll_descr){0};
    int kc = e->type == AP_EVENT_KERNEL_CH;
    return start_event(ctx, handle, e->type, &e->parentObj, e->rank, &d,
                       kc ? e->kernelCh.channelId : -1, kc ? e->kernelCh.pTimer : 0, e);
}

static ncclResult_t ap_start_v5(void *ctx, void **handle, ap_descr_v5 *e) {
    if (e == NULL) return AP_SUCCESS;
    ap_coll_descr d = e->type == AP_EVENT_COLL ? from_v4(&e->coll.base) : (ap_coll_descr){0};
    int kc = e->type == AP_EVENT_KERNEL_CH;
    return start_event(ctx, handle, e->type, &e->parentObj, e->rank, &d,
                       kc ? e->kernelCh.channelId : -1, kc ? e->kernelCh.pTimer : 0, e);
}

static ncclResult_t ap_start_v7(void *ctx, void **handle, ap_descr_v7 *e) {
    if (e == NULL) return AP_SUCCESS;
    ap_coll_descr d = {0};
    int index = -1;
    uint64_t timer = 0;
    if (e->type == AP_EVENT_COLL) {
        d = from_v4(&e->coll.base);
        d.variant = e->coll.kernelVariant;
        d.symmetric = e->coll.isSymColl ? 1 : 0;
        d.user_tag = e->coll.userTag;
    } else if (e->type == AP_EVENT_KERNEL_CH) {
        index = e->kernelCh.channelId;
        timer = e->kernelCh.pTimer;
    } else if (e->type == AP_EVENT_KERNEL_PHASE) {
        index = e->kernelPhase.phaseId;
        timer = e->kernelPhase.pTimer;
    }
    return start_event(ctx, handle, e->type, &e->parentObj, e->rank, &d, index, timer, e);
}

static ncclResult_t ap_init_v3(void **ctx, int *mask) {
    chain_comm_args a = {.rank = -1};
    return init_comm(ctx, mask, 3, &a);
}

static ncclResult_t ap_init_v4(void **ctx, int *mask, const char *name, uint64_t comm_hash,
                               int nnodes, int nranks, int rank, ap_logger_t log) {
    chain_comm_args a = {comm_hash, name, nnodes, nranks, rank, log};
    return init_comm(ctx, mask, 4, &a);
}

static ncclResult_t ap_init_v5(void **ctx, uint64_t comm_id, int *mask, const char *name,
                               int nnodes, int nranks, int rank, ap_logger_t log) {
    chain_comm_args a = {comm_id, name, nnodes, nranks, rank, log};
    return init_comm(ctx, mask, 5, &a);
}

static ncclResult_t ap_init_v6(void **ctx, uint64_t comm_id, int *mask, const char *name,
                               int nnodes, int nranks, int rank, ap_logger_t log) {
    chain_comm_args a = {comm_id, name, nnodes, nranks, rank, log};
    return init_comm(ctx, mask, 6, &a);
}

static ncclResult_t ap_init_v7(void **ctx, uint64_t comm_id, int *mask, const char *name,
                               int nnodes, int nranks, int rank, ap_logger_t log) {
    chain_comm_args a = {comm_id, name, nnodes, nranks, rank, log};
    return init_comm(ctx, mask, 7, &a);
}

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **, int *);
    ncclResult_t (*startEvent)(void *, void **, ap_descr_v3 *);
    ncclResult_t (*stopEvent)(void *);
    ncclResult_t (*recordEventState)(void *, int, void *);
    ncclResult_t (*finalize)(void *);
} ap_profiler_v3;

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **, int *, const char *, uint64_t, int, int, int, ap_logger_t);
    ncclResult_t (*startEvent)(void *, void **, ap_descr_v4 *);
    ncclResult_t (*stopEvent)(void *);
    ncclResult_t (*recordEventState)(void *, int, void *);
    ncclResult_t (*finalize)(void *);
} ap_profiler_v4;

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **, uint64_t, int *, const char *, int, int, int, ap_logger_t);
    ncclResult_t (*startEvent)(void *, void **, ap_descr_v5 *);
    ncclResult_t (*stopEvent)(void *);
    ncclResult_t (*recordEventState)(void *, int, void *);
    ncclResult_t (*finalize)(void *);
} ap_profiler_v5;

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **, uint64_t, int *, const char *, int, int, int, ap_logger_t);
    ncclResult_t (*startEvent)(void *, void **, ap_descr_v7 *);
    ncclResult_t (*stopEvent)(void *);
    ncclResult_t (*recordEventState)(void *, int, void *);
    ncclResult_t (*finalize)(void *);
} ap_profiler_v7;

__attribute__((visibility("default"))) const ap_profiler_v7 ncclProfiler_v7 = {
    "autotune", ap_init_v7, ap_start_v7, ap_stop, ap_record_state, ap_finalize};
__attribute__((visibility("default"))) const ap_profiler_v5 ncclProfiler_v6 = {
    "autotune", ap_init_v6, ap_start_v5, ap_stop, ap_record_state, ap_finalize};
__attribute__((visibility("default"))) const ap_profiler_v5 ncclProfiler_v5 = {
    "autotune", ap_init_v5, ap_start_v5, ap_stop, ap_record_state, ap_finalize};
__attribute__((visibility("default"))) const ap_profiler_v4 ncclProfiler_v4 = {
    "autotune", ap_init_v4, ap_start_v4, ap_stop, ap_record_state, ap_finalize};
__attribute__((visibility("default"))) const ap_profiler_v3 ncclProfiler_v3 = {
    "autotune", ap_init_v3, ap_start_v3, ap_stop, ap_record_state, ap_finalize};

/* -- what autotune calls (ctypes) ----------------------------------------------------------- */

/* Move up to `max` completed records into `out`; returns how many. One reader at a time. */
__attribute__((visibility("default"))) int ap_drain(ap_record *out, int max) {
    pthread_once(&g_once, ring_init);
    int n = 0;
    while (n < max && ring_pop(&out[n])) n++;
    atomic_fetch_add_explicit(&g_drained, (uint64_t)n, RELAXED);
    return n;
}

__attribute__((visibility("default"))) void ap_stats(ap_stats_t *out) {
    pthread_once(&g_once, ring_init);
    ap_stats_t s = {0};
    s.version = atomic_load(&g_version);
    s.comms = atomic_load(&g_live_comms);
    s.comms_total = atomic_load(&g_comms_total);
    s.records = atomic_load(&g_records);
    s.drained = atomic_load(&g_drained);
    s.ring_full = atomic_load(&g_ring_full);
    s.pool_full = atomic_load(&g_pool_full);
    s.stale = atomic_load(&g_stale);
    s.orphans = atomic_load(&g_orphans);
    s.late = atomic_load(&g_late);
    s.ignored = atomic_load(&g_ignored);
    s.in_flight = atomic_load(&g_in_flight);
    s.mask = g_mask;
    s.sampled_out = atomic_load(&g_sampled_out);
    s.chained = chain_forwarded();
    s.chain_failures = chain_failures();
    s.chain_version = chain_version();
    s.sample_every = (int32_t)g_sample;
    *out = s;
}

__attribute__((visibility("default"))) int ap_ring_capacity(void) { return AP_RING; }

__attribute__((visibility("default"))) int ap_pool_capacity(void) { return AP_POOL; }

/* A rank's exporter serves this process's collectives itself: the daemon leaves them out. */
__attribute__((visibility("default"))) void ap_shm_served(int32_t port) {
    if (g_shm != NULL) atomic_store(&g_shm->served, port);
}

/* The node view's file, or "" where there is none. */
__attribute__((visibility("default"))) const char *ap_shm_path(void) {
    return g_shm != NULL ? g_shm_path : "";
}

/* Reclaim stale collectives now, as if `age_ns` had passed (tests; a drain does not need it). */
__attribute__((visibility("default"))) void ap_reclaim(uint64_t age_ns) {
    reclaim_stale(host_ns() + age_ns);
}
