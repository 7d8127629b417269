//go:build ignore

/*
 * cuda.c — the driver API of the fake libcuda.so.1 (soname libcuda.so.1).
 * Synchronisation entry points block on the simulated device in fakegpu.c.
 * The fake libcudart never calls these exported cu* functions, so a uprobe
 * on cuStreamSynchronize sees only direct driver-API callers. Under
 * SLOWRANK_FAKE_ECHO (echo.c) the synchronisation calls only sleep.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "cuda.h"

#include "fakegpu.h"

#define CU_API __attribute__((visibility("default"))) __attribute__((noinline))

static int cu_inited;

static CUresult map_err(int e) {
  switch (e) {
  case FG_OK:
    return CUDA_SUCCESS;
  case FG_EINVAL:
  case FG_EUSAGE:
    return CUDA_ERROR_INVALID_VALUE;
  case FG_ENOMEM:
    return CUDA_ERROR_OUT_OF_MEMORY;
  case FG_EINIT:
    return CUDA_ERROR_NOT_INITIALIZED;
  case FG_ENOTREADY:
    return CUDA_ERROR_NOT_READY;
  case FG_ETIMEDOUT:
    return CUDA_ERROR_LAUNCH_TIMEOUT;
  case FG_EPEER:
    return CUDA_ERROR_LAUNCH_FAILED;
  default:
    return CUDA_ERROR_UNKNOWN;
  }
}

/* Echo mode: a synchronisation sleeps the set time, then fails only for a
 * NULL handle (so that a return probe sees a non-zero code too). */
static CUresult echo_sync(int valid) {
  slowrank_fake_echo_nap();
  return valid ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* The driver must be initialised by cuInit (or implicitly by the runtime). */
static int ready(void) { return __atomic_load_n(&cu_inited, __ATOMIC_ACQUIRE) || fg_attached(); }

CU_API CUresult cuInit(unsigned int Flags) {
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  int e = slowrank_fake_init();
  if (e == FG_OK) __atomic_store_n(&cu_inited, 1, __ATOMIC_RELEASE);
  return map_err(e);
}

CU_API CUresult cuDriverGetVersion(int *driverVersion) {
  if (!driverVersion) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = 13000;
  return CUDA_SUCCESS;
}

CU_API CUresult cuDeviceGetCount(int *count) {
  if (!ready()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = 1;
  return CUDA_SUCCESS;
}

CU_API CUresult cuCtxSynchronize(void) {
  if (slowrank_fake_echo()) return echo_sync(1);
  if (!ready()) return CUDA_ERROR_NOT_INITIALIZED;
  return map_err(slowrank_fake_device_sync());
}

CU_API CUresult cuStreamSynchronize(CUstream hStream) {
  if (slowrank_fake_echo()) return echo_sync(1);
  if (!ready()) return CUDA_ERROR_NOT_INITIALIZED;
  return map_err(slowrank_fake_stream_sync(hStream));
}

CU_API CUresult cuStreamQuery(CUstream hStream) {
  if (!ready()) return CUDA_ERROR_NOT_INITIALIZED;
  return map_err(slowrank_fake_stream_query(hStream));
}

CU_API CUresult cuEventSynchronize(CUevent hEvent) {
  if (slowrank_fake_echo()) return echo_sync(hEvent != NULL);
  if (!ready()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!hEvent) return CUDA_ERROR_INVALID_HANDLE;
  return map_err(slowrank_fake_event_sync(hEvent));
}

CU_API CUresult cuEventQuery(CUevent hEvent) {
  if (!ready()) return CUDA_ERROR_NOT_INITIALIZED;
  if (!hEvent) return CUDA_ERROR_INVALID_HANDLE;
  return map_err(slowrank_fake_event_query(hEvent));
}
