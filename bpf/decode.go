package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"unsafe"
)

// ErrMalformed is returned (wrapped) by Decode for a record it refuses.
var ErrMalformed = errors.New("malformed event")

// Flags of sr_comm_init_event and sr_group_event (events.h).
const (
	commFIDValid   = 0x1
	commFCommValid = 0x2
	commFParent    = 0x4
	groupFReturn   = 0x1
)

// HashUniqueID is the hash BPF computes over an ncclUniqueId (128 bytes):
// FNV-1a 64. Ranks that share a communicator report the same value.
func HashUniqueID(id []byte) uint64 {
	h := fnv.New64a()
	h.Write(id)
	return h.Sum64()
}

// Field offsets of the records: those of their generated mirrors of
// events.h (wire_gen.go), so that a layout change in the C header moves the
// decoder with it. The header is the first member of every record.
const (
	offHdrType    = unsafe.Offsetof(wireEventHdr{}.Type)
	offHdrProbeID = unsafe.Offsetof(wireEventHdr{}.ProbeId)
	offHdrPID     = unsafe.Offsetof(wireEventHdr{}.Pid)
	offHdrTID     = unsafe.Offsetof(wireEventHdr{}.Tid)
	offHdrStartNs = unsafe.Offsetof(wireEventHdr{}.StartNs)
	offHdrEndNs   = unsafe.Offsetof(wireEventHdr{}.EndNs)

	offCollCount    = unsafe.Offsetof(wireCollEvent{}.Count)
	offCollComm     = unsafe.Offsetof(wireCollEvent{}.Comm)
	offCollStream   = unsafe.Offsetof(wireCollEvent{}.Stream)
	offCollDatatype = unsafe.Offsetof(wireCollEvent{}.Datatype)
	offCollRedOp    = unsafe.Offsetof(wireCollEvent{}.Redop)
	offCollPeer     = unsafe.Offsetof(wireCollEvent{}.Peer)
	offCollRet      = unsafe.Offsetof(wireCollEvent{}.Ret)

	offCommInitIDHash = unsafe.Offsetof(wireCommInitEvent{}.IdHash)
	offCommInitComm   = unsafe.Offsetof(wireCommInitEvent{}.Comm)
	offCommInitParent = unsafe.Offsetof(wireCommInitEvent{}.ParentComm)
	offCommInitNRanks = unsafe.Offsetof(wireCommInitEvent{}.Nranks)
	offCommInitRank   = unsafe.Offsetof(wireCommInitEvent{}.Rank)
	offCommInitColor  = unsafe.Offsetof(wireCommInitEvent{}.Color)
	offCommInitKey    = unsafe.Offsetof(wireCommInitEvent{}.Key)
	offCommInitRet    = unsafe.Offsetof(wireCommInitEvent{}.Ret)
	offCommInitFlags  = unsafe.Offsetof(wireCommInitEvent{}.Flags)
	offCommInitNIDs   = unsafe.Offsetof(wireCommInitEvent{}.N_ids)

	offSyncHandle = unsafe.Offsetof(wireSyncEvent{}.Handle)
	offSyncRet    = unsafe.Offsetof(wireSyncEvent{}.Ret)

	offGroupRet   = unsafe.Offsetof(wireGroupEvent{}.Ret)
	offGroupFlags = unsafe.Offsetof(wireGroupEvent{}.Flags)

	offTorchArg0 = unsafe.Offsetof(wireTorchEvent{}.Arg0)
	offTorchArg1 = unsafe.Offsetof(wireTorchEvent{}.Arg1)

	offCUPTICallArg  = unsafe.Offsetof(wireCuptiCallEvent{}.Arg)
	offCUPTICallArg2 = unsafe.Offsetof(wireCuptiCallEvent{}.Arg2)

	offBatchLen = unsafe.Offsetof(wireBatchEvent{}.Len)
)

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// Decode turns one ring buffer record into a typed event. It is pure and
// strict: the size must match the type exactly (batches: within bounds), the
// type and probe id must be known and agree, and end must not precede start.
// Errors wrap ErrMalformed. The returned event does not alias b.
func Decode(b []byte) (Event, error) { return decode(b, nil) }

// scratch holds one event of each type for decoding without allocating
// (Reader.Next): at 100,000 records/s, an allocation per record and the
// garbage collection behind it were a third of the agent's CPU. A nil
// scratch allocates.
type scratch struct {
	coll     CollEvent
	commInit CommInitEvent
	sync     SyncEvent
	group    GroupEvent
	torch    TorchEvent
	batch    BatchEvent
	data     [BatchMax]byte
}

func (s *scratch) collEvent() *CollEvent {
	if s == nil {
		return new(CollEvent)
	}
	return &s.coll
}

func (s *scratch) commInitEvent() *CommInitEvent {
	if s == nil {
		return new(CommInitEvent)
	}
	return &s.commInit
}

func (s *scratch) syncEvent() *SyncEvent {
	if s == nil {
		return new(SyncEvent)
	}
	return &s.sync
}

func (s *scratch) groupEvent() *GroupEvent {
	if s == nil {
		return new(GroupEvent)
	}
	return &s.group
}

func (s *scratch) torchEvent() *TorchEvent {
	if s == nil {
		return new(TorchEvent)
	}
	return &s.torch
}

// batchEvent returns the event and n bytes for its data.
func (s *scratch) batchEvent(n uint32) (*BatchEvent, []byte) {
	if s == nil {
		return new(BatchEvent), make([]byte, n)
	}
	return &s.batch, s.data[:n]
}

func decode(b []byte, s *scratch) (Event, error) {
	if len(b) < headerSize {
		return nil, malformed("record of %d bytes is shorter than the %d-byte header", len(b), headerSize)
	}
	le := binary.LittleEndian
	h := Header{
		Type:    EventType(le.Uint32(b[offHdrType:])),
		Probe:   ProbeID(le.Uint32(b[offHdrProbeID:])),
		PID:     le.Uint32(b[offHdrPID:]),
		TID:     le.Uint32(b[offHdrTID:]),
		StartNs: le.Uint64(b[offHdrStartNs:]),
		EndNs:   le.Uint64(b[offHdrEndNs:]),
	}
	if h.Type < EventColl || h.Type > EventCUPTICall {
		return nil, malformed("unknown event type %d", uint32(h.Type))
	}
	info := h.Probe.info()
	if info == nil {
		return nil, malformed("unknown probe id %d", uint32(h.Probe))
	}
	if typ := info.class.EventType(); typ != h.Type {
		return nil, malformed("probe %s emits %s records, got type %s", h.Probe, typ, h.Type)
	}
	if h.EndNs < h.StartNs {
		return nil, malformed("%s: end %d before start %d", h.Probe, h.EndNs, h.StartNs)
	}
	exact := func(n int) error {
		if len(b) != n {
			return malformed("%s record of %d bytes, want %d", h.Type, len(b), n)
		}
		return nil
	}
	switch h.Type {
	case EventColl:
		if err := exact(collSize); err != nil {
			return nil, err
		}
		e := s.collEvent()
		*e = CollEvent{
			Header:   h,
			Count:    le.Uint64(b[offCollCount:]),
			Comm:     le.Uint64(b[offCollComm:]),
			Stream:   le.Uint64(b[offCollStream:]),
			Datatype: le.Uint32(b[offCollDatatype:]),
			RedOp:    le.Uint32(b[offCollRedOp:]),
			Peer:     int32(le.Uint32(b[offCollPeer:])),
			Ret:      int32(le.Uint32(b[offCollRet:])),
		}
		return e, nil
	case EventCommInit:
		if err := exact(commInitSize); err != nil {
			return nil, err
		}
		flags := le.Uint32(b[offCommInitFlags:])
		e := s.commInitEvent()
		*e = CommInitEvent{
			Header:    h,
			IDHash:    le.Uint64(b[offCommInitIDHash:]),
			IDValid:   flags&commFIDValid != 0,
			Comm:      le.Uint64(b[offCommInitComm:]),
			CommValid: flags&commFCommValid != 0,
			Parent:    le.Uint64(b[offCommInitParent:]),
			IsSplit:   flags&commFParent != 0,
			NRanks:    int32(le.Uint32(b[offCommInitNRanks:])),
			Rank:      int32(le.Uint32(b[offCommInitRank:])),
			Color:     int32(le.Uint32(b[offCommInitColor:])),
			Key:       int32(le.Uint32(b[offCommInitKey:])),
			Ret:       int32(le.Uint32(b[offCommInitRet:])),
			NIDs:      le.Uint32(b[offCommInitNIDs:]),
		}
		return e, nil
	case EventSync:
		if err := exact(syncSize); err != nil {
			return nil, err
		}
		e := s.syncEvent()
		*e = SyncEvent{Header: h, Handle: le.Uint64(b[offSyncHandle:]), Ret: int32(le.Uint32(b[offSyncRet:]))}
		return e, nil
	case EventGroup:
		if err := exact(groupSize); err != nil {
			return nil, err
		}
		flags := le.Uint32(b[offGroupFlags:])
		if flags&groupFReturn == 0 && h.EndNs != h.StartNs {
			return nil, malformed("%s marker with a duration", h.Probe)
		}
		e := s.groupEvent()
		*e = GroupEvent{Header: h, Ret: int32(le.Uint32(b[offGroupRet:])), HasReturn: flags&groupFReturn != 0}
		return e, nil
	case EventTorch:
		if err := exact(torchSize); err != nil {
			return nil, err
		}
		e := s.torchEvent()
		*e = TorchEvent{Header: h, Arg0: le.Uint64(b[offTorchArg0:]), Arg1: le.Uint64(b[offTorchArg1:])}
		e.Self = e.Arg0
		if info.selfArg == 1 {
			e.Self = e.Arg1
		}
		return e, nil
	case EventCUPTICall:
		if err := exact(cuptiCallSize); err != nil {
			return nil, err
		}
		if h.EndNs != h.StartNs {
			return nil, malformed("%s marker with a duration", h.Probe)
		}
		return &CUPTICallEvent{Header: h, Arg: le.Uint64(b[offCUPTICallArg:]), Arg2: le.Uint64(b[offCUPTICallArg2:])}, nil
	case EventBatch:
		if len(b) < batchDataOffset || len(b) > batchDataOffset+BatchMax {
			return nil, malformed("batch record of %d bytes outside [%d, %d]", len(b), batchDataOffset, batchDataOffset+BatchMax)
		}
		n := le.Uint32(b[offBatchLen:])
		if n > BatchMax || int(n) > len(b)-batchDataOffset {
			return nil, malformed("batch length %d exceeds record (%d data bytes, max %d)", n, len(b)-batchDataOffset, BatchMax)
		}
		e, data := s.batchEvent(n)
		copy(data, b[batchDataOffset:])
		*e = BatchEvent{Header: h, Data: data}
		return e, nil
	}
	// Unreachable while every class emits one of the types above.
	return nil, malformed("unknown event type %d", uint32(h.Type))
}
