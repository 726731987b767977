/*
 * What autotune's NCCL profiler plugin costs NCCL's threads: nanoseconds per collective, as NCCL
 * 2.28+ reports one (the host's collective start and stop, then per channel the kernel channel's
 * start, its GPU timer at stop and its stop), on T producer threads while one thread drains the
 * ring, as the rank's exporter does. It compiles the plugin's own source in (so the numbers are
 * the plugin's code, without NCCL or a GPU):
 *
 *   python benchmarks/profiler_cost.py            # builds this file, runs 1, 2 and 4 threads
 *
 * Prints one line per thread count: collectives, ns per collective per thread, the ring's drops
 * (0 while the drain keeps up), and the mean of the records' own cost (cost_ns: what the
 * plugin's series report). The driver runs it once per setting of the environment the plugin
 * reads at its first communicator: as it is, AUTOTUNE_NCCL_PROFILER_CHAIN, _SAMPLE.
 */
#include "../plugins/autotune-nccl/autotune_nccl/_profiler.c"

#include <stdio.h>

enum { CHANNELS = 2 };

static long g_per_thread;
static _Atomic int g_done;
static uint64_t g_cost_ns, g_costed; /* the drain thread's sums of the records' cost_ns */

static uint64_t now_ns(void) { return host_ns(); }

static void *produce(void *arg) {
    (void)arg;
    void *ctx = NULL;
    int mask = 0;
    ap_init_v6(&ctx, 0xBE7C, &mask, "bench", 1, 2, 0, NULL);
    ap_descr_v5 coll = {.type = AP_EVENT_COLL};
    coll.coll.base.func = "AllReduce";
    coll.coll.base.datatype = "ncclFloat32";
    coll.coll.base.algo = "RING";
    coll.coll.base.proto = "SIMPLE";
    coll.coll.base.count = 1 << 18;
    coll.coll.base.nChannels = CHANNELS;
    for (long i = 0; i < g_per_thread; i++) {
        void *handle = NULL;
        coll.coll.base.seqNumber = (uint64_t)i;
        ap_start_v5(ctx, &handle, &coll);
        ap_stop(handle);
        for (int ch = 0; ch < CHANNELS; ch++) {
            ap_descr_v5 k = {.type = AP_EVENT_KERNEL_CH, .parentObj = handle};
            k.kernelCh.channelId = (uint8_t)ch;
            k.kernelCh.pTimer = 1000 + (uint64_t)ch;
            void *kh = NULL;
            ap_start_v5(ctx, &kh, &k);
            uint64_t stop = 50000 + (uint64_t)ch;
            ap_record_state(kh, AP_STATE_KERNEL_CH_STOP, &stop);
            ap_stop(kh);
        }
    }
    ap_finalize(ctx);
    return NULL;
}

static void *drain(void *arg) {
    (void)arg;
    static ap_record out[256];
    for (int last = 0; !last;) {
        last = atomic_load(&g_done);
        int n = ap_drain(out, 256);
        for (int i = 0; i < n; i++) {
            g_cost_ns += out[i].cost_ns;
            g_costed += out[i].cost_ns > 0; /* every 16th of a communicator is timed */
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    g_per_thread = argc > 1 ? atol(argv[1]) : 200000;
    int counts[] = {1, 2, 4};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        int t = counts[c];
        ap_stats_t before, after;
        ap_stats(&before);
        atomic_store(&g_done, 0);
        g_cost_ns = g_costed = 0;
        pthread_t drainer, workers[8];
        pthread_create(&drainer, NULL, drain, NULL);
        uint64_t start = now_ns();
        for (int i = 0; i < t; i++) pthread_create(&workers[i], NULL, produce, NULL);
        for (int i = 0; i < t; i++) pthread_join(workers[i], NULL);
        uint64_t took = now_ns() - start;
        atomic_store(&g_done, 1);
        pthread_join(drainer, NULL);
        ap_stats(&after);
        long total = g_per_thread * t;
        printf("threads %d collectives %ld ns_per_collective_per_thread %.1f records %llu "
               "ring_full %llu pool_full %llu cost_ns_per_record %.1f chained %llu "
               "sampled_out %llu\n",
               t, total, (double)took / (double)g_per_thread,
               (unsigned long long)(after.records - before.records),
               (unsigned long long)(after.ring_full - before.ring_full),
               (unsigned long long)(after.pool_full - before.pool_full),
               g_costed ? (double)g_cost_ns / (double)g_costed : 0.0,
               (unsigned long long)(after.chained - before.chained),
               (unsigned long long)(after.sampled_out - before.sampled_out));
    }
    return 0;
}
