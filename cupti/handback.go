package cupti

import (
	"errors"
	"fmt"
	"io"
	"unsafe"
)

// HandbackSize is the size of the library's handback block.
const HandbackSize = int(unsafe.Sizeof(rawHandback{}))

// ErrHandback reports a handback block that is not the library's (wrong
// magic, version or size, or no block at all): the agent must not write to it.
var ErrHandback = errors.New("cupti handback block: not recognised")

// ForeignCallbacks is what the agent's uprobes saw of another CUPTI
// client's calls (arguments and CLOCK_MONOTONIC entry times, calls from any
// thread but Status.CtlTID): the library registers them again when its own
// registration may have replaced them (Handback in slowrank_abi.h). A zero
// time means "not seen"; Kinds is used only when KindsKept is set.
type ForeignCallbacks struct {
	// RequestFn and CompleteFn are the arguments of the other client's
	// last cuptiActivityRegisterCallbacks, PairNs the time of that call.
	RequestFn, CompleteFn, PairNs uint64
	// TimestampFn is the argument of its last
	// cuptiActivityRegisterTimestampCallback, TimestampNs its time.
	TimestampFn, TimestampNs uint64
	// Kinds has bit k set while the other client has called
	// cuptiActivityEnable(k) (k < 64) and not cuptiActivityDisable(k) or
	// cuptiFinalize since.
	Kinds     uint64
	KindsKept bool
}

// HandbackStatus is the part of the handback block the library writes.
type HandbackStatus struct {
	// The library's own callbacks (a registration with these is its own).
	OwnRequest, OwnComplete, OwnTimestamp uint64
	Handbacks                             uint64 // pairs of another client registered again after the library's
	ClockHandbacks                        uint64 // its timestamp callbacks likewise
	Forwarded                             uint64 // its buffers completed to the library, passed to its callback
	// Taken counts yields where the library's registration may have
	// replaced the other client's callbacks and no pair came to give back.
	Taken         uint64
	Rejected      uint64 // pairs refused: not code of a loaded object, or the library's own
	AppliedPairNs uint64 // PairNs of the last pair registered again
}

// Handback is a decoded slowrank_cupti_handback.
type Handback struct {
	Seq     uint32 // the agent's seqlock (odd while it writes)
	Foreign ForeignCallbacks
	Status  HandbackStatus
}

// ParseHandback decodes a handback block read from the process.
func ParseHandback(b []byte) (Handback, error) {
	var h Handback
	var r rawHandback
	if len(b) < HandbackSize {
		return h, fmt.Errorf("%w: %d bytes", ErrHandback, len(b))
	}
	if m := u32(b, unsafe.Offsetof(r.Magic)); m != HandbackMagic {
		return h, fmt.Errorf("%w: magic %#x", ErrHandback, m)
	}
	if v := u16(b, unsafe.Offsetof(r.Version)); v != HandbackVer {
		return h, fmt.Errorf("%w: version %d", ErrHandback, v)
	}
	if s := int(u16(b, unsafe.Offsetof(r.Size))); s != HandbackSize {
		return h, fmt.Errorf("%w: size %d", ErrHandback, s)
	}
	flags := u32(b, unsafe.Offsetof(r.Flags))
	h.Seq = u32(b, unsafe.Offsetof(r.Seq))
	h.Foreign = ForeignCallbacks{KindsKept: flags&handbackFlagKinds != 0}
	if flags&handbackFlagPair != 0 {
		h.Foreign.RequestFn = u64(b, unsafe.Offsetof(r.Request_fn))
		h.Foreign.CompleteFn = u64(b, unsafe.Offsetof(r.Complete_fn))
		h.Foreign.PairNs = u64(b, unsafe.Offsetof(r.Pair_ns))
	}
	if flags&handbackFlagClock != 0 {
		h.Foreign.TimestampFn = u64(b, unsafe.Offsetof(r.Timestamp_fn))
		h.Foreign.TimestampNs = u64(b, unsafe.Offsetof(r.Timestamp_ns))
	}
	if h.Foreign.KindsKept {
		h.Foreign.Kinds = u64(b, unsafe.Offsetof(r.Kinds))
	}
	h.Status = HandbackStatus{
		OwnRequest:     u64(b, unsafe.Offsetof(r.Own_request)),
		OwnComplete:    u64(b, unsafe.Offsetof(r.Own_complete)),
		OwnTimestamp:   u64(b, unsafe.Offsetof(r.Own_timestamp)),
		Handbacks:      u64(b, unsafe.Offsetof(r.Handbacks)),
		ClockHandbacks: u64(b, unsafe.Offsetof(r.Clock_handbacks)),
		Forwarded:      u64(b, unsafe.Offsetof(r.Forwarded)),
		Taken:          u64(b, unsafe.Offsetof(r.Taken)),
		Rejected:       u64(b, unsafe.Offsetof(r.Rejected)),
		AppliedPairNs:  u64(b, unsafe.Offsetof(r.Applied_pair_ns)),
	}
	return h, nil
}

// ReadHandback reads and decodes the handback block at addr
// (Status.HandbackAddr), typically from /proc/PID/mem.
func ReadHandback(r io.ReaderAt, addr int64) (Handback, error) {
	if addr == 0 {
		return Handback{}, fmt.Errorf("%w: the library has none", ErrHandback)
	}
	b := make([]byte, HandbackSize)
	if _, err := r.ReadAt(b, addr); err != nil {
		return Handback{}, fmt.Errorf("read handback block at %#x: %w", addr, err)
	}
	return ParseHandback(b)
}

// encodeForeign returns the bytes from `flags` to `kinds`.
func encodeForeign(f ForeignCallbacks) []byte {
	var r rawHandback
	start := unsafe.Offsetof(r.Flags)
	b := make([]byte, unsafe.Offsetof(r.Handbacks)-start)
	var flags uint32
	if f.PairNs != 0 {
		flags |= handbackFlagPair
		le.PutUint64(b[unsafe.Offsetof(r.Request_fn)-start:], f.RequestFn)
		le.PutUint64(b[unsafe.Offsetof(r.Complete_fn)-start:], f.CompleteFn)
		le.PutUint64(b[unsafe.Offsetof(r.Pair_ns)-start:], f.PairNs)
	}
	if f.TimestampNs != 0 {
		flags |= handbackFlagClock
		le.PutUint64(b[unsafe.Offsetof(r.Timestamp_fn)-start:], f.TimestampFn)
		le.PutUint64(b[unsafe.Offsetof(r.Timestamp_ns)-start:], f.TimestampNs)
	}
	if f.KindsKept {
		flags |= handbackFlagKinds
		le.PutUint64(b[unsafe.Offsetof(r.Kinds)-start:], f.Kinds)
	}
	le.PutUint32(b, flags)
	return b
}

// WriteHandback publishes f in the handback block at addr with the
// library's seqlock: seq+1 (odd), the fields, seq+2. seq is the value the
// caller last read (Handback.Seq) or got back; the new one is returned. The
// library reads it at its next poll after cupti_gen moves: call WriteYield
// (with the same or a new decision and an advanced Gen) after it. The block
// is read first: where none is (ErrHandback) or its seq is not seq
// (ErrBlockMoved), nothing is written. Only one writer per process.
func WriteHandback(m Mem, addr int64, seq uint32, f ForeignCallbacks) (uint32, error) {
	hb, err := ReadHandback(m, addr)
	if err != nil {
		return seq, err
	}
	if hb.Seq&^1 != seq&^1 {
		return seq, fmt.Errorf("%w: handback seq %d, last written %d", ErrBlockMoved, hb.Seq, seq)
	}
	var r rawHandback
	seq &^= 1
	seqAt := addr + int64(unsafe.Offsetof(r.Seq))
	var s [4]byte
	le.PutUint32(s[:], seq+1)
	if _, err := m.WriteAt(s[:], seqAt); err != nil {
		return seq, fmt.Errorf("write handback seq: %w", err)
	}
	if _, err := m.WriteAt(encodeForeign(f), addr+int64(unsafe.Offsetof(r.Flags))); err != nil {
		return seq + 1, fmt.Errorf("write handback fields: %w", err)
	}
	le.PutUint32(s[:], seq+2)
	if _, err := m.WriteAt(s[:], seqAt); err != nil {
		return seq + 1, fmt.Errorf("write handback seq: %w", err)
	}
	return seq + 2, nil
}
