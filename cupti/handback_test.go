package cupti

import (
	"errors"
	"testing"
	"unsafe"
)

// initialHandback is the block as the library initialises it.
func initialHandback(base int) *memFile {
	m := &memFile{b: make([]byte, base+HandbackSize+64)}
	var r rawHandback
	b := m.b[base:]
	le.PutUint32(b[unsafe.Offsetof(r.Magic):], HandbackMagic)
	le.PutUint16(b[unsafe.Offsetof(r.Version):], HandbackVer)
	le.PutUint16(b[unsafe.Offsetof(r.Size):], uint16(HandbackSize))
	le.PutUint64(b[unsafe.Offsetof(r.Own_request):], 0x7f0000001000)
	le.PutUint64(b[unsafe.Offsetof(r.Own_complete):], 0x7f0000002000)
	le.PutUint64(b[unsafe.Offsetof(r.Handbacks):], 2)
	le.PutUint64(b[unsafe.Offsetof(r.Taken):], 1)
	return m
}

func TestHandbackRoundTrip(t *testing.T) {
	const base = 64
	m := initialHandback(base)
	h, err := ReadHandback(m, base)
	if err != nil {
		t.Fatal(err)
	}
	if h.Seq != 0 || h.Foreign != (ForeignCallbacks{}) || h.Status.OwnRequest != 0x7f0000001000 ||
		h.Status.OwnComplete != 0x7f0000002000 || h.Status.Handbacks != 2 || h.Status.Taken != 1 {
		t.Fatalf("initial %+v", h)
	}
	f := ForeignCallbacks{RequestFn: 0x5500001000, CompleteFn: 0x5500002000, PairNs: 1000,
		TimestampFn: 0x5500003000, TimestampNs: 990, Kinds: 1<<1 | 1<<2 | 1<<10, KindsKept: true}
	seq, err := WriteHandback(m, base, h.Seq, f)
	if err != nil || seq != 2 {
		t.Fatalf("WriteHandback: %d %v", seq, err)
	}
	// The seqlock order: odd seq, fields, even seq.
	var r rawHandback
	seqOff := int64(base) + int64(unsafe.Offsetof(r.Seq))
	if len(m.writes) != 3 || m.writes[0] != seqOff || m.writes[1] != int64(base)+int64(unsafe.Offsetof(r.Flags)) ||
		m.writes[2] != seqOff {
		t.Fatalf("writes %v", m.writes)
	}
	if h, err = ReadHandback(m, base); err != nil || h.Foreign != f || h.Seq != 2 {
		t.Fatalf("after write %+v %v", h, err)
	}
	// The library's fields were not touched.
	if h.Status.OwnRequest != 0x7f0000001000 || h.Status.Handbacks != 2 || h.Status.Taken != 1 {
		t.Fatalf("library fields %+v", h.Status)
	}
	// Nothing seen: no flags, so the library uses none of the fields.
	if seq, err = WriteHandback(m, base, seq, ForeignCallbacks{}); err != nil || seq != 4 {
		t.Fatal(seq, err)
	}
	if got := le.Uint32(m.b[base+int(unsafe.Offsetof(r.Flags)):]); got != 0 {
		t.Fatalf("flags %#x", got)
	}
	if h, err = ReadHandback(m, base); err != nil || h.Foreign != (ForeignCallbacks{}) {
		t.Fatalf("cleared %+v %v", h, err)
	}
	// An odd seq read back (the agent died mid-write) is rounded down.
	le.PutUint32(m.b[seqOff:], 7)
	if seq, err = WriteHandback(m, base, 7, f); err != nil || seq != 8 {
		t.Fatal(seq, err)
	}
}

func TestHandbackRefused(t *testing.T) {
	var r rawHandback
	for _, tc := range []struct {
		name string
		mod  func(b []byte)
	}{
		{"magic", func(b []byte) { le.PutUint32(b[unsafe.Offsetof(r.Magic):], ControlMagic) }},
		{"version", func(b []byte) { le.PutUint16(b[unsafe.Offsetof(r.Version):], HandbackVer+1) }},
		{"size", func(b []byte) { le.PutUint16(b[unsafe.Offsetof(r.Size):], uint16(HandbackSize-8)) }},
	} {
		m := initialHandback(0)
		tc.mod(m.b)
		if _, err := ReadHandback(m, 0); !errors.Is(err, ErrHandback) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	if _, err := ParseHandback(make([]byte, HandbackSize-1)); !errors.Is(err, ErrHandback) {
		t.Errorf("short: %v", err)
	}
	m := initialHandback(0)
	if _, err := WriteHandback(m, 0, 0, ForeignCallbacks{PairNs: 1}); !errors.Is(err, ErrHandback) || len(m.writes) != 0 {
		t.Errorf("address 0 (a library without the block): %v, %d writes", err, len(m.writes))
	}
}

// A handback block whose seq is not the one the agent last wrote (another
// writer, or a new block at the address) is not written.
func TestHandbackWriteRefusedWhenSeqMoved(t *testing.T) {
	var r rawHandback
	const base = 64
	m := initialHandback(base)
	le.PutUint32(m.b[base+unsafe.Offsetof(r.Seq):], 10)
	if _, err := WriteHandback(m, base, 4, ForeignCallbacks{PairNs: 1}); !errors.Is(err, ErrBlockMoved) || len(m.writes) != 0 {
		t.Errorf("seq moved: %v, %d writes", err, len(m.writes))
	}
}
