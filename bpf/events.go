package bpf

import (
	"time"
	"unsafe"
)

// EventsVersion is SLOWRANK_EVENTS_VERSION of events.h that this decoder
// understands. Load refuses an object carrying another version.
const EventsVersion = 2

// BatchMax is SLOWRANK_BATCH_MAX: the largest CUPTI batch that is carried.
const BatchMax = 16384

// Wire sizes of the records in events.h, from their generated mirrors
// (wire_gen.go); layout_test.go pins them to the C _Static_asserts.
const (
	headerSize      = int(unsafe.Sizeof(wireEventHdr{}))
	collSize        = int(unsafe.Sizeof(wireCollEvent{}))
	commInitSize    = int(unsafe.Sizeof(wireCommInitEvent{}))
	syncSize        = int(unsafe.Sizeof(wireSyncEvent{}))
	groupSize       = int(unsafe.Sizeof(wireGroupEvent{}))
	torchSize       = int(unsafe.Sizeof(wireTorchEvent{}))
	cuptiCallSize   = int(unsafe.Sizeof(wireCuptiCallEvent{}))
	batchDataOffset = int(unsafe.Offsetof(wireBatchEvent{}.Data))
)

// EventType is the `type` field of every record (enum sr_event_type).
//
//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type EventType -linecomment
type EventType uint32

// Event types: EventColl is a *CollEvent, EventCommInit a *CommInitEvent and
// so on. The line comments are the String() names (stringer -linecomment,
// eventtype_string.go).
const (
	EventColl      EventType = 1 // coll
	EventCommInit  EventType = 2 // comm_init
	EventSync      EventType = 3 // sync
	EventGroup     EventType = 4 // group
	EventTorch     EventType = 5 // torch
	EventBatch     EventType = 6 // batch
	EventCUPTICall EventType = 7 // cupti_call
)

// Header is the common part of every event. PID is the kernel tgid, TID the
// kernel thread id; StartNs/EndNs are CLOCK_MONOTONIC nanoseconds
// (bpf_ktime_get_ns). Markers and batches have StartNs == EndNs.
type Header struct {
	Type    EventType
	Probe   ProbeID
	PID     uint32
	TID     uint32
	StartNs uint64
	EndNs   uint64
}

// Base returns the header; every event type has it through embedding.
func (h Header) Base() Header { return h }

// Duration is EndNs - StartNs.
func (h Header) Duration() time.Duration { return time.Duration(h.EndNs - h.StartNs) }

// Event is one decoded record: *CollEvent, *CommInitEvent, *SyncEvent,
// *GroupEvent, *TorchEvent or *BatchEvent.
type Event interface {
	Base() Header
}

// CollEvent is one NCCL collective or point-to-point call, entry to return.
// On the host NCCL only enqueues: the interval is enqueue time, not GPU time.
type CollEvent struct {
	Header
	Count    uint64 // element count as passed (sendcount for AllGather, recvcount for ReduceScatter)
	Comm     uint64 // ncclComm_t
	Stream   uint64 // cudaStream_t
	Datatype uint32 // ncclDataType_t
	RedOp    uint32 // ncclRedOp_t; 0 for calls without one
	Peer     int32  // peer (Send/Recv), root (Broadcast/Reduce/Bcast/Gather/Scatter), else -1
	Ret      int32  // ncclResult_t
}

// CommInitEvent is one communicator creation, entry to return.
type CommInitEvent struct {
	Header
	IDHash    uint64 // HashUniqueID of the ncclUniqueId (first one for InitRankScalable); valid if IDValid
	IDValid   bool
	Comm      uint64 // the new communicator (comms[0] for InitAll); valid if CommValid
	CommValid bool
	Parent    uint64 // ncclCommSplit: parent communicator; valid if IsSplit
	IsSplit   bool
	NRanks    int32 // -1 when unknown (split)
	Rank      int32 // rank in the new communicator, -1 when unknown (split, InitAll)
	Color     int32 // ncclCommSplit color (NCCL_SPLIT_NOCOLOR = -1)
	Key       int32 // ncclCommSplit key
	NIDs      uint32
	Ret       int32 // ncclResult_t (ncclInProgress = 7 for non-blocking communicators)
}

// SyncEvent is one device synchronisation wait, entry to return.
type SyncEvent struct {
	Header
	Handle uint64 // stream or event; 0 for cudaDeviceSynchronize/cuCtxSynchronize
	Ret    int32  // cudaError_t or CUresult
}

// GroupEvent is ncclGroupStart (a marker, HasReturn false) or ncclGroupEnd
// (an interval with a return code).
type GroupEvent struct {
	Header
	Ret       int32
	HasReturn bool
}

// TorchEvent is one torch c10d method call, entry to return.
type TorchEvent struct {
	Header
	Self uint64 // `this` (the ProcessGroup or Work object)
	Arg0 uint64 // rdi at entry
	Arg1 uint64 // rsi at entry
}

// CUPTICallEvent is one call into libcupti (entry only, StartNs == EndNs)
// with its first two arguments: the activity kind or flush flags, or for
// cuptiActivityRegisterCallbacks the request and completion callbacks (the
// injection library hands them back to a client whose registration it
// overwrote: cupti.ForeignCallbacks).
type CUPTICallEvent struct {
	Header
	Arg  uint64
	Arg2 uint64
}

// BatchEvent is one opaque CUPTI batch from slowrank_cupti_emit; decode it
// with the cupti package. Data is a copy owned by the event.
type BatchEvent struct {
	Header
	Data []byte
}

var (
	_ Event = (*CollEvent)(nil)
	_ Event = (*CommInitEvent)(nil)
	_ Event = (*SyncEvent)(nil)
	_ Event = (*GroupEvent)(nil)
	_ Event = (*TorchEvent)(nil)
	_ Event = (*BatchEvent)(nil)
	_ Event = (*CUPTICallEvent)(nil)
)
