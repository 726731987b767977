/*
 * A second NCCL profiler plugin loaded beside autotune's (AUTOTUNE_NCCL_PROFILER_CHAIN=<path>):
 * NCCL loads one profiler per process (NCCL_PROFILER_PLUGIN), so autotune's plugin loads the
 * other one itself and forwards every call to it (_profiler_chain.c; docs/NCCL_PROFILER.md).
 */
#ifndef AUTOTUNE_PROFILER_CHAIN_H
#define AUTOTUNE_PROFILER_CHAIN_H

#include <stdint.h>

typedef void (*ap_logger_t)(int level, unsigned long flags, const char *file, int line,
                            const char *fmt, ...);

/* What one communicator's init passes on (the arguments of every version's init). */
typedef struct {
    uint64_t comm_id; /* v4: the commHash; v5+: the commId */
    const char *name;
    int nnodes, nranks, rank;
    ap_logger_t log;
} chain_comm_args;

/* Bind the chained plugin for the profiler version NCCL called (3 to 7), once per process: the
 * version it is forwarded at (that one if it exports it; from v5 on, else the newest it exports
 * down to v5, whose descriptors are prefixes of the newer ones), or 0 where there is no chain
 * (the variable unset, the library or a usable symbol missing: logged once). */
int chain_bind(int nccl_version, ap_logger_t log);

/* The chained plugin's init for one communicator: 0 and its context and mask, or -1 (its init
 * failed, or no chain is bound for this version: then *ctx is NULL). */
int chain_init(int nccl_version, void **ctx, int *mask, const chain_comm_args *args);

/* Whether an event of `type` (NCCL's ncclProfile* bit) or a state (ncclProfiler* value) exists
 * at the bound version: v7's kernel phases and v6's copy-engine events are not passed on below. */
int chain_knows_type(uint64_t type);
int chain_knows_state(int state);

/* Forward a start: `parent_slot` is the descriptor's parentObj, set to `parent` (the chained
 * plugin's handle of the parent event) for the call and restored after it. Returns its handle. */
void *chain_start(void *ctx, void *descr, void **parent_slot, void *parent);
void chain_stop(void *handle);
void chain_record(void *handle, int state, void *args);
void chain_finalize(void *ctx);

/* Whether a chain is bound; its version; events forwarded; failures (logged once). */
int chain_version(void);
uint64_t chain_forwarded(void);
uint64_t chain_failures(void);

#endif
