//go:build ignore

/*
 * fakegpu.c — the simulated GPUs of one fake training job (part of the fake
 * libcuda.so.1). See fakegpu.h for the interface and README.md for the model.
 *
 * Layout: one POSIX shared-memory segment per job holds, under one robust
 * process-shared mutex,
 *   - a process table; each rank process owns FG_MAX_STREAMS stream rings of
 *     queued operations and FG_MAX_EVENTS events,
 *   - a communicator table; each communicator holds rings of collective and
 *     point-to-point instances with every participant's arrival time.
 * An operation's completion time is derived, never measured:
 *   start = max(previous op's completion, enqueue time)
 *   kernel: start + device time; marker: start;
 *   communication: max over its instances of (latest arrival + transfer time),
 *   where a rank "arrives" at an instance when its stream reaches the op.
 * Whoever waits resolves every stream it can (progress_all), so no rank needs
 * a peer's host thread to make device progress. Waiters block on a futex in
 * the segment (bounded slices) and sleep until the resolved completion time.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fakegpu.h"

#define FG_MAGIC 0x4b4e4152574f4c53ULL /* "SLOWRANK" */
#define FG_LAYOUT_VERSION 1u
#define FG_MAX_PROCS 64
#define FG_MAX_STREAMS 8
#define FG_RING 512
#define FG_MAX_EVENTS 128
#define FG_GROUP_MAX 4
#define FG_MAX_COMMS 64
#define FG_COLL_RING 64
#define FG_P2P_RING 256
#define FG_WAIT_SLICE_NS 20000000ull /* futex wait slice */
#define FG_PEER_CHECK_NS 20000000ull /* liveness check period */
#define FG_STREAM_MAGIC 0x5354524du
#define FG_EVENT_MAGIC 0x4556454eu

enum { OP_KERNEL = 1, OP_COMM = 2, OP_MARKER = 3, OP_WAITEV = 4 };
enum { PROC_FREE = 0, PROC_ALIVE = 1 };
enum { COMM_FREE = 0, COMM_FORMING = 1, COMM_READY = 2, COMM_BROKEN = 3 };
enum { ST_FREE = 0, ST_USED = 1, ST_DESTROYING = 2 };

struct fg_iref {
  uint16_t comm;
  uint8_t kind;
  uint8_t part; /* rank (collective) or side (p2p: 0 send, 1 recv) */
  uint32_t slot;
  uint64_t tag;
};

struct fg_op {
  uint8_t type;
  uint8_t ninst;
  uint8_t published; /* bit i: arrival published for inst[i] */
  uint8_t pad0;
  uint32_t aux; /* event index (MARKER, WAITEV) */
  uint64_t enq_ns;
  uint64_t arg; /* KERNEL: device ns; MARKER/WAITEV: event generation */
  uint64_t comp_ns;
  struct fg_iref inst[FG_GROUP_MAX];
};

struct fg_stream_sh {
  uint32_t state;
  uint32_t pad;
  uint64_t count;     /* operations enqueued */
  uint64_t resolved;  /* operations with a known completion time */
  uint64_t last_comp; /* completion of operation resolved-1 */
  struct fg_op ring[FG_RING];
};

struct fg_event_sh {
  uint32_t used;
  int32_t stream;   /* stream of the latest record, -1 if never recorded */
  uint64_t rec_gen; /* generations stay monotonic across slot reuse */
  uint64_t done_gen;
  uint64_t comp_ns;
};

struct fg_proc {
  int32_t pid;
  uint32_t state;
  uint64_t attach_ns;
  struct fg_event_sh ev[FG_MAX_EVENTS];
  struct fg_stream_sh st[FG_MAX_STREAMS];
};

struct fg_coll {
  uint64_t tag; /* seq+1, 0 when free */
  uint32_t outstanding;
  uint32_t narrived;
  uint64_t xfer_ns;
  uint64_t done_ns;
  uint64_t arrival[FG_MAX_RANKS];
};

struct fg_p2p {
  uint64_t tag; /* n+1, 0 when free */
  uint16_t src, dst;
  uint32_t outstanding;
  uint32_t narrived;
  uint16_t creator; /* rank that allocated the entry (quota accounting) */
  uint16_t pad;
  uint64_t xfer_ns;
  uint64_t done_ns;
  uint64_t arrival[2];
};

struct fg_comm_sh {
  uint32_t state;
  uint32_t nranks;
  uint32_t njoined;
  uint32_t nleft;
  unsigned char key[FG_KEY_BYTES];
  int16_t member_proc[FG_MAX_RANKS];
  int32_t member_pid[FG_MAX_RANKS];
  uint8_t member_left[FG_MAX_RANKS];
  uint64_t split_seq;
  uint32_t split_arrived;
  uint32_t split_consumed;
  int32_t split_color[FG_MAX_RANKS];
  int32_t split_key[FG_MAX_RANKS];
  /* P2P entries allocated per rank: a rank may hold at most
   * FG_P2P_RING/nranks, so one that runs ahead cannot starve the others. */
  uint16_t p2p_created[FG_MAX_RANKS];
  struct fg_coll coll[FG_COLL_RING];
  struct fg_p2p p2p[FG_P2P_RING];
};

struct fg_shm {
  uint64_t magic;
  uint32_t version;
  uint32_t pad;
  uint64_t size;
  pthread_mutex_t lock;
  uint32_t gen;     /* futex word: bumped on every change that can unblock a waiter */
  uint32_t waiters; /* processes' threads inside futex_wait */
  uint32_t nattached;
  uint32_t pad2;
  uint64_t last_peer_check_ns;
  struct fg_proc proc[FG_MAX_PROCS];
  struct fg_comm_sh comm[FG_MAX_COMMS];
};

struct CUstream_st {
  uint32_t magic;
  int idx;
};

struct CUevent_st {
  uint32_t magic;
  int idx;
};

/* ---- process-local state ---- */
static struct fg_shm *M;
static int P = -1;
static pid_t g_pid;
static int g_init_err = FG_EINIT;
static int g_forked;
static int g_sticky; /* sticky device error (atomic) */
static char g_name[256];
static struct fg_params g_params;
static pthread_once_t g_params_once = PTHREAD_ONCE_INIT;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static uint64_t u64max(uint64_t a, uint64_t b) { return a > b ? a : b; }

FG_API uint64_t slowrank_fake_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

FG_API void slowrank_fake_spin_ns(uint64_t ns) {
  if (ns == 0) return;
  uint64_t end = slowrank_fake_now_ns() + ns;
  while (slowrank_fake_now_ns() < end) {
  }
}

static void sleep_until(uint64_t t) {
  if (t == 0 || t <= slowrank_fake_now_ns()) return;
  struct timespec ts = {.tv_sec = (time_t)(t / 1000000000ull), .tv_nsec = (long)(t % 1000000000ull)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
  }
}

static double env_double(const char *name, double def) {
  const char *v = getenv(name);
  if (!v || !*v) return def;
  char *end;
  double d = strtod(v, &end);
  if (end == v || d < 0) return def;
  return d;
}

static void params_init(void) {
  g_params.gpu_scale = env_double("SLOWRANK_FAKE_GPU_SCALE", 1.0);
  g_params.launch_ns = (uint64_t)env_double("SLOWRANK_FAKE_LAUNCH_NS", 0);
  g_params.bw_gbps = env_double("SLOWRANK_FAKE_BW_GBPS", 50.0);
  if (g_params.bw_gbps <= 0) g_params.bw_gbps = 50.0;
  g_params.lat_ns = (uint64_t)(env_double("SLOWRANK_FAKE_LAT_US", 5.0) * 1000.0);
  g_params.copy_gbps = env_double("SLOWRANK_FAKE_COPY_GBPS", 25.0);
  if (g_params.copy_gbps <= 0) g_params.copy_gbps = 25.0;
  g_params.timeout_ns = (uint64_t)(env_double("SLOWRANK_FAKE_TIMEOUT_MS", 60000.0) * 1e6);
  if (g_params.timeout_ns == 0) g_params.timeout_ns = 60000000000ull;
}

FG_API const struct fg_params *slowrank_fake_params(void) {
  pthread_once(&g_params_once, params_init);
  return &g_params;
}

/* ---- futex and lock ---- */
static void futex_wait(uint32_t *addr, uint32_t val, uint64_t ns) {
  struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull), .tv_nsec = (long)(ns % 1000000000ull)};
  syscall(SYS_futex, addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void futex_wake_all(uint32_t *addr) { syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

static void lock(void) {
  int r = pthread_mutex_lock(&M->lock);
  if (r == EOWNERDEAD) pthread_mutex_consistent(&M->lock);
}

static void unlock(void) { pthread_mutex_unlock(&M->lock); }

/* Under the lock: announce a change; returns whether someone must be woken
 * (call wake() after unlock()). */
static int bump(void) {
  __atomic_add_fetch(&M->gen, 1, __ATOMIC_SEQ_CST);
  return M->waiters > 0;
}

static void wake(int need) {
  if (need) futex_wake_all(&M->gen);
}

static void set_sticky(int err) {
  int zero = 0;
  if (err == FG_ETIMEDOUT || err == FG_EPEER)
    __atomic_compare_exchange_n(&g_sticky, &zero, err, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

FG_API int slowrank_fake_device_error(void) { return __atomic_load_n(&g_sticky, __ATOMIC_SEQ_CST); }

/* ---- liveness ---- */
static int pid_alive(pid_t pid) {
  if (pid <= 0) return 0;
  if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno != ENOENT;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 1;
  buf[n] = 0;
  char *rp = strrchr(buf, ')');
  if (rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X')) return 0; /* zombie: dead but unreaped */
  return 1;
}

static int member_alive(const struct fg_comm_sh *c, int r) {
  int p = c->member_proc[r];
  if (p < 0 || p >= FG_MAX_PROCS) return 0;
  const struct fg_proc *pr = &M->proc[p];
  return pr->state == PROC_ALIVE && pr->pid == c->member_pid[r];
}

/* Under the lock: retire dead processes, break communicators that lost a
 * member, free communicators nobody uses any more. Returns whether anything
 * changed. */
static int check_peers(uint64_t now, int force) {
  if (!force && now - M->last_peer_check_ns < FG_PEER_CHECK_NS) return 0;
  M->last_peer_check_ns = now;
  int changed = 0;
  for (int p = 0; p < FG_MAX_PROCS; p++) {
    struct fg_proc *pr = &M->proc[p];
    if (pr->state != PROC_ALIVE || p == P) continue;
    if (!pid_alive(pr->pid)) {
      pr->state = PROC_FREE;
      pr->pid = 0;
      if (M->nattached > 0) M->nattached--;
      changed = 1;
    }
  }
  for (int i = 0; i < FG_MAX_COMMS; i++) {
    struct fg_comm_sh *c = &M->comm[i];
    if (c->state == COMM_FREE) continue;
    int live = 0, dead = 0;
    for (uint32_t r = 0; r < c->nranks; r++) {
      if (c->member_proc[r] < 0 || c->member_left[r]) continue;
      if (member_alive(c, (int)r))
        live++;
      else
        dead++;
    }
    if (live == 0 && (dead > 0 || c->nleft > 0)) {
      memset(c, 0, sizeof *c);
      changed = 1;
    } else if (dead > 0 && c->state != COMM_BROKEN) {
      c->state = COMM_BROKEN;
      changed = 1;
    }
  }
  return changed;
}

/* Under the lock: wait for a change (or a slice, or the deadline). Returns
 * FG_OK to re-check, FG_ETIMEDOUT when the deadline passed. */
static int wait_locked(uint64_t deadline) {
  uint64_t now = slowrank_fake_now_ns();
  if (now >= deadline) return FG_ETIMEDOUT;
  if (check_peers(now, 0)) {
    wake(bump());
    return FG_OK;
  }
  uint32_t g = __atomic_load_n(&M->gen, __ATOMIC_SEQ_CST);
  uint64_t slice = deadline - now;
  if (slice > FG_WAIT_SLICE_NS) slice = FG_WAIT_SLICE_NS;
  M->waiters++;
  unlock();
  futex_wait(&M->gen, g, slice);
  lock();
  M->waiters--;
  return FG_OK;
}

/* ---- resolution ---- */
static uint64_t inst_done(const struct fg_iref *ir, uint64_t arrival, int publish, int *bad) {
  struct fg_comm_sh *c = &M->comm[ir->comm];
  if (ir->kind == FG_INST_COLL) {
    struct fg_coll *k = &c->coll[ir->slot];
    if (k->tag != ir->tag) {
      *bad = 1;
      return 0;
    }
    if (publish && k->arrival[ir->part] == 0) {
      k->arrival[ir->part] = arrival;
      k->narrived++;
    }
    if (k->done_ns == 0 && k->narrived >= c->nranks) {
      uint64_t last = 0;
      for (uint32_t r = 0; r < c->nranks; r++) last = u64max(last, k->arrival[r]);
      k->done_ns = last + k->xfer_ns;
    }
    return k->done_ns;
  }
  struct fg_p2p *k = &c->p2p[ir->slot];
  if (k->tag != ir->tag) {
    *bad = 1;
    return 0;
  }
  if (publish && k->arrival[ir->part] == 0) {
    k->arrival[ir->part] = arrival;
    k->narrived++;
  }
  if (k->done_ns == 0 && k->narrived >= 2) k->done_ns = u64max(k->arrival[0], k->arrival[1]) + k->xfer_ns;
  return k->done_ns;
}

static void inst_release(const struct fg_iref *ir) {
  struct fg_comm_sh *c = &M->comm[ir->comm];
  if (ir->kind == FG_INST_COLL) {
    struct fg_coll *k = &c->coll[ir->slot];
    if (k->tag == ir->tag && k->outstanding > 0 && --k->outstanding == 0) memset(k, 0, sizeof *k);
  } else {
    struct fg_p2p *k = &c->p2p[ir->slot];
    if (k->tag == ir->tag && k->outstanding > 0 && --k->outstanding == 0) {
      if (k->creator < FG_MAX_RANKS && c->p2p_created[k->creator] > 0) c->p2p_created[k->creator]--;
      memset(k, 0, sizeof *k);
    }
  }
}

/* Under the lock: advance one stream as far as possible. Returns the number
 * of state changes (resolved ops and published arrivals). */
static int resolve_stream(struct fg_proc *pr, struct fg_stream_sh *st) {
  int progress = 0;
  while (st->resolved < st->count) {
    struct fg_op *op = &st->ring[st->resolved % FG_RING];
    uint64_t start = u64max(st->last_comp, op->enq_ns);
    uint64_t comp = start;
    switch (op->type) {
    case OP_KERNEL:
      comp = start + op->arg;
      break;
    case OP_MARKER: {
      struct fg_event_sh *ev = &pr->ev[op->aux % FG_MAX_EVENTS];
      if (op->arg > ev->done_gen) {
        ev->done_gen = op->arg;
        ev->comp_ns = start;
      }
      break;
    }
    case OP_WAITEV: {
      struct fg_event_sh *ev = &pr->ev[op->aux % FG_MAX_EVENTS];
      if (ev->done_gen < op->arg) return progress;
      comp = u64max(start, ev->comp_ns);
      break;
    }
    case OP_COMM: {
      int all = 1;
      for (int i = 0; i < op->ninst; i++) {
        int bad = 0, pub = !(op->published & (1u << i));
        uint64_t d = inst_done(&op->inst[i], start, pub, &bad);
        if (pub && !bad) {
          op->published |= (uint8_t)(1u << i);
          progress++;
        }
        if (bad) continue; /* instance vanished (communicator freed): treat as done */
        if (d == 0)
          all = 0;
        else
          comp = u64max(comp, d);
      }
      if (!all) return progress;
      for (int i = 0; i < op->ninst; i++) inst_release(&op->inst[i]);
      break;
    }
    default:
      break;
    }
    op->comp_ns = comp;
    st->last_comp = comp;
    st->resolved++;
    progress++;
  }
  return progress;
}

static void progress_all(void) {
  for (int pass = 0; pass < 64; pass++) {
    int n = 0;
    for (int p = 0; p < FG_MAX_PROCS; p++) {
      struct fg_proc *pr = &M->proc[p];
      if (pr->state != PROC_ALIVE) continue;
      for (int s = 0; s < FG_MAX_STREAMS; s++) {
        struct fg_stream_sh *st = &pr->st[s];
        if (st->state == ST_FREE) continue;
        n += resolve_stream(pr, st);
        if (st->state == ST_DESTROYING && st->resolved == st->count) st->state = ST_FREE;
      }
    }
    if (n == 0) break;
  }
}

/* Under the lock: why is stream s of this process stuck (FG_OK: it is not
 * known to be broken, only waiting). */
static int stream_blocked_err(int s, int depth) {
  struct fg_stream_sh *st = &M->proc[P].st[s];
  if (st->resolved >= st->count) return FG_OK;
  struct fg_op *op = &st->ring[st->resolved % FG_RING];
  if (op->type == OP_COMM) {
    for (int i = 0; i < op->ninst; i++) {
      const struct fg_comm_sh *c = &M->comm[op->inst[i].comm];
      if (c->state == COMM_BROKEN || c->state == COMM_FREE) return FG_EPEER;
    }
  } else if (op->type == OP_WAITEV && depth < 4) {
    const struct fg_event_sh *ev = &M->proc[P].ev[op->aux % FG_MAX_EVENTS];
    if (ev->stream >= 0 && ev->stream != s) return stream_blocked_err(ev->stream, depth + 1);
  }
  return FG_OK;
}

static uint64_t comp_at(const struct fg_stream_sh *st, uint64_t target) {
  if (target == 0) return 0;
  uint64_t idx = target - 1;
  if (idx + 1 == st->resolved) return st->last_comp;
  if (st->count - idx <= FG_RING) return st->ring[idx % FG_RING].comp_ns;
  return 0;
}

/* ---- attach / detach ---- */
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

static void job_name(char *out, size_t n) {
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
  char clean[200];
  sanitize(clean, sizeof clean, raw);
  snprintf(out, n, "/slowrank-fake-%s", clean);
}

static void reset_state(void) {
  memset(M->proc, 0, sizeof M->proc);
  memset(M->comm, 0, sizeof M->comm);
  M->nattached = 0;
}

static void atfork_child(void) { g_forked = 1; }

static void do_init(void) {
  slowrank_fake_params();
  job_name(g_name, sizeof g_name);
  size_t size = sizeof(struct fg_shm);
  int creator = 0;
  int fd = shm_open(g_name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd >= 0) {
    creator = 1;
    if (ftruncate(fd, (off_t)size) != 0) {
      fprintf(stderr, "fakegpu: ftruncate %s: %s\n", g_name, strerror(errno));
      close(fd);
      shm_unlink(g_name);
      return;
    }
  } else if (errno == EEXIST) {
    fd = shm_open(g_name, O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      fprintf(stderr, "fakegpu: open %s: %s\n", g_name, strerror(errno));
      return;
    }
    struct stat sb;
    uint64_t deadline = slowrank_fake_now_ns() + 5000000000ull;
    for (;;) {
      if (fstat(fd, &sb) != 0) {
        close(fd);
        return;
      }
      if ((size_t)sb.st_size >= size) break;
      if (slowrank_fake_now_ns() > deadline) {
        fprintf(stderr, "fakegpu: %s has size %lld, want %zu (stale segment of another layout? remove /dev/shm%s)\n",
                g_name, (long long)sb.st_size, size, g_name);
        close(fd);
        return;
      }
      usleep(1000);
    }
  } else {
    fprintf(stderr, "fakegpu: create %s: %s\n", g_name, strerror(errno));
    return;
  }
  void *addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (addr == MAP_FAILED) {
    fprintf(stderr, "fakegpu: mmap %s: %s\n", g_name, strerror(errno));
    return;
  }
  M = addr;
  if (creator) {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&M->lock, &a);
    pthread_mutexattr_destroy(&a);
    M->version = FG_LAYOUT_VERSION;
    M->size = size;
    __atomic_store_n(&M->magic, FG_MAGIC, __ATOMIC_RELEASE);
  } else {
    uint64_t deadline = slowrank_fake_now_ns() + 5000000000ull;
    while (__atomic_load_n(&M->magic, __ATOMIC_ACQUIRE) != FG_MAGIC) {
      if (slowrank_fake_now_ns() > deadline) {
        fprintf(stderr, "fakegpu: %s never initialised\n", g_name);
        M = NULL;
        return;
      }
      usleep(1000);
    }
    if (M->version != FG_LAYOUT_VERSION || M->size != size) {
      fprintf(stderr, "fakegpu: %s has layout %u/%llu, want %u/%zu (remove /dev/shm%s)\n", g_name, M->version,
              (unsigned long long)M->size, FG_LAYOUT_VERSION, size, g_name);
      M = NULL;
      return;
    }
  }
  g_pid = getpid();
  lock();
  check_peers(slowrank_fake_now_ns(), 1);
  int alive = 0;
  for (int p = 0; p < FG_MAX_PROCS; p++) alive += M->proc[p].state == PROC_ALIVE;
  if (alive == 0) reset_state(); /* left over by crashed processes of an earlier run */
  for (int p = 0; p < FG_MAX_PROCS; p++) {
    if (M->proc[p].state == PROC_FREE) {
      struct fg_proc *pr = &M->proc[p];
      memset(pr, 0, sizeof *pr);
      pr->pid = (int32_t)g_pid;
      pr->state = PROC_ALIVE;
      pr->attach_ns = slowrank_fake_now_ns();
      pr->st[0].state = ST_USED; /* the default stream */
      for (int e = 0; e < FG_MAX_EVENTS; e++) pr->ev[e].stream = -1;
      P = p;
      break;
    }
  }
  if (P >= 0) M->nattached++;
  unlock();
  if (P < 0) {
    fprintf(stderr, "fakegpu: %s: more than %d processes\n", g_name, FG_MAX_PROCS);
    return;
  }
  pthread_atfork(NULL, NULL, atfork_child);
  g_init_err = FG_OK;
}

FG_API int slowrank_fake_init(void) {
  if (g_forked) return FG_EINIT;
  pthread_once(&g_once, do_init);
  return g_init_err;
}

__attribute__((destructor)) static void fg_fini(void) {
  if (!M || P < 0 || g_forked || getpid() != g_pid) return;
  lock();
  M->proc[P].state = PROC_FREE;
  M->proc[P].pid = 0;
  if (M->nattached > 0) M->nattached--;
  int last = M->nattached == 0;
  int w = bump();
  unlock();
  wake(w);
  if (last) shm_unlink(g_name);
}

/* ---- handles ---- */
static int stream_idx(const struct CUstream_st *s) {
  if (s == NULL || s == (const struct CUstream_st *)0x1 || s == (const struct CUstream_st *)0x2) return 0;
  if (s->magic != FG_STREAM_MAGIC) return -1;
  return s->idx;
}

static int event_idx(const struct CUevent_st *e) {
  if (e == NULL || e->magic != FG_EVENT_MAGIC) return -1;
  return e->idx;
}

#define FG_ENTER()                 \
  do {                             \
    int e_ = slowrank_fake_init(); \
    if (e_ != FG_OK) return e_;    \
  } while (0)

/* Under the lock: wait until the stream ring has room for one more op. */
static int wait_room(int s, uint64_t deadline) {
  struct fg_stream_sh *st = &M->proc[P].st[s];
  for (;;) {
    if (st->count - st->resolved < FG_RING - 1) return FG_OK;
    progress_all();
    if (st->count - st->resolved < FG_RING - 1) return FG_OK;
    int e = stream_blocked_err(s, 0);
    if (e == FG_OK) e = wait_locked(deadline);
    if (e != FG_OK) return e;
  }
}

static struct fg_op *append(int s) {
  struct fg_stream_sh *st = &M->proc[P].st[s];
  struct fg_op *op = &st->ring[st->count % FG_RING];
  memset(op, 0, sizeof *op);
  op->enq_ns = slowrank_fake_now_ns();
  return op;
}

/* ---- streams ---- */
FG_API int slowrank_fake_stream_create(struct CUstream_st **out) {
  FG_ENTER();
  if (!out) return FG_EINVAL;
  struct CUstream_st *h = malloc(sizeof *h);
  if (!h) return FG_ENOMEM;
  lock();
  int idx = -1;
  for (int s = 1; s < FG_MAX_STREAMS; s++) {
    struct fg_stream_sh *st = &M->proc[P].st[s];
    if (st->state == ST_FREE) {
      st->count = st->resolved = st->last_comp = 0;
      st->state = ST_USED;
      idx = s;
      break;
    }
  }
  unlock();
  if (idx < 0) {
    free(h);
    return FG_ENOMEM;
  }
  h->magic = FG_STREAM_MAGIC;
  h->idx = idx;
  *out = h;
  return FG_OK;
}

FG_API int slowrank_fake_stream_destroy(struct CUstream_st *h) {
  FG_ENTER();
  int s = stream_idx(h);
  if (s <= 0 || s >= FG_MAX_STREAMS) return FG_EINVAL;
  lock();
  struct fg_stream_sh *st = &M->proc[P].st[s];
  if (st->state == ST_USED) st->state = st->resolved == st->count ? ST_FREE : ST_DESTROYING;
  unlock();
  h->magic = 0;
  free(h);
  return FG_OK;
}

FG_API int slowrank_fake_launch(struct CUstream_st *h, uint64_t device_ns) {
  FG_ENTER();
  int err = slowrank_fake_device_error();
  if (err) return err;
  int s = stream_idx(h);
  if (s < 0 || s >= FG_MAX_STREAMS) return FG_EINVAL;
  slowrank_fake_spin_ns(g_params.launch_ns);
  lock();
  if (M->proc[P].st[s].state != ST_USED) {
    unlock();
    return FG_EINVAL;
  }
  err = wait_room(s, slowrank_fake_now_ns() + g_params.timeout_ns);
  if (err == FG_OK) {
    struct fg_op *op = append(s);
    op->type = OP_KERNEL;
    op->arg = device_ns;
    M->proc[P].st[s].count++;
  }
  unlock();
  set_sticky(err);
  return err;
}

/* Wait until the first target[s] ops of each selected stream resolved, then
 * sleep until the latest of their completion times. */
static int sync_streams(int only) {
  int err = slowrank_fake_device_error();
  if (err) return err;
  uint64_t target[FG_MAX_STREAMS];
  uint64_t deadline = slowrank_fake_now_ns() + g_params.timeout_ns;
  uint64_t until = 0;
  lock();
  struct fg_proc *pr = &M->proc[P];
  for (int s = 0; s < FG_MAX_STREAMS; s++)
    target[s] = (pr->st[s].state != ST_FREE && (only < 0 || only == s)) ? pr->st[s].count : 0;
  for (;;) {
    progress_all();
    int done = 1;
    err = FG_OK;
    until = 0;
    for (int s = 0; s < FG_MAX_STREAMS; s++) {
      if (target[s] == 0) continue;
      struct fg_stream_sh *st = &pr->st[s];
      if (st->resolved < target[s]) {
        done = 0;
        int e = stream_blocked_err(s, 0);
        if (e != FG_OK) err = e;
      } else {
        until = u64max(until, comp_at(st, target[s]));
      }
    }
    if (done || err != FG_OK) break;
    err = wait_locked(deadline);
    if (err != FG_OK) break;
  }
  unlock();
  if (err != FG_OK) {
    set_sticky(err);
    return err;
  }
  sleep_until(until);
  return FG_OK;
}

FG_API int slowrank_fake_stream_sync(struct CUstream_st *h) {
  FG_ENTER();
  int s = stream_idx(h);
  if (s < 0 || s >= FG_MAX_STREAMS) return FG_EINVAL;
  return sync_streams(s);
}

FG_API int slowrank_fake_device_sync(void) {
  FG_ENTER();
  return sync_streams(-1);
}

FG_API int slowrank_fake_stream_query(struct CUstream_st *h) {
  FG_ENTER();
  int err = slowrank_fake_device_error();
  if (err) return err;
  int s = stream_idx(h);
  if (s < 0 || s >= FG_MAX_STREAMS) return FG_EINVAL;
  lock();
  progress_all();
  struct fg_stream_sh *st = &M->proc[P].st[s];
  int ready = st->resolved == st->count && st->last_comp <= slowrank_fake_now_ns();
  unlock();
  return ready ? FG_OK : FG_ENOTREADY;
}

/* ---- events ---- */
FG_API int slowrank_fake_event_create(struct CUevent_st **out) {
  FG_ENTER();
  if (!out) return FG_EINVAL;
  struct CUevent_st *h = malloc(sizeof *h);
  if (!h) return FG_ENOMEM;
  int idx = -1;
  lock();
  for (int e = 0; e < FG_MAX_EVENTS; e++) {
    struct fg_event_sh *ev = &M->proc[P].ev[e];
    if (!ev->used) {
      ev->used = 1;
      ev->stream = -1;
      ev->rec_gen = ev->done_gen = u64max(ev->rec_gen, ev->done_gen);
      idx = e;
      break;
    }
  }
  unlock();
  if (idx < 0) {
    free(h);
    return FG_ENOMEM;
  }
  h->magic = FG_EVENT_MAGIC;
  h->idx = idx;
  *out = h;
  return FG_OK;
}

FG_API int slowrank_fake_event_destroy(struct CUevent_st *h) {
  FG_ENTER();
  int e = event_idx(h);
  if (e < 0 || e >= FG_MAX_EVENTS) return FG_EINVAL;
  lock();
  /* A pending record may still reference the slot; markers of a freed slot
   * write harmlessly into it until it is reused. */
  M->proc[P].ev[e].used = 0;
  unlock();
  h->magic = 0;
  free(h);
  return FG_OK;
}

FG_API int slowrank_fake_event_record(struct CUevent_st *h, struct CUstream_st *sh) {
  FG_ENTER();
  int err = slowrank_fake_device_error();
  if (err) return err;
  int e = event_idx(h), s = stream_idx(sh);
  if (e < 0 || e >= FG_MAX_EVENTS || s < 0 || s >= FG_MAX_STREAMS) return FG_EINVAL;
  lock();
  if (M->proc[P].st[s].state != ST_USED) {
    unlock();
    return FG_EINVAL;
  }
  err = wait_room(s, slowrank_fake_now_ns() + g_params.timeout_ns);
  int w = 0;
  if (err == FG_OK) {
    struct fg_event_sh *ev = &M->proc[P].ev[e];
    struct fg_op *op = append(s);
    op->type = OP_MARKER;
    op->aux = (uint32_t)e;
    op->arg = ++ev->rec_gen;
    ev->stream = s;
    M->proc[P].st[s].count++;
    w = bump();
  }
  unlock();
  wake(w);
  set_sticky(err);
  return err;
}

FG_API int slowrank_fake_stream_wait_event(struct CUstream_st *sh, struct CUevent_st *h) {
  FG_ENTER();
  int err = slowrank_fake_device_error();
  if (err) return err;
  int e = event_idx(h), s = stream_idx(sh);
  if (e < 0 || e >= FG_MAX_EVENTS || s < 0 || s >= FG_MAX_STREAMS) return FG_EINVAL;
  lock();
  struct fg_event_sh *ev = &M->proc[P].ev[e];
  if (ev->stream < 0 || M->proc[P].st[s].state != ST_USED) { /* never recorded: no dependency */
    unlock();
    return ev->stream < 0 ? FG_OK : FG_EINVAL;
  }
  err = wait_room(s, slowrank_fake_now_ns() + g_params.timeout_ns);
  if (err == FG_OK) {
    struct fg_op *op = append(s);
    op->type = OP_WAITEV;
    op->aux = (uint32_t)e;
    op->arg = ev->rec_gen;
    M->proc[P].st[s].count++;
  }
  unlock();
  set_sticky(err);
  return err;
}

FG_API int slowrank_fake_event_sync(struct CUevent_st *h) {
  FG_ENTER();
  int err = slowrank_fake_device_error();
  if (err) return err;
  int e = event_idx(h);
  if (e < 0 || e >= FG_MAX_EVENTS) return FG_EINVAL;
  uint64_t deadline = slowrank_fake_now_ns() + g_params.timeout_ns, until = 0;
  lock();
  struct fg_event_sh *ev = &M->proc[P].ev[e];
  uint64_t gen = ev->stream < 0 ? 0 : ev->rec_gen;
  for (;;) {
    if (gen == 0) break;
    progress_all();
    if (ev->done_gen >= gen) {
      until = ev->comp_ns;
      break;
    }
    if (ev->stream >= 0) err = stream_blocked_err(ev->stream, 0);
    if (err == FG_OK) err = wait_locked(deadline);
    if (err != FG_OK) break;
  }
  unlock();
  if (err != FG_OK) {
    set_sticky(err);
    return err;
  }
  sleep_until(until);
  return FG_OK;
}

FG_API int slowrank_fake_event_query(struct CUevent_st *h) {
  FG_ENTER();
  int e = event_idx(h);
  if (e < 0 || e >= FG_MAX_EVENTS) return FG_EINVAL;
  lock();
  progress_all();
  struct fg_event_sh *ev = &M->proc[P].ev[e];
  int ready = ev->stream < 0 || (ev->done_gen >= ev->rec_gen && ev->comp_ns <= slowrank_fake_now_ns());
  unlock();
  return ready ? FG_OK : FG_ENOTREADY;
}

FG_API int slowrank_fake_event_elapsed(float *ms, struct CUevent_st *a, struct CUevent_st *b) {
  FG_ENTER();
  int ea = event_idx(a), eb = event_idx(b);
  if (!ms || ea < 0 || eb < 0 || ea >= FG_MAX_EVENTS || eb >= FG_MAX_EVENTS) return FG_EINVAL;
  lock();
  progress_all();
  struct fg_event_sh *va = &M->proc[P].ev[ea], *vb = &M->proc[P].ev[eb];
  uint64_t now = slowrank_fake_now_ns();
  int err = FG_OK;
  if (va->stream < 0 || vb->stream < 0)
    err = FG_EINVAL;
  else if (va->done_gen < va->rec_gen || vb->done_gen < vb->rec_gen || va->comp_ns > now || vb->comp_ns > now)
    err = FG_ENOTREADY;
  else
    *ms = (float)(((double)vb->comp_ns - (double)va->comp_ns) / 1e6);
  unlock();
  return err;
}

/* ---- communicators ---- */
FG_API int slowrank_fake_comm_join(const unsigned char key[FG_KEY_BYTES], int nranks, int rank, int *slot) {
  FG_ENTER();
  if (!key || !slot || nranks < 1 || nranks > FG_MAX_RANKS || rank < 0 || rank >= nranks) return FG_EINVAL;
  lock();
  check_peers(slowrank_fake_now_ns(), 1);
  int found = -1, free_slot = -1;
  for (int i = 0; i < FG_MAX_COMMS; i++) {
    struct fg_comm_sh *c = &M->comm[i];
    if (c->state == COMM_FREE) {
      if (free_slot < 0) free_slot = i;
      continue;
    }
    if (memcmp(c->key, key, FG_KEY_BYTES) == 0) {
      found = i;
      break;
    }
  }
  int err = FG_OK;
  if (found >= 0) {
    struct fg_comm_sh *c = &M->comm[found];
    if (c->state == COMM_BROKEN)
      err = FG_EPEER;
    else if ((int)c->nranks != nranks || c->member_proc[rank] >= 0)
      err = FG_EUSAGE;
  } else if (free_slot < 0) {
    err = FG_ENOMEM;
  } else {
    found = free_slot;
    struct fg_comm_sh *c = &M->comm[found];
    memset(c, 0, sizeof *c);
    c->state = COMM_FORMING;
    c->nranks = (uint32_t)nranks;
    memcpy(c->key, key, FG_KEY_BYTES);
    for (int r = 0; r < FG_MAX_RANKS; r++) c->member_proc[r] = -1;
  }
  int w = 0;
  if (err == FG_OK) {
    struct fg_comm_sh *c = &M->comm[found];
    c->member_proc[rank] = (int16_t)P;
    c->member_pid[rank] = (int32_t)g_pid;
    c->njoined++;
    if (c->njoined == c->nranks) c->state = COMM_READY;
    *slot = found;
    w = bump();
  }
  unlock();
  wake(w);
  return err;
}

static int comm_ok(int slot) { return slot >= 0 && slot < FG_MAX_COMMS; }

FG_API int slowrank_fake_comm_wait_ready(int slot) {
  FG_ENTER();
  if (!comm_ok(slot)) return FG_EINVAL;
  uint64_t deadline = slowrank_fake_now_ns() + g_params.timeout_ns;
  int err = FG_OK;
  lock();
  for (;;) {
    uint32_t st = M->comm[slot].state;
    if (st == COMM_READY) break;
    if (st != COMM_FORMING) {
      err = FG_EPEER;
      break;
    }
    err = wait_locked(deadline);
    if (err != FG_OK) break;
  }
  unlock();
  return err;
}

FG_API int slowrank_fake_comm_status(int slot) {
  FG_ENTER();
  if (!comm_ok(slot)) return FG_EINVAL;
  lock();
  int w = check_peers(slowrank_fake_now_ns(), 0) ? bump() : 0;
  uint32_t st = M->comm[slot].state;
  unlock();
  wake(w);
  return st == COMM_READY || st == COMM_FORMING ? FG_OK : FG_EPEER;
}

FG_API int slowrank_fake_comm_leave(int slot, int rank) {
  FG_ENTER();
  if (!comm_ok(slot) || rank < 0 || rank >= FG_MAX_RANKS) return FG_EINVAL;
  lock();
  struct fg_comm_sh *c = &M->comm[slot];
  int w = 0;
  if (c->state != COMM_FREE && c->member_proc[rank] == P && !c->member_left[rank]) {
    c->member_left[rank] = 1;
    c->nleft++;
    if (c->nleft >= c->njoined) memset(c, 0, sizeof *c);
    w = bump();
  }
  unlock();
  wake(w);
  return FG_OK;
}

FG_API int slowrank_fake_comm_split(int slot, int rank, uint64_t n, int color, int key, int *new_rank,
                                    int *new_nranks) {
  FG_ENTER();
  if (!comm_ok(slot) || !new_rank || !new_nranks) return FG_EINVAL;
  uint64_t deadline = slowrank_fake_now_ns() + g_params.timeout_ns;
  int err = FG_OK, w = 0;
  lock();
  struct fg_comm_sh *c = &M->comm[slot];
  if (rank < 0 || rank >= (int)c->nranks || c->member_proc[rank] != P) {
    unlock();
    return FG_EINVAL;
  }
  while (err == FG_OK && c->split_seq != n) { /* an earlier split is still being consumed */
    if (c->state != COMM_READY) err = FG_EPEER;
    if (err == FG_OK) err = wait_locked(deadline);
  }
  if (err == FG_OK) {
    c->split_color[rank] = color;
    c->split_key[rank] = key;
    c->split_arrived++;
    wake(bump());
  }
  while (err == FG_OK && c->split_arrived < c->nranks) {
    if (c->state != COMM_READY) err = FG_EPEER;
    if (err == FG_OK) err = wait_locked(deadline);
  }
  if (err == FG_OK) {
    int nr = 0, nn = 0;
    for (uint32_t j = 0; j < c->nranks; j++) {
      if (c->split_color[j] != color) continue;
      nn++;
      if (c->split_key[j] < key || (c->split_key[j] == key && (int)j < rank)) nr++;
    }
    *new_rank = nr;
    *new_nranks = nn;
    if (++c->split_consumed == c->nranks) {
      c->split_seq++;
      c->split_arrived = c->split_consumed = 0;
    }
    w = bump();
  }
  unlock();
  wake(w);
  return err;
}

/* Under the lock: take part in the instance described by d. FG_ENOMEM means
 * its ring slot is still busy: wait and retry. */
static int acquire_inst(const struct fg_inst_desc *d, struct fg_iref *ir) {
  if (!comm_ok(d->comm)) return FG_EINVAL;
  struct fg_comm_sh *c = &M->comm[d->comm];
  if (c->state == COMM_BROKEN) return FG_EPEER;
  if (c->state != COMM_READY) return FG_EUSAGE;
  if (d->rank < 0 || d->rank >= (int)c->nranks || c->member_proc[d->rank] != P) return FG_EINVAL;
  uint64_t tag = d->seq + 1;
  ir->comm = (uint16_t)d->comm;
  ir->kind = (uint8_t)d->kind;
  ir->tag = tag;
  if (d->kind == FG_INST_COLL) {
    uint32_t slot = (uint32_t)(d->seq % FG_COLL_RING);
    struct fg_coll *k = &c->coll[slot];
    if (k->tag == 0) {
      memset(k, 0, sizeof *k);
      k->tag = tag;
      k->outstanding = c->nranks;
    } else if (k->tag != tag) {
      return FG_ENOMEM;
    }
    if (d->xfer_ns > k->xfer_ns) k->xfer_ns = d->xfer_ns;
    ir->slot = slot;
    ir->part = (uint8_t)d->rank;
    return FG_OK;
  }
  if (d->kind != FG_INST_P2P || d->peer < 0 || d->peer >= (int)c->nranks) return FG_EINVAL;
  uint16_t src = (uint16_t)(d->is_send ? d->rank : d->peer), dst = (uint16_t)(d->is_send ? d->peer : d->rank);
  int found = -1, free_slot = -1;
  for (int i = 0; i < FG_P2P_RING; i++) {
    struct fg_p2p *k = &c->p2p[i];
    if (k->tag == 0) {
      if (free_slot < 0) free_slot = i;
    } else if (k->tag == tag && k->src == src && k->dst == dst) {
      found = i;
      break;
    }
  }
  if (found < 0) {
    uint32_t quota = FG_P2P_RING / c->nranks;
    if (free_slot < 0 || c->p2p_created[d->rank] >= quota) return FG_ENOMEM;
    found = free_slot;
    struct fg_p2p *k = &c->p2p[found];
    memset(k, 0, sizeof *k);
    k->tag = tag;
    k->src = src;
    k->dst = dst;
    k->outstanding = 2;
    k->creator = (uint16_t)d->rank;
    c->p2p_created[d->rank]++;
  }
  struct fg_p2p *k = &c->p2p[found];
  if (d->xfer_ns > k->xfer_ns) k->xfer_ns = d->xfer_ns;
  ir->slot = (uint32_t)found;
  ir->part = d->is_send ? 0 : 1;
  return FG_OK;
}

FG_API int slowrank_fake_comm_enqueue(struct CUstream_st *h, const struct fg_inst_desc *d, int n) {
  FG_ENTER();
  int err = slowrank_fake_device_error();
  if (err) return err;
  int s = stream_idx(h);
  if (s < 0 || s >= FG_MAX_STREAMS || n < 0 || (n > 0 && !d)) return FG_EINVAL;
  uint64_t deadline = slowrank_fake_now_ns() + g_params.timeout_ns;
  lock();
  if (M->proc[P].st[s].state != ST_USED) {
    unlock();
    return FG_EINVAL;
  }
  for (int i = 0; i < n && err == FG_OK; i += FG_GROUP_MAX) {
    struct fg_iref refs[FG_GROUP_MAX];
    int m = n - i < FG_GROUP_MAX ? n - i : FG_GROUP_MAX;
    for (int j = 0; j < m && err == FG_OK; j++) {
      for (;;) {
        err = acquire_inst(&d[i + j], &refs[j]);
        if (err != FG_ENOMEM) break;
        progress_all();
        err = acquire_inst(&d[i + j], &refs[j]);
        if (err != FG_ENOMEM) break;
        err = wait_locked(deadline);
        if (err != FG_OK) break;
      }
    }
    if (err == FG_OK) err = wait_room(s, deadline);
    if (err != FG_OK) break;
    struct fg_op *op = append(s);
    op->type = OP_COMM;
    op->ninst = (uint8_t)m;
    memcpy(op->inst, refs, sizeof(struct fg_iref) * (size_t)m);
    M->proc[P].st[s].count++;
  }
  int w = bump();
  unlock();
  wake(w);
  return err;
}

int fg_attached(void) { return M != NULL && P >= 0 && !g_forked; }
