/*
 * os.h - for cupti/test_nccl_abi.c only. From 2.30, NCCL's nccl_profiler.h
 * includes its os.h (C++) for ncclPid_t, which its os/linux.h defines as
 * pid_t. slowrank's own file, not NVIDIA's; searched before an NCCL
 * checkout's src/include (make cupti-nccl-abi-src).
 */
#ifndef SLOWRANK_NCCL_ABI_OS_H
#define SLOWRANK_NCCL_ABI_OS_H
#include <sys/types.h>
typedef pid_t ncclPid_t;
#endif
