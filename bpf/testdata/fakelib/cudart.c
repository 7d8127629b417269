/* Fake libcudart.so.13: synchronisation calls sleep a known time. */
#include <time.h>
#include "fake.h"

static long sleep_ns;
void fake_cudart_set_sleep_ns(long ns)
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

cudaError_t cudaDeviceSynchronize(void)
{
	nap();
	return 0;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
	nap();
	return 0;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
	nap();
	return event == 0 ? 400 /* cudaErrorInvalidResourceHandle */ : 0;
}
