/*
 * fakecupti.h - the test-only entry points of the fake libcupti
 * (test/fakelibs/cupti.c), which tests reach with dlsym: the application
 * side standing in for the driver, and the fake's own counters. One
 * declaration for the fake and the programs that drive it
 * (cupti/test_stress.c, cupti/test_drain.c).
 */
#ifndef SLOWRANK_FAKECUPTI_H
#define SLOWRANK_FAKECUPTI_H

#include <stdint.h>

/* Counters for tests (fakecupti_counters). */
struct fakecupti_counters {
  uint64_t launches, records, dropped_no_buffer, dropped_disabled, buffers_requested, buffers_completed,
      buffers_lost_finalize, buffers_completed_no_callback, subscribe_refused, register_calls, finalize_calls,
      enable_calls, disable_calls;
};

/* An activity of `kind` that lasts dur_ns from now, correlation id `id`. */
typedef int (*fakecupti_launch_fn)(int kind, const char *name, uint64_t dur_ns, uint32_t id);
/* Copies the fake's counters. */
typedef void (*fakecupti_counters_fn)(struct fakecupti_counters *out);

#endif
