package cupti

//go:generate sh -c "go tool cgo -godefs abi_godefs.go > abi_defs.go.tmp && gofmt abi_defs.go.tmp > abi_defs.go.fmt && mv abi_defs.go.fmt abi_defs.go; rc=$?; rm -rf _obj _cgo_*.o abi_defs.go.tmp abi_defs.go.fmt; exit $rc"

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"
)

// Errors of DecodeBatch; test with errors.Is.
var (
	ErrShort     = errors.New("cupti batch: too short")
	ErrMagic     = errors.New("cupti batch: bad magic")
	ErrVersion   = errors.New("cupti batch: unsupported version")
	ErrMalformed = errors.New("cupti batch: malformed")
)

// Header is a batch header.
type Header struct {
	Version uint16
	Flags   uint16
	// PID is getpid() in the training process's own pid namespace; key
	// per-process state by the kernel tgid the BPF event carries instead.
	PID   uint32
	Count uint32
	// Seq numbers the process's batches in completion order, from 1. A gap
	// means lost batches.
	Seq            uint64
	CUPTIDropped   uint64 // cumulative records CUPTI dropped
	LibDropped     uint64 // cumulative records the library dropped
	Len            uint32 // batch bytes including the header
	Clock          ClockSource
	ClockOffsetNs  int64  // already applied to every timestamp
	ClockBracketNs uint32 // calibration uncertainty (0 with the callback)
	Generation     uint32 // control-block generation the library applied
}

// EpochStart reports the first batch after an attach (or a name re-send
// request): every name is sent again before its next use.
func (h Header) EpochStart() bool { return h.Flags&batchFlagEpochStart != 0 }

// Final reports the process's last batch (exit flush).
func (h Header) Final() bool { return h.Flags&batchFlagFinal != 0 }

// Kernel is one kernel execution on the GPU. Times are CLOCK_MONOTONIC ns.
type Kernel struct {
	StartNs, EndNs uint64
	Device         uint32
	Context        uint32
	Stream         uint32
	Correlation    uint32
	Grid           [3]int32
	Block          [3]int32
	NameID         uint32 // 0: no name
	Class          Class
	Serial         bool // from CUPTI_ACTIVITY_KIND_KERNEL (serialised mode)
}

// Copy is a memcpy or memset on the GPU. Times are CLOCK_MONOTONIC ns.
type Copy struct {
	Memset         bool
	StartNs, EndNs uint64
	Bytes          uint64
	Device         uint32
	Context        uint32
	Stream         uint32
	Correlation    uint32
	CopyKind       uint8 // CUpti_ActivityMemcpyKind (memcpy)
	SrcKind        uint8 // CUpti_ActivityMemoryKind (memcpy source; memset: memory kind)
	DstKind        uint8 // CUpti_ActivityMemoryKind (memcpy destination)
	Flags          uint8 // CUpti_ActivityFlag low byte
}

// NameDef defines a kernel name id for the rest of the process's life.
type NameDef struct {
	ID        uint32
	Name      string // at most NameMax bytes
	FullLen   uint32 // length before truncation
	Truncated bool
	Class     Class
}

// Stats carries the library's cumulative counters.
type Stats struct {
	Counters [NumStats]uint64
	// N is how many counters the record carried (a newer library may send
	// more, an older fewer; the missing ones read 0).
	N int
}

// Get returns one counter.
func (s Stats) Get(k Stat) uint64 {
	if k < 0 || int(k) >= len(s.Counters) {
		return 0
	}
	return s.Counters[k]
}

// Transition records collection being switched on or off at TimestampNs
// (CLOCK_MONOTONIC). Between an "on" and the next "off", a process without
// kernels had an idle GPU; elsewhere device timing is absent.
type Transition struct {
	On          bool
	Reason      Reason
	Mode        DutyMode
	TimestampNs uint64
}

// Batch is one decoded emit of the injection library. Records keep their
// relative order within each slice; name definitions always precede, in the
// same or an earlier batch, the first kernel that uses them.
type Batch struct {
	Header      Header
	Kernels     []Kernel
	Copies      []Copy
	Names       []NameDef
	Stats       []Stats
	Transitions []Transition
	// Records of the NCCL profiler plugin (nccl.go).
	NCCLComms   []NCCLComm
	NCCLColls   []NCCLColl
	NCCLKernels []NCCLKernel
	// Skipped counts records of kinds this decoder does not know.
	Skipped int
}

// Offsets, from the generated mirror of slowrank_abi.h.
const (
	hdrSize        = int(unsafe.Sizeof(rawBatchHeader{}))
	kernelSize     = int(unsafe.Sizeof(rawKernel{}))
	copySize       = int(unsafe.Sizeof(rawCopy{}))
	nameSize       = int(unsafe.Sizeof(rawName{}))
	statsSize      = int(unsafe.Sizeof(rawStats{}))
	transitionSize = int(unsafe.Sizeof(rawTransition{}))
)

var le = binary.LittleEndian

func u16(b []byte, off uintptr) uint16 { return le.Uint16(b[off:]) }
func u32(b []byte, off uintptr) uint32 { return le.Uint32(b[off:]) }
func u64(b []byte, off uintptr) uint64 { return le.Uint64(b[off:]) }

// minSize is the smallest valid size of each known record kind.
func minSize(kind uint16) int {
	switch kind {
	case recKernel:
		return kernelSize
	case recMemcpy, recMemset:
		return copySize
	case recName:
		return nameSize
	case recStats:
		return statsSize
	case recTransition:
		return transitionSize
	case recNCCLComm:
		return ncclCommSize
	case recNCCLColl:
		return ncclCollSize
	case recNCCLKernel:
		return ncclKernelSize
	}
	return RecordMin
}

// DecodeBatch decodes one batch. It is strict: the header must have the
// known magic and version, the records must tile the batch exactly, and
// every known record must be at least as large as its structure (larger is
// accepted: newer libraries append fields). Records of unknown kinds are
// skipped and counted in Batch.Skipped. Bytes after Header.Len are ignored
// (a fixed-size copy may carry them). Allocation is bounded by len(b), which
// may not exceed BatchMax.
func DecodeBatch(b []byte) (Batch, error) {
	var out Batch
	err := DecodeBatchInto(b, &out)
	return out, err
}

type kindCounts struct {
	kernels, copies, names, stats, transitions, skipped int
	ncclComms, ncclColls, ncclKernels                   int
}

func decodeHeader(b []byte) (Header, []byte, error) {
	var h Header
	if len(b) < hdrSize {
		return h, nil, fmt.Errorf("%w: %d bytes", ErrShort, len(b))
	}
	var r rawBatchHeader
	if m := u32(b, unsafe.Offsetof(r.Magic)); m != BatchMagic {
		return h, nil, fmt.Errorf("%w: %#x", ErrMagic, m)
	}
	h.Version = u16(b, unsafe.Offsetof(r.Version))
	if h.Version != ABIVersion {
		return h, nil, fmt.Errorf("%w: %d", ErrVersion, h.Version)
	}
	h.Flags = u16(b, unsafe.Offsetof(r.Flags))
	h.PID = u32(b, unsafe.Offsetof(r.Pid))
	h.Count = u32(b, unsafe.Offsetof(r.Count))
	h.Seq = u64(b, unsafe.Offsetof(r.Seq))
	h.CUPTIDropped = u64(b, unsafe.Offsetof(r.Cupti_dropped))
	h.LibDropped = u64(b, unsafe.Offsetof(r.Lib_dropped))
	h.Len = u32(b, unsafe.Offsetof(r.Total_len))
	hs := int(u16(b, unsafe.Offsetof(r.Header_size)))
	h.Clock = ClockSource(u16(b, unsafe.Offsetof(r.Clock_source)))
	h.ClockOffsetNs = int64(u64(b, unsafe.Offsetof(r.Clock_offset_ns)))
	h.ClockBracketNs = u32(b, unsafe.Offsetof(r.Clock_bracket_ns))
	h.Generation = u32(b, unsafe.Offsetof(r.Generation))

	switch {
	case hs < hdrSize || hs%RecordAlign != 0:
		return h, nil, fmt.Errorf("%w: header size %d", ErrMalformed, hs)
	case int(h.Len) > BatchMax:
		return h, nil, fmt.Errorf("%w: length %d > %d", ErrMalformed, h.Len, BatchMax)
	case int(h.Len) > len(b):
		return h, nil, fmt.Errorf("%w: length %d, have %d bytes", ErrShort, h.Len, len(b))
	case int(h.Len) < hs:
		return h, nil, fmt.Errorf("%w: length %d < header size %d", ErrMalformed, h.Len, hs)
	case uint64(h.Count)*RecordMin > uint64(int(h.Len)-hs):
		return h, nil, fmt.Errorf("%w: %d records cannot fit %d bytes", ErrMalformed, h.Count, int(h.Len)-hs)
	}
	return h, b[hs:h.Len], nil
}

// scan validates the record framing and counts kinds.
func scan(recs []byte, count uint32) (kindCounts, error) {
	var kc kindCounts
	off := 0
	for i := uint32(0); i < count; i++ {
		if len(recs)-off < 4 {
			return kc, fmt.Errorf("%w: record %d: truncated header", ErrMalformed, i)
		}
		kind := le.Uint16(recs[off:])
		size := int(le.Uint16(recs[off+2:]))
		if size < RecordMin || size%RecordAlign != 0 || size > len(recs)-off {
			return kc, fmt.Errorf("%w: record %d (kind %d): size %d at offset %d of %d", ErrMalformed, i, kind, size, off, len(recs))
		}
		if size < minSize(kind) {
			return kc, fmt.Errorf("%w: record %d (kind %d): size %d < %d", ErrMalformed, i, kind, size, minSize(kind))
		}
		r := recs[off : off+size]
		switch kind {
		case recKernel:
			kc.kernels++
		case recMemcpy, recMemset:
			kc.copies++
		case recName:
			var n rawName
			l := int(u16(r, unsafe.Offsetof(n.Len)))
			if l > NameMax || nameSize+l > size {
				return kc, fmt.Errorf("%w: record %d: name length %d in %d bytes", ErrMalformed, i, l, size)
			}
			if u32(r, unsafe.Offsetof(n.Name_id)) == 0 {
				return kc, fmt.Errorf("%w: record %d: name id 0", ErrMalformed, i)
			}
			kc.names++
		case recStats:
			var s rawStats
			n := int(u16(r, unsafe.Offsetof(s.N)))
			if statsSize+8*n > size {
				return kc, fmt.Errorf("%w: record %d: %d counters in %d bytes", ErrMalformed, i, n, size)
			}
			kc.stats++
		case recTransition:
			kc.transitions++
		case recNCCLComm:
			kc.ncclComms++
		case recNCCLColl:
			kc.ncclColls++
		case recNCCLKernel:
			kc.ncclKernels++
		default:
			kc.skipped++
		}
		off += size
	}
	if off != len(recs) {
		return kc, fmt.Errorf("%w: %d trailing bytes after %d records", ErrMalformed, len(recs)-off, count)
	}
	return kc, nil
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, 0, n)
	}
	return s[:0]
}

// DecodeBatchInto is DecodeBatch reusing out's slices (a hot-path reader
// decodes every batch into one Batch). On error out is left unspecified.
func DecodeBatchInto(b []byte, out *Batch) error {
	h, recs, err := decodeHeader(b)
	if err != nil {
		return err
	}
	kc, err := scan(recs, h.Count)
	if err != nil {
		return err
	}
	out.Header = h
	out.Kernels = grow(out.Kernels, kc.kernels)
	out.Copies = grow(out.Copies, kc.copies)
	out.Names = grow(out.Names, kc.names)
	out.Stats = grow(out.Stats, kc.stats)
	out.Transitions = grow(out.Transitions, kc.transitions)
	out.NCCLComms = grow(out.NCCLComms, kc.ncclComms)
	out.NCCLColls = grow(out.NCCLColls, kc.ncclColls)
	out.NCCLKernels = grow(out.NCCLKernels, kc.ncclKernels)
	out.Skipped = kc.skipped

	off := 0
	for i := uint32(0); i < h.Count; i++ {
		kind := le.Uint16(recs[off:])
		size := int(le.Uint16(recs[off+2:]))
		r := recs[off : off+size]
		off += size
		switch kind {
		case recKernel:
			out.Kernels = append(out.Kernels, decodeKernel(r))
		case recMemcpy, recMemset:
			out.Copies = append(out.Copies, decodeCopy(r, kind == recMemset))
		case recName:
			out.Names = append(out.Names, decodeName(r))
		case recStats:
			out.Stats = append(out.Stats, decodeStats(r))
		case recTransition:
			var t rawTransition
			out.Transitions = append(out.Transitions, Transition{
				On:          r[unsafe.Offsetof(t.On)] != 0,
				Reason:      Reason(r[unsafe.Offsetof(t.Reason)]),
				Mode:        DutyMode(u16(r, unsafe.Offsetof(t.Mode))),
				TimestampNs: u64(r, unsafe.Offsetof(t.Timestamp)),
			})
		case recNCCLComm:
			out.NCCLComms = append(out.NCCLComms, decodeNCCLComm(r))
		case recNCCLColl:
			out.NCCLColls = append(out.NCCLColls, decodeNCCLColl(r))
		case recNCCLKernel:
			out.NCCLKernels = append(out.NCCLKernels, decodeNCCLKernel(r))
		}
	}
	return nil
}

func decodeKernel(r []byte) Kernel {
	var k rawKernel
	return Kernel{
		StartNs:     u64(r, unsafe.Offsetof(k.Start_ns)),
		EndNs:       u64(r, unsafe.Offsetof(k.End_ns)),
		Device:      u32(r, unsafe.Offsetof(k.Device)),
		Context:     u32(r, unsafe.Offsetof(k.Context)),
		Stream:      u32(r, unsafe.Offsetof(k.Stream)),
		Correlation: u32(r, unsafe.Offsetof(k.Correlation)),
		Grid: [3]int32{
			int32(u32(r, unsafe.Offsetof(k.Grid_x))),
			int32(u32(r, unsafe.Offsetof(k.Grid_y))),
			int32(u32(r, unsafe.Offsetof(k.Grid_z))),
		},
		Block: [3]int32{
			int32(u32(r, unsafe.Offsetof(k.Block_x))),
			int32(u32(r, unsafe.Offsetof(k.Block_y))),
			int32(u32(r, unsafe.Offsetof(k.Block_z))),
		},
		NameID: u32(r, unsafe.Offsetof(k.Name_id)),
		Class:  Class(r[unsafe.Offsetof(k.Kclass)]),
		Serial: r[unsafe.Offsetof(k.Flags)]&kernelFlagSerial != 0,
	}
}

func decodeCopy(r []byte, memset bool) Copy {
	var c rawCopy
	return Copy{
		Memset:      memset,
		StartNs:     u64(r, unsafe.Offsetof(c.Start_ns)),
		EndNs:       u64(r, unsafe.Offsetof(c.End_ns)),
		Bytes:       u64(r, unsafe.Offsetof(c.Bytes)),
		Device:      u32(r, unsafe.Offsetof(c.Device)),
		Context:     u32(r, unsafe.Offsetof(c.Context)),
		Stream:      u32(r, unsafe.Offsetof(c.Stream)),
		Correlation: u32(r, unsafe.Offsetof(c.Correlation)),
		CopyKind:    r[unsafe.Offsetof(c.Copy_kind)],
		SrcKind:     r[unsafe.Offsetof(c.Src_kind)],
		DstKind:     r[unsafe.Offsetof(c.Dst_kind)],
		Flags:       r[unsafe.Offsetof(c.Flags)],
	}
}

func decodeName(r []byte) NameDef {
	var n rawName
	l := int(u16(r, unsafe.Offsetof(n.Len)))
	return NameDef{
		ID:        u32(r, unsafe.Offsetof(n.Name_id)),
		Name:      string(r[nameSize : nameSize+l]),
		FullLen:   u32(r, unsafe.Offsetof(n.Full_len)),
		Truncated: r[unsafe.Offsetof(n.Flags)]&nameFlagTruncated != 0,
		Class:     Class(r[unsafe.Offsetof(n.Kclass)]),
	}
}

func decodeStats(r []byte) Stats {
	var s rawStats
	n := int(u16(r, unsafe.Offsetof(s.N)))
	var out Stats
	out.N = n
	for i := 0; i < n && i < len(out.Counters); i++ {
		out.Counters[i] = le.Uint64(r[statsSize+8*i:])
	}
	return out
}
