//go:build ignore

/*
 * cudart.c — the runtime API of the fake libcudart (soname libcudart.so.12,
 * symbols versioned "libcudart.so.12" like NVIDIA's). Everything is forwarded
 * to the simulated device in libcuda.so.1 through slowrank_fake_* calls, never
 * through the exported cu* symbols (no nested probe hits). Under
 * SLOWRANK_FAKE_ECHO (echo.c) the synchronisation calls only sleep.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_runtime_api.h"
#include "fakegpu.h"

#define RT_API __attribute__((visibility("default"))) __attribute__((noinline))

static _Thread_local cudaError_t last_error;
static _Thread_local int cur_device;

static cudaError_t map_err(int e) {
  switch (e) {
  case FG_OK:
    return cudaSuccess;
  case FG_EINVAL:
  case FG_EUSAGE:
    return cudaErrorInvalidValue;
  case FG_ENOMEM:
    return cudaErrorMemoryAllocation;
  case FG_EINIT:
    return cudaErrorInitializationError;
  case FG_ENOTREADY:
    return cudaErrorNotReady;
  case FG_ETIMEDOUT:
    return cudaErrorLaunchTimeout;
  case FG_EPEER:
    return cudaErrorLaunchFailure;
  default:
    return cudaErrorUnknown;
  }
}

/* Record an error as the thread's last error (cudaErrorNotReady is a status,
 * not an error, as in CUDA). */
static cudaError_t ret(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) last_error = e;
  return e;
}

static cudaError_t ret_fg(int e) { return ret(map_err(e)); }

/* Echo mode (echo.c): a synchronisation sleeps the set time, then fails
 * only for a NULL handle (so that a return probe sees a non-zero code). */
static cudaError_t echo_sync(int valid) {
  slowrank_fake_echo_nap();
  return valid ? cudaSuccess : ret(cudaErrorInvalidResourceHandle);
}

static int device_count(void) {
  const char *v = getenv("SLOWRANK_FAKE_DEVICES");
  int n = v && *v ? atoi(v) : 8;
  return n > 0 ? n : 8;
}

RT_API cudaError_t cudaGetDeviceCount(int *count) {
  if (!count) return ret(cudaErrorInvalidValue);
  int e = slowrank_fake_init();
  if (e != FG_OK) return ret_fg(e);
  *count = device_count();
  return cudaSuccess;
}

RT_API cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return ret(cudaErrorInvalidDevice);
  int e = slowrank_fake_init();
  if (e != FG_OK) return ret_fg(e);
  cur_device = device;
  return cudaSuccess;
}

RT_API cudaError_t cudaGetDevice(int *device) {
  if (!device) return ret(cudaErrorInvalidValue);
  *device = cur_device;
  return cudaSuccess;
}

RT_API cudaError_t cudaDeviceSynchronize(void) {
  if (slowrank_fake_echo()) return echo_sync(1);
  return ret_fg(slowrank_fake_device_sync());
}

RT_API cudaError_t cudaDriverGetVersion(int *driverVersion) {
  if (!driverVersion) return ret(cudaErrorInvalidValue);
  *driverVersion = 13000;
  return cudaSuccess;
}

RT_API cudaError_t cudaRuntimeGetVersion(int *runtimeVersion) {
  if (!runtimeVersion) return ret(cudaErrorInvalidValue);
  *runtimeVersion = CUDART_VERSION;
  return cudaSuccess;
}

RT_API cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  int sticky = slowrank_fake_device_error();
  return sticky ? map_err(sticky) : e;
}

RT_API cudaError_t cudaPeekAtLastError(void) {
  int sticky = slowrank_fake_device_error();
  return sticky ? map_err(sticky) : last_error;
}

RT_API const char *cudaGetErrorName(cudaError_t error) {
  switch (error) {
  case cudaSuccess:
    return "cudaSuccess";
  case cudaErrorInvalidValue:
    return "cudaErrorInvalidValue";
  case cudaErrorMemoryAllocation:
    return "cudaErrorMemoryAllocation";
  case cudaErrorInitializationError:
    return "cudaErrorInitializationError";
  case cudaErrorNoDevice:
    return "cudaErrorNoDevice";
  case cudaErrorInvalidDevice:
    return "cudaErrorInvalidDevice";
  case cudaErrorInvalidResourceHandle:
    return "cudaErrorInvalidResourceHandle";
  case cudaErrorNotReady:
    return "cudaErrorNotReady";
  case cudaErrorLaunchTimeout:
    return "cudaErrorLaunchTimeout";
  case cudaErrorLaunchFailure:
    return "cudaErrorLaunchFailure";
  default:
    return "cudaErrorUnknown";
  }
}

RT_API const char *cudaGetErrorString(cudaError_t error) {
  switch (error) {
  case cudaSuccess:
    return "no error";
  case cudaErrorInvalidValue:
    return "invalid argument";
  case cudaErrorMemoryAllocation:
    return "out of memory";
  case cudaErrorInitializationError:
    return "initialization error";
  case cudaErrorNotReady:
    return "device not ready";
  case cudaErrorLaunchTimeout:
    return "the launch timed out and was terminated (fake: a peer never arrived)";
  case cudaErrorLaunchFailure:
    return "unspecified launch failure (fake: a peer process died)";
  default:
    return "unknown error";
  }
}

RT_API cudaError_t cudaStreamCreate(cudaStream_t *pStream) { return ret_fg(slowrank_fake_stream_create(pStream)); }

RT_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
  (void)flags;
  return ret_fg(slowrank_fake_stream_create(pStream));
}

RT_API cudaError_t cudaStreamDestroy(cudaStream_t stream) { return ret_fg(slowrank_fake_stream_destroy(stream)); }

RT_API cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (slowrank_fake_echo()) return echo_sync(1);
  return ret_fg(slowrank_fake_stream_sync(stream));
}

RT_API cudaError_t cudaStreamQuery(cudaStream_t stream) { return ret_fg(slowrank_fake_stream_query(stream)); }

RT_API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  (void)flags;
  return ret_fg(slowrank_fake_stream_wait_event(stream, event));
}

RT_API cudaError_t cudaEventCreate(cudaEvent_t *event) { return ret_fg(slowrank_fake_event_create(event)); }

RT_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  (void)flags;
  return ret_fg(slowrank_fake_event_create(event));
}

RT_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  return ret_fg(slowrank_fake_event_record(event, stream));
}

RT_API cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (slowrank_fake_echo()) return echo_sync(event != NULL);
  return ret_fg(slowrank_fake_event_sync(event));
}

RT_API cudaError_t cudaEventQuery(cudaEvent_t event) { return ret_fg(slowrank_fake_event_query(event)); }

RT_API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  return ret_fg(slowrank_fake_event_elapsed(ms, start, end));
}

RT_API cudaError_t cudaEventDestroy(cudaEvent_t event) { return ret_fg(slowrank_fake_event_destroy(event)); }

RT_API cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                                    cudaStream_t stream) {
  (void)blockDim;
  (void)args;
  (void)sharedMem;
  if (!func) return ret(cudaErrorInvalidValue);
  uint64_t blocks = (uint64_t)gridDim.x * gridDim.y * gridDim.z;
  if (blocks == 0) return ret(cudaErrorInvalidValue);
  const struct fg_params *p = slowrank_fake_params();
  uint64_t ns = (uint64_t)((double)blocks * 1000.0 * p->gpu_scale);
  return ret_fg(slowrank_fake_launch(stream, ns));
}

RT_API cudaError_t cudaMalloc(void **devPtr, size_t size) {
  if (!devPtr) return ret(cudaErrorInvalidValue);
  int e = slowrank_fake_init();
  if (e != FG_OK) return ret_fg(e);
  void *p = NULL;
  if (posix_memalign(&p, 256, size ? size : 1) != 0) return ret(cudaErrorMemoryAllocation);
  *devPtr = p;
  return cudaSuccess;
}

RT_API cudaError_t cudaFree(void *devPtr) {
  free(devPtr);
  return cudaSuccess;
}

RT_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                                   cudaStream_t stream) {
  if ((!dst || !src) && count) return ret(cudaErrorInvalidValue);
  if ((int)kind < 0 || kind > cudaMemcpyDefault) return ret(cudaErrorInvalidValue);
  if (count) memmove(dst, src, count);
  const struct fg_params *p = slowrank_fake_params();
  return ret_fg(slowrank_fake_launch(stream, (uint64_t)((double)count / p->copy_gbps)));
}
