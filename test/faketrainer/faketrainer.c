//go:build ignore

/*
 * faketrainer — a synchronous data-parallel "training job" on the fake
 * NCCL/CUDA libraries of test/fakelibs, with exact ground truth.
 *
 * Two modes:
 *   launcher  (RANK unset): forks --ranks children and execs itself in each
 *             with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
 *             MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID and
 *             SLOWRANK_FAKE_JOB set as torchrun does; waits for all of them.
 *   rank      (RANK set, e.g. under torchrun): one rank of the job.
 *
 * Per rank: rank 0 creates the NCCL unique id and shares it through a POSIX
 * shared-memory "store"; every rank calls ncclCommInitRankConfig (or
 * ncclCommInitRank); then per step: host work, forward kernels, backward
 * kernels each followed by one gradient-bucket ncclAllReduce (optionally all
 * in one group, optionally on a separate communication stream), an optimizer
 * kernel, and the end-of-step synchronisation (cudaStreamSynchronize by
 * default). --help lists the flags. Build: test/fakelibs/fakelibs.mk.
 *
 * --backend gloo replaces NCCL by the fake libtorch_cpu.so (loaded with
 * dlopen, like torch's Python extension): the buckets become
 * c10d::ProcessGroupGloo::allreduce calls that carry no sizes for the probes,
 * which is what slowrank's timing-based step detection is for. --gloo-wait
 * says how the end of the backward pass waits for them: on the device only
 * (default), or on the host like DDP (each bucket's
 * c10::ivalue::Future::wait, --gloo-wait future) or through c10d::Work::wait
 * (--gloo-wait work); the host wait is the truth's coll_wait_ms.
 *
 * Compiled twice: FT_LINKED_NCCL=1 (DT_NEEDED libnccl.so.2) and
 * FT_LINKED_NCCL=0 ("faketrainer-dlopen", loads libnccl.so.2 with dlopen after
 * start like torch). The linked binary re-execs the dlopen one for
 * --dlopen-nccl, keeping its pid.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda.h"
#include "cuda_runtime_api.h"
#include "nccl.h"

#ifndef FT_LINKED_NCCL
#define FT_LINKED_NCCL 1
#endif

enum { EXIT_OK = 0, EXIT_USAGE = 2, EXIT_CRASH = 3, EXIT_DEVICE = 4, EXIT_IO = 5 };

/* ---------------- options ---------------- */

enum sync_mode { SYNC_STREAM, SYNC_DEVICE, SYNC_EVENT, SYNC_CU_STREAM, SYNC_CU_CTX };
static const char *const sync_names[] = {"stream", "device", "event", "cu-stream", "cu-ctx"};

/* How a gloo step waits for its buckets before the optimizer. */
enum gloo_wait { GLOO_WAIT_DEVICE, GLOO_WAIT_FUTURE, GLOO_WAIT_WORK };
static const char *const gloo_wait_names[] = {"device", "future", "work"};

/* --loop-shape: the call cycle of an external training loop (issue 16, the
 * loops of bench/gpu/ext_loops.py) instead of the default iteration. */
enum loop_shape { SHAPE_NONE, SHAPE_TRAINER, SHAPE_MEGATRON, SHAPE_LIGHTNING, SHAPE_CUDAGRAPH, SHAPE_COMPILE };
static const char *const shape_names[] = {"none", "trainer", "megatron", "lightning", "cudagraph", "compile"};

struct opts {
  int ranks;
  long steps;
  double duration_s;
  double step_ms;
  double gpu_ms;
  int buckets;
  double bucket_mb;
  int kernels;
  int group;
  int comm_stream;
  int split;
  long split_at; /* -1: none */
  int alltoall;
  int bcast;
  int init_plain;
  int workers;
  enum sync_mode sync;
  int device_sync;
  int slow_rank;
  long slow_from;
  long slow_to;
  double slow_factor;
  double slow_host_ms;
  double slow_gpu_ms;
  double jitter;
  uint64_t seed;
  int host_spin;
  int dlopen_nccl;
  double dlopen_delay_ms;
  double sleep_before_ms;
  const char *truth;
  long bench_calls;
  const char *bench_symbol;
  int threads;
  int crash_rank;
  long crash_step;
  int verbose;
  int no_device_truth;
  int gloo;
  int gloo_cuda_sync;
  int gloo_wait; /* enum gloo_wait */
  int warmup_buckets;
  int init_bursts;
  long eval_every;
  int eval_batches;
  int shape; /* enum loop_shape */
  long log_every;
  int epilogue;
  long speedup_at;
  double speedup;
};

static struct opts O = {
    .ranks = 2,
    .steps = 100,
    .step_ms = 10,
    .gpu_ms = 20,
    .buckets = 4,
    .bucket_mb = 25,
    .kernels = 4,
    .sync = SYNC_STREAM,
    .slow_rank = -1,
    .slow_to = -1,
    .slow_factor = 1,
    .jitter = 0.02,
    .seed = 1,
    .crash_rank = -1,
    .crash_step = -1,
    .eval_batches = 8,
    .log_every = 50,
    .speedup_at = -1,
    .split_at = -1,
    .speedup = 1,
};

static void usage(FILE *f) {
  fprintf(f,
          "usage: faketrainer [flags]\n"
          "  launcher mode when RANK is unset (forks --ranks ranks), rank mode when RANK is set.\n"
          "  --ranks N              ranks to launch (default 2)\n"
          "  --steps N              steps per rank (default 100)\n"
          "  --duration SEC         run for SEC seconds instead (rank 0 decides the last step)\n"
          "  --step-ms MS           host work per step (default 10)\n"
          "  --gpu-ms MS            device compute per step (default 20)\n"
          "  --buckets N            gradient buckets = ncclAllReduce calls per step (default 4, at most 4096)\n"
          "  --warmup-buckets N     buckets of step 0 only (DDP before its bucket rebuild; default --buckets;\n"
          "                         with --loop-shape too)\n"
          "  --init-bursts          before step 0: a parameter broadcast (ncclBroadcast per parameter, sizes\n"
          "                         repeating layer by layer, each followed by a stream synchronisation)\n"
          "                         and a barrier storm (1-element ncclAllReduce + synchronisation, 40 times),\n"
          "                         like DDP's init and a startup barrier loop; truth kind \"burst\"\n"
          "  --eval-every N         after every N-th step an evaluation loop of --eval-batches batches\n"
          "                         (forward kernel, 2-element metric ncclAllReduce, synchronisation)\n"
          "  --eval-batches M       batches of that loop (default 8)\n"
          "  --loop-shape NAME      the call cycle of an external loop instead of the default iteration\n"
          "                         (bench/gpu/ext_loops.py; --step-ms/--gpu-ms/--buckets scale it):\n"
          "                         trainer: the transformers Trainer without DDP: the model's copy to the GPU\n"
          "                           (a cudaStreamSynchronize per tensor), five cudaStreamSynchronize per\n"
          "                           iteration, a logging step every --log-every with an ncclAllGather and\n"
          "                           100 synchronisations\n"
          "                         megatron: Megatron-core's timers (cudaDeviceSynchronize at each start and\n"
          "                           stop), a grad-norm and a barrier all-reduce of one element per iteration\n"
          "                           (B S B S), the --buckets grad all-reduces after backward\n"
          "                         lightning: Lightning DDP: bucket all-reduces, no synchronisation except one\n"
          "                           every --log-every iterations\n"
          "                         cudagraph: a CUDA graph of the whole step: 3 eager warm-up iterations\n"
          "                           synchronising a side stream, the capture (no call), then one launch and\n"
          "                           one cudaStreamSynchronize per iteration\n"
          "                         compile: torch.compile under DDP: the copy to the GPU before the first\n"
          "                           collective, DDP's broadcast, an iteration 0 of 30 steps' time\n"
          "  --log-every N          (--loop-shape trainer, lightning) logging step period (default 50)\n"
          "  --epilogue             (--loop-shape trainer) the Trainer's end of training after the last\n"
          "                         iteration: a cudaDeviceSynchronize, a wait of ~30 steps' time, then a\n"
          "                         burst of 67 groups of five cudaStreamSynchronize (the H200 run: 68\n"
          "                         facts after the last iteration); truth kind \"burst\", what \"epilogue\"\n"
          "  --speedup-at N         (--loop-shape) from iteration N on, --speedup times less host and device\n"
          "                         work per iteration (a change of pace); logging steps keep their length\n"
          "  --speedup F            that factor (default 1; below 1: a slow-down)\n"
          "  --backend nccl|gloo    gloo: buckets are c10d::ProcessGroupGloo::allreduce calls of the fake\n"
          "                         libtorch_cpu.so (dlopen'ed), no NCCL call at all (default nccl)\n"
          "  --gloo-cuda-sync       gloo: one cudaStreamSynchronize per collective inside the library,\n"
          "                         like gloo's CUDA path (counted in the truth)\n"
          "  --gloo-wait MODE       gloo: how the optimizer waits for the buckets: device (the compute\n"
          "                         stream waits, the host does not; default), future (the host waits\n"
          "                         on each bucket's c10::ivalue::Future::wait, as DDP's reducer does)\n"
          "                         or work (the host waits in each bucket's c10d::Work::wait)\n"
          "  --bucket-mb MB         size of the largest bucket (default 25; bucket i is (N-i)/N of it)\n"
          "  --kernels N            forward kernels per step (default 4)\n"
          "  --group                issue the bucket allreduces inside ncclGroupStart/ncclGroupEnd\n"
          "  --comm-stream          allreduces on a separate stream ordered by events (like DDP)\n"
          "  --split                run collectives on ncclCommSplit(world, 0, rank) instead of world\n"
          "  --split-at STEP        at step STEP every rank splits world (color 0, key rank) and runs\n"
          "                         the later collectives on the new communicator (a late group)\n"
          "  --alltoall             one ncclAlltoAll at the start of each forward pass (MoE's dispatch; NCCL\n"
          "                         2.28 reports it to the profiler plugin as a send and a receive per peer)\n"
          "  --bcast                one in-place ncclBcast of a flag at the start of each step (torch's\n"
          "                         dist.broadcast; NCCL's ncclBcast calls ncclBroadcast: both uprobes fire)\n"
          "  --init-plain           ncclCommInitRank instead of ncclCommInitRankConfig\n"
          "  --workers N            after init each rank forks N idle workers (torch.compile's compile\n"
          "                         workers, data-loader workers): same environment (RANK), same mappings,\n"
          "                         no CUDA or NCCL call; killed when the rank ends\n"
          "  --sync MODE            end-of-step sync: stream|device|event|cu-stream|cu-ctx (default stream)\n"
          "  --device-sync          also cudaDeviceSynchronize after it\n"
          "  --slow-rank R          rank to slow down (default none)\n"
          "  --slow-from-step S     first slowed step (default 0)\n"
          "  --slow-to-step E       first step no longer slowed (default: never)\n"
          "  --slow-factor F        scale host work and device time of the slow rank by F\n"
          "  --slow-host-ms X       host stall of X ms at the start of each slowed step\n"
          "  --slow-gpu-ms X        X ms of extra device time in each slowed step (before the first bucket)\n"
          "  --slow-phases FROM-TO:MS[,...]  instead of --slow-from-step/--slow-to-step/--slow-host-ms: the\n"
          "                         slow rank's host stall is MS in steps [FROM, TO) of each phase (a schedule\n"
          "                         of magnitudes with healthy steps between: test/sensitivity)\n"
          "  --jitter J             relative uniform jitter of host and device times (default 0.02)\n"
          "  --seed N               jitter seed (default 1)\n"
          "  --host-mode sleep|spin host work sleeps (default) or burns CPU\n"
          "  --dlopen-nccl          load libnccl.so.2 with dlopen after start (late attach)\n"
          "  --dlopen-delay-ms MS   extra delay before that dlopen (default 0)\n"
          "  --sleep-before-start MS  sleep before the first CUDA/NCCL call (default 0)\n"
          "  --truth FILE           JSONL ground truth, appended by every rank (%%r: rank number)\n"
          "  --bench-calls N        call --bench-symbol N times in a tight loop and print ns/call\n"
          "  --bench-symbol NAME    cudaLaunchKernel, cudaStreamSynchronize, cudaDeviceSynchronize,\n"
          "                         cudaEventRecord, cudaEventSynchronize, cudaStreamQuery, cudaGetDevice,\n"
          "                         cuStreamSynchronize, cuCtxSynchronize, cuEventSynchronize,\n"
          "                         ncclAllReduce, ncclBroadcast, ncclAllGather, ncclReduceScatter,\n"
          "                         ncclGroupStart (Start+End pair), ncclCommCount, noop\n"
          "  --threads N            start N idle threads per rank\n"
          "  --crash-rank R --crash-at-step S  rank R exits with status 3 at the start of step S\n"
          "  --no-device-truth      do not record the two per-step events behind device_end_ns\n"
          "  --verbose              one line per step on stderr\n");
}

static int parse_sync(const char *v) {
  for (int i = 0; i < (int)(sizeof sync_names / sizeof sync_names[0]); i++)
    if (strcmp(v, sync_names[i]) == 0) return i;
  return -1;
}

/* --slow-phases: step ranges with their own host stall (a sensitivity schedule). */
#define MAX_SLOW_PHASES 64
static struct {
  long from, to;
  double host_ms;
} g_slow_phases[MAX_SLOW_PHASES];
static int g_n_slow_phases;

static int parse_slow_phases(const char *spec) {
  const char *p = spec;
  g_n_slow_phases = 0;
  while (*p) {
    char *end;
    long from = strtol(p, &end, 10), to;
    double ms;
    if (end == p || *end != '-') goto bad;
    p = end + 1;
    to = strtol(p, &end, 10);
    if (end == p || *end != ':') goto bad;
    p = end + 1;
    ms = strtod(p, &end);
    if (end == p || (*end != ',' && *end != 0) || from < 0 || to <= from || !(ms >= 0)) goto bad;
    if (g_n_slow_phases == MAX_SLOW_PHASES) goto bad;
    g_slow_phases[g_n_slow_phases].from = from;
    g_slow_phases[g_n_slow_phases].to = to;
    g_slow_phases[g_n_slow_phases++].host_ms = ms;
    p = end;
    if (*p == ',' && *++p == 0) goto bad; /* a trailing comma */
  }
  if (g_n_slow_phases > 0) return 0;
bad:
  fprintf(stderr, "faketrainer: --slow-phases %s: want FROM-TO:MS[,FROM-TO:MS...] (at most %d)\n", spec, MAX_SLOW_PHASES);
  return -1;
}

/* Whether rank is slowed at step k, and its injected host stall. */
static int slowed_at(int rank, long k, double *host_ms) {
  *host_ms = O.slow_host_ms;
  if (rank != O.slow_rank) return 0;
  if (g_n_slow_phases == 0) return k >= O.slow_from && (O.slow_to < 0 || k < O.slow_to);
  for (int i = 0; i < g_n_slow_phases; i++)
    if (k >= g_slow_phases[i].from && k < g_slow_phases[i].to) {
      *host_ms = g_slow_phases[i].host_ms;
      return 1;
    }
  return 0;
}

static int parse_opts(int argc, char **argv) {
  enum {
    o_ranks = 256, o_steps, o_duration, o_step_ms, o_gpu_ms, o_buckets, o_bucket_mb, o_kernels, o_group,
    o_comm_stream, o_split, o_split_at, o_init_plain, o_sync, o_device_sync, o_slow_rank, o_slow_from, o_slow_to,
    o_slow_factor, o_slow_host, o_slow_gpu, o_jitter, o_seed, o_host_mode, o_dlopen, o_dlopen_delay,
    o_sleep_before, o_truth, o_bench_calls, o_bench_symbol, o_threads, o_crash_rank, o_crash_step, o_verbose,
    o_no_device_truth, o_backend, o_gloo_cuda_sync, o_gloo_wait, o_warmup_buckets, o_init_bursts, o_eval_every, o_workers,
    o_eval_batches, o_loop_shape, o_log_every, o_epilogue, o_speedup_at, o_speedup, o_alltoall, o_bcast, o_slow_phases, o_help
  };
  static const struct option lo[] = {
      {"ranks", required_argument, 0, o_ranks},
      {"steps", required_argument, 0, o_steps},
      {"duration", required_argument, 0, o_duration},
      {"step-ms", required_argument, 0, o_step_ms},
      {"gpu-ms", required_argument, 0, o_gpu_ms},
      {"buckets", required_argument, 0, o_buckets},
      {"bucket-mb", required_argument, 0, o_bucket_mb},
      {"kernels", required_argument, 0, o_kernels},
      {"group", no_argument, 0, o_group},
      {"comm-stream", no_argument, 0, o_comm_stream},
      {"split", no_argument, 0, o_split},
      {"split-at", required_argument, 0, o_split_at},
      {"init-plain", no_argument, 0, o_init_plain},
      {"sync", required_argument, 0, o_sync},
      {"device-sync", no_argument, 0, o_device_sync},
      {"slow-rank", required_argument, 0, o_slow_rank},
      {"slow-from-step", required_argument, 0, o_slow_from},
      {"slow-to-step", required_argument, 0, o_slow_to},
      {"slow-factor", required_argument, 0, o_slow_factor},
      {"slow-host-ms", required_argument, 0, o_slow_host},
      {"slow-gpu-ms", required_argument, 0, o_slow_gpu},
      {"jitter", required_argument, 0, o_jitter},
      {"seed", required_argument, 0, o_seed},
      {"host-mode", required_argument, 0, o_host_mode},
      {"dlopen-nccl", no_argument, 0, o_dlopen},
      {"dlopen-delay-ms", required_argument, 0, o_dlopen_delay},
      {"sleep-before-start", required_argument, 0, o_sleep_before},
      {"truth", required_argument, 0, o_truth},
      {"bench-calls", required_argument, 0, o_bench_calls},
      {"bench-symbol", required_argument, 0, o_bench_symbol},
      {"threads", required_argument, 0, o_threads},
      {"crash-rank", required_argument, 0, o_crash_rank},
      {"crash-at-step", required_argument, 0, o_crash_step},
      {"verbose", no_argument, 0, o_verbose},
      {"no-device-truth", no_argument, 0, o_no_device_truth},
      {"backend", required_argument, 0, o_backend},
      {"gloo-cuda-sync", no_argument, 0, o_gloo_cuda_sync},
      {"gloo-wait", required_argument, 0, o_gloo_wait},
      {"warmup-buckets", required_argument, 0, o_warmup_buckets},
      {"init-bursts", no_argument, 0, o_init_bursts},
      {"eval-every", required_argument, 0, o_eval_every},
      {"workers", required_argument, 0, o_workers},
      {"eval-batches", required_argument, 0, o_eval_batches},
      {"loop-shape", required_argument, 0, o_loop_shape},
      {"log-every", required_argument, 0, o_log_every},
      {"epilogue", no_argument, 0, o_epilogue},
      {"speedup-at", required_argument, 0, o_speedup_at},
      {"speedup", required_argument, 0, o_speedup},
      {"slow-phases", required_argument, 0, o_slow_phases},
      {"alltoall", no_argument, 0, o_alltoall},
      {"bcast", no_argument, 0, o_bcast},
      {"help", no_argument, 0, o_help},
      {0, 0, 0, 0},
  };
  int c;
  opterr = 1;
  while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (c) {
    case o_ranks: O.ranks = atoi(optarg); break;
    case o_steps: O.steps = atol(optarg); break;
    case o_duration: O.duration_s = atof(optarg); break;
    case o_step_ms: O.step_ms = atof(optarg); break;
    case o_gpu_ms: O.gpu_ms = atof(optarg); break;
    case o_buckets: O.buckets = atoi(optarg); break;
    case o_bucket_mb: O.bucket_mb = atof(optarg); break;
    case o_kernels: O.kernels = atoi(optarg); break;
    case o_group: O.group = 1; break;
    case o_comm_stream: O.comm_stream = 1; break;
    case o_split: O.split = 1; break;
    case o_split_at: O.split_at = atol(optarg); break;
    case o_alltoall: O.alltoall = 1; break;
    case o_bcast: O.bcast = 1; break;
    case o_init_plain: O.init_plain = 1; break;
    case o_sync: {
      int m = parse_sync(optarg);
      if (m < 0) {
        fprintf(stderr, "faketrainer: bad --sync %s\n", optarg);
        return -1;
      }
      O.sync = (enum sync_mode)m;
      break;
    }
    case o_device_sync: O.device_sync = 1; break;
    case o_slow_rank: O.slow_rank = atoi(optarg); break;
    case o_slow_from: O.slow_from = atol(optarg); break;
    case o_slow_to: O.slow_to = atol(optarg); break;
    case o_slow_factor: O.slow_factor = atof(optarg); break;
    case o_slow_host: O.slow_host_ms = atof(optarg); break;
    case o_slow_gpu: O.slow_gpu_ms = atof(optarg); break;
    case o_jitter: O.jitter = atof(optarg); break;
    case o_seed: O.seed = strtoull(optarg, NULL, 0); break;
    case o_host_mode:
      if (strcmp(optarg, "spin") == 0)
        O.host_spin = 1;
      else if (strcmp(optarg, "sleep") == 0)
        O.host_spin = 0;
      else {
        fprintf(stderr, "faketrainer: bad --host-mode %s\n", optarg);
        return -1;
      }
      break;
    case o_dlopen: O.dlopen_nccl = 1; break;
    case o_dlopen_delay: O.dlopen_delay_ms = atof(optarg); break;
    case o_sleep_before: O.sleep_before_ms = atof(optarg); break;
    case o_truth: O.truth = optarg; break;
    case o_bench_calls: O.bench_calls = atol(optarg); break;
    case o_bench_symbol: O.bench_symbol = optarg; break;
    case o_threads: O.threads = atoi(optarg); break;
    case o_crash_rank: O.crash_rank = atoi(optarg); break;
    case o_crash_step: O.crash_step = atol(optarg); break;
    case o_verbose: O.verbose = 1; break;
    case o_no_device_truth: O.no_device_truth = 1; break;
    case o_backend:
      if (strcmp(optarg, "gloo") == 0)
        O.gloo = 1;
      else if (strcmp(optarg, "nccl") == 0)
        O.gloo = 0;
      else {
        fprintf(stderr, "faketrainer: bad --backend %s\n", optarg);
        return -1;
      }
      break;
    case o_gloo_cuda_sync: O.gloo_cuda_sync = 1; break;
    case o_gloo_wait: {
      int m = -1;
      for (int i = 0; i < (int)(sizeof gloo_wait_names / sizeof gloo_wait_names[0]); i++)
        if (strcmp(optarg, gloo_wait_names[i]) == 0) m = i;
      if (m < 0) {
        fprintf(stderr, "faketrainer: bad --gloo-wait %s\n", optarg);
        return -1;
      }
      O.gloo_wait = m;
      break;
    }
    case o_warmup_buckets: O.warmup_buckets = atoi(optarg); break;
    case o_init_bursts: O.init_bursts = 1; break;
    case o_loop_shape: {
      int m = -1;
      for (int i = 0; i < (int)(sizeof shape_names / sizeof shape_names[0]); i++)
        if (strcmp(optarg, shape_names[i]) == 0) m = i;
      if (m < 0) {
        fprintf(stderr, "faketrainer: bad --loop-shape %s\n", optarg);
        return -1;
      }
      O.shape = m;
      break;
    }
    case o_log_every: O.log_every = atol(optarg); break;
    case o_epilogue: O.epilogue = 1; break;
    case o_speedup_at: O.speedup_at = atol(optarg); break;
    case o_speedup: O.speedup = atof(optarg); break;
    case o_slow_phases:
      if (parse_slow_phases(optarg) != 0) return -1;
      break;
    case o_eval_every: O.eval_every = atol(optarg); break;
    case o_workers: O.workers = atoi(optarg); break;
    case o_eval_batches: O.eval_batches = atoi(optarg); break;
    case o_help: usage(stdout); exit(0);
    default: usage(stderr); return -1;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "faketrainer: unexpected argument %s\n", argv[optind]);
    return -1;
  }
  if (O.ranks < 1 || O.ranks > 64 || O.steps < 0 || O.buckets < 0 || O.buckets > 4096 || O.kernels < 0 ||
      O.step_ms < 0 || O.gpu_ms < 0 || O.jitter < 0 || O.jitter >= 1 || O.slow_factor <= 0 || O.threads < 0 ||
      O.slow_host_ms < 0 || O.slow_gpu_ms < 0 || O.bucket_mb < 0 || O.warmup_buckets < 0 || O.warmup_buckets > 4096 ||
      O.eval_every < 0 || O.eval_batches < 1 || O.eval_batches > 1000 || O.workers < 0 || O.workers > 64 ||
      !(O.speedup > 0 && O.speedup <= 1000)) {
    fprintf(stderr, "faketrainer: flag out of range\n");
    return -1;
  }
  if (O.gloo && (O.group || O.comm_stream || O.split || O.split_at >= 0 || O.init_plain || O.dlopen_nccl || O.bench_calls > 0)) {
    fprintf(stderr, "faketrainer: --backend gloo takes none of --group --comm-stream --split --split-at --init-plain "
                    "--dlopen-nccl --bench-calls\n");
    return -1;
  }
  if ((O.alltoall || O.bcast) && (O.gloo || O.shape != SHAPE_NONE)) {
    fprintf(stderr, "faketrainer: --alltoall and --bcast need --backend nccl and no --loop-shape\n");
    return -1;
  }
  if (O.split && O.split_at >= 0) {
    fprintf(stderr, "faketrainer: --split and --split-at exclude each other\n");
    return -1;
  }
  if (O.speedup_at >= 0 && O.shape == SHAPE_NONE) {
    fprintf(stderr, "faketrainer: --speedup-at needs --loop-shape\n");
    return -1;
  }
  if (O.gloo && O.shape != SHAPE_NONE) {
    fprintf(stderr, "faketrainer: --loop-shape needs --backend nccl\n");
    return -1;
  }
  if (O.gloo && (O.init_bursts || O.eval_every > 0)) {
    fprintf(stderr, "faketrainer: --init-bursts and --eval-every need --backend nccl\n");
    return -1;
  }
  if (!O.gloo && O.gloo_wait != GLOO_WAIT_DEVICE) {
    fprintf(stderr, "faketrainer: --gloo-wait needs --backend gloo\n");
    return -1;
  }
  if (O.bench_calls > 0 && !O.bench_symbol) {
    fprintf(stderr, "faketrainer: --bench-calls needs --bench-symbol\n");
    return -1;
  }
  return 0;
}

/* ---------------- small helpers ---------------- */

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns) {
  if (ns == 0) return;
  struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull), .tv_nsec = (long)(ns % 1000000000ull)};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

static double ms_of(uint64_t ns) { return (double)ns / 1e6; }

static int g_rank = -1;

__attribute__((format(printf, 1, 2))) static void logf_(const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (g_rank >= 0)
    fprintf(stderr, "faketrainer rank %d: %s\n", g_rank, buf);
  else
    fprintf(stderr, "faketrainer: %s\n", buf);
}

static int env_int(const char *name, int def) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : def;
}

static void sanitize(char *dst, size_t n, const char *src) {
  size_t j = 0;
  for (size_t i = 0; src[i] && j + 1 < n; i++) {
    char ch = src[i];
    int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' ||
             ch == '_' || ch == '.';
    dst[j++] = ok ? ch : '_';
  }
  dst[j] = 0;
}

/* The job id, derived like the fake libraries do. */
static void job_id(char *out, size_t n) {
  char raw[200];
  const char *v = getenv("SLOWRANK_FAKE_JOB");
  if (!v || !*v) v = getenv("TORCHELASTIC_RUN_ID");
  if (v && *v) {
    snprintf(raw, sizeof raw, "%s", v);
  } else {
    const char *a = getenv("MASTER_ADDR"), *p = getenv("MASTER_PORT");
    if (a && *a && p && *p)
      snprintf(raw, sizeof raw, "%s-%s", a, p);
    else
      snprintf(raw, sizeof raw, "default-%u", (unsigned)getuid());
  }
  sanitize(out, n, raw);
}

static uint64_t timeout_ns(void) {
  const char *v = getenv("SLOWRANK_FAKE_TIMEOUT_MS");
  double ms = v && *v ? atof(v) : 60000;
  if (ms <= 0) ms = 60000;
  return (uint64_t)(ms * 1e6);
}

/* splitmix64 */
static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static double jittered(uint64_t *s, double v) {
  if (O.jitter <= 0 || v <= 0) return v;
  double u = (double)(rng_next(s) >> 11) / 9007199254740992.0; /* [0,1) */
  return v * (1.0 + O.jitter * (2.0 * u - 1.0));
}

/* ---------------- NCCL entry points (linked or dlopen'ed) ---------------- */

struct nccl_fns {
  ncclResult_t (*GetUniqueId)(ncclUniqueId *);
  ncclResult_t (*CommInitRank)(ncclComm_t *, int, ncclUniqueId, int);
  ncclResult_t (*CommInitRankConfig)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
  ncclResult_t (*CommSplit)(ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*CommCount)(const ncclComm_t, int *);
  ncclResult_t (*CommUserRank)(const ncclComm_t, int *);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t *);
  ncclResult_t (*AllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*Broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*Bcast)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*AllGather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*AlltoAll)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*ReduceScatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*GroupStart)(void);
  ncclResult_t (*GroupEnd)(void);
  const char *(*GetErrorString)(ncclResult_t);
};
static struct nccl_fns N;
static const char *g_nccl_mode = "linked";

static int load_nccl(void) {
#if FT_LINKED_NCCL
  N.GetUniqueId = ncclGetUniqueId;
  N.CommInitRank = ncclCommInitRank;
  N.CommInitRankConfig = ncclCommInitRankConfig;
  N.CommSplit = ncclCommSplit;
  N.CommDestroy = ncclCommDestroy;
  N.CommCount = ncclCommCount;
  N.CommUserRank = ncclCommUserRank;
  N.CommGetAsyncError = ncclCommGetAsyncError;
  N.AllReduce = ncclAllReduce;
  N.Broadcast = ncclBroadcast;
  N.Bcast = ncclBcast;
  N.AllGather = ncclAllGather;
  N.AlltoAll = ncclAlltoAll;
  N.ReduceScatter = ncclReduceScatter;
  N.GroupStart = ncclGroupStart;
  N.GroupEnd = ncclGroupEnd;
  N.GetErrorString = ncclGetErrorString;
  return 0;
#else
  g_nccl_mode = "dlopen";
  void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
  if (!h) {
    /* Fall back to the directory of the executable. */
    char exe[PATH_MAX], path[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
      exe[n] = 0;
      char *slash = strrchr(exe, '/');
      if (slash) *slash = 0;
      snprintf(path, sizeof path, "%s/libnccl.so.2", exe);
      h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    }
  }
  if (!h) {
    logf_("dlopen libnccl.so.2: %s", dlerror());
    return -1;
  }
#define LOAD(field, sym)                                  \
  do {                                                    \
    *(void **)(&N.field) = dlsym(h, sym);                 \
    if (!N.field) {                                       \
      logf_("dlsym %s: %s", sym, dlerror());              \
      return -1;                                          \
    }                                                     \
  } while (0)
  LOAD(GetUniqueId, "ncclGetUniqueId");
  LOAD(CommInitRank, "ncclCommInitRank");
  LOAD(CommInitRankConfig, "ncclCommInitRankConfig");
  LOAD(CommSplit, "ncclCommSplit");
  LOAD(CommDestroy, "ncclCommDestroy");
  LOAD(CommCount, "ncclCommCount");
  LOAD(CommUserRank, "ncclCommUserRank");
  LOAD(CommGetAsyncError, "ncclCommGetAsyncError");
  LOAD(AllReduce, "ncclAllReduce");
  LOAD(Broadcast, "ncclBroadcast");
  LOAD(Bcast, "ncclBcast");
  LOAD(AllGather, "ncclAllGather");
  LOAD(AlltoAll, "ncclAlltoAll");
  LOAD(ReduceScatter, "ncclReduceScatter");
  LOAD(GroupStart, "ncclGroupStart");
  LOAD(GroupEnd, "ncclGroupEnd");
  LOAD(GetErrorString, "ncclGetErrorString");
#undef LOAD
  return 0;
#endif
}

/* ---------------- the fake libtorch_cpu.so (gloo backend) ---------------- */

/* What Call does with the collective's Work (FAKE_GLOO_* of torch.cpp). */
enum { FT_GLOO_NO_WAIT = 0, FT_GLOO_WAIT_NOW = 1, FT_GLOO_KEEP_FUTURE = 2, FT_GLOO_KEEP_WORK = 3 };

struct torch_fns {
  void *(*New)(const char *key, int size, int rank);
  int (*Call)(void *pg, const char *op, double bytes, cudaStream_t stream, int mode);
  int (*Join)(void *pg, cudaStream_t stream);
  int (*Finalize)(void *pg, cudaStream_t stream);
  void (*Free)(void *pg);
};
static struct torch_fns T;

/* dlopen, like torch's Python extension, from the library path or the
 * directory of the executable. */
static void *dlopen_here(const char *lib) {
  void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
  if (h) return h;
  char exe[PATH_MAX], path[PATH_MAX + 64];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    snprintf(path, sizeof path, "%s/%s", exe, lib);
    h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  }
  return h;
}

static int load_torch(void) {
  void *h = dlopen_here("libtorch_cpu.so");
  if (!h) {
    logf_("dlopen libtorch_cpu.so: %s", dlerror());
    return -1;
  }
  *(void **)(&T.New) = dlsym(h, "slowrank_fake_gloo_new");
  *(void **)(&T.Call) = dlsym(h, "slowrank_fake_gloo_call");
  *(void **)(&T.Join) = dlsym(h, "slowrank_fake_gloo_join");
  *(void **)(&T.Finalize) = dlsym(h, "slowrank_fake_gloo_finalize");
  *(void **)(&T.Free) = dlsym(h, "slowrank_fake_gloo_free");
  if (!T.New || !T.Call || !T.Join || !T.Finalize || !T.Free) {
    logf_("libtorch_cpu.so lacks the slowrank_fake_gloo_* entry points");
    return -1;
  }
  return 0;
}

/* ---------------- per-step call accounting ---------------- */

enum sym {
  S_cudaLaunchKernel, S_cudaStreamSynchronize, S_cudaDeviceSynchronize, S_cudaEventRecord,
  S_cudaEventSynchronize, S_cudaStreamWaitEvent, S_cuStreamSynchronize, S_cuCtxSynchronize,
  S_ncclAllReduce, S_ncclGroupStart, S_ncclGroupEnd, S_glooAllreduce, S_futureWait, S_workWait, S_ncclBroadcast,
  S_ncclAllGather, S_ncclAlltoAll, S_ncclBcast, S_NUM
};
static const char *const sym_names[S_NUM] = {
    "cudaLaunchKernel", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventRecord",
    "cudaEventSynchronize", "cudaStreamWaitEvent", "cuStreamSynchronize", "cuCtxSynchronize",
    "ncclAllReduce", "ncclGroupStart", "ncclGroupEnd", "c10d::ProcessGroupGloo::allreduce",
    "c10::ivalue::Future::wait", "c10d::Work::wait", "ncclBroadcast", "ncclAllGather", "ncclAlltoAll", "ncclBcast"};

struct step_acc {
  uint64_t calls[S_NUM];
  uint64_t sync_ns;   /* inside synchronisation calls */
  uint64_t coll_wait_ns; /* blocked waiting for collectives (gloo Future::wait / Work::wait) */
  uint64_t nccl_ns;   /* inside NCCL calls */
  uint64_t host_ns;   /* inside host work (including an injected stall) */
  uint64_t gpu_ns;    /* device compute enqueued (modelled) */
};
static struct step_acc A;
static int g_failed;      /* a CUDA/NCCL call failed */
static long g_cur_step = -1;

static void cuda_check(cudaError_t e, const char *what) {
  if (e != cudaSuccess && !g_failed) {
    logf_("step %ld: %s: %s (%d)", g_cur_step, what, cudaGetErrorString(e), (int)e);
    g_failed = 1;
  }
}

static void cu_check(CUresult e, const char *what) {
  if (e != CUDA_SUCCESS && !g_failed) {
    logf_("step %ld: %s: CUresult %d", g_cur_step, what, (int)e);
    g_failed = 1;
  }
}

static void nccl_check(ncclResult_t e, const char *what) {
  if (e != ncclSuccess && !g_failed) {
    logf_("step %ld: %s: %s (%d)", g_cur_step, what, N.GetErrorString ? N.GetErrorString(e) : "?", (int)e);
    g_failed = 1;
  }
}

/* Fake kernels: the address identifies the kernel; the library ignores it. */
static void fwd_kernel(void) {}
static void bwd_kernel(void) {}
static void opt_kernel(void) {}
static void stall_kernel(void) {}

static double g_gpu_scale = 1.0;

static void launch(void (*fn)(void), double ms, cudaStream_t s) {
  unsigned us = ms > 0 ? (unsigned)llround(ms * 1000.0) : 0;
  if (us == 0) us = 1;
  dim3 grid = {us, 1, 1}, block = {128, 1, 1};
  void *args[1] = {NULL};
  A.calls[S_cudaLaunchKernel]++;
  A.gpu_ns += (uint64_t)((double)us * 1000.0 * g_gpu_scale);
  cuda_check(cudaLaunchKernel((const void *)fn, grid, block, args, 0, s), "cudaLaunchKernel");
}

static void host_work(double ms) {
  if (ms <= 0) return;
  uint64_t t0 = now_ns(), ns = (uint64_t)(ms * 1e6);
  if (O.host_spin) {
    while (now_ns() - t0 < ns) {
    }
  } else {
    sleep_ns(ns);
  }
  A.host_ns += now_ns() - t0;
}

/* ---------------- rendezvous store (the job's "TCPStore") ---------------- */

struct store {
  uint32_t ready;
  uint32_t pad;
  uint64_t created_realtime_ns;
  ncclUniqueId id;
  int64_t stop_at; /* --duration: first step nobody runs; 0 = unknown */
};
#define STORE_READY 0x52454459u

static struct store *open_store(int rank, const char *job) {
  char name[512];
  snprintf(name, sizeof name, "/slowrank-fake-store-%s", job);
  if (rank == 0) {
    shm_unlink(name); /* drop one left over by a crashed run with this job id */
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, sizeof(struct store)) != 0) {
      logf_("create store %s: %s", name, strerror(errno));
      if (fd >= 0) close(fd);
      return NULL;
    }
    struct store *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (s == MAP_FAILED) return NULL;
    s->created_realtime_ns = realtime_ns();
    return s;
  }
  uint64_t start_rt = realtime_ns(), deadline = now_ns() + timeout_ns();
  for (;;) {
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) {
      struct stat sb;
      if (fstat(fd, &sb) == 0 && (size_t)sb.st_size >= sizeof(struct store)) {
        struct store *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (s == MAP_FAILED) return NULL;
        /* Accept only a store written for this run (not one left by a crash). */
        if (__atomic_load_n(&s->ready, __ATOMIC_ACQUIRE) == STORE_READY &&
            s->created_realtime_ns + 120000000000ull >= start_rt)
          return s;
        munmap(s, sizeof *s);
      } else {
        close(fd);
      }
    }
    if (now_ns() > deadline) {
      logf_("rank 0 never published the unique id in %s", name);
      return NULL;
    }
    sleep_ns(2000000);
  }
}

/* ---------------- truth file ---------------- */

static int g_truth_fd = -1;
static char *g_tbuf;
static size_t g_tlen, g_tcap;

static void truth_flush(void) {
  if (g_truth_fd < 0 || g_tlen == 0) return;
  size_t off = 0;
  while (off < g_tlen) {
    ssize_t n = write(g_truth_fd, g_tbuf + off, g_tlen - off); /* O_APPEND: whole lines per write */
    if (n < 0) {
      if (errno == EINTR) continue;
      logf_("write truth: %s", strerror(errno));
      break;
    }
    off += (size_t)n;
  }
  g_tlen = 0;
}

__attribute__((format(printf, 1, 2))) static void truth_printf(const char *fmt, ...) {
  if (g_truth_fd < 0) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(g_tbuf + g_tlen, g_tcap - g_tlen, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < g_tcap - g_tlen) {
      g_tlen += (size_t)n;
      break;
    }
    if (g_tlen > 0) {
      truth_flush();
      continue;
    }
    size_t cap = (size_t)n + 1024;
    char *nb = realloc(g_tbuf, cap);
    if (!nb) return;
    g_tbuf = nb;
    g_tcap = cap;
  }
  if (g_tlen > 60000) truth_flush();
}

static int truth_open(int rank, int truncate) {
  if (!O.truth) return 0;
  char path[PATH_MAX];
  const char *p = strstr(O.truth, "%r");
  if (p)
    snprintf(path, sizeof path, "%.*s%d%s", (int)(p - O.truth), O.truth, rank, p + 2);
  else
    snprintf(path, sizeof path, "%s", O.truth);
  int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0);
  g_truth_fd = open(path, flags, 0644);
  if (g_truth_fd < 0) {
    logf_("open truth %s: %s", path, strerror(errno));
    return -1;
  }
  g_tcap = 65536 + 4096;
  g_tbuf = malloc(g_tcap);
  return g_tbuf ? 0 : -1;
}

/* ---------------- idle threads ---------------- */

static pthread_mutex_t g_idle_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_idle_cv = PTHREAD_COND_INITIALIZER;
static int g_idle_stop;

static void *idle_thread(void *arg) {
  char name[16];
  snprintf(name, sizeof name, "ft-idle-%ld", (long)(intptr_t)arg);
  pthread_setname_np(pthread_self(), name);
  pthread_mutex_lock(&g_idle_mu);
  while (!g_idle_stop) pthread_cond_wait(&g_idle_cv, &g_idle_mu);
  pthread_mutex_unlock(&g_idle_mu);
  return NULL;
}

static pthread_t *start_idle_threads(int n) {
  if (n <= 0) return NULL;
  pthread_t *t = calloc((size_t)n, sizeof *t);
  if (!t) return NULL;
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setstacksize(&a, 64 * 1024);
  for (int i = 0; i < n; i++) {
    int e = pthread_create(&t[i], &a, idle_thread, (void *)(intptr_t)i);
    if (e != 0) {
      logf_("pthread_create %d: %s", i, strerror(e));
      t[i] = 0;
    }
  }
  pthread_attr_destroy(&a);
  return t;
}

static void stop_idle_threads(pthread_t *t, int n) {
  if (!t) return;
  pthread_mutex_lock(&g_idle_mu);
  g_idle_stop = 1;
  pthread_cond_broadcast(&g_idle_cv);
  pthread_mutex_unlock(&g_idle_mu);
  for (int i = 0; i < n; i++)
    if (t[i]) pthread_join(t[i], NULL);
  free(t);
}

/* ---------------- the rank ---------------- */

struct rank_ctx {
  int rank, local_rank, world;
  char job[200];
  ncclComm_t world_comm, comm;
  cudaStream_t compute, commst;
  cudaEvent_t ev_step_end, ev_comm_done, ev_base, *ev_bucket;
  uint64_t base_ns;      /* host time at which ev_base was recorded on the idle stream */
  uint64_t device_end_ns; /* device completion of the step's last op, 0 if unknown */
  uint64_t host_end_ns;   /* the step's end on the host: its last call returned */
  void *buf;
  size_t *bucket_count;
  void *pg; /* --backend gloo: the process group */
};

static void do_sync(struct rank_ctx *c) {
  uint64_t t0 = now_ns();
  switch (O.sync) {
  case SYNC_STREAM:
    A.calls[S_cudaStreamSynchronize]++;
    cuda_check(cudaStreamSynchronize(c->compute), "cudaStreamSynchronize");
    break;
  case SYNC_DEVICE:
    A.calls[S_cudaDeviceSynchronize]++;
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    break;
  case SYNC_EVENT:
    A.calls[S_cudaEventSynchronize]++;
    cuda_check(cudaEventSynchronize(c->ev_step_end), "cudaEventSynchronize");
    break;
  case SYNC_CU_STREAM:
    A.calls[S_cuStreamSynchronize]++;
    cu_check(cuStreamSynchronize((CUstream)c->compute), "cuStreamSynchronize");
    break;
  case SYNC_CU_CTX:
    A.calls[S_cuCtxSynchronize]++;
    cu_check(cuCtxSynchronize(), "cuCtxSynchronize");
    break;
  }
  A.sync_ns += now_ns() - t0;
  if (O.device_sync) {
    t0 = now_ns();
    A.calls[S_cudaDeviceSynchronize]++;
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    A.sync_ns += now_ns() - t0;
  }
}

static void allreduce(struct rank_ctx *c, int b, cudaStream_t s) {
  uint64_t t0 = now_ns();
  if (O.gloo) {
    A.calls[S_glooAllreduce]++;
    if (O.gloo_cuda_sync) A.calls[S_cudaStreamSynchronize]++;
    int mode = O.gloo_wait == GLOO_WAIT_FUTURE ? FT_GLOO_KEEP_FUTURE
               : O.gloo_wait == GLOO_WAIT_WORK ? FT_GLOO_KEEP_WORK
                                               : FT_GLOO_NO_WAIT;
    int e = T.Call(c->pg, "allreduce", 4.0 * (double)c->bucket_count[b], s, mode);
    if (e != 0 && !g_failed) {
      logf_("step %ld: ProcessGroupGloo::allreduce: fake GPU error %d", g_cur_step, e);
      g_failed = 1;
    }
    A.nccl_ns += now_ns() - t0;
    return;
  }
  A.calls[S_ncclAllReduce]++;
  nccl_check(N.AllReduce(c->buf, c->buf, c->bucket_count[b], ncclFloat32, ncclSum, c->comm, s), "ncclAllReduce");
  A.nccl_ns += now_ns() - t0;
}

static void group_call(int start) {
  uint64_t t0 = now_ns();
  A.calls[start ? S_ncclGroupStart : S_ncclGroupEnd]++;
  nccl_check(start ? N.GroupStart() : N.GroupEnd(), start ? "ncclGroupStart" : "ncclGroupEnd");
  A.nccl_ns += now_ns() - t0;
}

/* Issue the allreduce of bucket b now (or, with --group, later). */
static void bucket_ready(struct rank_ctx *c, int b) {
  if (O.group) return;
  if (O.comm_stream) {
    A.calls[S_cudaEventRecord]++;
    cuda_check(cudaEventRecord(c->ev_bucket[b], c->compute), "cudaEventRecord");
    A.calls[S_cudaStreamWaitEvent]++;
    cuda_check(cudaStreamWaitEvent(c->commst, c->ev_bucket[b], 0), "cudaStreamWaitEvent");
    allreduce(c, b, c->commst);
  } else {
    allreduce(c, b, c->compute);
  }
}

/* The calls counted since the last truth record, as JSON members. */
static void format_calls(char *calls, size_t cap) {
  size_t n = 0;
  calls[0] = 0;
  for (int i = 0; i < S_NUM; i++) {
    if (!A.calls[i]) continue;
    n += (size_t)snprintf(calls + n, cap - n, "%s\"%s\":%" PRIu64, n ? "," : "", sym_names[i], A.calls[i]);
    if (n >= cap) break;
  }
}

/* ---------------- bursts outside the training iterations ---------------- */

/* Ground truth of a burst: its kind, time span and calls. */
static void write_burst(struct rank_ctx *c, const char *what, long after_step, uint64_t start, uint64_t end) {
  char calls[1024];
  format_calls(calls, sizeof calls);
  truth_printf("{\"kind\":\"burst\",\"what\":\"%s\",\"job\":\"%s\",\"rank\":%d,\"pid\":%d,\"after_step\":%ld,"
               "\"start_ns\":%" PRIu64 ",\"end_ns\":%" PRIu64 ",\"calls\":{%s}}\n",
               what, c->job, c->rank, (int)getpid(), after_step, start, end, calls);
}

static void small_allreduce(struct rank_ctx *c, size_t count) {
  uint64_t t0 = now_ns();
  A.calls[S_ncclAllReduce]++;
  nccl_check(N.AllReduce(c->buf, c->buf, count, ncclFloat32, ncclSum, c->comm, c->compute), "ncclAllReduce");
  A.nccl_ns += now_ns() - t0;
}

static void stream_sync(struct rank_ctx *c) {
  A.calls[S_cudaStreamSynchronize]++;
  cuda_check(cudaStreamSynchronize(c->compute), "cudaStreamSynchronize");
}

/* DDP's init: every parameter broadcast from rank 0 (a transformer's
 * layers repeat their parameter shapes, so the sizes repeat layer by
 * layer), each followed by a synchronisation; then a startup barrier loop.
 * Periodic, brief, and no training iteration. */
static void init_bursts(struct rank_ctx *c) {
  static const size_t layer[] = {3 * 1024 * 1024, 3 * 1024, 1024 * 1024, 1024, 1024, 1024};
  const int layers = 24, barriers = 40;
  memset(&A, 0, sizeof A);
  uint64_t t0 = now_ns();
  for (int l = 0; l < layers; l++) {
    for (size_t i = 0; i < sizeof layer / sizeof layer[0]; i++) {
      uint64_t b0 = now_ns();
      A.calls[S_ncclBroadcast]++;
      nccl_check(N.Broadcast(c->buf, c->buf, layer[i], ncclFloat32, 0, c->comm, c->compute), "ncclBroadcast");
      A.nccl_ns += now_ns() - b0;
      stream_sync(c);
    }
  }
  for (int i = 0; i < barriers; i++) {
    small_allreduce(c, 1);
    stream_sync(c);
  }
  write_burst(c, "init", -1, t0, now_ns());
}

/* An evaluation loop after step k: forward passes with a metric
 * all-reduce and a synchronisation per batch. */
static void eval_burst(struct rank_ctx *c, long k, uint64_t *rng) {
  memset(&A, 0, sizeof A);
  uint64_t t0 = now_ns();
  for (int i = 0; i < O.eval_batches; i++) {
    host_work(jittered(rng, O.step_ms * 0.2));
    launch(fwd_kernel, jittered(rng, O.gpu_ms * 0.2), c->compute);
    small_allreduce(c, 2);
    stream_sync(c);
  }
  write_burst(c, "eval", k, t0, now_ns());
}


/* ---------------- external loop shapes (--loop-shape) ---------------- */

static cudaStream_t g_side; /* cudagraph: the warm-up's side stream */

static void device_sync(void) {
  uint64_t t0 = now_ns();
  A.calls[S_cudaDeviceSynchronize]++;
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  A.sync_ns += now_ns() - t0;
}

static void timed_stream_sync(struct rank_ctx *c, cudaStream_t s) {
  uint64_t t0 = now_ns();
  A.calls[S_cudaStreamSynchronize]++;
  cuda_check(cudaStreamSynchronize(s ? s : c->compute), "cudaStreamSynchronize");
  A.sync_ns += now_ns() - t0;
}

/* model.to("cuda"): a pageable copy and its synchronisation per tensor, a
 * GPT's layers one after another (weights, then small biases). */
static void param_copies(struct rank_ctx *c) {
  static const double tensor_ms[] = {0.2, 0.02, 1.0, 0.3, 1.0, 0.3, 0.02, 0.02, 0.02, 0.02, 0.8, 0.2};
  memset(&A, 0, sizeof A);
  uint64_t t0 = now_ns();
  for (int l = 0; l < 6; l++)
    for (size_t i = 0; i < sizeof tensor_ms / sizeof tensor_ms[0]; i++) {
      host_work(0.05);
      launch(fwd_kernel, tensor_ms[i], c->compute);
      timed_stream_sync(c, 0);
    }
  write_burst(c, "params", -1, t0, now_ns());
}

static void broadcast(struct rank_ctx *c, size_t count) {
  uint64_t t0 = now_ns();
  A.calls[S_ncclBroadcast]++;
  nccl_check(N.Broadcast(c->buf, c->buf, count, ncclFloat32, 0, c->comm, c->compute), "ncclBroadcast");
  A.nccl_ns += now_ns() - t0;
}

/* Before the first iteration, per shape. */
static void shape_init(struct rank_ctx *c) {
  switch (O.shape) {
  case SHAPE_TRAINER:
  case SHAPE_CUDAGRAPH:
    param_copies(c);
    break;
  case SHAPE_COMPILE: {
    param_copies(c);
    memset(&A, 0, sizeof A);
    uint64_t t0 = now_ns();
    broadcast(c, 1 << 20); /* DDP's _sync_module_states */
    broadcast(c, 1024);
    write_burst(c, "init", -1, t0, now_ns());
    break;
  }
  case SHAPE_LIGHTNING: {
    memset(&A, 0, sizeof A);
    uint64_t t0 = now_ns();
    broadcast(c, 1 << 20);
    timed_stream_sync(c, 0);
    write_burst(c, "init", -1, t0, now_ns());
    break;
  }
  case SHAPE_MEGATRON: {
    memset(&A, 0, sizeof A);
    uint64_t t0 = now_ns();
    small_allreduce(c, 1); /* timers("interval-time").start(barrier=True) */
    device_sync();
    write_burst(c, "init", -1, t0, now_ns());
    break;
  }
  default:
    break;
  }
  if (O.shape == SHAPE_CUDAGRAPH) cuda_check(cudaStreamCreate(&g_side), "cudaStreamCreate");
}

/* Forward and backward: host dispatch and device work on stream s, with
 * the bucket all-reduces of --buckets during backward when buckets. */
static void fwd_bwd(struct rank_ctx *c, uint64_t *rng, double host, double gpu, cudaStream_t s, int buckets) {
  host_work(jittered(rng, host * 0.3));
  launch(fwd_kernel, jittered(rng, gpu * 0.3), s);
  int nb = buckets && O.buckets > 0 ? O.buckets : 1;
  if (buckets && g_cur_step == 0 && O.warmup_buckets > 0) nb = O.warmup_buckets; /* before DDP's rebuild */
  for (int b = 0; b < nb; b++) {
    host_work(jittered(rng, host * 0.3 / nb));
    launch(bwd_kernel, jittered(rng, gpu * 0.6 / nb), s);
    if (buckets && O.buckets > 0) allreduce(c, b, s);
  }
}

/* One iteration of an external loop's shape. From --speedup-at on, the
 * host and device work of the iterations is --speedup times less (after a
 * warm-up, a smaller batch), except for the logging steps' (--log-every):
 * they keep their length. */
static void run_shape_step(struct rank_ctx *c, long k, uint64_t *rng) {
  double host = O.step_ms, gpu = O.gpu_ms;
  int logging = (O.shape == SHAPE_TRAINER || O.shape == SHAPE_LIGHTNING) && O.log_every > 0 && (k + 1) % O.log_every == 0;
  if (O.speedup_at >= 0 && k >= O.speedup_at && !logging) {
    host /= O.speedup;
    gpu /= O.speedup;
  }
  switch (O.shape) {
  case SHAPE_TRAINER:
    /* data: the batch's token count and two more .item()s */
    host_work(jittered(rng, host * 0.1));
    timed_stream_sync(c, 0);
    timed_stream_sync(c, 0);
    host_work(jittered(rng, host * 0.1));
    timed_stream_sync(c, 0);
    fwd_bwd(c, rng, host * 0.6, gpu * 0.9, c->compute, 0);
    timed_stream_sync(c, 0); /* the nan check of the loss: waits for backward */
    launch(opt_kernel, jittered(rng, gpu * 0.05), c->compute);
    timed_stream_sync(c, 0); /* grad_norm.item() */
    host_work(jittered(rng, host * 0.1));
    launch(opt_kernel, jittered(rng, gpu * 0.05), c->compute);
    if (logging) {
      uint64_t t0 = now_ns();
      A.calls[S_ncclAllGather]++; /* the logged loss, gathered */
      nccl_check(N.AllGather(c->buf, c->buf, 1, ncclFloat32, c->comm, c->compute), "ncclAllGather");
      A.nccl_ns += now_ns() - t0;
      for (int i = 0; i < 100; i++) {
        host_work(0.05);
        timed_stream_sync(c, 0);
      }
    }
    break;
  case SHAPE_MEGATRON:
    device_sync(); /* timers("forward-backward").start() */
    fwd_bwd(c, rng, host * 0.9, gpu * 0.95, c->compute, 1);
    device_sync(); /* .stop(): waits for backward */
    small_allreduce(c, 1); /* the grad norm */
    device_sync();         /* timers("optimizer").start() */
    host_work(jittered(rng, host * 0.02));
    launch(opt_kernel, jittered(rng, gpu * 0.05), c->compute);
    small_allreduce(c, 1); /* interval-time elapsed(barrier=True) */
    device_sync();
    timed_stream_sync(c, 0); /* float(loss) */
    break;
  case SHAPE_LIGHTNING:
    fwd_bwd(c, rng, host * 0.9, gpu * 0.9, c->compute, 1);
    host_work(jittered(rng, host * 0.1));
    launch(opt_kernel, jittered(rng, gpu * 0.1), c->compute);
    if (logging) timed_stream_sync(c, 0); /* logging */
    break;
  case SHAPE_CUDAGRAPH:
    if (k < 3) { /* eager warm-up on the side stream; loss.item() there */
      fwd_bwd(c, rng, host * 0.9, gpu, g_side, 0);
      timed_stream_sync(c, g_side);
      host_work(jittered(rng, host * 0.1));
      break;
    }
    if (k == 3) host_work(host * 5); /* the capture: no synchronisation allowed */
    host_work(jittered(rng, host * 0.05));
    launch(fwd_kernel, jittered(rng, gpu), c->compute); /* graph.replay() */
    timed_stream_sync(c, 0);
    break;
  case SHAPE_COMPILE:
    if (k == 0) host_work(host * 30); /* compilation */
    fwd_bwd(c, rng, host * 0.9, gpu * 0.9, c->compute, 1);
    host_work(jittered(rng, host * 0.1));
    launch(opt_kernel, jittered(rng, gpu * 0.1), c->compute);
    timed_stream_sync(c, 0); /* loss.item() */
    break;
  default:
    break;
  }
}

/* --epilogue: the transformers Trainer's end of training on the H200, after
 * its last iteration (bench/results/raw/ext-loops/run2): another kind of
 * synchronisation, a wait of ~30 iterations' time with a few
 * synchronisations, then a burst of 67 groups of five within ~17 ms (four
 * back to back, the fifth after a short host gap). No iteration. */
static void trainer_epilogue(struct rank_ctx *c) {
  memset(&A, 0, sizeof A);
  uint64_t t0 = now_ns();
  device_sync();
  for (int i = 0; i < 4; i++) {
    host_work(O.step_ms * 0.5);
    timed_stream_sync(c, 0);
  }
  host_work(O.step_ms * 4);
  timed_stream_sync(c, 0);
  for (int i = 0; i < 4; i++) timed_stream_sync(c, 0);
  host_work(O.step_ms * 25);
  timed_stream_sync(c, 0);
  for (int g = 0; g < 67; g++) {
    for (int i = 0; i < 4; i++) timed_stream_sync(c, 0);
    host_work(0.2);
    timed_stream_sync(c, 0);
  }
  write_burst(c, "epilogue", -1, t0, now_ns());
}

static void run_step(struct rank_ctx *c, long k, uint64_t *rng) {
  if (O.shape != SHAPE_NONE) {
    run_shape_step(c, k, rng);
    return;
  }
  double stall_ms;
  int slowed = slowed_at(c->rank, k, &stall_ms);
  double f = slowed ? O.slow_factor : 1.0;
  double host = O.step_ms * f, gpu = O.gpu_ms * f;
  double inj_host = slowed ? stall_ms : 0, inj_gpu = slowed ? O.slow_gpu_ms : 0;
  int K = O.kernels, B = k == 0 && O.warmup_buckets > 0 ? O.warmup_buckets : O.buckets;

  if (O.bcast) {
    uint64_t t0 = now_ns();
    A.calls[S_ncclBcast]++;
    nccl_check(N.Bcast(c->buf, 1, ncclFloat32, 0, c->comm, c->compute), "ncclBcast");
    A.nccl_ns += now_ns() - t0;
  }
  /* data loading (+ injected host stall) */
  host_work(jittered(rng, host * 0.3) + inj_host);
  if (O.alltoall) {
    /* MoE's token dispatch, first in the forward pass: one call to the
     * uprobes; NCCL 2.28 appends it as a Send and a Recv task per peer
     * (test/fakelibs/ncclprof.c), nothing naming it reaches the plugin. */
    uint64_t t0 = now_ns();
    A.calls[S_ncclAlltoAll]++;
    nccl_check(N.AlltoAll(c->buf, c->buf, 256, ncclFloat32, c->comm, c->compute), "ncclAlltoAll");
    A.nccl_ns += now_ns() - t0;
  }
  /* forward: 30% of host dispatch, 30% of device time */
  for (int i = 0; i < K; i++) {
    host_work(jittered(rng, host * 0.3 / K));
    launch(fwd_kernel, jittered(rng, gpu * 0.3 / K), c->compute);
  }
  if (K == 0) host_work(jittered(rng, host * 0.3));
  /* backward: one kernel then one bucket allreduce per bucket */
  if (inj_gpu > 0) launch(stall_kernel, inj_gpu, c->compute);
  int nb = B > 0 ? B : 1;
  for (int b = 0; b < nb; b++) {
    host_work(jittered(rng, host * 0.3 / nb));
    launch(bwd_kernel, jittered(rng, gpu * 0.6 / nb), c->compute);
    if (B > 0) bucket_ready(c, b);
  }
  if (O.group && B > 0) {
    cudaStream_t s = c->compute;
    if (O.comm_stream) {
      A.calls[S_cudaEventRecord]++;
      cuda_check(cudaEventRecord(c->ev_bucket[0], c->compute), "cudaEventRecord");
      A.calls[S_cudaStreamWaitEvent]++;
      cuda_check(cudaStreamWaitEvent(c->commst, c->ev_bucket[0], 0), "cudaStreamWaitEvent");
      s = c->commst;
    }
    group_call(1);
    for (int b = 0; b < B; b++) allreduce(c, b, s);
    group_call(0);
  }
  if (O.gloo && B > 0 && O.gloo_wait == GLOO_WAIT_DEVICE) /* the optimizer's stream waits for the buckets */
    cuda_check(T.Join(c->pg, c->compute) == 0 ? cudaSuccess : cudaErrorLaunchFailure, "gloo join");
  if (O.gloo && B > 0 && O.gloo_wait != GLOO_WAIT_DEVICE) {
    /* DDP's finalize_backward: the host waits for each bucket in turn. */
    uint64_t t0 = now_ns();
    A.calls[O.gloo_wait == GLOO_WAIT_FUTURE ? S_futureWait : S_workWait] += (uint64_t)B;
    int e = T.Finalize(c->pg, c->compute);
    A.coll_wait_ns += now_ns() - t0;
    if (e != 0 && !g_failed) {
      logf_("step %ld: gloo %s wait: fake GPU error %d", g_cur_step, gloo_wait_names[O.gloo_wait], e);
      g_failed = 1;
    }
  }
  if (O.comm_stream && B > 0) {
    A.calls[S_cudaEventRecord]++;
    cuda_check(cudaEventRecord(c->ev_comm_done, c->commst), "cudaEventRecord");
    A.calls[S_cudaStreamWaitEvent]++;
    cuda_check(cudaStreamWaitEvent(c->compute, c->ev_comm_done, 0), "cudaStreamWaitEvent");
  }
  /* optimizer */
  host_work(jittered(rng, host * 0.1));
  launch(opt_kernel, jittered(rng, gpu * 0.1), c->compute);
  if (O.sync == SYNC_EVENT || !O.no_device_truth) {
    A.calls[S_cudaEventRecord]++;
    cuda_check(cudaEventRecord(c->ev_step_end, c->compute), "cudaEventRecord");
  }
  do_sync(c);
  /* Read before cudaEventElapsedTime, which takes the fake GPU's lock that
   * every rank's process shares: a preemption in there would put the truth's
   * end milliseconds after the call that ended the step. */
  c->host_end_ns = now_ns();
  c->device_end_ns = 0;
  if (!O.no_device_truth && !g_failed) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, c->ev_base, c->ev_step_end) == cudaSuccess)
      c->device_end_ns = c->base_ns + (uint64_t)llround((double)ms * 1e6);
  }
}

/* The stream is idle at the start of a step, so an event recorded now
 * completes at its enqueue time: bracket it with host clock reads to get a
 * device-clock reference (retried when the thread was preempted). */
static void rebase(struct rank_ctx *c) {
  if (O.no_device_truth) return;
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < 3 && best > 50000; i++) {
    uint64_t a = now_ns();
    A.calls[S_cudaEventRecord]++;
    cuda_check(cudaEventRecord(c->ev_base, c->compute), "cudaEventRecord");
    uint64_t b = now_ns();
    if (b - a < best) {
      best = b - a;
      c->base_ns = a + (b - a) / 2;
    }
  }
}

static void write_step(struct rank_ctx *c, long k, uint64_t start, uint64_t end, int slowed) {
  double step = ms_of(end - start), sync = ms_of(A.sync_ns), collw = ms_of(A.coll_wait_ns), stall_ms;
  slowed_at(c->rank, k, &stall_ms);
  char dev[64] = "";
  if (c->device_end_ns) snprintf(dev, sizeof dev, "\"device_end_ns\":%" PRIu64 ",", c->device_end_ns);
  char calls[1024];
  format_calls(calls, sizeof calls);
  truth_printf("{\"kind\":\"step\",\"job\":\"%s\",\"rank\":%d,\"local_rank\":%d,\"world\":%d,\"pid\":%d,"
               "\"tid\":%d,\"step\":%ld,\"start_ns\":%" PRIu64 ",\"end_ns\":%" PRIu64 ",\"step_ms\":%.6f,"
               "\"host_ms\":%.6f,\"host_work_ms\":%.6f,\"sync_wait_ms\":%.6f,\"coll_wait_ms\":%.6f,"
               "\"nccl_ms\":%.6f,\"gpu_ms\":%.6f,"
               "\"slowed\":%s,\"injected_host_ms\":%.6f,\"injected_gpu_ms\":%.6f,%s\"calls\":{%s}}\n",
               c->job, c->rank, c->local_rank, c->world, (int)getpid(), (int)syscall(SYS_gettid), k, start, end,
               step, step - sync - collw, ms_of(A.host_ns), sync, collw, ms_of(A.nccl_ns), ms_of(A.gpu_ns),
               slowed ? "true" : "false", slowed ? stall_ms : 0.0, slowed ? O.slow_gpu_ms : 0.0, dev, calls);
  if (O.verbose)
    logf_("step %ld: step=%.3fms host=%.3fms sync_wait=%.3fms coll_wait=%.3fms%s", k, step, step - sync - collw,
          sync, collw, slowed ? " (slowed)" : "");
}

static void noop_target(void) __attribute__((noinline));
static void noop_target(void) { __asm__ volatile("" ::: "memory"); }

static int run_bench(struct rank_ctx *c) {
  const char *sym = O.bench_symbol;
  long n = O.bench_calls;
  const long batch = 256; /* device work is flushed between batches, outside the timed part */
  long warm = n < 1000 ? n : 1000;
  uint64_t timed = 0;
  int recorded = 0;
  enum { B_UNKNOWN, B_LAUNCH, B_SSYNC, B_DSYNC, B_EREC, B_ESYNC, B_SQUERY, B_GETDEV, B_CUSSYNC, B_CUCSYNC,
         B_CUESYNC, B_AR, B_BC, B_AG, B_RS, B_GROUP, B_COUNT, B_NOOP } kind = B_UNKNOWN;
  static const struct { const char *name; int kind; } table[] = {
      {"cudaLaunchKernel", B_LAUNCH}, {"cudaStreamSynchronize", B_SSYNC}, {"cudaDeviceSynchronize", B_DSYNC},
      {"cudaEventRecord", B_EREC}, {"cudaEventSynchronize", B_ESYNC}, {"cudaStreamQuery", B_SQUERY},
      {"cudaGetDevice", B_GETDEV}, {"cuStreamSynchronize", B_CUSSYNC}, {"cuCtxSynchronize", B_CUCSYNC},
      {"cuEventSynchronize", B_CUESYNC}, {"ncclAllReduce", B_AR}, {"ncclBroadcast", B_BC},
      {"ncclAllGather", B_AG}, {"ncclReduceScatter", B_RS}, {"ncclGroupStart", B_GROUP},
      {"ncclGroupEnd", B_GROUP}, {"ncclCommCount", B_COUNT}, {"noop", B_NOOP},
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strcmp(sym, table[i].name) == 0) kind = table[i].kind;
  if (kind == B_UNKNOWN) {
    logf_("unknown --bench-symbol %s", sym);
    return EXIT_USAGE;
  }
  dim3 grid = {1, 1, 1}, block = {32, 1, 1};
  void *args[1] = {NULL};
  int cnt = 0;
  for (int phase = 0; phase < 2 && !g_failed; phase++) {
    long total = phase == 0 ? warm : n;
    for (long done = 0; done < total && !g_failed; done += batch) {
      long m = total - done < batch ? total - done : batch;
      uint64_t t0 = now_ns();
      for (long i = 0; i < m; i++) {
        switch (kind) {
        case B_LAUNCH: cudaLaunchKernel((const void *)fwd_kernel, grid, block, args, 0, c->compute); break;
        case B_SSYNC: cudaStreamSynchronize(c->compute); break;
        case B_DSYNC: cudaDeviceSynchronize(); break;
        case B_EREC: cudaEventRecord(c->ev_step_end, c->compute); break;
        case B_ESYNC: cudaEventSynchronize(c->ev_step_end); break;
        case B_SQUERY: cudaStreamQuery(c->compute); break;
        case B_GETDEV: { int d; cudaGetDevice(&d); break; }
        case B_CUSSYNC: cuStreamSynchronize((CUstream)c->compute); break;
        case B_CUCSYNC: cuCtxSynchronize(); break;
        case B_CUESYNC: cuEventSynchronize((CUevent)c->ev_step_end); break;
        case B_AR: N.AllReduce(c->buf, c->buf, 1024, ncclFloat32, ncclSum, c->comm, c->compute); break;
        case B_BC: N.Broadcast(c->buf, c->buf, 1024, ncclFloat32, 0, c->comm, c->compute); break;
        case B_AG: N.AllGather(c->buf, c->buf, 1024, ncclFloat32, c->comm, c->compute); break;
        case B_RS: N.ReduceScatter(c->buf, c->buf, 1024, ncclFloat32, ncclSum, c->comm, c->compute); break;
        case B_GROUP: N.GroupStart(); N.GroupEnd(); break;
        case B_COUNT: N.CommCount(c->comm, &cnt); break;
        case B_NOOP: noop_target(); break;
        default: break;
        }
      }
      uint64_t t1 = now_ns();
      if (phase == 1) timed += t1 - t0;
      if (kind == B_ESYNC || kind == B_CUESYNC) {
        if (!recorded) {
          cuda_check(cudaEventRecord(c->ev_step_end, c->compute), "cudaEventRecord");
          recorded = 1;
        }
      }
      cuda_check(cudaStreamSynchronize(c->compute), "cudaStreamSynchronize");
    }
  }
  if (g_failed) return EXIT_DEVICE;
  printf("{\"kind\":\"bench\",\"rank\":%d,\"symbol\":\"%s\",\"calls\":%ld,\"total_ns\":%" PRIu64
         ",\"ns_per_call\":%.2f,\"nccl\":\"%s\"}\n",
         c->rank, sym, n, timed, n ? (double)timed / (double)n : 0.0, g_nccl_mode);
  fflush(stdout);
  return EXIT_OK;
}

/* --workers: children of the rank that inherit its environment and
 * mappings and call nothing (they die with the rank). */
static pid_t g_workers[64];
static void fork_workers(void) {
  pid_t parent = getpid();
  for (int i = 0; i < O.workers; i++) {
    pid_t pid = fork();
    if (pid < 0) {
      logf_("fork worker: %s", strerror(errno));
      return;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(0);
      for (;;) pause();
    }
    g_workers[i] = pid;
  }
}

static void reap_workers(void) {
  for (int i = 0; i < O.workers; i++) {
    if (g_workers[i] > 0) {
      kill(g_workers[i], SIGKILL);
      waitpid(g_workers[i], NULL, 0);
    }
  }
}

/* The world communicator (rank 0 publishes the unique id in the store). */
static int init_nccl(struct rank_ctx *c, struct store *st, int *crank, int *ccount) {
  ncclUniqueId id;
  if (c->rank == 0) {
    nccl_check(N.GetUniqueId(&st->id), "ncclGetUniqueId");
    if (g_failed) return -1;
    __atomic_store_n(&st->ready, STORE_READY, __ATOMIC_RELEASE);
  }
  memcpy(&id, &st->id, sizeof id);
  if (O.init_plain) {
    nccl_check(N.CommInitRank(&c->world_comm, c->world, id, c->rank), "ncclCommInitRank");
  } else {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.commName = "faketrainer-world";
    nccl_check(N.CommInitRankConfig(&c->world_comm, c->world, id, c->rank, &cfg), "ncclCommInitRankConfig");
  }
  if (g_failed) return -1;
  if (c->rank == 0) {
    char name[512];
    snprintf(name, sizeof name, "/slowrank-fake-store-%s", c->job);
    shm_unlink(name); /* everyone joined, so everyone has it mapped */
  }
  c->comm = c->world_comm;
  if (O.split) {
    nccl_check(N.CommSplit(c->world_comm, 0, c->rank, &c->comm, NULL), "ncclCommSplit");
    if (g_failed) return -1;
  }
  nccl_check(N.CommUserRank(c->comm, crank), "ncclCommUserRank");
  nccl_check(N.CommCount(c->comm, ccount), "ncclCommCount");
  return g_failed ? -1 : 0;
}

/* --split-at: a communicator created mid-run, as a late process group is:
 * every rank of world calls ncclCommSplit at the same step (it is
 * collective over the parent), then the collectives go to the new one. */
static int late_split(struct rank_ctx *c, long k) {
  ncclComm_t n = NULL;
  nccl_check(N.CommSplit(c->world_comm, 0, c->rank, &n, NULL), "ncclCommSplit");
  if (g_failed) return -1;
  c->comm = n;
  truth_printf("{\"kind\":\"comm\",\"job\":\"%s\",\"rank\":%d,\"pid\":%d,\"comm\":\"%p\",\"from_step\":%ld}\n", c->job,
               c->rank, (int)getpid(), (void *)n, k);
  truth_flush();
  return 0;
}

/* The gloo process group of the fake libtorch_cpu.so. */
static int init_gloo(struct rank_ctx *c, struct store *st, int *crank, int *ccount) {
  if (c->rank == 0) __atomic_store_n(&st->ready, STORE_READY, __ATOMIC_RELEASE);
  if (O.gloo_cuda_sync) setenv("SLOWRANK_FAKE_GLOO_CUDA_SYNC", "1", 1);
  c->pg = T.New(c->job, c->world, c->rank);
  if (!c->pg) {
    logf_("ProcessGroupGloo: joining the fake process group failed");
    return -1;
  }
  if (c->rank == 0) {
    char name[512];
    snprintf(name, sizeof name, "/slowrank-fake-store-%s", c->job);
    shm_unlink(name); /* everyone joined, so everyone has it mapped */
  }
  g_nccl_mode = "none";
  *crank = c->rank;
  *ccount = c->world;
  return 0;
}

static int rank_main(char **argv) {
  struct rank_ctx ctx;
  memset(&ctx, 0, sizeof ctx);
  struct rank_ctx *c = &ctx;
  c->rank = env_int("RANK", 0);
  c->local_rank = env_int("LOCAL_RANK", c->rank);
  c->world = env_int("WORLD_SIZE", 1);
  g_rank = c->rank;
  job_id(c->job, sizeof c->job);
  if (c->world < 1 || c->world > 64 || c->rank < 0 || c->rank >= c->world) {
    logf_("bad RANK=%d WORLD_SIZE=%d", c->rank, c->world);
    return EXIT_USAGE;
  }
#if FT_LINKED_NCCL
  if (O.dlopen_nccl) {
    /* Become the variant without DT_NEEDED libnccl.so.2 (same pid). */
    char exe[PATH_MAX], path[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
      exe[n] = 0;
      char *slash = strrchr(exe, '/');
      if (slash) *slash = 0;
      snprintf(path, sizeof path, "%s/faketrainer-dlopen", exe);
      execv(path, argv);
      logf_("exec %s: %s", path, strerror(errno));
    }
    return EXIT_USAGE;
  }
#else
  (void)argv;
#endif
  if (O.duration_s > 0 && c->world > 1 && O.buckets == 0) {
    logf_("--duration with several ranks needs --buckets >= 1");
    return EXIT_USAGE;
  }
  {
    const char *v = getenv("SLOWRANK_FAKE_GPU_SCALE");
    if (v && *v && atof(v) > 0) g_gpu_scale = atof(v);
  }
  if (truth_open(c->rank, 0) != 0) return EXIT_IO;
  pthread_t *idle = start_idle_threads(O.threads);

  /* torch's libraries are mapped at `import torch`, before anything runs. */
  if (O.gloo && load_torch() != 0) return EXIT_DEVICE;
  sleep_ns((uint64_t)(O.sleep_before_ms * 1e6));
  uint64_t t_init0 = now_ns();

  /* CUDA first, as a framework does. */
  int ndev = 0;
  cuda_check(cudaGetDeviceCount(&ndev), "cudaGetDeviceCount");
  if (ndev > 0) cuda_check(cudaSetDevice(c->local_rank % ndev), "cudaSetDevice");
  cuda_check(cudaStreamCreate(&c->compute), "cudaStreamCreate");
  if (O.comm_stream) cuda_check(cudaStreamCreateWithFlags(&c->commst, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda_check(cudaEventCreate(&c->ev_step_end), "cudaEventCreate");
  cuda_check(cudaEventCreate(&c->ev_comm_done), "cudaEventCreate");
  cuda_check(cudaEventCreate(&c->ev_base), "cudaEventCreate");
  int nb = O.buckets > O.warmup_buckets ? O.buckets : O.warmup_buckets;
  if (nb < 1) nb = 1;
  c->ev_bucket = calloc((size_t)nb, sizeof *c->ev_bucket);
  c->bucket_count = calloc((size_t)nb, sizeof *c->bucket_count);
  if (!c->ev_bucket || !c->bucket_count) return EXIT_DEVICE;
  for (int b = 0; b < nb; b++) {
    if (O.comm_stream) cuda_check(cudaEventCreate(&c->ev_bucket[b]), "cudaEventCreate");
    double floats = O.bucket_mb * 1048576.0 / 4.0 * (double)(nb - b) / (double)nb;
    c->bucket_count[b] = (size_t)floats + (size_t)b + 1; /* distinct counts */
  }
  cuda_check(cudaMalloc(&c->buf, 4096), "cudaMalloc");
  if (g_failed) return EXIT_DEVICE;

  if (!FT_LINKED_NCCL) sleep_ns((uint64_t)(O.dlopen_delay_ms * 1e6));
  if (!O.gloo && load_nccl() != 0) return EXIT_DEVICE;

  struct store *st = open_store(c->rank, c->job);
  if (!st) return EXIT_DEVICE;
  int crank = -1, ccount = -1;
  if ((O.gloo ? init_gloo(c, st, &crank, &ccount) : init_nccl(c, st, &crank, &ccount)) != 0) return EXIT_DEVICE;

  truth_printf("{\"kind\":\"rank\",\"job\":\"%s\",\"rank\":%d,\"local_rank\":%d,\"world\":%d,\"pid\":%d,"
               "\"tid\":%d,\"comm\":\"%p\",\"world_comm\":\"%p\",\"comm_rank\":%d,\"comm_size\":%d,"
               "\"stream\":\"%p\",\"nccl\":\"%s\",\"sync\":\"%s\",\"init_start_ns\":%" PRIu64
               ",\"init_end_ns\":%" PRIu64 "}\n",
               c->job, c->rank, c->local_rank, c->world, (int)getpid(), (int)syscall(SYS_gettid),
               O.gloo ? c->pg : (void *)c->comm, O.gloo ? c->pg : (void *)c->world_comm, crank, ccount, (void *)c->compute, g_nccl_mode, sync_names[O.sync], t_init0,
               now_ns());
  truth_flush();
  fork_workers();

  int rc = EXIT_OK;
  long steps_done = 0;
  if (O.bench_calls > 0) {
    rc = run_bench(c);
  } else {
    uint64_t rng = O.seed * 0x9e3779b97f4a7c15ull ^ ((uint64_t)c->rank << 32 | 0x5bd1e995u);
    if (O.init_bursts) init_bursts(c);
    if (O.shape != SHAPE_NONE) shape_init(c);
    if (g_failed) rc = EXIT_DEVICE;
    uint64_t t_run0 = now_ns();
    for (long k = 0; rc == EXIT_OK; k++) {
      if (O.duration_s > 0) {
        if (c->rank == 0 && __atomic_load_n(&st->stop_at, __ATOMIC_ACQUIRE) == 0 &&
            (double)(now_ns() - t_run0) >= O.duration_s * 1e9)
          __atomic_store_n(&st->stop_at, (int64_t)k + 1, __ATOMIC_RELEASE);
        int64_t stop = __atomic_load_n(&st->stop_at, __ATOMIC_ACQUIRE);
        if (stop > 0 && k >= stop) break;
      } else if (k >= O.steps) {
        break;
      }
      g_cur_step = k;
      if (c->rank == O.crash_rank && k == O.crash_step) {
        truth_flush();
        logf_("crash injected at step %ld", k);
        _exit(EXIT_CRASH);
      }
      if (k == O.split_at && late_split(c, k) != 0) {
        rc = EXIT_DEVICE;
        break;
      }
      memset(&A, 0, sizeof A);
      double stall_ms;
      int slowed = slowed_at(c->rank, k, &stall_ms);
      uint64_t t0 = now_ns();
      rebase(c);
      c->host_end_ns = 0;
      run_step(c, k, &rng);
      uint64_t t1 = c->host_end_ns ? c->host_end_ns : now_ns(); /* shapes end where they return */
      if (g_failed) {
        rc = EXIT_DEVICE;
        break;
      }
      write_step(c, k, t0, t1, slowed);
      steps_done++;
      if (O.eval_every > 0 && (k + 1) % O.eval_every == 0) {
        eval_burst(c, k, &rng);
        if (g_failed) {
          rc = EXIT_DEVICE;
          break;
        }
      }
    }
  }
  if (rc == EXIT_OK && O.epilogue && O.shape == SHAPE_TRAINER) {
    trainer_epilogue(c);
    if (g_failed) rc = EXIT_DEVICE;
  }
  g_cur_step = -1;
  truth_printf("{\"kind\":\"done\",\"job\":\"%s\",\"rank\":%d,\"pid\":%d,\"steps\":%ld,\"exit\":%d}\n", c->job,
               c->rank, (int)getpid(), steps_done, rc);
  truth_flush();
  if (rc == EXIT_OK && O.gloo) {
    T.Free(c->pg);
  } else if (rc == EXIT_OK) {
    if (c->comm != c->world_comm) nccl_check(N.CommDestroy(c->comm), "ncclCommDestroy");
    nccl_check(N.CommDestroy(c->world_comm), "ncclCommDestroy");
    if (g_failed) rc = EXIT_DEVICE;
  }
  stop_idle_threads(idle, O.threads);
  reap_workers();
  if (g_truth_fd >= 0) close(g_truth_fd);
  return rc;
}

/* ---------------- launcher ---------------- */

static volatile sig_atomic_t g_sig;
static void on_signal(int s) { g_sig = s; }

static int launcher_main(char **argv) {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) {
    logf_("readlink /proc/self/exe: %s", strerror(errno));
    return EXIT_USAGE;
  }
  exe[n] = 0;
  char job[200];
  const char *j = getenv("SLOWRANK_FAKE_JOB");
  if (j && *j)
    sanitize(job, sizeof job, j);
  else
    snprintf(job, sizeof job, "ft-%d-%" PRIu64, (int)getpid(), now_ns());
  int port = env_int("MASTER_PORT", 0);
  if (port <= 0) port = 29500 + (int)(getpid() % 20000);
  if (O.truth && !strstr(O.truth, "%r")) {
    int fd = open(O.truth, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      logf_("open truth %s: %s", O.truth, strerror(errno));
      return EXIT_IO;
    }
    close(fd);
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);

  int W = O.ranks;
  pid_t *pids = calloc((size_t)W, sizeof *pids);
  if (!pids) return EXIT_DEVICE;
  char sbuf[64];
  for (int r = 0; r < W; r++) {
    pid_t pid = fork();
    if (pid < 0) {
      logf_("fork: %s", strerror(errno));
      for (int i = 0; i < r; i++) kill(pids[i], SIGKILL);
      return EXIT_DEVICE;
    }
    if (pid == 0) {
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      snprintf(sbuf, sizeof sbuf, "%d", r);
      setenv("RANK", sbuf, 1);
      setenv("LOCAL_RANK", sbuf, 1);
      setenv("GROUP_RANK", "0", 1);
      setenv("ROLE_RANK", sbuf, 1);
      snprintf(sbuf, sizeof sbuf, "%d", W);
      setenv("WORLD_SIZE", sbuf, 1);
      setenv("LOCAL_WORLD_SIZE", sbuf, 1);
      setenv("ROLE_WORLD_SIZE", sbuf, 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      snprintf(sbuf, sizeof sbuf, "%d", port);
      setenv("MASTER_PORT", sbuf, 1);
      setenv("TORCHELASTIC_RUN_ID", job, 1);
      setenv("SLOWRANK_FAKE_JOB", job, 1);
      execv(exe, argv);
      fprintf(stderr, "faketrainer: exec %s: %s\n", exe, strerror(errno));
      _exit(127);
    }
    pids[r] = pid;
  }
  /* Wait for every rank; after the first failure give the others time to
   * notice (the fake libraries detect a dead peer within ~50 ms), then kill. */
  int rc = EXIT_OK, left = W, killed = 0;
  uint64_t fail_at = 0;
  const uint64_t grace = timeout_ns() + 5000000000ull;
  while (left > 0) {
    int status;
    pid_t p = waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      int r = -1;
      for (int i = 0; i < W; i++)
        if (pids[i] == p) r = i;
      if (r < 0) continue;
      pids[r] = 0;
      left--;
      int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (code != 0) {
        if (O.verbose || !killed) logf_("rank %d (pid %d) exited with status %d", r, (int)p, code);
        if (rc == EXIT_OK) rc = code;
        if (!fail_at) fail_at = now_ns();
      }
      continue;
    }
    if (p < 0 && errno != EINTR) break;
    if (g_sig && !killed) {
      for (int i = 0; i < W; i++)
        if (pids[i]) kill(pids[i], g_sig);
      killed = 1;
      if (rc == EXIT_OK) rc = 128 + g_sig;
    }
    if (fail_at && !killed && now_ns() - fail_at > grace) {
      logf_("killing ranks still running %.1fs after a failure", (double)grace / 1e9);
      for (int i = 0; i < W; i++)
        if (pids[i]) kill(pids[i], SIGKILL);
      killed = 1;
    }
    sleep_ns(2000000);
  }
  free(pids);
  return rc;
}

/* The fake libraries found beside this binary, or a clear error: GPU hosts
 * set LD_LIBRARY_PATH to the driver's libraries, and the loader searches it
 * before our DT_RUNPATH, so the real libcuda.so.1 would be bound and the
 * fake libcudart die at its first call ("undefined symbol
 * slowrank_fake_init", exit 127). A bench on such a host then measures
 * nothing. */
static int check_fake_libs(void) {
  if (dlsym(RTLD_DEFAULT, "slowrank_fake_init") != NULL) return 0;
  Dl_info info;
  void *cu = dlsym(RTLD_DEFAULT, "cuInit");
  const char *from = cu && dladdr(cu, &info) && info.dli_fname ? info.dli_fname : "?";
  const char *llp = getenv("LD_LIBRARY_PATH");
  fprintf(stderr,
          "faketrainer: libcuda.so.1 came from %s, not the fake libraries beside this binary "
          "(LD_LIBRARY_PATH=%s is searched before its RUNPATH); run it with LD_LIBRARY_PATH unset "
          "or pointing at fake libraries\n",
          from, llp ? llp : "");
  return -1;
}

int main(int argc, char **argv) {
  if (check_fake_libs() != 0) return EXIT_USAGE;
  if (parse_opts(argc, argv) != 0) return EXIT_USAGE;
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (getenv("RANK") && *getenv("RANK")) return rank_main(argv);
  return launcher_main(argv);
}
