package agent

import (
	"encoding/binary"
	"math/rand/v2"
	"os"
	"path/filepath"
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

func TestGoMemoryLimit(t *testing.T) {
	got, err := GoMemoryLimit(512<<20, 8<<20)
	if err != nil || got != 512<<20-16<<20-memoryReserve {
		t.Errorf("GoMemoryLimit(512 MiB, 8 MiB) = %d, %v", got, err)
	}
	if _, err := GoMemoryLimit(64<<20, 8<<20); err == nil || !strings.Contains(err.Error(), "at least 80 MiB") {
		t.Errorf("64 MiB with an 8 MiB ring buffer: %v", err)
	}
}

func TestParseStatus(t *testing.T) {
	rss, threads, err := parseStatus([]byte("Name:\tslowrank\nVmRSS:\t   46232 kB\nThreads:\t14\n"))
	if err != nil || rss != 46232<<10 || threads != 14 {
		t.Errorf("parseStatus = %d, %d, %v", rss, threads, err)
	}
	for _, in := range []string{"", "VmRSS:\t1 kB\n", "VmRSS: x kB\nThreads: 1\n", "VmRSS:\nThreads:\t1\n"} {
		if _, _, err := parseStatus([]byte(in)); err == nil {
			t.Errorf("parseStatus(%q) accepted", in)
		}
	}
}

// TestNextEpoch: restarts within the same second (or after the clock stepped
// back) still get a greater epoch, persisted safely.
func TestNextEpoch(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	now := time.Unix(1_800_000_000, 0)
	var got []int
	for _, at := range []time.Time{now, now, now.Add(500 * time.Millisecond), now.Add(-time.Hour), now.Add(10 * time.Second)} {
		e, err := NextEpoch(dir, at)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e)
	}
	want := []int{1_800_000_000, 1_800_000_001, 1_800_000_002, 1_800_000_003, 1_800_000_010}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("epochs %v, want %v", got, want)
		}
	}
	fi, err := os.Stat(filepath.Join(dir, epochFile))
	if err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("epoch file: %v %v", fi, err)
	}
	if e, err := NextEpoch("", now); err != nil || e != 1_800_000_000 {
		t.Errorf("no state dir: %d %v", e, err)
	}
	// Garbage in the file and a planted symlink are errors, not followed.
	os.WriteFile(filepath.Join(dir, epochFile), []byte("banana\n"), 0o640)
	if _, err := NextEpoch(dir, now); err == nil || !strings.Contains(err.Error(), "invalid epoch") {
		t.Errorf("garbage epoch: %v", err)
	}
	victim := filepath.Join(t.TempDir(), "victim")
	os.WriteFile(victim, []byte("1900000000\n"), 0o600)
	os.Remove(filepath.Join(dir, epochFile))
	os.Symlink(victim, filepath.Join(dir, epochFile))
	if _, err := NextEpoch(dir, now); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("symlinked epoch file: %v", err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "1900000000\n" {
		t.Error("symlink target modified")
	}
}

func batchEvent(pid uint32, data []byte) *bpf.BatchEvent {
	return &bpf.BatchEvent{Header: bpf.Header{Type: bpf.EventBatch, Probe: bpf.ProbeCUPTIEmit, PID: pid, TID: pid, StartNs: 1, EndNs: 2}, Data: data}
}

// TestConverterHostileBatches feeds the converter what a compromised
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
		out = conv.convert(batchEvent(100, b), out[:0])
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
			out = conv.convert(batchEvent(pid, data), out[:0])
			sent += len(b.Names)
		}
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	st := conv.names.Stats()
	refused := int64(st.Refused) + conv.refusedNames()
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
		out = conv.convert(batchEvent(7, data), out[:0])
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
		for _, in := range conv.convert(batchEvent(9, data), nil) {
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
			conv.convert(&bpf.CollEvent{Header: bpf.Header{Type: bpf.EventColl, Probe: bpf.ProbeNCCLAllReduce, PID: pid, StartNs: 1, EndNs: 2}}, nil)
			conv.convert(&bpf.TorchEvent{Header: bpf.Header{Type: bpf.EventTorch, Probe: bpf.ProbeTorchNCCLAllreduce, PID: pid, StartNs: 1, EndNs: 2}}, nil)
		}
	}()
	for i := 0; ; i++ {
		select {
		case <-done:
			return
		default:
			conv.forgetPID(uint32(i % 64))
		}
	}
}
