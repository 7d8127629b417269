//go:build ignore

/*
 * echo.c — the echo mode of the fake libraries (part of libcuda.so.1, which
 * the fake libcudart, libnccl and libtorch_cpu all link).
 *
 * SLOWRANK_FAKE_ECHO=1 is for tests of the probes themselves (bpf/'s
 * uprobe tests): they call the probed entry points from one process with
 * made-up handles (a communicator 0xc0ffee00, a stream 0x5000) and check that
 * BPF read every argument and return value. The simulator would reject such
 * handles or wait for ranks that never come, so in this mode the probed
 * entry points never reach it: each returns a value derived from its
 * arguments (README.md lists them) and each synchronisation call sleeps the
 * time set with slowrank_fake_echo_set_sleep_ns. Everything else (symbols,
 * argument registers, one probe hit per call) stays as in the normal mode.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fakegpu.h"

static pthread_once_t echo_once = PTHREAD_ONCE_INIT;
static int echo_on;
static long echo_sleep_ns;

static void echo_init(void) {
  const char *v = getenv("SLOWRANK_FAKE_ECHO");
  echo_on = v && *v && strcmp(v, "0") != 0;
}

FG_API int slowrank_fake_echo(void) {
  pthread_once(&echo_once, echo_init);
  return echo_on;
}

FG_API void slowrank_fake_echo_set_sleep_ns(long ns) { __atomic_store_n(&echo_sleep_ns, ns, __ATOMIC_RELAXED); }

/* A relative sleep, resumed after signals: the probe test brackets each call
 * with its own clock and wants at least this long. */
FG_API void slowrank_fake_echo_nap(void) {
  long ns = __atomic_load_n(&echo_sleep_ns, __ATOMIC_RELAXED);
  if (ns <= 0) return;
  struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}
