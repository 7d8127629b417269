//go:build ignore

/*
 * test_nccl.c - libslowrank_cupti.so as NCCL's profiler plugin, without a
 * GPU: a fake NCCL (test/fakelibs/ncclprof.c) loads it by
 * NCCL_PROFILER_PLUGIN and drives it as NCCL's profiler.cc does, from
 * several user threads and a proxy thread. Each scenario runs in its own
 * child with a deadline; the library's batches are read back from
 * SLOWRANK_CUPTI_DUMP and checked record by record.
 *   v5        NCCL 2.28: every collective once, right identity, API times,
 *             GPU times from kernel channels on CLOCK_MONOTONIC
 *   v4        NCCL 2.27 (SLOWRANK_FAKE_NCCL_PROFILER_MAX=4): no API events
 *   v6        NCCL 2.29/2.30 (MAX=6): v6 bound, CeColl in the mask
 *   ce        2.29, copy-engine collectives: one CE record each, no kernel
 *   ce5       2.28.9, the same: invisible to the plugin
 *   noagent   no agent: mask stays 0, NCCL never calls the plugin
 *   disabled  SLOWRANK_NCCL_DISABLE=1: init fails, NCCL runs on
 *   none      NCCL_PROFILER_PLUGIN=none: not loaded
 *   abuse     NULL/forged/stale handles, unknown types, finalize with
 *             events in flight, a flood that overfills the ring: no crash,
 *             no wait, everything counted
 *   toggle    duty cycle: kernel-channel events on and off at run time
 *   nokch     the agent's NO_KERNELCH flag: none in an on-phase, back when
 *             the flag is cleared
 *   twocopies two copies of NCCL, each with its own mask: both kept current,
 *             the one that unloaded never written again
 *   skew      a GPU clock 300 us ahead: the host's sightings of the ends set
 *             the offset, nothing clamped or flagged
 *   behind    a GPU clock 2 ms behind (the H200's was 0.43 ms): the same,
 *             ends converted close to when the host saw them
 *   wrongclock a GPU clock 5 s ahead: every kernel record CLOCK_SUSPECT
 *   apilost   a group larger than a thread's API slots: lost joins counted
 *   preempt   a thread stalled between its call and its group end while
 *             another makes 2,000 calls: its API times survive
 *   stale     NCCL's never-cleared CollApi handle, stopped again by every
 *             collective once the mask is 0: no bad handle, no record
 *   alltoall  ncclAlltoAll/Gather/Scatter reach the plugin as Send/Recv
 *
 * Usage: test_nccl PATH/libslowrank_cupti.so [scenario...]
 */
#define _GNU_SOURCE
#include "nccl_profiler.h"
#include "slowrank_abi.h"
#include "test_clock.h"
#include "../test/fakelibs/ncclprof.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *lib;
static char dump[256];

#define FAIL(...)                                        \
	do {                                             \
		fprintf(stderr, "  FAIL: " __VA_ARGS__); \
		fprintf(stderr, "\n");                   \
		_exit(1);                                \
	} while (0)

static int wait_mask(int bits, int ms)
{
	for (int i = 0; i < ms; i++) {
		if ((fp_mask() & bits) == bits)
			return 1;
		sleep_ms(1);
	}
	return 0;
}

/* ---- reading the dump ---- */

#define MAXREC 200000
static struct slowrank_nccl_coll_record colls[MAXREC];
static struct slowrank_nccl_kernel_record kerns[MAXREC];
static struct slowrank_nccl_comm_record comms[4096];
static int ncoll, nkern, ncomm;
static uint64_t stats[SLOWRANK_STAT_COUNT];
static int nstats, saw_final;

static void read_dump(void)
{
	FILE *f = fopen(dump, "rb");
	if (!f)
		FAIL("no dump %s", dump);
	uint32_t len;
	static uint8_t b[SLOWRANK_BATCH_MAX];
	uint64_t last_seq = 0;
	while (fread(&len, 4, 1, f) == 1) {
		if (len > sizeof(b) || len < sizeof(struct slowrank_batch_header) || fread(b, 1, len, f) != len)
			FAIL("bad batch length %u", len);
		struct slowrank_batch_header h;
		memcpy(&h, b, sizeof(h));
		if (h.magic != SLOWRANK_BATCH_MAGIC || h.total_len != len || h.seq != last_seq + 1)
			FAIL("bad batch header (seq %llu after %llu)", (unsigned long long)h.seq,
			     (unsigned long long)last_seq);
		last_seq = h.seq;
		if (h.flags & SLOWRANK_BATCH_F_FINAL)
			saw_final = 1;
		uint32_t off = h.header_size;
		for (uint32_t i = 0; i < h.count; i++) {
			struct slowrank_record_header rh;
			memcpy(&rh, b + off, sizeof(rh));
			if (rh.size < 8 || rh.size % 8 || off + rh.size > len)
				FAIL("bad record framing");
			if (rh.kind == SLOWRANK_REC_NCCL_COLL && ncoll < MAXREC)
				memcpy(&colls[ncoll++], b + off, sizeof(colls[0]));
			else if (rh.kind == SLOWRANK_REC_NCCL_KERNEL && nkern < MAXREC)
				memcpy(&kerns[nkern++], b + off, sizeof(kerns[0]));
			else if (rh.kind == SLOWRANK_REC_NCCL_COMM && ncomm < 4096)
				memcpy(&comms[ncomm++], b + off, sizeof(comms[0]));
			else if (rh.kind == SLOWRANK_REC_STATS) {
				struct slowrank_stats_record sr;
				memcpy(&sr, b + off, sizeof(sr));
				int n = sr.n < SLOWRANK_STAT_COUNT ? sr.n : SLOWRANK_STAT_COUNT;
				memcpy(stats, b + off + sizeof(sr), 8u * (unsigned)n);
				nstats++;
			}
			off += rh.size;
		}
		if (off != len)
			FAIL("records do not tile the batch");
	}
	fclose(f);
}

/* ---- the workload ---- */

#define NTHREADS 4
#define NITER 300

struct worker {
	int idx;
	struct fp_comm *comm;
};

static void *work(void *arg)
{
	struct worker *w = arg;
	static const char *const gf[3] = {"AllGather", "ReduceScatter", "AllReduce"};
	for (int i = 0; i < NITER; i++) {
		size_t counts[3] = {(size_t)1000 + (size_t)i, (size_t)2000 + (size_t)i, (size_t)3000 + (size_t)i};
		fp_coll(w->comm, "AllReduce", (size_t)(i + 1) * 256, "ncclBfloat16", -1, 2 + (i % 3));
		if (i % 10 == 0)
			fp_group(w->comm, 3, gf, counts, "ncclFloat32", 2);
		if (i % 25 == 0) {
			fp_p2p(w->comm, "Send", 77, "ncclInt8", (w->idx + 1) % NTHREADS, 1);
			fp_p2p(w->comm, "Recv", 77, "ncclInt8", (w->idx + NTHREADS - 1) % NTHREADS, 1);
		}
	}
	return NULL;
}

/* Expected collectives per comm. */
static int expect_allreduce(void)
{
	return NITER + NITER / 10;
}
static int expect_colls(void)
{
	return NITER + 3 * (NITER / 10) + 2 * ((NITER + 24) / 25);
}

static void run_workload(struct fp_comm **cs)
{
	pthread_t t[NTHREADS];
	struct worker w[NTHREADS];
	for (int i = 0; i < NTHREADS; i++) {
		w[i].idx = i;
		w[i].comm = cs[i];
		pthread_create(&t[i], NULL, work, &w[i]);
	}
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(t[i], NULL);
}

static void child_env(int attach, const char *mode)
{
	setenv("NCCL_PROFILER_PLUGIN", lib, 1);
	setenv("SLOWRANK_CUPTI_QUIET", "1", 1);
	setenv("SLOWRANK_CUPTI_DUMP", dump, 1);
	if (attach)
		setenv("SLOWRANK_CUPTI_FORCE_ATTACH", "1", 1);
	if (mode)
		setenv("SLOWRANK_CUPTI_MODE", mode, 1);
}

static uint64_t hash_of(int i)
{
	return 0x1234567800000000ull + (uint64_t)i * 0x1111;
}

/* Child: NTHREADS comms (one per thread, like torch's process groups). */
static void child_run(int want_version, int kernel)
{
	int v = fp_load();
	if (v != want_version)
		FAIL("bound v%d, want v%d", v, want_version);
	struct fp_comm *cs[NTHREADS];
	for (int i = 0; i < NTHREADS; i++) {
		cs[i] = fp_comm_init(hash_of(i), NTHREADS * 2, i);
		if (!fp_comm_profiled(cs[i]))
			FAIL("plugin init failed");
	}
	int bits = SR_NCCL_PROFILE_COLL | (kernel ? SR_NCCL_PROFILE_KERNEL_CH : 0);
	if (!wait_mask(bits, 2000))
		FAIL("mask %#x after 2 s, want %#x", fp_mask(), bits);
	if (v >= 5 && !(fp_mask() & SR_NCCL_PROFILE_COLL_API))
		FAIL("v%d without CollApi in the mask: %#x", v, fp_mask());
	if ((v >= 6) != !!(fp_mask() & SR_NCCL_PROFILE_CE_COLL))
		FAIL("v%d with mask %#x (CeColl from v6 only)", v, fp_mask());
	if (v == 4 && (fp_mask() & ~0xff))
		FAIL("v4 with v5 bits in the mask: %#x", fp_mask());
	run_workload(cs);
	fp_proxy_drain();
	for (int i = 0; i < NTHREADS; i++)
		fp_comm_destroy(cs[i]);
	exit(0); /* the library's exit handler drains the ring and sends final stats */
}

static void check_run(int version, int kernel)
{
	read_dump();
	if (!saw_final || nstats == 0)
		FAIL("no final stats batch");
	int want = NTHREADS * expect_colls();
	if (ncoll != want)
		FAIL("%d coll records, want %d", ncoll, want);
	if (stats[SLOWRANK_STAT_NCCL_COLLS] != (uint64_t)want || stats[SLOWRANK_STAT_NCCL_RING_FULL] ||
	    stats[SLOWRANK_STAT_NCCL_BAD_HANDLES] || stats[SLOWRANK_STAT_NCCL_DISCARDED])
		FAIL("stats colls %llu full %llu bad %llu discarded %llu",
		     (unsigned long long)stats[SLOWRANK_STAT_NCCL_COLLS],
		     (unsigned long long)stats[SLOWRANK_STAT_NCCL_RING_FULL],
		     (unsigned long long)stats[SLOWRANK_STAT_NCCL_BAD_HANDLES],
		     (unsigned long long)stats[SLOWRANK_STAT_NCCL_DISCARDED]);
	if (stats[SLOWRANK_STAT_NCCL_COMMS] != NTHREADS)
		FAIL("comms %llu", (unsigned long long)stats[SLOWRANK_STAT_NCCL_COMMS]);
	int inits = 0, fins = 0;
	for (int i = 0; i < ncomm; i++) {
		if (comms[i].version != version || comms[i].nranks != NTHREADS * 2)
			FAIL("comm record v%d nranks %d", comms[i].version, comms[i].nranks);
		if (comms[i].flags & SLOWRANK_NCCL_COMM_F_FINALIZED)
			fins++;
		else if (!(comms[i].flags & SLOWRANK_NCCL_COMM_F_RESENT))
			inits++;
	}
	if (inits != NTHREADS || fins != NTHREADS)
		FAIL("comm records: %d inits, %d finalizes", inits, fins);
	int no_api = 0;
	for (int t = 0; t < NTHREADS; t++) {
		/* AllReduce seq per comm: each of 0..n-1 exactly once. */
		int n = expect_allreduce();
		char *seen = calloc((size_t)n, 1);
		int p2p = 0;
		for (int i = 0; i < ncoll; i++) {
			struct slowrank_nccl_coll_record *r = &colls[i];
			if (r->comm_hash != hash_of(t))
				continue;
			if (r->rank != t || r->nranks != NTHREADS * 2 || r->version != version)
				FAIL("identity: rank %d nranks %d v%d", r->rank, r->nranks, r->version);
			if (r->launch_start_ns == 0 || r->launch_end_ns < r->launch_start_ns)
				FAIL("launch times %llu..%llu", (unsigned long long)r->launch_start_ns,
				     (unsigned long long)r->launch_end_ns);
			if (version >= 5 && !(r->flags & SLOWRANK_NCCL_F_API)) {
				no_api++; /* must be what the plugin counted, checked below */
			} else if (version >= 5) {
				if (r->api_start_ns == 0 || r->api_end_ns < r->api_start_ns ||
				    r->api_end_ns > r->launch_start_ns)
					FAIL("v5 api times: flags %#x %llu..%llu launch %llu", r->flags,
					     (unsigned long long)r->api_start_ns, (unsigned long long)r->api_end_ns,
					     (unsigned long long)r->launch_start_ns);
			} else if (r->flags & SLOWRANK_NCCL_F_API) {
				FAIL("v4 record with API times");
			}
			if (r->flags & SLOWRANK_NCCL_F_P2P) {
				if ((r->func != SLOWRANK_NCCL_FUNC_SEND && r->func != SLOWRANK_NCCL_FUNC_RECV) ||
				    r->count != 77 || r->datatype != SLOWRANK_NCCL_DT_INT8 || r->seq != 0)
					FAIL("p2p record func %d count %llu", r->func, (unsigned long long)r->count);
				p2p++;
				continue;
			}
			if (r->algo != SLOWRANK_NCCL_ALGO_RING || r->proto != SLOWRANK_NCCL_PROTO_SIMPLE)
				FAIL("algo %d proto %d", r->algo, r->proto);
			if (r->func == SLOWRANK_NCCL_FUNC_ALLREDUCE) {
				if (r->seq >= (uint64_t)n || seen[r->seq])
					FAIL("allreduce seq %llu duplicated or out of range",
					     (unsigned long long)r->seq);
				seen[r->seq] = 1;
				if (r->datatype != SLOWRANK_NCCL_DT_BFLOAT16 && r->datatype != SLOWRANK_NCCL_DT_FLOAT32)
					FAIL("datatype %d", r->datatype);
			} else if (r->func != SLOWRANK_NCCL_FUNC_ALLGATHER &&
				   r->func != SLOWRANK_NCCL_FUNC_REDUCESCATTER) {
				FAIL("func %d", r->func);
			}
		}
		free(seen);
		if (p2p != 2 * ((NITER + 24) / 25))
			FAIL("comm %d: %d p2p records", t, p2p);
	}
	/* Every record without API times is counted by the plugin; with a
	 * block of API slots per thread none is lost here, however long a
	 * thread is preempted between its calls and their group end. */
	if ((uint64_t)no_api != stats[SLOWRANK_STAT_NCCL_API_LOST] || no_api != 0)
		FAIL("%d v5 records without API times, %llu counted lost (want 0)", no_api,
		     (unsigned long long)stats[SLOWRANK_STAT_NCCL_API_LOST]);
	if (!kernel) {
		if (nkern != 0)
			FAIL("%d kernel records without kernel-channel events", nkern);
		return;
	}
	if (nkern != ncoll)
		FAIL("%d kernel records for %d operations", nkern, ncoll);
	for (int i = 0; i < nkern; i++) {
		struct slowrank_nccl_kernel_record *k = &kerns[i];
		if (k->flags & (SLOWRANK_NCCL_F_PARTIAL | SLOWRANK_NCCL_F_CLOCK_SUSPECT) || k->channels != k->nchannels)
			FAIL("kernel record flags %#x channels %d/%d", k->flags, k->channels, k->nchannels);
		if (!k->gpu_start_ns || k->gpu_end_ns < k->gpu_start_ns ||
		    k->gpu_end_ns - k->gpu_start_ns > 1000000000ull)
			FAIL("gpu interval %llu..%llu", (unsigned long long)k->gpu_start_ns,
			     (unsigned long long)k->gpu_end_ns);
		/* The fake GPU ends just before the proxy saw it: on CLOCK_MONOTONIC
		 * the converted end lies shortly before host_seen_ns (a loaded or
		 * sanitized run may preempt the proxy in between). An end converted
		 * to a little after it (the offset's calibration error) is clamped
		 * by the plugin: never after host_seen_ns. Signed: either side. */
		int64_t lag = (int64_t)(k->host_seen_ns - k->gpu_end_ns);
		if (lag < 0 || lag > 200000000)
			FAIL("gpu end %llu vs host seen %llu (offset %lld)", (unsigned long long)k->gpu_end_ns,
			     (unsigned long long)k->host_seen_ns, (long long)k->clock_offset_ns);
		if (k->flags & SLOWRANK_NCCL_F_P2P)
			continue;
		int found = 0;
		for (int j = 0; j < ncoll && !found; j++)
			found = colls[j].comm_hash == k->comm_hash && colls[j].seq == k->seq &&
				colls[j].func == k->func && colls[j].rank == k->rank &&
				!(colls[j].flags & SLOWRANK_NCCL_F_P2P) && k->gpu_start_ns >= colls[j].launch_start_ns;
		if (!found)
			FAIL("kernel record (func %d seq %llu) joins no collective launched before it", k->func,
			     (unsigned long long)k->seq);
	}
}

/* ---- scenarios ---- */

static void sc_v5(void)
{
	child_env(1, "always");
	child_run(5, 1);
}
/* TEST_NCCL_SAVE=PATH keeps the v5 dump (cupti/testdata/nccl-plugin.batches:
 * the Go decoder's test reads real batches of the library). */
static void save_dump(void)
{
	const char *to = getenv("TEST_NCCL_SAVE");
	if (!to || !*to)
		return;
	FILE *in = fopen(dump, "rb"), *out = fopen(to, "wb");
	if (!in || !out)
		FAIL("save %s", to);
	char buf[65536];
	size_t n;
	while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
		fwrite(buf, 1, n, out);
	fclose(in);
	fclose(out);
}

static void sc_v5_check(void)
{
	check_run(5, 1);
	save_dump();
	printf("  (%d collectives, %d with GPU times, %d comm records)\n", ncoll, nkern, ncomm);
}
static void sc_v4(void)
{
	child_env(1, "always");
	setenv("SLOWRANK_FAKE_NCCL_PROFILER_MAX", "4", 1);
	child_run(4, 1);
}
static void sc_v4_check(void)
{
	check_run(4, 1);
}
/* NCCL 2.29 / 2.30 bind v6; without copy-engine collectives the events are v5's. */
static void sc_v6(void)
{
	child_env(1, "always");
	setenv("SLOWRANK_FAKE_NCCL_PROFILER_MAX", "6", 1);
	child_run(6, 1);
}
static void sc_v6_check(void)
{
	check_run(6, 1);
}

/* Copy-engine collectives (one node, symmetric buffers, zero-CTA policy):
 * on 2.29 (v6) each AllGather / AlltoAll is one CeColl event under its
 * CollApi, recorded as a collective flagged CE with the comm's CE counter
 * as seq (two synchronisations per collective here) and no kernel record;
 * the AllReduce beside them stays a Coll with kernel channels. */
#define CE_N 50
static void ce_workload(void)
{
	struct fp_comm *c = fp_comm_init(60, 4, 2);
	if (!fp_comm_profiled(c))
		FAIL("init failed");
	if (!wait_mask(SR_NCCL_PROFILE_COLL, 2000))
		FAIL("mask never set");
	for (int i = 0; i < CE_N; i++) {
		fp_coll(c, "AllReduce", 1000, "ncclBfloat16", -1, 2);
		fp_coll(c, "AllGather", (size_t)(10 + i), "ncclFloat32", -1, 2);
	}
	fp_coll(c, "AlltoAll", 5, "ncclInt8", -1, 2);
	fp_proxy_drain();
	fp_comm_destroy(c);
	exit(0);
}
static void sc_ce(void)
{
	child_env(1, "always");
	setenv("SLOWRANK_FAKE_NCCL_PROFILER_MAX", "6", 1);
	setenv("SLOWRANK_FAKE_NCCL_CE", "1", 1);
	if (fp_load() != 6)
		FAIL("not bound at v6");
	ce_workload();
}
static void sc_ce_check(void)
{
	read_dump();
	int ar = 0, ag = 0, a2a = 0;
	for (int i = 0; i < ncoll; i++) {
		struct slowrank_nccl_coll_record *r = &colls[i];
		if (r->comm_hash != 60 || r->version != 6 || r->rank != 2 || r->nranks != 4)
			FAIL("identity: hash %llu v%d rank %d/%d", (unsigned long long)r->comm_hash, r->version,
			     r->rank, r->nranks);
		if (!(r->flags & SLOWRANK_NCCL_F_API) || r->api_end_ns > r->launch_start_ns)
			FAIL("func %d without API times (flags %#x)", r->func, r->flags);
		if (r->func == SLOWRANK_NCCL_FUNC_ALLREDUCE) {
			if (r->flags & SLOWRANK_NCCL_F_CE || r->seq != (uint64_t)ar || r->nchannels != 2)
				FAIL("allreduce %d: flags %#x seq %llu", ar, r->flags, (unsigned long long)r->seq);
			ar++;
		} else if (r->func == SLOWRANK_NCCL_FUNC_ALLGATHER || r->func == SLOWRANK_NCCL_FUNC_ALLTOALL) {
			int k = ag + a2a;
			if (!(r->flags & SLOWRANK_NCCL_F_CE) || (r->flags & SLOWRANK_NCCL_F_P2P) ||
			    r->seq != 2 * (uint64_t)k || r->nchannels != 0 || r->algo || r->proto)
				FAIL("CE %d: func %d flags %#x seq %llu nchannels %d", k, r->func, r->flags,
				     (unsigned long long)r->seq, r->nchannels);
			if (r->func == SLOWRANK_NCCL_FUNC_ALLGATHER) {
				if (r->count != (uint64_t)(10 + ag) || r->datatype != SLOWRANK_NCCL_DT_FLOAT32)
					FAIL("allgather %d: count %llu dtype %d", ag, (unsigned long long)r->count,
					     r->datatype);
				ag++;
			} else {
				a2a++;
			}
		} else {
			FAIL("func %d", r->func);
		}
	}
	if (ar != CE_N || ag != CE_N || a2a != 1)
		FAIL("%d allreduce, %d allgather, %d alltoall records (want %d, %d, 1)", ar, ag, a2a, CE_N, CE_N);
	if (nkern != CE_N)
		FAIL("%d kernel records, want %d (the AllReduces only)", nkern, CE_N);
	for (int i = 0; i < nkern; i++)
		if (kerns[i].func != SLOWRANK_NCCL_FUNC_ALLREDUCE)
			FAIL("kernel record of func %d", kerns[i].func);
	if (stats[SLOWRANK_STAT_NCCL_BAD_HANDLES] || stats[SLOWRANK_STAT_NCCL_API_LOST] ||
	    stats[SLOWRANK_STAT_NCCL_UNKNOWN_EVENTS] || stats[SLOWRANK_STAT_NCCL_INCOMPLETE])
		FAIL("bad %llu api lost %llu unknown %llu incomplete %llu",
		     (unsigned long long)stats[SLOWRANK_STAT_NCCL_BAD_HANDLES],
		     (unsigned long long)stats[SLOWRANK_STAT_NCCL_API_LOST],
		     (unsigned long long)stats[SLOWRANK_STAT_NCCL_UNKNOWN_EVENTS],
		     (unsigned long long)stats[SLOWRANK_STAT_NCCL_INCOMPLETE]);
	printf("  (%d CE collectives, %d kernel collectives)\n", ag + a2a, ar);
}

/* The same on 2.28.9 (v5): NCCL emits no profiler event for a CE
 * collective, so only the AllReduces are recorded. */
static void sc_ce5(void)
{
	child_env(1, "always");
	setenv("SLOWRANK_FAKE_NCCL_CE", "1", 1);
	if (fp_load() != 5)
		FAIL("not bound at v5");
	ce_workload();
}
static void sc_ce5_check(void)
{
	read_dump();
	for (int i = 0; i < ncoll; i++)
		if (colls[i].func != SLOWRANK_NCCL_FUNC_ALLREDUCE || (colls[i].flags & SLOWRANK_NCCL_F_CE) ||
		    colls[i].seq != (uint64_t)i)
			FAIL("record %d: func %d flags %#x seq %llu", i, colls[i].func, colls[i].flags,
			     (unsigned long long)colls[i].seq);
	if (ncoll != CE_N || nkern != CE_N)
		FAIL("%d records, %d kernel records (want %d: the AllReduces)", ncoll, nkern, CE_N);
}

static void sc_nokernel(void)
{
	child_env(1, "off");
	child_run(5, 0);
}
static void sc_nokernel_check(void)
{
	check_run(5, 0);
}

static void sc_noagent(void)
{
	child_env(0, "always");
	if (fp_load() != 5)
		FAIL("not bound");
	struct fp_comm *c = fp_comm_init(1, 2, 0);
	if (!fp_comm_profiled(c))
		FAIL("init failed");
	sleep_ms(200);
	if (fp_mask() != 0)
		FAIL("mask %#x without an agent", fp_mask());
	uint64_t t0 = now_ns();
	for (int i = 0; i < 100000; i++)
		fp_coll(c, "AllReduce", 16, "ncclFloat32", -1, 2);
	if (now_ns() - t0 > 5000000000ull)
		FAIL("100k collectives took %.1f s with the plugin idle", (double)(now_ns() - t0) / 1e9);
	fp_comm_destroy(c);
	exit(0);
}

static void sc_noagent_check(void)
{
	FILE *f = fopen(dump, "rb");
	if (f) {
		fseek(f, 0, SEEK_END);
		long n = ftell(f);
		fclose(f);
		if (n != 0)
			FAIL("%ld bytes emitted without an agent", n);
	}
}

static void sc_disabled(void)
{
	child_env(1, "always");
	setenv("SLOWRANK_NCCL_DISABLE", "1", 1);
	if (fp_load() != 5)
		FAIL("not bound");
	struct fp_comm *c = fp_comm_init(1, 2, 0);
	if (fp_comm_profiled(c))
		FAIL("init succeeded with SLOWRANK_NCCL_DISABLE=1");
	fp_coll(c, "AllReduce", 16, "ncclFloat32", -1, 2);
	fp_comm_destroy(c);
	exit(0);
}

static void sc_none(void)
{
	child_env(1, "always");
	setenv("NCCL_PROFILER_PLUGIN", "none", 1);
	if (fp_load() != 0)
		FAIL("loaded with NCCL_PROFILER_PLUGIN=none");
	exit(0);
}

#define FLOOD_N 250000ull
static const sr_nccl_profiler_v5_t *P5;
static void *flood_ctx;

static void *flood(void *arg)
{
	uint64_t n = 0;
	(void)arg;
	sr_nccl_descr_v5_t d;
	memset(&d, 0, sizeof(d));
	d.type = SR_NCCL_PROFILE_COLL;
	d.u.coll.func = "AllReduce";
	d.u.coll.datatype = "ncclFloat32";
	d.u.coll.nChannels = 1;
	while (n < FLOOD_N) {
		void *h = NULL;
		d.u.coll.seqNumber = n;
		P5->startEvent(flood_ctx, &h, &d);
		P5->stopEvent(h);
		n++;
	}
	return (void *)(uintptr_t)n;
}

static void sc_abuse(void)
{
	child_env(1, "always");
	if (fp_load() != 5)
		FAIL("not bound");
	P5 = fp_plugin();
	struct fp_comm *c = fp_comm_init(42, 2, 1);
	if (!wait_mask(SR_NCCL_PROFILE_COLL, 2000))
		FAIL("mask never set");
	int mask = 0;
	void *ctx = NULL;
	/* NULLs everywhere */
	if (P5->init(&ctx, 7, NULL, NULL, 1, 2, 0, NULL) == 0)
		FAIL("init with a NULL mask succeeded");
	P5->startEvent(NULL, NULL, NULL);
	void *h = (void *)1;
	P5->startEvent(NULL, &h, NULL);
	if (h)
		FAIL("handle for a NULL descriptor");
	P5->stopEvent(NULL);
	P5->recordEventState(NULL, SR_NCCL_STATE_KERNEL_CH_STOP, NULL);
	P5->finalize(NULL);
	/* forged and foreign handles and contexts */
	uint64_t seed = 88172645463325252ull;
	for (int i = 0; i < 100000; i++) {
		seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
		void *bogus = (void *)(uintptr_t)(i & 1 ? seed : (seed | (0xA5ull << 56)));
		P5->stopEvent(bogus);
		sr_nccl_state_args_t a = {.kernelCh = {seed}};
		P5->recordEventState(bogus, SR_NCCL_STATE_KERNEL_CH_STOP, &a);
		P5->recordEventState(bogus, (int)(seed % 40), NULL);
		sr_nccl_descr_v5_t d;
		memset(&d, 0, sizeof(d));
		d.type = SR_NCCL_PROFILE_KERNEL_CH;
		d.parentObj = bogus;
		void *k = NULL;
		P5->startEvent(bogus, &k, &d); /* bogus context, bogus parent */
		P5->stopEvent(k);
		d.type = SR_NCCL_PROFILE_COLL;
		P5->startEvent(bogus, &k, &d);
		P5->stopEvent(k);
		d.type = 1ull << (seed % 64); /* every type, known or not */
		k = NULL;
		P5->startEvent(bogus, &k, &d);
		P5->stopEvent(k);
		P5->finalize(bogus);
	}
	/* stop without start, double stop, a KernelCh stopping twice */
	{
		struct fp_comm *c2 = fp_comm_init(43, 2, 0);
		flood_ctx = NULL;
		(void)c2;
		sr_nccl_descr_v5_t d;
		memset(&d, 0, sizeof(d));
		d.type = SR_NCCL_PROFILE_COLL;
		d.u.coll.func = "Bogus";
		d.u.coll.datatype = NULL;
		d.u.coll.algo = "";
		d.u.coll.nChannels = 1;
		void *ch = NULL, *kh = NULL;
		/* the context NCCL holds is private to the fake; use a fresh init */
		void *cx = NULL;
		if (P5->init(&cx, 44, &mask, "abuse", 1, 2, 0, NULL) != 0 || !cx)
			FAIL("init");
		P5->startEvent(cx, &ch, &d);
		if (!ch)
			FAIL("no handle for a Coll event");
		d.type = SR_NCCL_PROFILE_KERNEL_CH;
		d.parentObj = ch;
		P5->startEvent(cx, &kh, &d);
		P5->stopEvent(ch);
		P5->stopEvent(ch);
		P5->stopEvent(kh);
		P5->stopEvent(kh);
		/* finalize with an event in flight, then its stop */
		void *late = NULL;
		d.type = SR_NCCL_PROFILE_COLL;
		d.parentObj = NULL;
		P5->startEvent(cx, &late, &d);
		P5->finalize(cx);
		P5->stopEvent(late);
		P5->startEvent(cx, &late, &d); /* after finalize: not ours any more */
		if (late)
			FAIL("handle for a finalized context");
	}
	(void)c;
	exit(0);
}

static void sc_abuse_check(void)
{
	read_dump();
	if (!saw_final)
		FAIL("no final batch");
	if (stats[SLOWRANK_STAT_NCCL_BAD_HANDLES] < 100000)
		FAIL("bad handles %llu", (unsigned long long)stats[SLOWRANK_STAT_NCCL_BAD_HANDLES]);
	printf("  (%llu bad handles counted)\n", (unsigned long long)stats[SLOWRANK_STAT_NCCL_BAD_HANDLES]);
}

/* No agent (records are discarded when drained), NCCL ignoring the mask
 * (it is 0): 4 threads start and stop collectives as fast as they can. The
 * ring overfills; every stop is a record queued or a drop counted. */
static void sc_flood(void)
{
	child_env(0, NULL);
	if (fp_load() != 5)
		FAIL("not bound");
	P5 = fp_plugin();
	int mask = 0;
	void *fx = NULL;
	if (P5->init(&fx, 45, &mask, "flood", 1, 2, 0, NULL) != 0 || !fx)
		FAIL("init");
	flood_ctx = fx;
	pthread_t t[4];
	uint64_t t0 = now_ns();
	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, flood, NULL);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	double secs = (double)(now_ns() - t0) / 1e9;
	if (secs > 30)
		FAIL("flood took %.1f s", secs);
	void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
	struct slowrank_nccl_status *st = h ? dlsym(h, SLOWRANK_SYM_NCCL_STATUS) : NULL;
	if (!st)
		FAIL("no %s", SLOWRANK_SYM_NCCL_STATUS);
	sleep_ms(300); /* a drain publishes the counters */
	uint64_t want = 4 * FLOOD_N, q = __atomic_load_n(&st->colls, __ATOMIC_RELAXED),
		 d = __atomic_load_n(&st->dropped, __ATOMIC_RELAXED);
	if (q + d != want)
		FAIL("flood: %llu queued + %llu dropped != %llu", (unsigned long long)q, (unsigned long long)d,
		     (unsigned long long)want);
	if (mask != 0)
		FAIL("mask %#x without an agent", mask);
	printf("  (%llu collectives from 4 threads in %.2f s: %llu queued, %llu dropped on a full ring)\n",
	       (unsigned long long)want, secs, (unsigned long long)q, (unsigned long long)d);
	exit(0);
}

/* A GPU clock a little ahead of the host's: ends that the realtime offset
 * would put after host_seen_ns are converted with the offset that the
 * host's sightings show; nothing is clamped or flagged. */
static void sc_skew(void)
{
	child_env(1, "always");
	setenv("SLOWRANK_FAKE_NCCL_GPU_SKEW_NS", "300000", 1);
	child_run(5, 1);
}

/* The median of host_seen_ns - gpu_end_ns over the kernel records. */
static int64_t median_seen_lag(void)
{
	int64_t *l = calloc((size_t)nkern + 1, sizeof(*l));
	for (int i = 0; i < nkern; i++)
		l[i] = (int64_t)(kerns[i].host_seen_ns - kerns[i].gpu_end_ns);
	for (int i = 1; i < nkern; i++)
		for (int j = i; j > 0 && l[j - 1] > l[j]; j--) {
			int64_t t = l[j];
			l[j] = l[j - 1];
			l[j - 1] = t;
		}
	int64_t m = nkern ? l[nkern / 2] : -1;
	free(l);
	return m;
}

static void check_seen_offset(const char *what)
{
	check_run(5, 1); /* gpu_end_ns <= host_seen_ns, no CLOCK_SUSPECT */
	int64_t lag = median_seen_lag();
	if (stats[SLOWRANK_STAT_NCCL_CLOCK_CLAMPED] != 0 || stats[SLOWRANK_STAT_NCCL_CLOCK_SUSPECT] != 0 || lag < 0 ||
	    lag > 1000000)
		FAIL("%s: %llu clamped, %llu suspect, median host_seen - gpu_end %lld ns", what,
		     (unsigned long long)stats[SLOWRANK_STAT_NCCL_CLOCK_CLAMPED],
		     (unsigned long long)stats[SLOWRANK_STAT_NCCL_CLOCK_SUSPECT], (long long)lag);
	printf("  (%d kernel records, median host_seen - gpu_end %lld ns)\n", nkern, (long long)lag);
}

static void sc_skew_check(void)
{
	check_seen_offset("skew 300 us");
}

/* A GPU clock behind the host's realtime: the realtime offset alone would
 * put every end 2 ms before the host saw it. */
static void sc_behind(void)
{
	child_env(1, "always");
	setenv("SLOWRANK_FAKE_NCCL_GPU_SKEW_NS", "-2000000", 1);
	child_run(5, 1);
}

static void sc_behind_check(void)
{
	check_seen_offset("behind 2 ms");
}

/* A GPU clock seconds off: not calibration noise; every kernel record is
 * flagged CLOCK_SUSPECT and keeps its times. */
static void sc_wrongclock(void)
{
	child_env(1, "always");
	setenv("SLOWRANK_FAKE_NCCL_GPU_SKEW_NS", "5000000000", 1);
	child_run(5, 1);
}

static void sc_wrongclock_check(void)
{
	read_dump();
	int flagged = 0;
	for (int i = 0; i < nkern; i++)
		if ((kerns[i].flags & SLOWRANK_NCCL_F_CLOCK_SUSPECT) && kerns[i].gpu_end_ns > kerns[i].host_seen_ns)
			flagged++;
	if (nkern == 0 || flagged != nkern || stats[SLOWRANK_STAT_NCCL_CLOCK_SUSPECT] != (uint64_t)nkern ||
	    stats[SLOWRANK_STAT_NCCL_CLOCK_CLAMPED] != 0)
		FAIL("skew 5 s: %d of %d flagged, %llu suspect, %llu clamped", flagged, nkern,
		     (unsigned long long)stats[SLOWRANK_STAT_NCCL_CLOCK_SUSPECT],
		     (unsigned long long)stats[SLOWRANK_STAT_NCCL_CLOCK_CLAMPED]);
}

/* An attached v5 plugin (duty mode) with a communicator driven through the
 * fake NCCL, and a context of the test's own (ctx_hash, name) in *cx that
 * the scenario drives directly; returns the communicator. */
static struct fp_comm *bind_v5(const char *mode, uint64_t comm_hash, uint64_t ctx_hash, const char *name, void **cx,
			       int *mask)
{
	child_env(1, mode);
	if (fp_load() != 5)
		FAIL("not bound");
	P5 = fp_plugin();
	struct fp_comm *c = fp_comm_init(comm_hash, 2, 0);
	if (!wait_mask(SR_NCCL_PROFILE_COLL_API, 2000))
		FAIL("mask never set");
	if (P5->init(cx, ctx_hash, mask, name, 1, 2, 0, NULL) != 0 || !*cx)
		FAIL("init");
	return c;
}

/* One thread's group of more calls than its API block holds (NCCL allows
 * any group size): the first calls' slots are reused before their Coll
 * events start, so those operations carry no API times, and each is
 * counted (SLOWRANK_STAT_NCCL_API_LOST), never silently missing. */
#define APILOST_N 1100
static void sc_apilost(void)
{
	int mask = 0;
	void *cx = NULL;
	struct fp_comm *c = bind_v5("always", 46, 47, "apilost", &cx, &mask);
	static void *api[APILOST_N];
	sr_nccl_descr_v5_t d;
	for (int i = 0; i < APILOST_N; i++) {
		memset(&d, 0, sizeof(d));
		d.type = SR_NCCL_PROFILE_COLL_API;
		d.u.collApi.func = "AllReduce";
		d.u.collApi.count = 8;
		d.u.collApi.datatype = "ncclFloat32";
		P5->startEvent(cx, &api[i], &d);
		P5->stopEvent(api[i]);
	}
	for (int i = 0; i < APILOST_N; i++) {
		void *h = NULL;
		memset(&d, 0, sizeof(d));
		d.type = SR_NCCL_PROFILE_COLL;
		d.parentObj = api[i];
		d.u.coll.seqNumber = (uint64_t)i;
		d.u.coll.func = "AllReduce";
		d.u.coll.count = 8;
		d.u.coll.datatype = "ncclFloat32";
		d.u.coll.nChannels = 1;
		P5->startEvent(cx, &h, &d);
		P5->stopEvent(h);
	}
	P5->finalize(cx);
	fp_comm_destroy(c);
	exit(0);
}

static void sc_apilost_check(void)
{
	read_dump();
	int with = 0, without = 0;
	for (int i = 0; i < ncoll; i++)
		if (colls[i].comm_hash == 47)
			(colls[i].flags & SLOWRANK_NCCL_F_API) ? with++ : without++;
	/* 1024 API slots per thread block */
	if (with + without != APILOST_N || without != APILOST_N - 1024 ||
	    stats[SLOWRANK_STAT_NCCL_API_LOST] != (uint64_t)without)
		FAIL("group of %d: %d with API times, %d without, %llu counted lost", APILOST_N, with, without,
		     (unsigned long long)stats[SLOWRANK_STAT_NCCL_API_LOST]);
	printf("  (group of %d calls: %d joins lost, all counted)\n", APILOST_N, without);
}

/* (b) made deterministic: a thread "preempted" between its call (CollApi
 * start/stop) and its group end (Coll start) while another thread makes
 * 2,000 calls. Its collective keeps its API times: its slot is in its own
 * thread's block (one ring shared by all threads lost the join). */
static void *preempt_other(void *arg)
{
	struct fp_comm *c = arg;
	for (int i = 0; i < 2000; i++)
		fp_coll(c, "AllReduce", 16, "ncclFloat32", -1, 1);
	return NULL;
}

static void sc_preempt(void)
{
	int mask = 0;
	void *cx = NULL;
	struct fp_comm *other = bind_v5("off", 48, 49, "preempt", &cx, &mask);
	sr_nccl_descr_v5_t d;
	memset(&d, 0, sizeof(d));
	d.type = SR_NCCL_PROFILE_COLL_API;
	d.u.collApi.func = "AllReduce";
	d.u.collApi.count = 8;
	d.u.collApi.datatype = "ncclFloat32";
	void *api = NULL, *h = NULL;
	P5->startEvent(cx, &api, &d);
	P5->stopEvent(api);
	pthread_t t;
	pthread_create(&t, NULL, preempt_other, other);
	pthread_join(t, NULL);
	memset(&d, 0, sizeof(d));
	d.type = SR_NCCL_PROFILE_COLL;
	d.parentObj = api;
	d.u.coll.func = "AllReduce";
	d.u.coll.count = 8;
	d.u.coll.datatype = "ncclFloat32";
	d.u.coll.nChannels = 1;
	P5->startEvent(cx, &h, &d);
	P5->stopEvent(h);
	P5->finalize(cx);
	fp_comm_destroy(other);
	exit(0);
}

static void sc_preempt_check(void)
{
	read_dump();
	int found = 0;
	for (int i = 0; i < ncoll; i++) {
		if (colls[i].comm_hash != 49)
			continue;
		found++;
		if (!(colls[i].flags & SLOWRANK_NCCL_F_API) || colls[i].api_end_ns < colls[i].api_start_ns)
			FAIL("the preempted thread's collective lost its API times (flags %#x)", colls[i].flags);
	}
	if (found != 1 || stats[SLOWRANK_STAT_NCCL_API_LOST] != 0)
		FAIL("%d records of the preempted thread, %llu API joins lost", found,
		     (unsigned long long)stats[SLOWRANK_STAT_NCCL_API_LOST]);
}

/* NCCL 2.28-2.30 never clear a thread's CollApi handle (profiler.cc's
 * ncclProfilerStopCollApiEvent): once the mask is 0 (an agent detached)
 * every collective stops the thread's last CollApi event again. No bad
 * handle, no record, and the call's end is its first stop. (NCCL starts
 * CollApi whenever it would start a Coll, so a stale one never becomes a
 * Coll's parent.) */
static void sc_stale(void)
{
	child_env(1, "off");
	if (fp_load() != 5)
		FAIL("not bound");
	struct fp_comm *c = fp_comm_init(50, 2, 0);
	if (!wait_mask(SR_NCCL_PROFILE_COLL_API, 2000))
		FAIL("mask never set");
	sleep_ms(150); /* the control thread's polls: it stores into the mask only when its choice changes */
	for (int i = 0; i < 20; i++)
		fp_coll(c, "AllReduce", (size_t)(100 + i), "ncclFloat32", -1, 1);
	fp_set_mask(0);
	for (int i = 0; i < 2000; i++)
		fp_coll(c, "AllReduce", (size_t)(300 + i), "ncclFloat32", -1, 1);
	if (fp_stale_api_stops() < 2000)
		FAIL("the fake stopped the stale CollApi handle %llu times, want 2000",
		     (unsigned long long)fp_stale_api_stops());
	fp_comm_destroy(c);
	exit(0);
}

static void sc_stale_check(void)
{
	read_dump();
	int api = 0;
	for (int i = 0; i < ncoll; i++) {
		struct slowrank_nccl_coll_record *r = &colls[i];
		if (r->comm_hash != 50)
			continue;
		if (r->count < 100 || r->count >= 120 || !(r->flags & SLOWRANK_NCCL_F_API) ||
		    r->api_end_ns > r->launch_start_ns)
			FAIL("record count %llu flags %#x", (unsigned long long)r->count, r->flags);
		api++;
	}
	if (api != 20 || stats[SLOWRANK_STAT_NCCL_BAD_HANDLES] != 0 || stats[SLOWRANK_STAT_NCCL_API_LOST] != 0)
		FAIL("%d records (want 20); %llu bad handles, %llu API joins lost", api,
		     (unsigned long long)stats[SLOWRANK_STAT_NCCL_BAD_HANDLES],
		     (unsigned long long)stats[SLOWRANK_STAT_NCCL_API_LOST]);
}

/* From 2.28 ncclAlltoAll, ncclGather and ncclScatter append Send/Recv
 * tasks: the plugin sees P2pApi + P2p events per peer, never the
 * collective (the uprobes see the call). */
static void sc_alltoall(void)
{
	child_env(1, "off");
	if (fp_load() != 5)
		FAIL("not bound");
	struct fp_comm *c = fp_comm_init(51, 4, 1);
	if (!wait_mask(SR_NCCL_PROFILE_P2P_API, 2000))
		FAIL("mask never set");
	for (int i = 0; i < 10; i++)
		fp_coll(c, "AlltoAll", 64, "ncclFloat32", -1, 1);
	fp_coll(c, "Gather", 8, "ncclInt8", 1, 1);  /* this rank is the root: a send, a recv per rank */
	fp_coll(c, "Scatter", 8, "ncclInt8", 0, 1); /* another root: a recv */
	fp_comm_destroy(c);
	exit(0);
}

static void sc_alltoall_check(void)
{
	read_dump();
	int sends = 0, recvs = 0;
	for (int i = 0; i < ncoll; i++) {
		struct slowrank_nccl_coll_record *r = &colls[i];
		if (r->comm_hash != 51)
			continue;
		if (!(r->flags & SLOWRANK_NCCL_F_P2P) || !(r->flags & SLOWRANK_NCCL_F_API) || r->seq != 0)
			FAIL("func %d flags %#x seq %llu", r->func, r->flags, (unsigned long long)r->seq);
		if (r->func == SLOWRANK_NCCL_FUNC_SEND)
			sends++;
		else if (r->func == SLOWRANK_NCCL_FUNC_RECV)
			recvs++;
		else
			FAIL("func %d", r->func);
	}
	if (sends != 10 * 4 + 1 || recvs != 10 * 4 + 4 + 1)
		FAIL("%d sends, %d recvs (want 41, 45)", sends, recvs);
}

static void sc_toggle(void)
{
	child_env(1, "time:100:200");
	if (fp_load() != 5)
		FAIL("not bound");
	struct fp_comm *c = fp_comm_init(7, 2, 0);
	if (!wait_mask(SR_NCCL_PROFILE_COLL, 2000))
		FAIL("mask never set");
	uint64_t t0 = now_ns();
	while (now_ns() - t0 < 900000000ull) {
		fp_coll(c, "AllReduce", 16, "ncclFloat32", -1, 2);
		usleep(200);
	}
	fp_comm_destroy(c);
	if (fp_ops_with_kernel_ch() == 0 || fp_ops_without_kernel_ch() == 0)
		FAIL("kernel-channel events never toggled: %llu on, %llu off",
		     (unsigned long long)fp_ops_with_kernel_ch(), (unsigned long long)fp_ops_without_kernel_ch());
	exit(0);
}

/* Writes agent_flags (and duty mode always) into the control block with
 * the seqlock protocol the agent uses, and waits until it is applied. */
static void write_flags(uint32_t flags)
{
	void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
	struct slowrank_cupti_control *c = h ? dlsym(h, SLOWRANK_SYM_CONTROL) : NULL;
	if (!c)
		FAIL("no control block");
	uint32_t g = __atomic_load_n(&c->generation, __ATOMIC_ACQUIRE);
	g += g & 1 ? 1 : 0;
	__atomic_store_n(&c->generation, g + 1, __ATOMIC_RELEASE);
	__atomic_store_n(&c->mode, SLOWRANK_DUTY_ALWAYS, __ATOMIC_RELAXED);
	__atomic_store_n(&c->agent_flags, flags, __ATOMIC_RELAXED);
	__atomic_store_n(&c->generation, g + 2, __ATOMIC_RELEASE);
	uint64_t t0 = now_ns();
	while (__atomic_load_n(&c->applied_generation, __ATOMIC_ACQUIRE) != g + 2)
		if (now_ns() - t0 > 2000000000ull)
			FAIL("flags %#x not applied within 2 s", flags);
		else
			sleep_ms(5);
}

static void sc_nokch(void)
{
	child_env(1, "always");
	if (fp_load() != 5)
		FAIL("not bound");
	struct fp_comm *c = fp_comm_init(8, 2, 0);
	if (!wait_mask(SR_NCCL_PROFILE_COLL | SR_NCCL_PROFILE_KERNEL_CH, 2000))
		FAIL("kernel channels never on in an always-on phase: mask %#x", fp_mask());
	write_flags(SLOWRANK_AGENT_F_NCCL_PLUGIN | SLOWRANK_AGENT_F_NCCL_NO_KERNELCH);
	sleep_ms(100); /* a poll stores the mask */
	if (fp_mask() & SR_NCCL_PROFILE_KERNEL_CH || !(fp_mask() & SR_NCCL_PROFILE_COLL))
		FAIL("mask %#x with NO_KERNELCH: want Coll without KernelCh", fp_mask());
	uint64_t with = fp_ops_with_kernel_ch();
	for (int i = 0; i < 200; i++)
		fp_coll(c, "AllReduce", 16, "ncclFloat32", -1, 2);
	if (fp_ops_with_kernel_ch() != with)
		FAIL("%llu operations with kernel channels under NO_KERNELCH",
		     (unsigned long long)(fp_ops_with_kernel_ch() - with));
	write_flags(SLOWRANK_AGENT_F_NCCL_PLUGIN);
	if (!wait_mask(SR_NCCL_PROFILE_KERNEL_CH, 2000))
		FAIL("kernel channels not back after the flag was cleared: mask %#x", fp_mask());
	fp_comm_destroy(c);
	exit(0);
}

/* Two copies of NCCL in one process, each with its own mask: the second
 * one's last communicator finalizes and the copy unloads (its mask page
 * unmapped); the control thread's next mask change reaches the first copy
 * and never the unmapped page (a write there is SIGSEGV). */
static void sc_twocopies(void)
{
	child_env(1, "always");
	if (fp_load() != 5)
		FAIL("not bound");
	const sr_nccl_profiler_v5_t *p5 = fp_plugin();
	struct fp_comm *a = fp_comm_init(11, 2, 0);
	if (!wait_mask(SR_NCCL_PROFILE_COLL | SR_NCCL_PROFILE_KERNEL_CH, 2000))
		FAIL("first copy's mask never set: %#x", fp_mask());
	long page = sysconf(_SC_PAGESIZE);
	int *mask_b = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mask_b == MAP_FAILED)
		FAIL("mmap");
	void *ctx_b = NULL;
	if (p5->init(&ctx_b, 0x77, mask_b, "copy-b", 1, 2, 0, NULL) != 0 || !ctx_b)
		FAIL("second copy's init");
	if (!(*mask_b & SR_NCCL_PROFILE_COLL))
		FAIL("second copy's mask %#x at init", *mask_b);
	write_flags(SLOWRANK_AGENT_F_NCCL_PLUGIN | SLOWRANK_AGENT_F_NCCL_NO_KERNELCH);
	sleep_ms(100); /* a poll stores the mask */
	if (__atomic_load_n(mask_b, __ATOMIC_RELAXED) & SR_NCCL_PROFILE_KERNEL_CH)
		FAIL("second copy's mask %#x not kept current", *mask_b);
	if (fp_mask() & SR_NCCL_PROFILE_KERNEL_CH)
		FAIL("first copy's mask %#x not kept current after the second copy's init", fp_mask());
	p5->finalize(ctx_b);
	munmap(mask_b, (size_t)page);
	write_flags(SLOWRANK_AGENT_F_NCCL_PLUGIN);
	if (!wait_mask(SR_NCCL_PROFILE_KERNEL_CH, 2000))
		FAIL("first copy's mask %#x not kept current after the second copy left", fp_mask());
	fp_comm_destroy(a);
	exit(0);
}

static void sc_toggle_check(void)
{
	read_dump();
	if (nkern == 0 || nkern >= ncoll)
		FAIL("%d kernel records for %d collectives under a 50 %% duty cycle", nkern, ncoll);
	if (stats[SLOWRANK_STAT_NCCL_INCOMPLETE] || stats[SLOWRANK_STAT_NCCL_BAD_HANDLES])
		FAIL("incomplete %llu bad %llu", (unsigned long long)stats[SLOWRANK_STAT_NCCL_INCOMPLETE],
		     (unsigned long long)stats[SLOWRANK_STAT_NCCL_BAD_HANDLES]);
	printf("  (%d collectives, %d with GPU times)\n", ncoll, nkern);
}

struct scenario {
	const char *name;
	void (*child)(void);
	void (*check)(void);
};

static const struct scenario scenarios[] = {
	{"v5", sc_v5, sc_v5_check},
	{"v4", sc_v4, sc_v4_check},
	{"v6", sc_v6, sc_v6_check},
	{"ce", sc_ce, sc_ce_check},
	{"ce5", sc_ce5, sc_ce5_check},
	{"nokernel", sc_nokernel, sc_nokernel_check},
	{"noagent", sc_noagent, sc_noagent_check},
	{"disabled", sc_disabled, NULL},
	{"none", sc_none, NULL},
	{"abuse", sc_abuse, sc_abuse_check},
	{"flood", sc_flood, NULL},
	{"toggle", sc_toggle, sc_toggle_check},
	{"nokch", sc_nokch, NULL},
	{"twocopies", sc_twocopies, NULL},
	{"skew", sc_skew, sc_skew_check},
	{"behind", sc_behind, sc_behind_check},
	{"wrongclock", sc_wrongclock, sc_wrongclock_check},
	{"apilost", sc_apilost, sc_apilost_check},
	{"preempt", sc_preempt, sc_preempt_check},
	{"stale", sc_stale, sc_stale_check},
	{"alltoall", sc_alltoall, sc_alltoall_check},
};

static int run(const struct scenario *s)
{
	snprintf(dump, sizeof(dump), "/tmp/slowrank-test-nccl-%d-%s.dump", (int)getpid(), s->name);
	unlink(dump);
	printf("test_nccl %s\n", s->name);
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		alarm(90);
		s->child();
		_exit(0);
	}
	int st = 0;
	waitpid(pid, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "  FAIL: %s: child %s %d\n", s->name, WIFSIGNALED(st) ? "signal" : "exit",
			WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
		return 1;
	}
	pid = fork();
	if (pid == 0) {
		if (s->check)
			s->check();
		fflush(stdout);
		_exit(0);
	}
	waitpid(pid, &st, 0);
	unlink(dump);
	return !WIFEXITED(st) || WEXITSTATUS(st) != 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s libslowrank_cupti.so [scenario...]\n", argv[0]);
		return 2;
	}
	lib = argv[1];
	int fails = 0;
	for (size_t i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++) {
		int want = argc == 2;
		for (int a = 2; a < argc; a++)
			want |= strcmp(argv[a], scenarios[i].name) == 0;
		if (want)
			fails += run(&scenarios[i]);
	}
	printf(fails ? "test_nccl: %d FAILED\n" : "test_nccl: ok\n", fails);
	return fails != 0;
}
