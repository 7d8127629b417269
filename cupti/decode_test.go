package cupti

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
)

func sampleBatch() *Batch {
	return &Batch{
		Header: Header{Flags: batchFlagEpochStart, PID: 77, Seq: 9, CUPTIDropped: 3, LibDropped: 1,
			Clock: ClockCalibrated, ClockOffsetNs: -1234, ClockBracketNs: 80, Generation: 4},
		Names: []NameDef{
			{ID: 1, Name: "ncclDevKernel_AllReduce_Sum_f32_RING_LL", FullLen: 39, Class: ClassCommunication},
			{ID: 2, Name: strings.Repeat("g", NameMax), FullLen: 2000, Truncated: true, Class: ClassGEMM},
		},
		Kernels: []Kernel{
			{StartNs: 100, EndNs: 200, Device: 1, Context: 2, Stream: 3, Correlation: 4, Grid: [3]int32{8, 1, 1}, Block: [3]int32{256, 1, 1}, NameID: 1, Class: ClassCommunication},
			{StartNs: 150, EndNs: 400, Device: 1, Context: 2, Stream: 7, Correlation: 5, Grid: [3]int32{132, 2, 1}, Block: [3]int32{384, 1, 1}, NameID: 2, Class: ClassGEMM, Serial: true},
		},
		Copies: []Copy{
			{StartNs: 10, EndNs: 20, Bytes: 1 << 20, Device: 1, Context: 2, Stream: 9, Correlation: 6, CopyKind: 1, SrcKind: 3, DstKind: 2, Flags: 1},
			{Memset: true, StartNs: 30, EndNs: 31, Bytes: 4096, Device: 1, Context: 2, Stream: 9, Correlation: 7, SrcKind: 2},
		},
		Transitions: []Transition{{On: true, Reason: ReasonEscalation, Mode: DutyTime, TimestampNs: 99}},
		Stats:       []Stats{{Counters: [NumStats]uint64{StatKernels: 2, StatBatches: 9}, N: int(NumStats)}},
	}
}

func mustEncode(t testing.TB, b *Batch) []byte {
	t.Helper()
	raw, err := EncodeBatch(b)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func TestDecodeRoundTrip(t *testing.T) {
	in := sampleBatch()
	raw := mustEncode(t, in)
	got, err := DecodeBatch(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := *in
	want.Header.Version = ABIVersion
	want.Header.Count = 8
	want.Header.Len = uint32(len(raw))
	if !reflect.DeepEqual(got, want) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, want)
	}
	if !got.Header.EpochStart() || got.Header.Final() {
		t.Errorf("flags %#x", got.Header.Flags)
	}
	if got.Stats[0].Get(StatBatches) != 9 || got.Stats[0].Get(Stat(-1)) != 0 || got.Stats[0].Get(NumStats) != 0 {
		t.Errorf("stats %+v", got.Stats[0])
	}
	// Bytes after Header.Len (a fixed-size copy) are ignored.
	padded := append(append([]byte{}, raw...), make([]byte, 100)...)
	if _, err := DecodeBatch(padded); err != nil {
		t.Errorf("padded: %v", err)
	}
}

// put16/put32 patch a raw batch.
func put16(b []byte, off int, v uint16) { binary.LittleEndian.PutUint16(b[off:], v) }
func put32(b []byte, off int, v uint32) { binary.LittleEndian.PutUint32(b[off:], v) }

func TestDecodeErrors(t *testing.T) {
	base := mustEncode(t, sampleBatch())
	// Offsets of the first record (a name) and of the kernels.
	first := hdrSize
	nameRec := roundUp(nameSize + len(sampleBatch().Names[0].Name))
	tests := []struct {
		name  string
		patch func([]byte) []byte
		want  error
	}{
		{"empty", func(b []byte) []byte { return nil }, ErrShort},
		{"short header", func(b []byte) []byte { return b[:hdrSize-1] }, ErrShort},
		{"bad magic", func(b []byte) []byte { put32(b, 0, 0xdeadbeef); return b }, ErrMagic},
		{"version 2", func(b []byte) []byte { put16(b, 4, 2); return b }, ErrVersion},
		{"version 0", func(b []byte) []byte { put16(b, 4, 0); return b }, ErrVersion},
		{"header size small", func(b []byte) []byte { put16(b, 44, 56); return b }, ErrMalformed},
		{"header size unaligned", func(b []byte) []byte { put16(b, 44, 68); return b }, ErrMalformed},
		{"length beyond buffer", func(b []byte) []byte { return b[:len(b)-8] }, ErrShort},
		{"length above max", func(b []byte) []byte { put32(b, 40, BatchMax+8); return b }, ErrMalformed},
		{"length below header", func(b []byte) []byte { put32(b, 40, 32); return b }, ErrMalformed},
		{"count too large", func(b []byte) []byte { put32(b, 12, 1<<30); return b }, ErrMalformed},
		{"count too small", func(b []byte) []byte { put32(b, 12, 7); return b }, ErrMalformed},
		{"count one more", func(b []byte) []byte { put32(b, 12, 9); return b }, ErrMalformed},
		{"record size zero", func(b []byte) []byte { put16(b, first+2, 0); return b }, ErrMalformed},
		{"record size unaligned", func(b []byte) []byte { put16(b, first+2, uint16(nameRec-4)); return b }, ErrMalformed},
		{"record overruns", func(b []byte) []byte { put16(b, first+2, 0xfff8); return b }, ErrMalformed},
		{"name too long", func(b []byte) []byte { put16(b, first+4, NameMax+1); return b }, ErrMalformed},
		{"name beyond record", func(b []byte) []byte { put16(b, first+4, uint16(nameRec)); return b }, ErrMalformed},
		{"name id zero", func(b []byte) []byte { put32(b, first+8, 0); return b }, ErrMalformed},
		{"kernel too small", func(b []byte) []byte {
			// Turn the first name record (48 bytes) into a "kernel".
			put16(b, first, recKernel)
			return b
		}, ErrMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.patch(append([]byte{}, base...))
			_, err := DecodeBatch(b)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

// rawBatch builds a batch from raw records (each with its own header).
func rawBatch(records ...[]byte) []byte {
	out, err := EncodeBatch(&Batch{})
	if err != nil {
		panic(err)
	}
	for _, r := range records {
		out = append(out, r...)
	}
	put32(out, 12, uint32(len(records)))
	put32(out, 40, uint32(len(out)))
	return out
}

func record(kind uint16, size int) []byte {
	r := make([]byte, size)
	put16(r, 0, kind)
	put16(r, 2, uint16(size))
	return r
}

func TestDecodeForwardCompatible(t *testing.T) {
	// An unknown kind is skipped by its size and counted.
	unknown := record(0x7777, 24)
	// A known kind grown by newer fields is accepted; the prefix is read.
	bigKernel := record(recKernel, kernelSize+16)
	binary.LittleEndian.PutUint64(bigKernel[8:], 5)
	binary.LittleEndian.PutUint64(bigKernel[16:], 6)
	bigKernel[kernelSize] = 0xff // a newer field
	// A stats record with fewer and one with more counters than known.
	fewer := record(recStats, statsSize+8*2)
	put16(fewer, 4, 2)
	binary.LittleEndian.PutUint64(fewer[statsSize+8:], 42)
	more := record(recStats, statsSize+8*(int(NumStats)+3))
	put16(more, 4, uint16(NumStats)+3)
	got, err := DecodeBatch(rawBatch(unknown, bigKernel, fewer, more))
	if err != nil {
		t.Fatal(err)
	}
	if got.Skipped != 1 || len(got.Kernels) != 1 || len(got.Stats) != 2 {
		t.Fatalf("got %+v", got)
	}
	if got.Kernels[0].StartNs != 5 || got.Kernels[0].EndNs != 6 {
		t.Errorf("kernel %+v", got.Kernels[0])
	}
	if got.Stats[0].N != 2 || got.Stats[0].Get(StatKernels) != 42 || got.Stats[1].N != int(NumStats)+3 {
		t.Errorf("stats %+v", got.Stats)
	}
	// An empty batch is valid.
	if b, err := DecodeBatch(rawBatch()); err != nil || b.Header.Count != 0 {
		t.Errorf("empty batch: %+v %v", b, err)
	}
	// Trailing bytes inside Header.Len are not.
	tr := rawBatch(record(recTransition, transitionSize))
	tr = append(tr, make([]byte, 8)...)
	put32(tr, 40, uint32(len(tr)))
	if _, err := DecodeBatch(tr); !errors.Is(err, ErrMalformed) {
		t.Errorf("trailing bytes: %v", err)
	}
}

func TestEncodeErrors(t *testing.T) {
	if _, err := EncodeBatch(&Batch{Names: []NameDef{{ID: 1, Name: strings.Repeat("x", NameMax+1)}}}); err == nil {
		t.Error("long name encoded")
	}
	if _, err := EncodeBatch(&Batch{Names: []NameDef{{ID: 0, Name: "x"}}}); err == nil {
		t.Error("name id 0 encoded")
	}
	if _, err := EncodeBatch(&Batch{Kernels: make([]Kernel, BatchMax/kernelSize+1)}); err == nil {
		t.Error("oversized batch encoded")
	}
}

func TestDecodeIntoReusesMemory(t *testing.T) {
	b := sampleBatch()
	b.Names = nil // names allocate their strings
	raw := mustEncode(t, b)
	var out Batch
	if err := DecodeBatchInto(raw, &out); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if err := DecodeBatchInto(raw, &out); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("DecodeBatchInto allocates %v times per batch", allocs)
	}
}

// readBatches reads the [u32 len][batch] stream written by the C converter
// test (make cupti-test) and by SLOWRANK_CUPTI_DUMP.
func readBatches(t *testing.T, path string) [][]byte {
	t.Helper()
	out, err := readBatchFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func readBatchFile(path string) ([][]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out [][]byte
	for len(data) > 0 {
		if len(data) < 4 {
			return nil, fmt.Errorf("%s: truncated length", path)
		}
		n := binary.LittleEndian.Uint32(data)
		if int(n) > len(data)-4 {
			return nil, fmt.Errorf("%s: truncated batch", path)
		}
		out = append(out, data[4:4+n])
		data = data[4+n:]
	}
	return out, nil
}

// TestConverterBatches decodes batches produced by the real C converter
// (slowrank_convert.c driven by test_convert.c with synthetic CUPTI records).
func TestConverterBatches(t *testing.T) {
	raws := readBatches(t, "testdata/converter.batches")
	if len(raws) < 5 {
		t.Fatalf("%d batches", len(raws))
	}
	in := NewInterner()
	var batches []Batch
	for i, raw := range raws {
		b, err := DecodeBatch(raw)
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		if b.Header.PID != 4242 || b.Header.Len != uint32(len(raw)) || len(raw) > BatchMax {
			t.Fatalf("batch %d header %+v", i, b.Header)
		}
		batches = append(batches, b)
	}

	// The first case: six names, seven kernels, a memcpy and a memset.
	b := batches[0]
	in.Observe(4242, &b)
	if len(b.Names) != 6 || len(b.Kernels) != 7 || len(b.Copies) != 2 || b.Skipped != 0 {
		t.Fatalf("basic batch: %d names %d kernels %d copies", len(b.Names), len(b.Kernels), len(b.Copies))
	}
	if !b.Header.EpochStart() || b.Header.LibDropped != 2 || b.Header.Seq != 1 || b.Header.Clock != ClockMonotonicCallback {
		t.Errorf("basic header %+v", b.Header)
	}
	wantClass := []Class{ClassCommunication, ClassAttention, ClassGEMM, ClassMoE, ClassCopy, ClassOther, ClassGEMM}
	for i, k := range b.Kernels {
		if k.Class != wantClass[i] {
			t.Errorf("kernel %d class %v, want %v", i, k.Class, wantClass[i])
		}
		def, ok := in.Lookup(4242, k.NameID)
		if !ok || def.Class != k.Class {
			t.Errorf("kernel %d: name %d %+v", i, k.NameID, def)
		}
		if k.EndNs <= k.StartNs || k.Device != 3 || k.Stream != 7 || k.Grid != [3]int32{128, 2, 1} || k.Block != [3]int32{256, 1, 1} {
			t.Errorf("kernel %d: %+v", i, k)
		}
	}
	if !b.Kernels[3].Serial {
		t.Error("kernel 3 not marked serial")
	}
	if got := in.Name(4242, b.Kernels[0].NameID); !strings.HasPrefix(got, "ncclDevKernel_AllReduce") {
		t.Errorf("name %q", got)
	}
	if b.Kernels[2].NameID != b.Kernels[6].NameID {
		t.Error("one name interned twice")
	}
	mc, ms := b.Copies[0], b.Copies[1]
	if mc.Memset || mc.Bytes != 1<<20 || mc.StartNs != 8000 || mc.EndNs != 9000 || mc.Correlation != 21 {
		t.Errorf("memcpy %+v", mc)
	}
	if !ms.Memset || ms.Bytes != 4096 || ms.Correlation != 22 {
		t.Errorf("memset %+v", ms)
	}

	// Truncated long name.
	var sawTruncated, sawFinal, sawStats, sawTransition bool
	var kernels int
	for i := range batches {
		b := &batches[i]
		for _, n := range b.Names {
			if n.Truncated {
				sawTruncated = true
				if len(n.Name) != NameMax || n.FullLen != 3000 || n.Class != ClassGEMM {
					t.Errorf("truncated name %d bytes full %d class %v", len(n.Name), n.FullLen, n.Class)
				}
			}
		}
		kernels += len(b.Kernels)
		sawFinal = sawFinal || b.Header.Final()
		sawStats = sawStats || len(b.Stats) > 0
		sawTransition = sawTransition || len(b.Transitions) > 0
	}
	if !sawTruncated || !sawFinal || !sawStats || !sawTransition {
		t.Errorf("truncated %v final %v stats %v transition %v", sawTruncated, sawFinal, sawStats, sawTransition)
	}
	if kernels < 3000 {
		t.Errorf("%d kernels", kernels)
	}
}

// TestH200Batches decodes batches recorded on an H200 (CUDA 13.0, CUPTI
// 2025.3.1, torch 2.11) by bench/gpu/cupti_smoke.sh with
// SLOWRANK_CUPTI_DUMP: the first twelve and the last three of a duty-cycled
// run (300 ms of every 1 s).
func TestH200Batches(t *testing.T) {
	raws := readBatches(t, "testdata/h200_cuda13.batches")
	in := NewInterner()
	var kernels, transitions, stats int
	var final bool
	classes := map[Class]int{}
	for i, raw := range raws {
		b, err := DecodeBatch(raw)
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		if b.Header.Clock != ClockMonotonicCallback || b.Header.CUPTIDropped != 0 || b.Header.LibDropped != 0 {
			t.Errorf("batch %d header %+v", i, b.Header)
		}
		in.Observe(b.Header.PID, &b)
		for _, k := range b.Kernels {
			if k.StartNs == 0 || k.EndNs < k.StartNs {
				t.Errorf("kernel times %+v", k)
			}
			if d, ok := in.Lookup(b.Header.PID, k.NameID); !ok || d.Class != k.Class {
				t.Errorf("kernel %+v: name %+v %v", k, d, ok)
			}
			classes[k.Class]++
		}
		kernels += len(b.Kernels)
		transitions += len(b.Transitions)
		stats += len(b.Stats)
		final = final || b.Header.Final()
		if i == 0 && !b.Header.EpochStart() {
			t.Error("first batch is not an epoch start")
		}
	}
	if kernels < 100 || transitions < 5 || stats < 3 || !final {
		t.Errorf("kernels %d transitions %d stats %d final %v", kernels, transitions, stats, final)
	}
	t.Logf("classes %v", classes)
}
