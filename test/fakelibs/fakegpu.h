/*
 * fakegpu.h — internal interface of the simulated GPU that lives in the fake
 * libcuda.so.1 and is shared by the fake libcudart and libnccl.
 *
 * The simulated device of every rank process is a set of streams whose queued
 * operations (kernels, communication, event markers, event waits) sit in one
 * POSIX shared-memory segment per job. Completion times are a pure function of
 * what every rank has enqueued and when, so any process can work out any
 * stream's progress: nothing runs in the background and no rank depends on
 * another one's host thread being scheduled. See README.md.
 *
 * These symbols are exported from libcuda.so.1 under the slowrank_fake_
 * prefix; they are not part of any real library and must never be probed.
 */
#ifndef SLOWRANK_FAKEGPU_H_
#define SLOWRANK_FAKEGPU_H_

#include <stddef.h>
#include <stdint.h>

#define FG_API __attribute__((visibility("default")))

/* Result codes of the simulator; each library maps them to its own enum. */
enum {
  FG_OK = 0,
  FG_EINVAL = 1,    /* bad argument or handle */
  FG_ENOMEM = 2,    /* a fixed table is full */
  FG_EINIT = 3,     /* shared memory unavailable, or used after fork */
  FG_ENOTREADY = 4, /* query: work still pending */
  FG_ETIMEDOUT = 5, /* waited longer than SLOWRANK_FAKE_TIMEOUT_MS */
  FG_EPEER = 6,     /* a peer process died or a communicator broke */
  FG_EUSAGE = 7     /* API misuse (duplicate rank, mismatched sizes) */
};

#define FG_KEY_BYTES 128
#define FG_MAX_RANKS 64

enum { FG_INST_COLL = 1, FG_INST_P2P = 2 };

/* One communication instance a rank takes part in. */
struct fg_inst_desc {
  int comm;         /* communicator slot (from slowrank_fake_comm_join) */
  int kind;         /* FG_INST_COLL or FG_INST_P2P */
  int rank;         /* caller's rank in the communicator */
  int peer;         /* P2P: the other rank */
  int is_send;      /* P2P: 1 for the sender side */
  uint64_t seq;     /* COLL: per-communicator call number; P2P: n-th message src->dst */
  uint64_t xfer_ns; /* modelled transfer time once every participant arrived */
};

struct CUstream_st;
struct CUevent_st;

/* Environment-derived model parameters (read once). */
struct fg_params {
  double gpu_scale;    /* SLOWRANK_FAKE_GPU_SCALE, default 1 */
  uint64_t launch_ns;  /* SLOWRANK_FAKE_LAUNCH_NS host cost per launch, default 0 */
  double bw_gbps;      /* SLOWRANK_FAKE_BW_GBPS, default 50 (bytes/ns) */
  uint64_t lat_ns;     /* SLOWRANK_FAKE_LAT_US, default 5 us */
  double copy_gbps;    /* SLOWRANK_FAKE_COPY_GBPS, default 25 */
  uint64_t timeout_ns; /* SLOWRANK_FAKE_TIMEOUT_MS, default 60000 */
};

FG_API const struct fg_params *slowrank_fake_params(void);
FG_API uint64_t slowrank_fake_now_ns(void);
FG_API void slowrank_fake_spin_ns(uint64_t ns);

/* Attach this process to the job's segment (idempotent). */
FG_API int slowrank_fake_init(void);
FG_API int slowrank_fake_device_error(void); /* sticky error of this process, FG_OK if none */

FG_API int slowrank_fake_stream_create(struct CUstream_st **out);
FG_API int slowrank_fake_stream_destroy(struct CUstream_st *s);
FG_API int slowrank_fake_stream_sync(struct CUstream_st *s);
FG_API int slowrank_fake_stream_query(struct CUstream_st *s);
FG_API int slowrank_fake_stream_wait_event(struct CUstream_st *s, struct CUevent_st *e);
FG_API int slowrank_fake_device_sync(void);
FG_API int slowrank_fake_launch(struct CUstream_st *s, uint64_t device_ns);

FG_API int slowrank_fake_event_create(struct CUevent_st **out);
FG_API int slowrank_fake_event_destroy(struct CUevent_st *e);
FG_API int slowrank_fake_event_record(struct CUevent_st *e, struct CUstream_st *s);
FG_API int slowrank_fake_event_sync(struct CUevent_st *e);
FG_API int slowrank_fake_event_query(struct CUevent_st *e);
FG_API int slowrank_fake_event_elapsed(float *ms, struct CUevent_st *a, struct CUevent_st *b);

/* Communicators. join registers rank in the communicator keyed by key
 * (creating it), without waiting; wait_ready blocks until all nranks joined. */
FG_API int slowrank_fake_comm_join(const unsigned char key[FG_KEY_BYTES], int nranks, int rank, int *slot);
FG_API int slowrank_fake_comm_wait_ready(int slot);
FG_API int slowrank_fake_comm_status(int slot);
FG_API int slowrank_fake_comm_leave(int slot, int rank);
/* Blocking exchange of (color, key) among all ranks of the communicator for
 * its n-th split; returns the caller's rank and size in its color group. */
FG_API int slowrank_fake_comm_split(int slot, int rank, uint64_t n, int color, int key, int *new_rank, int *new_nranks);
/* Enqueue communication on a stream: the n instances form one fused
 * operation (a group); returns as soon as they are queued. */
FG_API int slowrank_fake_comm_enqueue(struct CUstream_st *s, const struct fg_inst_desc *d, int n);

/* Echo mode (SLOWRANK_FAKE_ECHO, echo.c): the probed entry points return
 * values derived from their arguments and never reach the simulator; the
 * synchronisation calls sleep the time set here instead. */
FG_API int slowrank_fake_echo(void);
FG_API void slowrank_fake_echo_set_sleep_ns(long ns);
FG_API void slowrank_fake_echo_nap(void);

/* Inside libcuda.so.1 only: whether this process is attached. */
__attribute__((visibility("hidden"))) int fg_attached(void);

#endif /* SLOWRANK_FAKEGPU_H_ */
