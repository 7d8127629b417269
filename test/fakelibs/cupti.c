//go:build ignore

/*
 * cupti.c - a fake libcupti.so for tests without a GPU: the part of the
 * activity and callback API that slowrank's injection library and Kineto use,
 * with CUPTI's documented contract rather than a convenient one:
 *
 *   - one subscriber per process (cuptiSubscribe: a second one gets
 *     CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED);
 *   - one pair of buffer callbacks per process: cuptiActivityRegisterCallbacks
 *     replaces the pair, and a buffer is completed to the pair registered when
 *     it completes, not to the one that supplied it;
 *   - activity kinds are a plain global switch (not reference counted);
 *   - a record's slot is taken from the current buffer when the activity
 *     starts and its timestamps are written when it ends, on CUPTI's worker
 *     thread: buffers requested on application threads, completed on the
 *     worker thread (full buffers) or on the thread calling
 *     cuptiActivityFlushAll (flag 0: buffers whose records all completed;
 *     CUPTI_ACTIVITY_FLAG_FLUSH_FORCED: every buffer, incomplete records with
 *     zero timestamps); after completion CUPTI never touches a buffer again;
 *   - timestamps from the callback of cuptiActivityRegisterTimestampCallback,
 *     else CLOCK_REALTIME (the default the header documents for Linux);
 *   - cuptiFinalize drops everything: buffers CUPTI holds are never returned,
 *     callbacks, kinds and the subscriber are cleared.
 * Callbacks run without the fake's lock held.
 *
 * Contract violations by a client abort the process with a message: a buffer
 * handed to CUPTI while CUPTI still holds it, a buffer smaller than a record.
 *
 * The application side (standing in for the driver) is fakecupti_launch():
 * an activity of `kind` that lasts `dur_ns` from now, with `id` as its
 * correlation id. fakecupti_counters() reads the fake's own counters.
 */
#define _GNU_SOURCE
#include <cupti.h>

#include "fakecupti.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FC_API __attribute__((visibility("default")))
#define FC_PENDING_MAX 65536
#define FC_HELD_MAX 256
#define FC_WORKER_NS 1000000ull

struct fc_buf {
  uint8_t *mem;
  size_t size, used, max_records, records;
  int pending; /* pending entries (activities not ended) that point here */
  int closed;  /* no new records: completes once pending == 0 */
  int gone;    /* completed or dropped: never touched again */
};

struct fc_pending {
  struct fc_buf *buf;
  size_t off;
  uint64_t end_mono;
  uint64_t start_ts, dur_ns;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static pthread_once_t worker_once = PTHREAD_ONCE_INIT;
static CUpti_SubscriberHandle subscriber; /* non-NULL while subscribed */
static CUpti_BuffersCallbackRequestFunc cb_req;
static CUpti_BuffersCallbackCompleteFunc cb_comp;
static CUpti_TimestampCallbackFunc cb_ts;
static uint64_t enabled; /* bit per activity kind < 64 */
static struct fc_buf *cur;
static struct fc_buf *held[FC_HELD_MAX]; /* buffers CUPTI holds */
static struct fc_pending pending[FC_PENDING_MAX];
static size_t npending;
static uint64_t dropped_since_query;
static struct fakecupti_counters ctr;

static uint64_t clock_ns(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t mono(void) { return clock_ns(CLOCK_MONOTONIC); }

/* CUPTI's timestamp: the client's callback or the documented default. */
static uint64_t stamp(void) {
  CUpti_TimestampCallbackFunc f = __atomic_load_n(&cb_ts, __ATOMIC_ACQUIRE);
  return f ? f() : clock_ns(CLOCK_REALTIME);
}

static void violation(const char *what) {
  fprintf(stderr, "fakecupti: contract violation: %s\n", what);
  abort();
}

static size_t record_size(CUpti_ActivityKind k) {
  switch (k) {
  case CUPTI_ACTIVITY_KIND_KERNEL:
  case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
    return sizeof(CUpti_ActivityKernel4);
  case CUPTI_ACTIVITY_KIND_MEMCPY:
    return sizeof(CUpti_ActivityMemcpy);
  case CUPTI_ACTIVITY_KIND_MEMSET:
    return sizeof(CUpti_ActivityMemset);
  default:
    return 0;
  }
}

/* ---- buffers (mu held unless said otherwise) ---------------------------- */

static int held_add(struct fc_buf *b) {
  for (int i = 0; i < FC_HELD_MAX; i++) {
    if (held[i] && held[i]->mem == b->mem) violation("buffer handed to CUPTI while CUPTI still holds it");
  }
  for (int i = 0; i < FC_HELD_MAX; i++) {
    if (!held[i]) {
      held[i] = b;
      return 1;
    }
  }
  return 0;
}

static void held_remove(struct fc_buf *b) {
  for (int i = 0; i < FC_HELD_MAX; i++)
    if (held[i] == b) held[i] = NULL;
}

/* Completes b to the callbacks registered now; drops mu around the call. */
static void complete(struct fc_buf *b) {
  held_remove(b);
  b->gone = 1;
  if (cur == b) cur = NULL;
  CUpti_BuffersCallbackCompleteFunc f = cb_comp;
  uint8_t *mem = b->mem;
  size_t size = b->size, used = b->used;
  /* Pending entries still pointing at b skip it from now on; the last
   * one frees it (finish_due). */
  if (b->pending == 0) free(b);
  if (!f) {
    ctr.buffers_completed_no_callback++;
    return;
  }
  ctr.buffers_completed++;
  pthread_mutex_unlock(&mu);
  f(NULL, 0, mem, size, used);
  pthread_mutex_lock(&mu);
}

/* A new current buffer from the client; drops mu around the request. */
static struct fc_buf *request(void) {
  CUpti_BuffersCallbackRequestFunc f = cb_req;
  if (!f) return NULL;
  ctr.buffers_requested++;
  uint8_t *mem = NULL;
  size_t size = 0, max = 0;
  pthread_mutex_unlock(&mu);
  f(&mem, &size, &max);
  pthread_mutex_lock(&mu);
  if (!mem) return NULL;
  if (size < sizeof(CUpti_ActivityKernel4)) violation("buffer smaller than one record");
  struct fc_buf *b = calloc(1, sizeof(*b));
  if (!b) return NULL;
  b->mem = mem;
  b->size = size;
  b->max_records = max;
  if (!held_add(b)) {
    free(b);
    return NULL;
  }
  if (cur) { /* another thread installed one meanwhile: use it, give this back later */
    b->closed = 1;
    return cur;
  }
  cur = b;
  return b;
}

static int fits(const struct fc_buf *b, size_t n) {
  return b->used + n <= b->size && (b->max_records == 0 || b->records < b->max_records);
}

/* Completes every buffer that may complete; force: incomplete ones too. */
static void deliver(int force) {
  for (;;) {
    struct fc_buf *next = NULL;
    for (int i = 0; i < FC_HELD_MAX && !next; i++) {
      struct fc_buf *b = held[i];
      if (b && (force || (b->closed && b->pending == 0))) next = b;
    }
    if (!next) return;
    complete(next);
  }
}

static void finish_due(uint64_t now) {
  size_t keep = 0;
  for (size_t i = 0; i < npending; i++) {
    struct fc_pending *p = &pending[i];
    if (p->end_mono > now) {
      pending[keep++] = *p;
      continue;
    }
    struct fc_buf *b = p->buf;
    if (!b->gone) {
      /* start/end sit at the same offsets in all three record types */
      CUpti_ActivityKernel4 *k = (CUpti_ActivityKernel4 *)(b->mem + p->off);
      k->start = p->start_ts;
      k->end = p->start_ts + p->dur_ns;
    }
    if (--b->pending == 0 && b->gone) free(b);
  }
  npending = keep;
}

static void *worker(void *arg) {
  (void)arg;
  pthread_mutex_lock(&mu);
  for (;;) {
    finish_due(mono());
    /* The worker completes full buffers only. */
    for (;;) {
      struct fc_buf *next = NULL;
      for (int i = 0; i < FC_HELD_MAX && !next; i++)
        if (held[i] && held[i]->closed && held[i]->pending == 0) next = held[i];
      if (!next) break;
      complete(next);
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t d = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + FC_WORKER_NS;
    ts.tv_sec = (time_t)(d / 1000000000ull);
    ts.tv_nsec = (long)(d % 1000000000ull);
    pthread_cond_timedwait(&cv, &mu, &ts);
  }
  return NULL;
}

static void start_worker(void) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_t t;
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&t, &a, worker, NULL) == 0) pthread_setname_np(t, "fakecupti-work");
  pthread_attr_destroy(&a);
}

static void lock(void) {
  pthread_once(&worker_once, start_worker);
  pthread_mutex_lock(&mu);
}

static void unlock(void) { pthread_mutex_unlock(&mu); }

/* ---- the application side ------------------------------------------------ */

FC_API int fakecupti_launch(int kind, const char *name, uint64_t dur_ns, uint32_t id) {
  size_t n = record_size((CUpti_ActivityKind)kind);
  lock();
  ctr.launches++;
  if (n == 0 || kind >= 64 || !(enabled & (1ull << kind))) {
    ctr.dropped_disabled++;
    unlock();
    return 0;
  }
  struct fc_buf *b = cur;
  if (b && !fits(b, n)) {
    b->closed = 1;
    cur = NULL;
    b = NULL;
  }
  if (!b) b = request();
  if (b && !fits(b, n)) /* a fresh buffer that cannot take even this record */
    b = NULL;
  if (!b || npending == FC_PENDING_MAX) {
    ctr.dropped_no_buffer++;
    dropped_since_query++;
    unlock();
    return 0;
  }
  uint8_t *slot = b->mem + b->used;
  memset(slot, 0, n);
  if (n == sizeof(CUpti_ActivityKernel4)) {
    CUpti_ActivityKernel4 *k = (CUpti_ActivityKernel4 *)slot;
    k->kind = (CUpti_ActivityKind)kind;
    k->name = name;
    k->correlationId = id;
    k->streamId = 7;
    k->gridX = k->gridY = k->gridZ = 1;
    k->blockX = 128;
    k->blockY = k->blockZ = 1;
  } else if (kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
    CUpti_ActivityMemcpy *m = (CUpti_ActivityMemcpy *)slot;
    m->kind = CUPTI_ACTIVITY_KIND_MEMCPY;
    m->bytes = 1 << 20;
    m->correlationId = id;
    m->streamId = 7;
  } else {
    CUpti_ActivityMemset *m = (CUpti_ActivityMemset *)slot;
    m->kind = CUPTI_ACTIVITY_KIND_MEMSET;
    m->bytes = 1 << 16;
    m->correlationId = id;
    m->streamId = 7;
  }
  pending[npending++] =
      (struct fc_pending){.buf = b, .off = b->used, .end_mono = mono() + dur_ns, .start_ts = stamp(), .dur_ns = dur_ns};
  b->used += n;
  b->records++;
  b->pending++;
  ctr.records++;
  unlock();
  return 1;
}

FC_API void fakecupti_counters(struct fakecupti_counters *out) {
  lock();
  *out = ctr;
  unlock();
}

/* ---- the API ------------------------------------------------------------- */

CUptiResult CUPTIAPI cuptiGetVersion(uint32_t *version) {
  if (!version) return CUPTI_ERROR_INVALID_PARAMETER;
  *version = CUPTI_API_VERSION;
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetResultString(CUptiResult result, const char **str) {
  if (!str) return CUPTI_ERROR_INVALID_PARAMETER;
  switch (result) {
  case CUPTI_SUCCESS:
    *str = "CUPTI_SUCCESS";
    break;
  case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
    *str = "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED";
    break;
  case CUPTI_ERROR_INVALID_OPERATION:
    *str = "CUPTI_ERROR_INVALID_OPERATION";
    break;
  default:
    *str = "CUPTI_ERROR (fake)";
  }
  return CUPTI_SUCCESS;
}

static int subscriber_token;

CUptiResult CUPTIAPI cuptiSubscribe(CUpti_SubscriberHandle *sub, CUpti_CallbackFunc cb, void *ud) {
  (void)cb;
  (void)ud;
  if (!sub) return CUPTI_ERROR_INVALID_PARAMETER;
  lock();
  if (subscriber) {
    ctr.subscribe_refused++;
    unlock();
    return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  }
  subscriber = (CUpti_SubscriberHandle)&subscriber_token;
  *sub = subscriber;
  unlock();
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiUnsubscribe(CUpti_SubscriberHandle sub) {
  lock();
  CUptiResult r = CUPTI_ERROR_INVALID_PARAMETER;
  if (sub && sub == subscriber) {
    subscriber = NULL;
    r = CUPTI_SUCCESS;
  }
  unlock();
  return r;
}

CUptiResult CUPTIAPI cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc req,
                                                    CUpti_BuffersCallbackCompleteFunc comp) {
  if (!req || !comp) return CUPTI_ERROR_INVALID_PARAMETER;
  lock();
  cb_req = req;
  cb_comp = comp;
  ctr.register_calls++;
  unlock();
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityRegisterTimestampCallback(CUpti_TimestampCallbackFunc f) {
  if (!f) return CUPTI_ERROR_INVALID_PARAMETER;
  __atomic_store_n(&cb_ts, f, __ATOMIC_RELEASE);
  return CUPTI_SUCCESS;
}

static CUptiResult set_kind(CUpti_ActivityKind kind, int on) {
  if ((int)kind <= 0 || (int)kind >= 64) return CUPTI_ERROR_INVALID_KIND;
  lock();
  if (on) {
    enabled |= 1ull << kind;
    ctr.enable_calls++;
  } else {
    enabled &= ~(1ull << kind);
    ctr.disable_calls++;
  }
  unlock();
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityEnable(CUpti_ActivityKind kind) { return set_kind(kind, 1); }
CUptiResult CUPTIAPI cuptiActivityDisable(CUpti_ActivityKind kind) { return set_kind(kind, 0); }

CUptiResult CUPTIAPI cuptiActivityFlushAll(uint32_t flag) {
  lock();
  if (!cb_comp) {
    unlock();
    return CUPTI_ERROR_INVALID_OPERATION;
  }
  finish_due(mono());
  if (cur && cur->records > 0) {
    cur->closed = 1;
    cur = NULL;
  }
  deliver((flag & CUPTI_ACTIVITY_FLAG_FLUSH_FORCED) != 0);
  unlock();
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, CUpti_Activity **record) {
  if (!buffer || !record) return CUPTI_ERROR_INVALID_PARAMETER;
  size_t off = 0;
  if (*record) {
    uint8_t *p = (uint8_t *)*record;
    if (p < buffer || p >= buffer + valid) return CUPTI_ERROR_INVALID_PARAMETER;
    size_t n = record_size(((CUpti_Activity *)p)->kind);
    if (n == 0) return CUPTI_ERROR_INVALID_KIND;
    off = (size_t)(p - buffer) + n;
  }
  if (off + sizeof(CUpti_Activity) > valid) {
    *record = NULL;
    return CUPTI_ERROR_MAX_LIMIT_REACHED;
  }
  size_t n = record_size(((CUpti_Activity *)(buffer + off))->kind);
  if (n == 0 || off + n > valid) return CUPTI_ERROR_INVALID_KIND;
  *record = (CUpti_Activity *)(buffer + off);
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityGetNumDroppedRecords(CUcontext ctx, uint32_t stream, size_t *dropped) {
  (void)ctx;
  (void)stream;
  if (!dropped) return CUPTI_ERROR_INVALID_PARAMETER;
  lock();
  *dropped = (size_t)dropped_since_query;
  dropped_since_query = 0;
  unlock();
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetTimestamp(uint64_t *timestamp) {
  if (!timestamp) return CUPTI_ERROR_INVALID_PARAMETER;
  *timestamp = clock_ns(CLOCK_REALTIME);
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiFinalize(void) {
  lock();
  ctr.finalize_calls++;
  for (int i = 0; i < FC_HELD_MAX; i++) {
    struct fc_buf *b = held[i];
    if (b) {
      b->gone = 1;
      held[i] = NULL;
      ctr.buffers_lost_finalize++;
      if (b->pending == 0) free(b);
    }
  }
  cur = NULL;
  cb_req = NULL;
  cb_comp = NULL;
  __atomic_store_n(&cb_ts, NULL, __ATOMIC_RELEASE);
  enabled = 0;
  subscriber = NULL;
  unlock();
  return CUPTI_SUCCESS;
}
