package capture

import (
	"encoding/binary"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slowrank/slowrank/agent/pipeline"
	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/correlate"
	"github.com/slowrank/slowrank/cupti"
	"github.com/slowrank/slowrank/detector"
)

func batchEvent(pid uint32, data []byte) *bpf.BatchEvent {
	return &bpf.BatchEvent{Header: bpf.Header{Type: bpf.EventBatch, Probe: bpf.ProbeCUPTIEmit, PID: pid, TID: pid, StartNs: 1, EndNs: 2}, Data: data}
}

// TestConverterHostileBatches feeds the Converter what a compromised
// training process could send through the injection library's emit: it
// never panics, counts everything it refuses, keeps its memory bounded and
// its counters sane.
func TestConverterHostileBatches(t *testing.T) {
	c := newCounters()
	conv := newConverter(c, false)
	rng := rand.New(rand.NewPCG(1, 2))
	var out []pipeline.Input

	// Random bytes, with and without a valid magic.
	for i := 0; i < 5000; i++ {
		b := make([]byte, rng.IntN(cupti.BatchMax+1))
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		if i%2 == 0 && len(b) >= 8 {
			binary.LittleEndian.PutUint32(b, 0x42435253)
			binary.LittleEndian.PutUint16(b[4:], 1)
		}
		out = conv.Convert(batchEvent(100, b), out[:0])
	}
	if got := c.get("batches_malformed") + c.get("batches"); got != 5000 {
		t.Errorf("%d of 5000 random batches accounted for", got)
	}

	// A flood of distinct maximum-length names from many processes.
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	name := strings.Repeat("n", cupti.NameMax-12)
	sent := 0
	for pid := uint32(1000); pid < 1000+200; pid++ {
		for batchN := 0; batchN < 40; batchN++ {
			b := cupti.Batch{Header: cupti.Header{Version: cupti.ABIVersion, PID: pid, Seq: uint64(batchN + 1)}}
			for k := 0; k < 25; k++ {
				id := uint32(batchN*25 + k + 1)
				b.Names = append(b.Names, cupti.NameDef{ID: id, Name: name + strconv.Itoa(int(id)), FullLen: uint32(len(name) + 8)})
			}
			data, err := cupti.EncodeBatch(&b)
			if err != nil {
				t.Fatal(err)
			}
			out = conv.Convert(batchEvent(pid, data), out[:0])
			sent += len(b.Names)
		}
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	st := conv.NameStats()
	refused := int64(st.Refused)
	if st.Names > MaxInternedNames || st.Names+int(refused) != sent {
		t.Errorf("names: %d held, %d refused, %d sent (bound %d)", st.Names, refused, sent, MaxInternedNames)
	}
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 96<<20 {
		t.Errorf("heap grew by %d MiB for %d names", grew>>20, st.Names)
	}
	t.Logf("%d names sent by 200 processes: %d held, %d refused; heap +%d MiB", sent, st.Names, refused, (int64(after.HeapAlloc)-int64(before.HeapAlloc))>>20)

	// Lying sequence numbers and drop counters do not wrap the counters.
	for _, h := range []cupti.Header{
		{Version: cupti.ABIVersion, Seq: 1},
		{Version: cupti.ABIVersion, Seq: ^uint64(0)},
		{Version: cupti.ABIVersion, Seq: ^uint64(0), CUPTIDropped: ^uint64(0), LibDropped: ^uint64(0)},
	} {
		data, err := cupti.EncodeBatch(&cupti.Batch{Header: h})
		if err != nil {
			t.Fatal(err)
		}
		out = conv.Convert(batchEvent(7, data), out[:0])
	}
	for _, k := range []string{"batches_lost", "device_records_dropped"} {
		if v := c.get(k); v < 0 || v > 2*maxPlausibleLoss {
			t.Errorf("%s = %d after lying headers", k, v)
		}
	}
	if c.get("batches_implausible") == 0 {
		t.Error("implausible headers not counted")
	}
}

// TestPipelineHostileDeviceRecords: device intervals with absurd times from
// a hostile batch go through the correlator and detector in bounded time.
func TestPipelineHostileDeviceRecords(t *testing.T) {
	det, err := detector.New(detector.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	c := newCounters()
	p := pipeline.New(pipeline.Config{Correlator: correlate.New(correlate.Config{}), Detector: det, Count: c.add})
	conv := newConverter(c, false)
	p.SetRank(correlate.RankInfo{PID: 9, Rank: 0, WorldSize: 1, Job: "j", Host: "h"})
	b := cupti.Batch{Header: cupti.Header{Version: cupti.ABIVersion, Seq: 1}}
	for i := 0; i < 150; i++ {
		start, end := uint64(i)*1_000_000, uint64(i)*1_000_000+500_000
		switch i % 4 {
		case 0:
			start, end = end, start // ends before it starts
		case 1:
			start, end = 0, ^uint64(0) // negative as int64
		case 2:
			start, end = 1<<62, 1<<63-1
		}
		b.Kernels = append(b.Kernels, cupti.Kernel{StartNs: start, EndNs: end, Class: cupti.Class(i % 7), NameID: uint32(i)})
		if i%3 == 0 {
			b.Transitions = append(b.Transitions, cupti.Transition{On: i%2 == 0, TimestampNs: rand.Uint64()})
		}
	}
	data, err := cupti.EncodeBatch(&b)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for round := 0; round < 50; round++ {
		for _, in := range conv.Convert(batchEvent(9, data), nil) {
			p.Feed(in)
		}
		p.Tick(int64(round) * int64(time.Second))
	}
	p.Flush(1 << 62)
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("50 hostile batches took %v", d)
	}
}

// TestConverterConcurrentForget: the reader goroutine converts while the
// main goroutine forgets exited processes (run with -race).
func TestConverterConcurrentForget(t *testing.T) {
	conv := newConverter(newCounters(), false)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 20000; i++ {
			pid := uint32(i % 64)
			conv.Convert(&bpf.CollEvent{Header: bpf.Header{Type: bpf.EventColl, Probe: bpf.ProbeNCCLAllReduce, PID: pid, StartNs: 1, EndNs: 2}}, nil)
			conv.Convert(&bpf.TorchEvent{Header: bpf.Header{Type: bpf.EventTorch, Probe: bpf.ProbeTorchNCCLAllreduce, PID: pid, StartNs: 1, EndNs: 2}}, nil)
		}
	}()
	for i := 0; ; i++ {
		select {
		case <-done:
			return
		default:
			conv.Forget(uint32(i % 64))
		}
	}
}
