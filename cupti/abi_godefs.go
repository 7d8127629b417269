//go:build ignore

// Input of `go tool cgo -godefs` (make cupti-generate): the Go mirror of
// slowrank_abi.h, written to abi_defs.go.

package cupti

/*
#include "slowrank_abi.h"
*/
import "C"

const (
	BatchMagic    = C.SLOWRANK_BATCH_MAGIC
	ABIVersion    = C.SLOWRANK_ABI_VERSION
	BatchMax      = C.SLOWRANK_BATCH_MAX
	RecordAlign   = C.SLOWRANK_RECORD_ALIGN
	RecordMin     = C.SLOWRANK_RECORD_MIN
	NameMax       = C.SLOWRANK_NAME_MAX
	ControlMagic  = C.SLOWRANK_CONTROL_MAGIC
	ControlVer    = C.SLOWRANK_CONTROL_VERSION
	HandbackMagic = C.SLOWRANK_HANDBACK_MAGIC
	HandbackVer   = C.SLOWRANK_HANDBACK_VERSION

	handbackFlagPair  = C.SLOWRANK_HANDBACK_F_PAIR
	handbackFlagClock = C.SLOWRANK_HANDBACK_F_CLOCK
	handbackFlagKinds = C.SLOWRANK_HANDBACK_F_KINDS

	batchFlagEpochStart = C.SLOWRANK_BATCH_F_EPOCH_START
	batchFlagFinal      = C.SLOWRANK_BATCH_F_FINAL

	recKernel     = C.SLOWRANK_REC_KERNEL
	recMemcpy     = C.SLOWRANK_REC_MEMCPY
	recMemset     = C.SLOWRANK_REC_MEMSET
	recName       = C.SLOWRANK_REC_NAME
	recStats      = C.SLOWRANK_REC_STATS
	recTransition = C.SLOWRANK_REC_TRANSITION
	recNCCLComm   = C.SLOWRANK_REC_NCCL_COMM
	recNCCLColl   = C.SLOWRANK_REC_NCCL_COLL
	recNCCLKernel = C.SLOWRANK_REC_NCCL_KERNEL

	ncclFlagP2P          = C.SLOWRANK_NCCL_F_P2P
	ncclFlagAPI          = C.SLOWRANK_NCCL_F_API
	ncclFlagGraph        = C.SLOWRANK_NCCL_F_GRAPH
	ncclFlagPartial      = C.SLOWRANK_NCCL_F_PARTIAL
	ncclFlagClockSuspect = C.SLOWRANK_NCCL_F_CLOCK_SUSPECT
	ncclFlagCE           = C.SLOWRANK_NCCL_F_CE
	NCCLClockSlackNs     = C.SLOWRANK_NCCL_CLOCK_SLACK_NS
	ncclCommFinalized    = C.SLOWRANK_NCCL_COMM_F_FINALIZED
	ncclCommResent       = C.SLOWRANK_NCCL_COMM_F_RESENT
	numNCCLFuncs         = C.SLOWRANK_NCCL_FUNC_COUNT
	numNCCLDatatypes     = C.SLOWRANK_NCCL_DT_COUNT
	numNCCLAlgos         = C.SLOWRANK_NCCL_ALGO_COUNT
	numNCCLProtos        = C.SLOWRANK_NCCL_PROTO_COUNT
	NCCLStatusMagic      = C.SLOWRANK_NCCL_STATUS_MAGIC
	NCCLStatusVer        = C.SLOWRANK_NCCL_STATUS_VERSION

	kernelFlagSerial    = C.SLOWRANK_KERNEL_F_SERIAL
	nameFlagTruncated   = C.SLOWRANK_NAME_F_TRUNCATED
	numClasses          = C.SLOWRANK_CLASS_COUNT
	numStats            = C.SLOWRANK_STAT_COUNT
	defaultDutyOnMs     = C.SLOWRANK_DEFAULT_ON_MS
	defaultDutyPeriodMs = C.SLOWRANK_DEFAULT_PERIOD_MS
)

type rawBatchHeader C.struct_slowrank_batch_header

type rawRecordHeader C.struct_slowrank_record_header

type rawKernel C.struct_slowrank_kernel_record

type rawCopy C.struct_slowrank_copy_record

type rawName C.struct_slowrank_name_record

type rawStats C.struct_slowrank_stats_record

type rawTransition C.struct_slowrank_transition_record

type rawNCCLComm C.struct_slowrank_nccl_comm_record

type rawNCCLColl C.struct_slowrank_nccl_coll_record

type rawNCCLKernel C.struct_slowrank_nccl_kernel_record

type rawNCCLStatus C.struct_slowrank_nccl_status

type rawControl C.struct_slowrank_cupti_control

type rawHandback C.struct_slowrank_cupti_handback
