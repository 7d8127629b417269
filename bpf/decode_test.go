//go:build 386 || amd64

package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
	"time"
)

// encode writes a bpf2go mirror as BPF would (little endian, C layout).
func encode(tb testing.TB, v any) []byte {
	tb.Helper()
	var buf bytes.Buffer
	if err := binary.Write(&buf, binary.LittleEndian, v); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

func hdr(typ EventType, probe ProbeID, start, end uint64) slowrankSrEventHdr {
	return slowrankSrEventHdr{Type: uint32(typ), ProbeId: uint32(probe), Pid: 42, Tid: 43, StartNs: start, EndNs: end}
}

func goHdr(typ EventType, probe ProbeID, start, end uint64) Header {
	return Header{Type: typ, Probe: probe, PID: 42, TID: 43, StartNs: start, EndNs: end}
}

func batchRecord(tb testing.TB, class int, data []byte) []byte {
	b := slowrankSrBatchEvent{Hdr: hdr(EventBatch, ProbeCUPTIEmit, 7, 7), Len: uint32(len(data))}
	copy(b.Data[:], data)
	return encode(tb, &b)[:batchDataOffset+class]
}

func validRecords(tb testing.TB) []struct {
	name string
	in   []byte
	want Event
} {
	return []struct {
		name string
		in   []byte
		want Event
	}{
		{"allreduce", encode(tb, slowrankSrCollEvent{Hdr: hdr(EventColl, ProbeNCCLAllReduce, 100, 250),
			Count: 1 << 20, Comm: 0xc0ffee, Stream: 0x5000, Datatype: 7, Redop: 2, Peer: -1, Ret: 0}),
			&CollEvent{Header: goHdr(EventColl, ProbeNCCLAllReduce, 100, 250), Count: 1 << 20, Comm: 0xc0ffee,
				Stream: 0x5000, Datatype: 7, RedOp: 2, Peer: -1}},
		{"reduce root", encode(tb, slowrankSrCollEvent{Hdr: hdr(EventColl, ProbeNCCLReduce, 1, 1),
			Count: 3, Comm: 1, Stream: 2, Datatype: 9, Redop: 1, Peer: 5, Ret: 3}),
			&CollEvent{Header: goHdr(EventColl, ProbeNCCLReduce, 1, 1), Count: 3, Comm: 1, Stream: 2, Datatype: 9,
				RedOp: 1, Peer: 5, Ret: 3}},
		{"comm init", encode(tb, slowrankSrCommInitEvent{Hdr: hdr(EventCommInit, ProbeNCCLCommInitRankConfig, 10, 20),
			IdHash: 0xfeed, Comm: 0xabc, Nranks: 8, Rank: 3, Flags: commFIDValid | commFCommValid, N_ids: 1}),
			&CommInitEvent{Header: goHdr(EventCommInit, ProbeNCCLCommInitRankConfig, 10, 20), IDHash: 0xfeed,
				IDValid: true, Comm: 0xabc, CommValid: true, NRanks: 8, Rank: 3, NIDs: 1}},
		{"comm split", encode(tb, slowrankSrCommInitEvent{Hdr: hdr(EventCommInit, ProbeNCCLCommSplit, 10, 20),
			Comm: 0xdef, ParentComm: 0xabc, Nranks: -1, Rank: -1, Color: -1, Key: 4, Ret: 7,
			Flags: commFCommValid | commFParent}),
			&CommInitEvent{Header: goHdr(EventCommInit, ProbeNCCLCommSplit, 10, 20), Comm: 0xdef, CommValid: true,
				Parent: 0xabc, IsSplit: true, NRanks: -1, Rank: -1, Color: -1, Key: 4, Ret: 7}},
		{"sync", encode(tb, slowrankSrSyncEvent{Hdr: hdr(EventSync, ProbeCuStreamSynchronize, 5, 20_000_005),
			Handle: 0x7000, Ret: 0}),
			&SyncEvent{Header: goHdr(EventSync, ProbeCuStreamSynchronize, 5, 20_000_005), Handle: 0x7000}},
		{"group start", encode(tb, slowrankSrGroupEvent{Hdr: hdr(EventGroup, ProbeNCCLGroupStart, 9, 9)}),
			&GroupEvent{Header: goHdr(EventGroup, ProbeNCCLGroupStart, 9, 9)}},
		{"group end", encode(tb, slowrankSrGroupEvent{Hdr: hdr(EventGroup, ProbeNCCLGroupEnd, 9, 19), Ret: 5, Flags: groupFReturn}),
			&GroupEvent{Header: goHdr(EventGroup, ProbeNCCLGroupEnd, 9, 19), Ret: 5, HasReturn: true}},
		{"torch this in rsi", encode(tb, slowrankSrTorchEvent{Hdr: hdr(EventTorch, ProbeTorchGlooAllreduce, 1, 2), Arg0: 0x7ffd, Arg1: 0x55aa}),
			&TorchEvent{Header: goHdr(EventTorch, ProbeTorchGlooAllreduce, 1, 2), Self: 0x55aa, Arg0: 0x7ffd, Arg1: 0x55aa}},
		{"torch this in rdi", encode(tb, slowrankSrTorchEvent{Hdr: hdr(EventTorch, ProbeTorchWorkWait, 1, 2), Arg0: 0x55bb, Arg1: 5}),
			&TorchEvent{Header: goHdr(EventTorch, ProbeTorchWorkWait, 1, 2), Self: 0x55bb, Arg0: 0x55bb, Arg1: 5}},
		{"batch small class", batchRecord(tb, 512, []byte("hello")),
			&BatchEvent{Header: goHdr(EventBatch, ProbeCUPTIEmit, 7, 7), Data: []byte("hello")}},
		{"batch full", batchRecord(tb, BatchMax, bytes.Repeat([]byte{0xa5}, BatchMax)),
			&BatchEvent{Header: goHdr(EventBatch, ProbeCUPTIEmit, 7, 7), Data: bytes.Repeat([]byte{0xa5}, BatchMax)}},
		{"batch empty", batchRecord(tb, 0, nil),
			&BatchEvent{Header: goHdr(EventBatch, ProbeCUPTIEmit, 7, 7), Data: []byte{}}},
	}
}

func TestDecodeValid(t *testing.T) {
	for _, tc := range validRecords(t) {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode(tc.in)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestDecodeDoesNotAlias(t *testing.T) {
	in := batchRecord(t, 512, []byte("abc"))
	ev, err := Decode(in)
	if err != nil {
		t.Fatal(err)
	}
	in[batchDataOffset] = 'X'
	if d := ev.(*BatchEvent).Data; string(d) != "abc" {
		t.Errorf("batch data aliases the record: %q", d)
	}
}

func TestDecodeMalformed(t *testing.T) {
	coll := encode(t, slowrankSrCollEvent{Hdr: hdr(EventColl, ProbeNCCLAllReduce, 1, 2)})
	mutate := func(b []byte, f func([]byte)) []byte {
		c := append([]byte(nil), b...)
		f(c)
		return c
	}
	put32 := func(off int, v uint32) func([]byte) {
		return func(b []byte) { binary.LittleEndian.PutUint32(b[off:], v) }
	}
	bigBatch := batchRecord(t, 512, []byte("x"))
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"short header", coll[:31]},
		{"unknown type", mutate(coll, put32(0, 99))},
		{"type zero", mutate(coll, put32(0, 0))},
		{"unknown probe", mutate(coll, put32(4, 999))},
		{"probe of another type", mutate(coll, put32(4, uint32(ProbeCuCtxSynchronize)))},
		{"coll too short", coll[:collSize-1]},
		{"coll too long", append(append([]byte(nil), coll...), 0)},
		{"end before start", encode(t, slowrankSrCollEvent{Hdr: hdr(EventColl, ProbeNCCLAllReduce, 2, 1)})},
		{"sync as coll size", mutate(coll, func(b []byte) { put32(0, uint32(EventSync))(b); put32(4, uint32(ProbeCUDADeviceSynchronize))(b) })},
		{"marker with duration", encode(t, slowrankSrGroupEvent{Hdr: hdr(EventGroup, ProbeNCCLGroupStart, 1, 2)})},
		{"batch header only", bigBatch[:batchDataOffset-1]},
		{"batch len beyond record", mutate(bigBatch, put32(32, 513))},
		{"batch len beyond max", mutate(batchRecord(t, BatchMax, nil), put32(32, BatchMax+1))},
		{"batch record beyond max", append(batchRecord(t, BatchMax, nil), 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := Decode(tc.in)
			if !errors.Is(err, ErrMalformed) {
				t.Errorf("Decode = %+v, %v; want ErrMalformed", ev, err)
			}
		})
	}
}

func TestHashUniqueID(t *testing.T) {
	// FNV-1a 64 reference values.
	if h := HashUniqueID(nil); h != 0xcbf29ce484222325 {
		t.Errorf("empty: %#x", h)
	}
	if h := HashUniqueID([]byte("a")); h != 0xaf63dc4c8601ec8c {
		t.Errorf("a: %#x", h)
	}
}

// FuzzDecode: Decode never panics, and what it accepts is consistent with
// the bytes it was given.
func FuzzDecode(f *testing.F) {
	for _, tc := range validRecords(f) {
		if len(tc.in) <= 4096 {
			f.Add(tc.in)
		}
	}
	f.Add([]byte{})
	var s scratch // reused across inputs, as Reader.Next does
	f.Fuzz(func(t *testing.T, b []byte) {
		ev, err := Decode(b)
		if reused, rerr := decode(b, &s); (rerr == nil) != (err == nil) || !reflect.DeepEqual(reused, ev) {
			t.Fatalf("decode into scratch: %+v, %v; Decode: %+v, %v", reused, rerr, ev, err)
		}
		if err != nil {
			if !errors.Is(err, ErrMalformed) || ev != nil {
				t.Fatalf("error %v with event %v", err, ev)
			}
			return
		}
		h := ev.Base()
		le := binary.LittleEndian
		if uint32(h.Type) != le.Uint32(b) || uint32(h.Probe) != le.Uint32(b[4:]) ||
			h.PID != le.Uint32(b[8:]) || h.TID != le.Uint32(b[12:]) ||
			h.StartNs != le.Uint64(b[16:]) || h.EndNs != le.Uint64(b[24:]) {
			t.Fatalf("header %+v does not match input", h)
		}
		if h.EndNs < h.StartNs || h.Probe.EventType() != h.Type {
			t.Fatalf("accepted inconsistent header %+v", h)
		}
		switch e := ev.(type) {
		case *BatchEvent:
			if len(e.Data) > BatchMax || !bytes.Equal(e.Data, b[batchDataOffset:batchDataOffset+len(e.Data)]) {
				t.Fatalf("batch data of %d bytes does not match input", len(e.Data))
			}
		case *CollEvent:
			if len(b) != collSize {
				t.Fatalf("coll of %d bytes accepted", len(b))
			}
		case *CommInitEvent:
			if len(b) != commInitSize {
				t.Fatalf("comm init of %d bytes accepted", len(b))
			}
		case *SyncEvent:
			if len(b) != syncSize {
				t.Fatalf("sync of %d bytes accepted", len(b))
			}
		case *GroupEvent:
			if len(b) != groupSize {
				t.Fatalf("group of %d bytes accepted", len(b))
			}
		case *TorchEvent:
			if len(b) != torchSize {
				t.Fatalf("torch of %d bytes accepted", len(b))
			}
		case *CUPTICallEvent:
			if len(b) != cuptiCallSize || h.EndNs != h.StartNs || e.Arg != le.Uint64(b[32:]) || e.Arg2 != le.Uint64(b[40:]) {
				t.Fatalf("cupti call %+v from %d bytes accepted", e, len(b))
			}
		default:
			t.Fatalf("unexpected event type %T", ev)
		}
	})
}

func TestReaderPollBackOff(t *testing.T) {
	const poll = 20 * time.Millisecond
	r := &Reader{p: &Probes{poll: poll}, wait: poll}
	tests := []struct {
		got  bool // a record arrived since the last tick
		want time.Duration
	}{
		{false, 40 * time.Millisecond},
		{false, 80 * time.Millisecond},
		{false, 160 * time.Millisecond},
		{false, 200 * time.Millisecond}, // capped at maxIdlePolls intervals
		{false, 200 * time.Millisecond},
		{true, poll}, // records flow again: back to the poll interval
		{true, poll},
		{false, 40 * time.Millisecond},
	}
	for i, tt := range tests {
		r.got = tt.got
		r.backOff()
		if r.wait != tt.want || r.got {
			t.Fatalf("tick %d: wait %v got %v, want %v and got reset", i, r.wait, r.got, tt.want)
		}
	}
}
