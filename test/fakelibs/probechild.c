//go:build ignore

/*
 * probechild.c — the traced process of bpf/'s probe tests (uprobe_test.go,
 * bench_test.go), on the fake libraries in echo mode (SLOWRANK_FAKE_ECHO=1,
 * which the test sets; echo.c): it calls the probed entry points a known
 * number of times with known arguments and answers on stdout.
 *   sem           -> "sem N" (the CUPTI semaphore as the library sees it)
 *   run           -> the workload of uprobe_test.go, then "done"
 *   bench K N     -> N calls of kind K, then "ns TOTAL"
 *   quit
 * Keep the counts and arguments in step with uprobe_test.go.
 * Build: fakelibs.mk, target fakelibs-probe.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda.h"
#include "cuda_runtime_api.h"
#include "fakegpu.h"
#include "nccl.h"

/* Not part of the real libraries: the fakes' entry points for this test. */
void slowrank_fake_nccl_noop(void);                                /* libnccl.so.2 */
void *slowrank_fake_gloo_new(const char *key, int size, int rank); /* libtorch_cpu.so */
int slowrank_fake_gloo_probe(void *pg, void **work, void **future);
uint16_t slowrank_fake_cupti_semaphore(void); /* libslowrank_cupti.so */
void slowrank_fake_cupti_flush(uint32_t seed, uint32_t len);

static long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void fill_id(ncclUniqueId *id, int salt) {
  for (int j = 0; j < NCCL_UNIQUE_ID_BYTES; j++) id->internal[j] = (char)(j * 13 + 7 + salt);
}

static const unsigned batch_lens[] = {1, 100, 512, 513, 2048, 5000, 8192, 8193, 16384, 16385, 0};

#define STREAM(v) ((cudaStream_t)(v))

static void collectives(void) {
  static char sbuf[64], rbuf[64];
  ncclComm_t c0 = (ncclComm_t)0xc0ffee00UL, c1 = (ncclComm_t)0xc0ffee01UL;

  ncclGroupStart();
  for (int i = 0; i < 50; i++)
    ncclAllReduce(sbuf, rbuf, 1000 + i, ncclFloat32, (ncclRedOp_t)(i % 4), c0, STREAM(0x5000UL + i));
  ncclGroupEnd();
  for (int i = 0; i < 7; i++) ncclReduce(sbuf, rbuf, 2000 + i, ncclBfloat16, ncclMax, i % 3, c1, STREAM(0x6000UL + i));
  for (int i = 0; i < 3; i++) ncclBroadcast(sbuf, rbuf, 3000 + i, ncclFloat32, 1, c0, STREAM(0x7000UL + i));
  for (int i = 0; i < 4; i++) ncclAllGather(sbuf, rbuf, 4000 + i, ncclFloat32, c0, STREAM(0x8000UL + i));
  for (int i = 0; i < 2; i++) ncclReduceScatter(sbuf, rbuf, 5000 + i, ncclFloat32, ncclSum, c0, STREAM(0x9000UL + i));
  for (int i = 0; i < 5; i++) {
    ncclSend(sbuf, 6000 + i, ncclFloat32, i, c0, STREAM(0xa000UL));
    ncclRecv(rbuf, 7000 + i, ncclFloat32, i + 1, c0, STREAM(0xa001UL));
  }
  ncclAlltoAll(sbuf, rbuf, 8000, ncclFloat32, c0, STREAM(0xb000UL));
}

static void comm_inits(void) {
  ncclUniqueId id, id2;
  ncclComm_t comm = 0, comm2 = 0, split = 0, all[2] = {0, 0}, scal = 0;
  fill_id(&id, 0);
  fill_id(&id2, 1);
  ncclCommInitRank(&comm, 8, id, 3);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  ncclCommInitRankConfig(&comm2, 4, id2, 1, &cfg);
  ncclCommSplit(comm, 2, 5, &split, NULL);
  ncclCommInitAll(all, 2, NULL);
  ncclCommInitRankScalable(&scal, 16, 9, 1, &id2, &cfg);
  printf("comm %lx %lx %lx %lx %lx\n", (unsigned long)comm, (unsigned long)comm2, (unsigned long)split,
         (unsigned long)all[0], (unsigned long)scal);
}

/* Every wait is bracketed by the child's own CLOCK_MONOTONIC. */
#define TIMED(name, call)                         \
  do {                                            \
    long t0 = now_ns();                           \
    call;                                         \
    printf("sync %s %ld\n", name, now_ns() - t0); \
  } while (0)

static void syncs(void) {
  slowrank_fake_echo_set_sleep_ns(20000000L);
  for (int i = 0; i < 3; i++) TIMED("cudaStreamSynchronize", cudaStreamSynchronize(STREAM(0xd000UL + i)));
  slowrank_fake_echo_set_sleep_ns(5000000L);
  TIMED("cudaDeviceSynchronize", cudaDeviceSynchronize());
  TIMED("cudaEventSynchronize", cudaEventSynchronize((cudaEvent_t)0xe000UL));
  slowrank_fake_echo_set_sleep_ns(10000000L);
  for (int i = 0; i < 2; i++) TIMED("cuStreamSynchronize", cuStreamSynchronize(STREAM(0xf000UL + i)));
  TIMED("cuCtxSynchronize", cuCtxSynchronize());
  TIMED("cuEventSynchronize", cuEventSynchronize((CUevent)0));
  slowrank_fake_echo_set_sleep_ns(0);
}

/* "pg P", then per bucket "work W F": the `this` of each torch probe. */
static void torch(void) {
  void *pg = slowrank_fake_gloo_new("probechild", 1, 0);
  printf("pg %lx\n", (unsigned long)pg);
  for (int i = 0; i < 3; i++) {
    void *work = NULL, *future = NULL;
    slowrank_fake_gloo_probe(pg, &work, &future);
    printf("work %lx %lx\n", (unsigned long)work, (unsigned long)future);
  }
}

static void run(void) {
  collectives();
  comm_inits();
  syncs();
  torch();
  for (unsigned i = 0; i < sizeof(batch_lens) / sizeof(batch_lens[0]); i++)
    slowrank_fake_cupti_flush(i + 1, batch_lens[i]);
  printf("done\n");
}

static void bench(const char *kind, long n) {
  long t0 = now_ns();
  if (!strcmp(kind, "noop")) {
    for (long i = 0; i < n; i++) slowrank_fake_nccl_noop();
  } else if (!strcmp(kind, "entry")) {
    for (long i = 0; i < n; i++) ncclGroupStart();
  } else if (!strcmp(kind, "pair")) {
    slowrank_fake_echo_set_sleep_ns(0);
    for (long i = 0; i < n; i++) cudaStreamSynchronize(0);
  }
  printf("ns %ld\n", now_ns() - t0);
}

int main(void) {
  char line[256];
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (!slowrank_fake_echo()) {
    fprintf(stderr, "probechild: needs SLOWRANK_FAKE_ECHO=1 (its handles are made up)\n");
    return 2;
  }
  printf("ready %d\n", (int)getpid());
  while (fgets(line, sizeof(line), stdin)) {
    char kind[32];
    long n;
    if (!strncmp(line, "sem", 3)) {
      printf("sem %u\n", (unsigned)slowrank_fake_cupti_semaphore());
    } else if (!strncmp(line, "run", 3)) {
      run();
    } else if (sscanf(line, "bench %31s %ld", kind, &n) == 2) {
      bench(kind, n);
    } else if (!strncmp(line, "quit", 4)) {
      break;
    }
  }
  return 0;
}
