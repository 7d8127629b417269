/*
 * test_clock.h - CLOCK_MONOTONIC and sleeps for the library's C test
 * programs (test_inject, test_nccl, test_stress, test_drain): one copy.
 */
#ifndef SLOWRANK_TEST_CLOCK_H
#define SLOWRANK_TEST_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Sleeps us microseconds, resuming after signals. */
static inline void sleep_us(uint64_t us)
{
	struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000L};
	while (nanosleep(&ts, &ts) != 0)
		;
}

static inline void sleep_ms(uint64_t ms)
{
	sleep_us(ms * 1000);
}

#endif
