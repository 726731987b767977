/*
 * autotune's NCCL tuner plugin: one shared library that NCCL loads through NCCL_TUNER_PLUGIN and
 * that autotune's Python side opens by the same path (ctypes), so both share the state below
 * (dlopen returns the same handle for the same file). See docs/NCCL_TUNER.md.
 *
 * It exports ncclTunerPlugin_v7 down to _v2, so that every NCCL from 2.21 on finds the newest
 * one it knows (docs/NCCL_TUNER.md has the table of NCCL releases and symbols). The layouts are
 * written from NCCL's own headers of each release (src/include/plugin/tuner/tuner_v*.h,
 * plugins/tuner/example/nccl/tuner.h): v5 is name, init, getCollInfo, finalize; v6 and v7 add
 * getChunkSize. Their init takes (ctx, commId, nRanks, nNodes, logger, NVLink domain info,
 * constants); v7 differs from v6 only in the constants' size, which this plugin never reads.
 * v2 to v4 have init(nRanks, nNodes, logger, ctx): no communicator id, so a choice armed for
 * one communicator never applies there (arm it for any). v4's getCollInfo is v5's; v3's has no
 * regBuff; v2's has no cost table at all: NCCL passes whether CollNet and NVLS are supported and
 * takes the algorithm and protocol the plugin writes, unchecked, so under v2 the plugin offers
 * only cells NCCL 2.21 can always run (ring and tree with LL or Simple; CollNet and NVLS where
 * NCCL says they are supported) and reports the rest unusable. The cost table is NCCL's
 * float[numAlgo][numProto], passed as float**.
 *
 * Two sources of a choice, for all-reduce only (every other collective is left to NCCL):
 *  - driven: a thread arms a choice (at_arm) for the next all-reduce it launches; the first
 *    getCollInfo for an all-reduce on that thread (and communicator, if one was named) takes it
 *    and disarms it. Other threads, and so DDP's own and the user's collectives, never see it.
 *  - a table: rows by size range (and nodes, ranks where given), loaded from the CSV of
 *    AUTOTUNE_NCCL_TABLE at the first init, or set from Python (at_table_load).
 * A choice sets its algorithm x protocol cell of the cost table to 0 (NCCL takes the cheapest)
 * and, if given, the channel count; a cell NCCL marked -1 (unusable) is never forced: the call
 * is left to NCCL and reported as refused. getChunkSize applies a chosen chunk size to the call
 * that chose it.
 *
 * Every call (v3 on: v2 has no cost table) also keeps NCCL's own prediction: its table before
 * any steering, per (communicator, collective, bytes), read back with at_predictions and joined
 * with the profiler's measured kernel times (_profiler.c, autotune_nccl.collectives). Nothing here
 * returns an error to NCCL, which wraps these calls in NCCLCHECK: what the plugin cannot use is
 * left to NCCL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int ncclResult_t; /* ncclSuccess = 0: the only value this plugin returns */
#define AT_SUCCESS 0

typedef void (*at_logger_t)(int level, unsigned long flags, const char *file, int line,
                            const char *fmt, ...);

#define AT_ALLREDUCE 4     /* ncclFuncAllReduce */
#define AT_NUM_FUNCS 5     /* broadcast, reduce, allgather, reducescatter, allreduce */
#define AT_MAX_ALGOS 7     /* tree, ring, collnet direct, collnet chain, nvls, nvls tree, pat */
#define AT_MAX_PROTOS 3    /* LL, LL128, Simple */
#define AT_IGNORE -1.0f    /* NCCL_ALGO_PROTO_IGNORE */
#define AT_MAX_ROWS 256
#define AT_MAX_PREDICTIONS 512

enum { AT_NONE = 0, AT_DRIVEN = 1, AT_TABLE = 2 };

typedef struct {
    uint64_t comm_id;
    size_t n_ranks;
    size_t n_nodes;
    at_logger_t log;
} at_context;

typedef struct {
    int armed;
    int any_comm;
    uint64_t comm_id;
    int algo, proto, channels;
    long long chunk;
} at_choice;

/* What the last all-reduce getCollInfo on a thread did (read back with at_last). */
typedef struct {
    int calls;          /* all-reduce getCollInfo calls on this thread so far */
    int source;         /* AT_NONE, AT_DRIVEN or AT_TABLE */
    int applied;        /* 1: the choice's cell was set to 0 */
    int refused;        /* 1: the choice's cell was -1 (or out of range): left to NCCL */
    int algo, proto, channels;
    long long chunk;
    unsigned int usable; /* bit a * AT_MAX_PROTOS + p: the cell was not -1 */
    uint64_t comm_id;
    unsigned long long n_bytes;
} at_report;

typedef struct {
    int func;           /* AT_ALLREDUCE, ... ; -1: any */
    unsigned long long lo, hi;
    int algo, proto, channels;
    int n_nodes, n_ranks, pipe_ops, reg_buff; /* -1: any */
} at_row;

static __thread at_choice t_next;
static __thread at_choice t_used; /* the choice the last applied call took, for getChunkSize */
static __thread at_report t_last = {.algo = -1, .proto = -1, .channels = -1};

/* NCCL's own prediction for one (communicator, collective, size): its cost table before any
 * steering (microseconds per cell, -1 unusable), the cell it would have taken, and the cell the
 * last call ran (-1: NCCL's own). Read back with at_predictions, joined with the profiler's
 * measured kernel times in autotune_nccl.collectives. */
typedef struct {
    uint64_t comm_id;
    unsigned long long n_bytes;
    int func;
    int n_ranks, n_nodes;
    int nccl_algo, nccl_proto;
    int steered_algo, steered_proto;
    unsigned long long calls;
    float cost[AT_MAX_ALGOS][AT_MAX_PROTOS];
} at_prediction;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static at_prediction g_preds[AT_MAX_PREDICTIONS];
static int g_npreds;
static unsigned long long g_preds_dropped;
static at_row g_rows[AT_MAX_ROWS];
static int g_nrows;
static int g_env_loaded;
static char g_error[512];

static const char *ALGOS[AT_MAX_ALGOS] = {"tree", "ring", "collnet_direct", "collnet_chain",
                                          "nvls", "nvls_tree", "pat"};
static const char *PROTOS[AT_MAX_PROTOS] = {"ll", "ll128", "simple"};
static const char *FUNCS[AT_NUM_FUNCS] = {"broadcast", "reduce", "allgather", "reducescatter",
                                          "allreduce"};

static int index_of(const char *name, const char **names, int n) {
    for (int i = 0; i < n; i++) {
        if (strcasecmp(name, names[i]) == 0) return i;
    }
    return -1;
}

/* -- the table ------------------------------------------------------------------------------ */

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    char *end = s + strlen(s);
    while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r'))
        *--end = '\0';
    return s;
}

/* Parse NCCL's example tuner CSV: collective_type,min_bytes,max_bytes,algorithm,protocol,
 * channels,nNodes,nRanks,numPipeOps,regBuff (the last four optional, -1: any). Returns the row
 * count, or -1 with g_error set. Caller holds g_lock. */
static int parse_table(const char *path) {
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(g_error, sizeof g_error, "%s: %s", path, strerror(errno));
        return -1;
    }
    at_row rows[AT_MAX_ROWS];
    int n = 0, lineno = 0;
    char line[1024];
    while (fgets(line, sizeof line, f) != NULL) {
        lineno++;
        char *s = trim(line);
        if (*s == '\0' || *s == '#') continue;
        char *fields[10];
        int k = 0;
        for (char *tok = strtok(s, ","); tok != NULL && k < 10; tok = strtok(NULL, ","))
            fields[k++] = trim(tok);
        if (k < 6) {
            snprintf(g_error, sizeof g_error, "%s:%d: need at least 6 fields, got %d", path,
                     lineno, k);
            fclose(f);
            return -1;
        }
        if (n == AT_MAX_ROWS) {
            snprintf(g_error, sizeof g_error, "%s: more than %d rows", path, AT_MAX_ROWS);
            fclose(f);
            return -1;
        }
        at_row r = {.n_nodes = -1, .n_ranks = -1, .pipe_ops = -1, .reg_buff = -1};
        r.func = index_of(fields[0], FUNCS, AT_NUM_FUNCS);
        r.lo = strtoull(fields[1], NULL, 10);
        r.hi = strtoull(fields[2], NULL, 10);
        r.algo = index_of(fields[3], ALGOS, AT_MAX_ALGOS);
        r.proto = index_of(fields[4], PROTOS, AT_MAX_PROTOS);
        r.channels = atoi(fields[5]);
        int *optional[4] = {&r.n_nodes, &r.n_ranks, &r.pipe_ops, &r.reg_buff};
        for (int i = 6; i < k; i++) *optional[i - 6] = atoi(fields[i]);
        if (r.func < 0 || r.algo < 0 || r.proto < 0 || r.hi < r.lo) {
            snprintf(g_error, sizeof g_error,
                     "%s:%d: unknown collective, algorithm or protocol, or max < min", path,
                     lineno);
            fclose(f);
            return -1;
        }
        rows[n++] = r;
    }
    fclose(f);
    memcpy(g_rows, rows, sizeof(at_row) * n);
    g_nrows = n;
    return n;
}

static int table_lookup(const at_context *c, int func, size_t n_bytes, int pipe_ops,
                        int reg_buff, at_row *out) {
    int found = 0;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_nrows && !found; i++) {
        const at_row *r = &g_rows[i];
        if (r->func != func || n_bytes < r->lo || n_bytes > r->hi) continue;
        if (r->n_nodes >= 0 && (size_t)r->n_nodes != c->n_nodes) continue;
        if (r->n_ranks >= 0 && (size_t)r->n_ranks != c->n_ranks) continue;
        if (r->pipe_ops >= 0 && r->pipe_ops != pipe_ops) continue;
        if (r->reg_buff >= 0 && r->reg_buff != reg_buff) continue;
        *out = *r;
        found = 1;
    }
    pthread_mutex_unlock(&g_lock);
    return found;
}

/* Keep NCCL's table for this call (before the choice touches it). One entry per (communicator,
 * collective, bytes): NCCL's model gives the same table each time for those. */
static void predict(const at_context *c, int func, size_t n_bytes, const float *table,
                    int num_algo, int num_proto, int steered_algo, int steered_proto) {
    pthread_mutex_lock(&g_lock);
    at_prediction *e = NULL;
    for (int i = 0; i < g_npreds; i++) {
        at_prediction *p = &g_preds[i];
        if (p->comm_id == c->comm_id && p->func == func && p->n_bytes == n_bytes &&
            p->n_ranks == (int)c->n_ranks && p->n_nodes == (int)c->n_nodes) {
            e = p;
            break;
        }
    }
    if (e == NULL && g_npreds < AT_MAX_PREDICTIONS) {
        e = &g_preds[g_npreds++];
        memset(e, 0, sizeof *e);
        e->comm_id = c->comm_id;
        e->func = func;
        e->n_bytes = n_bytes;
        e->n_ranks = (int)c->n_ranks;
        e->n_nodes = (int)c->n_nodes;
    }
    if (e == NULL) {
        g_preds_dropped++;
    } else {
        float best = -1.0f;
        e->nccl_algo = e->nccl_proto = -1;
        for (int a = 0; a < AT_MAX_ALGOS; a++)
            for (int p = 0; p < AT_MAX_PROTOS; p++) {
                float v = a < num_algo && p < num_proto ? table[a * num_proto + p] : AT_IGNORE;
                e->cost[a][p] = v;
                if (v >= 0.0f && (best < 0.0f || v < best)) {
                    best = v;
                    e->nccl_algo = a;
                    e->nccl_proto = p;
                }
            }
        e->steered_algo = steered_algo;
        e->steered_proto = steered_proto;
        e->calls++;
    }
    pthread_mutex_unlock(&g_lock);
}

/* -- what NCCL calls ------------------------------------------------------------------------ */

static ncclResult_t at_init(void **ctx, uint64_t comm_id, size_t n_ranks, size_t n_nodes,
                            at_logger_t log, void *nvl_domain_info, void *constants) {
    (void)nvl_domain_info;
    (void)constants;
    at_context *c = calloc(1, sizeof *c);
    *ctx = c;
    if (c == NULL) return AT_SUCCESS; /* an error would fail NCCL's init: steer nothing instead */
    c->comm_id = comm_id;
    c->n_ranks = n_ranks;
    c->n_nodes = n_nodes;
    c->log = log;
    pthread_mutex_lock(&g_lock);
    if (!g_env_loaded) {
        g_env_loaded = 1;
        const char *path = getenv("AUTOTUNE_NCCL_TABLE");
        if (path != NULL && *path != '\0' && parse_table(path) < 0 && log != NULL)
            log(2 /* NCCL_LOG_WARN */, ~0UL, __FILE__, __LINE__,
                "autotune tuner: AUTOTUNE_NCCL_TABLE ignored: %s", g_error);
    }
    pthread_mutex_unlock(&g_lock);
    *ctx = c;
    return AT_SUCCESS;
}

/* NCCL wraps getCollInfo in NCCLCHECK: an error fails the user's collective. So nothing here
 * returns one; whatever the plugin cannot use (no context, no table, an unknown collective) is
 * left to NCCL. `keep` is 0 where the table is not NCCL's (v2's stand-in). */
static ncclResult_t coll_info(void *ctx, int coll_type, size_t n_bytes, int num_pipe_ops,
                              float **cost_table, int num_algo, int num_proto, int reg_buff,
                              int *n_channels, int keep) {
    const at_context *c = ctx;
    if (c == NULL || cost_table == NULL || num_algo <= 0 || num_proto <= 0) return AT_SUCCESS;
    if (coll_type < 0 || coll_type >= AT_NUM_FUNCS) return AT_SUCCESS;
    float *table = (float *)cost_table; /* float[num_algo][num_proto], as NCCL lays it out */
    at_report rep = {.calls = t_last.calls, .algo = -1, .proto = -1, .channels = -1,
                     .comm_id = c->comm_id, .n_bytes = n_bytes};
    if (coll_type == AT_ALLREDUCE) {
        rep.calls++;
        for (int a = 0; a < num_algo && a < AT_MAX_ALGOS; a++)
            for (int p = 0; p < num_proto && p < AT_MAX_PROTOS; p++)
                if (table[a * num_proto + p] != AT_IGNORE) rep.usable |= 1u << (a * AT_MAX_PROTOS + p);
    }
    float before[AT_MAX_ALGOS * AT_MAX_PROTOS];
    int cells = num_algo * num_proto;
    if (keep && cells <= AT_MAX_ALGOS * AT_MAX_PROTOS)
        memcpy(before, table, sizeof(float) * (size_t)cells);
    else
        keep = 0;
    at_choice choice = {0};
    if (coll_type == AT_ALLREDUCE && t_next.armed &&
        (t_next.any_comm || t_next.comm_id == c->comm_id)) {
        choice = t_next;
        t_next.armed = 0;
        rep.source = AT_DRIVEN;
    } else {
        at_row row;
        if (table_lookup(c, coll_type, n_bytes, num_pipe_ops, reg_buff, &row)) {
            choice.algo = row.algo;
            choice.proto = row.proto;
            choice.channels = row.channels;
            choice.chunk = 0;
            rep.source = AT_TABLE;
        }
    }
    if (rep.source != AT_NONE) {
        rep.algo = choice.algo;
        rep.proto = choice.proto;
        rep.channels = choice.channels;
        rep.chunk = choice.chunk;
        int in_range = choice.algo >= 0 && choice.algo < num_algo && choice.proto >= 0 &&
                       choice.proto < num_proto;
        if (in_range && table[choice.algo * num_proto + choice.proto] != AT_IGNORE) {
            table[choice.algo * num_proto + choice.proto] = 0.0f;
            if (choice.channels > 0 && n_channels != NULL) *n_channels = choice.channels;
            rep.applied = 1;
            t_used = choice;
            t_used.armed = 1;
            t_used.comm_id = c->comm_id;
        } else {
            rep.refused = 1;
            t_used.armed = 0;
            if (c->log != NULL)
                c->log(2, ~0UL, __FILE__, __LINE__,
                       "autotune tuner: algorithm %d protocol %d not usable for %zu bytes: left "
                       "to NCCL", choice.algo, choice.proto, n_bytes);
        }
    } else {
        t_used.armed = 0;
    }
    if (coll_type == AT_ALLREDUCE || rep.source != AT_NONE) t_last = rep;
    if (keep)
        predict(c, coll_type, n_bytes, before, num_algo, num_proto,
                rep.applied ? choice.algo : -1, rep.applied ? choice.proto : -1);
    return AT_SUCCESS;
}

static ncclResult_t at_get_coll_info(void *ctx, int coll_type, size_t n_bytes, int num_pipe_ops,
                                     float **cost_table, int num_algo, int num_proto,
                                     int reg_buff, int *n_channels) {
    return coll_info(ctx, coll_type, n_bytes, num_pipe_ops, cost_table, num_algo, num_proto,
                     reg_buff, n_channels, 1);
}

static ncclResult_t at_get_chunk_size(void *ctx, int coll_type, size_t n_bytes, int algo,
                                      int proto, int n_channels, size_t *chunk_size) {
    (void)n_bytes;
    (void)n_channels;
    const at_context *c = ctx;
    if (c == NULL || chunk_size == NULL) return AT_SUCCESS; /* NCCL keeps its own chunk */
    if (t_used.armed && coll_type == AT_ALLREDUCE && t_used.comm_id == c->comm_id &&
        t_used.algo == algo && t_used.proto == proto && t_used.chunk > 0) {
        *chunk_size = (size_t)t_used.chunk;
    }
    t_used.armed = 0;
    return AT_SUCCESS;
}

static ncclResult_t at_finalize(void *ctx) {
    free(ctx);
    return AT_SUCCESS;
}

/* NCCL's structs, as laid out in its tuner.h (v5: no getChunkSize; v6 and v7: the same). */
typedef struct {
    const char *name;
    ncclResult_t (*init)(void **, uint64_t, size_t, size_t, at_logger_t, void *, void *);
    ncclResult_t (*getCollInfo)(void *, int, size_t, int, float **, int, int, int, int *);
    ncclResult_t (*finalize)(void *);
} at_tuner_v5;

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **, uint64_t, size_t, size_t, at_logger_t, void *, void *);
    ncclResult_t (*getCollInfo)(void *, int, size_t, int, float **, int, int, int, int *);
    ncclResult_t (*finalize)(void *);
    ncclResult_t (*getChunkSize)(void *, int, size_t, int, int, int, size_t *);
} at_tuner_v6;

__attribute__((visibility("default"))) const at_tuner_v6 ncclTunerPlugin_v7 = {
    "autotune", at_init, at_get_coll_info, at_finalize, at_get_chunk_size};
__attribute__((visibility("default"))) const at_tuner_v6 ncclTunerPlugin_v6 = {
    "autotune", at_init, at_get_coll_info, at_finalize, at_get_chunk_size};
__attribute__((visibility("default"))) const at_tuner_v5 ncclTunerPlugin_v5 = {
    "autotune", at_init, at_get_coll_info, at_finalize};

/* -- NCCL 2.21 to 2.27: tuner v2, v3, v4 (init without a communicator id) ------------------- */

static ncclResult_t at_init_legacy(size_t n_ranks, size_t n_nodes, at_logger_t log, void **ctx) {
    return at_init(ctx, 0, n_ranks, n_nodes, log, NULL, NULL);
}

static ncclResult_t at_get_coll_info_v3(void *ctx, int coll_type, size_t n_bytes,
                                        int num_pipe_ops, float **cost_table, int num_algo,
                                        int num_proto, int *n_channels) {
    return at_get_coll_info(ctx, coll_type, n_bytes, num_pipe_ops, cost_table, num_algo,
                            num_proto, 0, n_channels);
}

/* v2: no cost table. A table of the cells NCCL 2.21 can run whatever the machine (ring and tree
 * with LL or Simple; LL128 depends on the GPU and is left out), CollNet and NVLS where NCCL says
 * so, goes through the same choice as v3+; the cell the choice set to 0 becomes the output. */
static ncclResult_t at_get_coll_info_v2(void *ctx, int coll_type, size_t n_bytes,
                                        int coll_net_support, int nvls_support, int num_pipe_ops,
                                        int *algorithm, int *protocol, int *n_channels) {
    if (ctx == NULL || algorithm == NULL || protocol == NULL) return AT_SUCCESS;
    enum { V2_ALGOS = 6 }; /* NCCL 2.21: tree, ring, collnet direct, collnet chain, nvls, nvls tree */
    float table[V2_ALGOS][AT_MAX_PROTOS];
    for (int a = 0; a < V2_ALGOS; a++) {
        int usable = a <= 1 || (a <= 3 && coll_net_support) || (a >= 4 && nvls_support);
        for (int p = 0; p < AT_MAX_PROTOS; p++)
            table[a][p] = usable && p != 1 /* LL128 */ ? 1.0f : AT_IGNORE;
    }
    int channels = n_channels != NULL ? *n_channels : 0;
    ncclResult_t rc = coll_info(ctx, coll_type, n_bytes, num_pipe_ops, (float **)table,
                                V2_ALGOS, AT_MAX_PROTOS, 0, &channels, 0);
    if (rc != AT_SUCCESS) return rc;
    for (int a = 0; a < V2_ALGOS; a++)
        for (int p = 0; p < AT_MAX_PROTOS; p++)
            if (table[a][p] == 0.0f) {
                *algorithm = a;
                *protocol = p;
                if (n_channels != NULL) *n_channels = channels;
            }
    return AT_SUCCESS;
}

typedef struct {
    const char *name;
    ncclResult_t (*init)(size_t, size_t, at_logger_t, void **);
    ncclResult_t (*getCollInfo)(void *, int, size_t, int, int, int, int *, int *, int *);
    ncclResult_t (*destroy)(void *);
} at_tuner_v2;

typedef struct {
    const char *name;
    ncclResult_t (*init)(size_t, size_t, at_logger_t, void **);
    ncclResult_t (*getCollInfo)(void *, int, size_t, int, float **, int, int, int *);
    ncclResult_t (*destroy)(void *);
} at_tuner_v3;

typedef struct {
    const char *name;
    ncclResult_t (*init)(size_t, size_t, at_logger_t, void **);
    ncclResult_t (*getCollInfo)(void *, int, size_t, int, float **, int, int, int, int *);
    ncclResult_t (*destroy)(void *);
} at_tuner_v4;

__attribute__((visibility("default"))) const at_tuner_v4 ncclTunerPlugin_v4 = {
    "autotune", at_init_legacy, at_get_coll_info, at_finalize};
__attribute__((visibility("default"))) const at_tuner_v3 ncclTunerPlugin_v3 = {
    "autotune", at_init_legacy, at_get_coll_info_v3, at_finalize};
__attribute__((visibility("default"))) const at_tuner_v2 ncclTunerPlugin_v2 = {
    "autotune", at_init_legacy, at_get_coll_info_v2, at_finalize};

/* -- what autotune calls (ctypes) ----------------------------------------------------------- */

/* Arm a choice for this thread's next all-reduce (comm_id used only if any_comm is 0). */
__attribute__((visibility("default"))) int at_arm(int algo, int proto, int channels,
                                                  long long chunk, int any_comm,
                                                  uint64_t comm_id) {
    if (algo < 0 || algo >= AT_MAX_ALGOS || proto < 0 || proto >= AT_MAX_PROTOS) return -1;
    t_next = (at_choice){.armed = 1, .any_comm = any_comm, .comm_id = comm_id, .algo = algo,
                         .proto = proto, .channels = channels, .chunk = chunk};
    return 0;
}

__attribute__((visibility("default"))) void at_disarm(void) { t_next.armed = 0; }

__attribute__((visibility("default"))) int at_armed(void) { return t_next.armed; }

__attribute__((visibility("default"))) void at_last(at_report *out) { *out = t_last; }

/* Load a table (NULL or "": clear it). Returns the row count, or -1 (see at_error). */
__attribute__((visibility("default"))) int at_table_load(const char *path) {
    pthread_mutex_lock(&g_lock);
    g_env_loaded = 1; /* an explicit table wins over the environment's */
    int n = 0;
    if (path == NULL || *path == '\0')
        g_nrows = 0;
    else
        n = parse_table(path);
    pthread_mutex_unlock(&g_lock);
    return n;
}

__attribute__((visibility("default"))) int at_table_rows(void) {
    pthread_mutex_lock(&g_lock);
    int n = g_nrows;
    pthread_mutex_unlock(&g_lock);
    return n;
}

__attribute__((visibility("default"))) const char *at_error(void) { return g_error; }

/* Copy up to `max` of NCCL's predictions into `out`; returns how many there are in all. */
__attribute__((visibility("default"))) int at_predictions(at_prediction *out, int max,
                                                          unsigned long long *dropped) {
    pthread_mutex_lock(&g_lock);
    int n = g_npreds;
    if (out != NULL) memcpy(out, g_preds, sizeof(at_prediction) * (size_t)(n < max ? n : max));
    if (dropped != NULL) *dropped = g_preds_dropped;
    pthread_mutex_unlock(&g_lock);
    return n;
}

__attribute__((visibility("default"))) void at_predictions_clear(void) {
    pthread_mutex_lock(&g_lock);
    g_npreds = 0;
    g_preds_dropped = 0;
    pthread_mutex_unlock(&g_lock);
}

/* -- a Python module, so that pip builds and installs it like any extension ------------------ */

static struct PyModuleDef at_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_tuner",
    .m_doc = "autotune's NCCL tuner plugin (see autotune_nccl)",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__tuner(void) { return PyModule_Create(&at_module); }
