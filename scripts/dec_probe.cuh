/* dec_probe.cuh: per-block timing of the tensor-core decode attention kernels, for a probe build
 * only (scripts/dec_probe.sh includes it into a patched copy of attention.cu; never built into
 * cvllm). Each block's thread 0 stamps %globaltimer and clock64 at 9 points: 0 entry, 1 after
 * pdl_wait (where the setup comes first, after it: then phase 1 also holds the setup), 2 after the
 * setup and the early table / tiles, 3 when warp 0's first tile has landed, 4 warp 0's loop done,
 * 5 after the barrier before the merge, 6 the end; with the fused prologue also 7 when warp 0's
 * part of it is done and 8 after its last barrier (phase 2-3 is then split into "pro" 2-7, "proj"
 * 7-8, the wait for the other warps' heads and the key's store, and "tile" 8-3). Host side: before
 * a launch whose shape (sequences, longest context, cache type, order, blocks) differs from the
 * last one, the last launch's stamps are summarized on stderr (every PROBE_EVERY-th change): the
 * phases (from clock64, at 1.98 GHz), when the first wave's data arrived, and how many blocks were
 * in their loop / resident at 20 points of the launch. */
#pragma once
#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>
#define PROBE_MAXB 32768
#define PW 10 /* stamps a block: 0..8, and its SM in dec_probe_c[.][9] */
__device__ unsigned long long dec_probe_g[PROBE_MAXB][PW];
__device__ long long dec_probe_c[PROBE_MAXB][PW];
__device__ __forceinline__ void probe_stamp(int i) {
    const unsigned blk = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    if (blk >= PROBE_MAXB) return;
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    dec_probe_g[blk][i] = t;
    dec_probe_c[blk][i] = clock64();
    if (i == 0) {
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        dec_probe_c[blk][9] = sm;
    }
}
#define PROBE(i) (threadIdx.x == 0 ? probe_stamp(i) : (void)0)

static void probe_dump(int nblk, const char *what) {
    if (nblk > PROBE_MAXB) nblk = PROBE_MAXB;
    std::vector<unsigned long long> g((size_t)nblk * PW);
    std::vector<long long> c((size_t)nblk * PW);
    cudaMemcpyFromSymbol(g.data(), dec_probe_g, g.size() * 8);
    cudaMemcpyFromSymbol(c.data(), dec_probe_c, c.size() * 8);
    unsigned long long T0 = ~0ull, T1 = 0;
    for (int b = 0; b < nblk; b++)
        T0 = std::min(T0, g[b * PW]), T1 = std::max(T1, g[b * PW + 6]);
    double span = (T1 - T0) / 1e3;
    /* phases from clock64 (same SM), in cycles -> us at 1.98 GHz */
    const double cyc = 1.98e3;
    const char *nm[6] = {"wait", "setup", "first", "loop", "join", "fin"};
    double sum[6] = {0};
    std::vector<double> ph[6];
    for (int b = 0; b < nblk; b++)
        for (int i = 0; i < 6; i++) {
            double d = (c[b * PW + i + 1] - c[b * PW + i]) / cyc;
            sum[i] += d, ph[i].push_back(d);
        }
    fprintf(stderr, "PROBE %s: %d blocks, span %.2f us (globaltimer)\n", what, nblk, span);
    for (int i = 0; i < 6; i++) {
        std::sort(ph[i].begin(), ph[i].end());
        fprintf(stderr, "  %-5s mean %7.2f  p10 %7.2f  p50 %7.2f  p90 %7.2f us\n", nm[i],
                sum[i] / nblk, ph[i][nblk / 10], ph[i][nblk / 2], ph[i][nblk * 9 / 10]);
    }
    /* the fused prologue's stamps, where this launch wrote them (2 <= 7 <= 8 <= 3) */
    const char *nm2[3] = {"pro", "proj", "tile"};
    const int at[4] = {2, 7, 8, 3};
    std::vector<double> sp[3];
    for (int b = 0; b < nblk; b++) {
        const long long *cb = &c[(size_t)b * PW];
        if (!(cb[2] <= cb[7] && cb[7] <= cb[8] && cb[8] <= cb[3])) continue;
        for (int i = 0; i < 3; i++)
            sp[i].push_back((cb[at[i + 1]] - cb[at[i]]) / cyc);
    }
    for (int i = 0; i < 3 && !sp[0].empty(); i++) {
        const size_t n = sp[i].size();
        double m = 0;
        for (double v : sp[i]) m += v;
        std::sort(sp[i].begin(), sp[i].end());
        fprintf(stderr, "  %-5s mean %7.2f  p10 %7.2f  p50 %7.2f  p90 %7.2f us (%zu blocks)\n",
                nm2[i], m / n, sp[i][n / 10], sp[i][n / 2], sp[i][n * 9 / 10], n);
    }
    /* first wave: blocks entered within 2 us of T0 */
    int nf = 0;
    double f3 = 0, f1 = 0, lastdata = 0;
    std::vector<double> ends, starts3;
    for (int b = 0; b < nblk; b++) {
        double e0 = (g[b * PW] - T0) / 1e3;
        if (e0 < 2.0) nf++, f3 += (g[b * PW + 3] - T0) / 1e3, f1 += (g[b * PW + 1] - T0) / 1e3;
        ends.push_back((g[b * PW + 6] - T0) / 1e3);
        starts3.push_back((g[b * PW + 3] - T0) / 1e3);
        lastdata = std::max(lastdata, (g[b * PW + 4] - T0) / 1e3);
    }
    std::sort(ends.begin(), ends.end());
    fprintf(stderr,
            "  first wave %d blocks: wait returns at %.2f us, first tile at %.2f us (mean)\n", nf,
            nf ? f1 / nf : 0, nf ? f3 / nf : 0);
    fprintf(stderr, "  ends: p50 %.2f p90 %.2f p99 %.2f max %.2f us; last loop end %.2f\n",
            ends[nblk / 2], ends[nblk * 9 / 10], ends[nblk * 99 / 100], ends[nblk - 1], lastdata);
    /* blocks in their loop (t3..t4) at 20 points of the span */
    fprintf(stderr, "  in loop:");
    for (int k = 0; k < 20; k++) {
        double t = span * (k + 0.5) / 20;
        int n = 0;
        for (int b = 0; b < nblk; b++) {
            double a = (g[b * PW + 3] - T0) / 1e3, z = (g[b * PW + 4] - T0) / 1e3;
            n += a <= t && t < z;
        }
        fprintf(stderr, " %d", n);
    }
    fprintf(stderr, "\n  resident:");
    for (int k = 0; k < 20; k++) {
        double t = span * (k + 0.5) / 20;
        int n = 0;
        for (int b = 0; b < nblk; b++) {
            double a = (g[b * PW] - T0) / 1e3, z = (g[b * PW + 6] - T0) / 1e3;
            n += a <= t && t < z;
        }
        fprintf(stderr, " %d", n);
    }
    fprintf(stderr, "\n");
}
/* host: call after each launch; dumps the previous config's last launch when the config changes */
static void probe_before_launch(const AttentionParams *p, int nblk, cudaStream_t st) {
    static long long key = -1;
    static int prev_n = 0;
    static char prev_what[128];
    cudaStreamCaptureStatus cs;
    cudaStreamIsCapturing(st, &cs);
    if (cs != cudaStreamCaptureStatusNone) return;
    long long k = (long long)p->num_seqs * 1000003LL + p->max_seqlen_k * 7 +
                  (p->seq_order ? 1 : 0) + (long long)p->kvdt * 100000007LL + (long long)nblk * 31;
    static int every = -1, nchg = 0;
    if (every < 0) {
        const char *e = getenv("PROBE_EVERY");
        every = e ? atoi(e) : 1;
        if (every < 1) every = 1;
    }
    if (key != -1 && k != key && (nchg++ % every) == 0) {
        cudaDeviceSynchronize();
        probe_dump(prev_n, prev_what);
    }
    if (k != key) {
        key = k, prev_n = nblk;
        snprintf(prev_what, sizeof prev_what, "B %d maxc %d kvdt %d order %d", p->num_seqs,
                 p->max_seqlen_k, (int)p->kvdt, p->seq_order ? 1 : 0);
    }
}
