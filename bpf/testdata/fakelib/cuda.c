/* Fake libcuda.so.1 (driver API): synchronisation calls sleep a known time. */
#include <time.h>
#include "fake.h"

static long sleep_ns;
void fake_cuda_set_sleep_ns(long ns)
{
	sleep_ns = ns;
}

static void nap(void)
{
	if (sleep_ns <= 0)
		return;
	struct timespec ts = {sleep_ns / 1000000000L, sleep_ns % 1000000000L};
	while (nanosleep(&ts, &ts) != 0)
		;
}

CUresult cuCtxSynchronize(void)
{
	nap();
	return 0;
}
CUresult cuStreamSynchronize(cudaStream_t stream)
{
	nap();
	return 0;
}
CUresult cuEventSynchronize(cudaEvent_t event)
{
	nap();
	return event == 0 ? 400 /* CUDA_ERROR_INVALID_HANDLE */ : 0;
}
