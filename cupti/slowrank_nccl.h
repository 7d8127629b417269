//go:build ignore

/*
 * slowrank_nccl.h - the seam between the runtime (slowrank_cupti.c: control
 * thread, converter, duty cycle) and the NCCL profiler plugin
 * (slowrank_nccl.c: NCCL's callbacks, the lock-free ring). Internal: none of
 * this is exported from the library.
 */
#ifndef SLOWRANK_NCCL_INTERNAL_H
#define SLOWRANK_NCCL_INTERNAL_H

#include <stdint.h>

#include "slowrank_abi.h"

struct slowrank_conv;

/* Runtime side (slowrank_cupti.c). */

/* Starts the control thread if neither InitializeInjection nor an earlier
 * plugin init did; CUPTI is loaded only once InitializeInjection ran (the
 * CUDA driver loaded the library too). Returns 0 when the library is
 * disabled or could not start: the plugin then refuses NCCL's init. */
int sr_runtime_start_for_plugin(void);

/* Plugin side (slowrank_nccl.c), called by the control thread only. */

/* Drains the ring into c (attached) or counts and discards it, and re-sends
 * every live communicator first when resend is set (a new attach epoch).
 * The caller holds the converter's mutex. Returns records appended. */
uint32_t sr_nccl_drain(struct slowrank_conv *c, int attached, int resend, uint64_t now);

/* The activation mask NCCL should run with: 0 while no agent is attached,
 * Coll/P2p (and their API events from v5, CeColl on v6) while one is, plus KernelCh while
 * the duty cycle is on. Stored into NCCL when it changed. */
void sr_nccl_set_mask(int attached, int kernel_on);

/* Measures CLOCK_MONOTONIC - CLOCK_REALTIME (the GPU %globaltimer runs on
 * the realtime epoch) for converting kernel-channel timers. */
void sr_nccl_calibrate(void);

/* The plugin's counters are the stats slots SR_NCCL_STAT_FIRST..LAST. */
#define SR_NCCL_STAT_FIRST SLOWRANK_STAT_NCCL_EVENTS
#define SR_NCCL_STAT_LAST SLOWRANK_STAT_NCCL_CLOCK_CLAMPED

/* Copies the plugin's counters into the SLOWRANK_STAT_NCCL_* slots. */
void sr_nccl_counters(uint64_t counters[SLOWRANK_STAT_COUNT]);

/* 1 once NCCL bound the plugin (some init ran). */
int sr_nccl_active(void);

#endif /* SLOWRANK_NCCL_INTERNAL_H */
