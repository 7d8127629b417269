/* Fake libnccl.so.2: real symbol names and signatures, distinct bodies. */
#include "fake.h"

volatile long fake_nccl_calls[64];
#define HIT(i) (fake_nccl_calls[i]++)

ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, ncclDataType_t dt, ncclRedOp_t op,
			   ncclComm_t comm, cudaStream_t stream)
{
	HIT(1);
	return (ncclResult_t)(count % 3);
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, ncclDataType_t dt, int root,
			   ncclComm_t comm, cudaStream_t stream)
{
	HIT(2);
	return ncclSuccess;
}
ncclResult_t ncclReduce(const void *s, void *r, size_t count, ncclDataType_t dt, ncclRedOp_t op,
			int root, ncclComm_t comm, cudaStream_t stream)
{
	HIT(3);
	return ncclSuccess;
}
ncclResult_t ncclAllGather(const void *s, void *r, size_t count, ncclDataType_t dt, ncclComm_t comm,
			   cudaStream_t stream)
{
	HIT(4);
	return ncclSuccess;
}
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t count, ncclDataType_t dt,
			       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
	HIT(5);
	return ncclSuccess;
}
ncclResult_t ncclSend(const void *s, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
		      cudaStream_t stream)
{
	HIT(6);
	return ncclSuccess;
}
ncclResult_t ncclRecv(void *r, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
		      cudaStream_t stream)
{
	HIT(7);
	return ncclSuccess;
}
ncclResult_t ncclAlltoAll(const void *s, void *r, size_t count, ncclDataType_t dt, ncclComm_t comm,
			  cudaStream_t stream)
{
	HIT(8);
	return ncclSuccess;
}
ncclResult_t ncclGroupStart(void)
{
	HIT(20);
	return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void)
{
	HIT(21);
	return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
	HIT(30);
	*comm = (ncclComm_t)(0xabc000UL + (unsigned long)rank * 0x100 +
			     (unsigned char)id.internal[5]);
	return ncclSuccess;
}
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
				    ncclConfig_t *cfg)
{
	HIT(31);
	*comm = (ncclComm_t)(0xbcd000UL + (unsigned long)rank * 0x100 +
			     (unsigned char)id.internal[127]);
	return ncclSuccess;
}
ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
	HIT(32);
	for (int i = 0; i < ndev; i++)
		comms[i] = (ncclComm_t)(0xcde000UL + (unsigned long)i);
	return ncclSuccess;
}
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
			   ncclConfig_t *cfg)
{
	HIT(33);
	*newcomm = (ncclComm_t)((unsigned long)comm + 0x10000UL + (unsigned long)color);
	return ncclSuccess;
}
ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
				      ncclUniqueId *ids, ncclConfig_t *cfg)
{
	HIT(34);
	*newcomm = (ncclComm_t)(0xdef000UL + (unsigned long)myrank);
	return ncclSuccess;
}
void fake_nccl_noop(void)
{
	HIT(63);
}
