package bpf

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// Counts of test/fakelibs/probechild.c `run`.
const (
	nAllReduce     = 50
	nReduce        = 7
	nBroadcast     = 3
	nAllGather     = 4
	nReduceScatter = 2
	nSendRecv      = 5
	nTorch         = 3
)

var batchLens = []int{1, 100, 512, 513, 2048, 5000, 8192, 8193, 16384, 16385, 0}

func batchByte(seed, i uint32) byte { return byte(seed*131 + i*7 + (i >> 8)) }

func uniqueID(salt int) []byte {
	id := make([]byte, 128)
	for j := range id {
		id[j] = byte(j*13 + 7 + salt)
	}
	return id
}

// attachAll attaches every fake library and returns the attachments by kind.
func attachAll(t *testing.T, p *Probes, dir string) map[LibKind]*Attachment {
	t.Helper()
	libs := map[LibKind]string{
		LibNCCL:   "libnccl.so.2",
		LibCUDART: "libcudart.so.13",
		LibCUDA:   "libcuda.so.1",
		LibTorch:  "libtorch_cpu.so",
		LibCUPTI:  "probe/libslowrank_cupti.so",
	}
	out := map[LibKind]*Attachment{}
	for kind, name := range libs {
		path := filepath.Join(dir, name)
		if k, ok := ClassifyLibrary(path); !ok || k != kind {
			t.Fatalf("ClassifyLibrary(%s) = %v, %v; want %v", name, k, ok, kind)
		}
		a, err := p.AttachLibrary(LibSource{Path: path}, kind)
		if err != nil {
			t.Fatalf("attach %s: %v", name, err)
		}
		for _, r := range a.Results {
			if r.Status == StatusFailed {
				t.Errorf("%s: %s failed: %v", name, r.Spec.Name(), r.Err)
			}
		}
		if missing, required := a.Missing(); required {
			t.Errorf("%s: required symbols missing: %v", name, missing)
		}
		out[kind] = a
	}
	return out
}

// TestUprobesEndToEnd runs the fake libraries' calls through both kinds of
// uprobe the agent uses: uprobe_multi links where the kernel has them, and
// perf-event uprobes (the fallback for kernels before 6.6).
func TestUprobesEndToEnd(t *testing.T) {
	requireBPF(t)
	for _, tc := range []struct {
		name   string
		single bool
	}{{"uprobe_multi", false}, {"perf_event", true}} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Load(Options{RingBufferSize: 1 << 20, SingleUprobes: tc.single})
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			defer closeOK(t, p)
			if !tc.single && !p.UprobeMulti() {
				t.Skip("kernel without uprobe_multi links")
			}
			uprobesEndToEnd(t, p)
		})
	}
}

func uprobesEndToEnd(t *testing.T, p *Probes) {
	dir := fakeLibs(t)
	r, err := p.NewReader()
	if err != nil {
		t.Fatal(err)
	}
	col := collect(r)

	c := startChild(t, dir)
	if v := c.semaphore(); v != 0 {
		t.Fatalf("semaphore before attach = %d, want 0", v)
	}
	atts := attachAll(t, p, dir)
	if got := atts[LibNCCL].Attached(); got != fakeNCCLFuncs { // every function of the fake
		t.Errorf("nccl: %d functions attached, want %d: %+v", got, fakeNCCLFuncs, atts[LibNCCL].Results)
	}
	if got := atts[LibTorch].Attached(); got != fakeTorchFuncs {
		t.Errorf("torch: %d functions attached, want %d", got, fakeTorchFuncs)
	}
	if a := atts[LibCUPTI]; a.RefCtrOffset == 0 || a.RefCtrErr != nil {
		t.Errorf("cupti: ref_ctr_offset %#x, err %v", a.RefCtrOffset, a.RefCtrErr)
	}
	if v := c.semaphore(); v != 1 {
		t.Fatalf("semaphore after attach = %d, want 1", v)
	}
	late := startChild(t, dir) // maps the library after the uprobe exists
	if v := late.semaphore(); v != 1 {
		t.Errorf("semaphore of a process started after attach = %d, want 1", v)
	}

	// Untracked processes are filtered in BPF.
	late.send("run")
	for late.line() != "done" {
	}

	if err := p.Track(uint32(c.pid), 3); err != nil {
		t.Fatal(err)
	}
	c.send("run")
	var comms [5]uint64
	var pg uint64
	var work, future []uint64 // per torch bucket: Work and Future are per call
	var syncs = map[string][]time.Duration{}
	for {
		line := c.line()
		if line == "done" {
			break
		}
		f := strings.Fields(line)
		switch f[0] {
		case "comm":
			for i := range comms {
				if _, err := fmt.Sscanf(f[i+1], "%x", &comms[i]); err != nil {
					t.Fatalf("child line %q: %v", line, err)
				}
			}
		case "pg":
			if _, err := fmt.Sscanf(f[1], "%x", &pg); err != nil {
				t.Fatalf("child line %q: %v", line, err)
			}
		case "work":
			var w, fu uint64
			if _, err := fmt.Sscanf(f[1], "%x", &w); err != nil {
				t.Fatalf("child line %q: %v", line, err)
			}
			if _, err := fmt.Sscanf(f[2], "%x", &fu); err != nil {
				t.Fatalf("child line %q: %v", line, err)
			}
			work, future = append(work, w), append(future, fu)
		case "sync":
			var ns int64
			if _, err := fmt.Sscanf(f[2], "%d", &ns); err != nil {
				t.Fatalf("child line %q: %v", line, err)
			}
			syncs[f[1]] = append(syncs[f[1]], time.Duration(ns))
		}
	}

	const wantEvents = nAllReduce + nReduce + nBroadcast + nAllGather + nReduceScatter + 2*nSendRecv + 1 + // coll
		2 + 5 + 9 + 3*nTorch + 9 // group, comm init, sync, torch, batches
	evs := col.waitFor(c.pid, 10*time.Second, func(e []Event) bool { return len(e) >= wantEvents })
	if len(evs) != wantEvents {
		t.Errorf("got %d events of the tracked child, want %d", len(evs), wantEvents)
	}
	byProbe := map[ProbeID][]Event{}
	for _, e := range evs {
		byProbe[e.Base().Probe] = append(byProbe[e.Base().Probe], e)
		if h := e.Base(); h.TID != uint32(c.pid) {
			t.Errorf("%s: tid %d, want %d (single-threaded child)", h.Probe, h.TID, c.pid)
		}
	}
	for _, l := range byProbe {
		sort.Slice(l, func(i, j int) bool { return l[i].Base().StartNs < l[j].Base().StartNs })
	}

	t.Run("collectives", func(t *testing.T) {
		type want struct {
			probe  ProbeID
			n      int
			count0 uint64
			dt     uint32
			redop  func(i int) uint32
			peer   func(i int) int32
			comm   uint64
			stream func(i int) uint64
			ret    func(i int) int32
		}
		c0, c1 := uint64(0xc0ffee00), uint64(0xc0ffee01)
		zero := func(int) uint32 { return 0 }
		none := func(int) int32 { return -1 }
		ok := func(int) int32 { return 0 }
		wants := []want{
			{ProbeNCCLAllReduce, nAllReduce, 1000, 7, func(i int) uint32 { return uint32(i % 4) }, none, c0,
				func(i int) uint64 { return 0x5000 + uint64(i) }, func(i int) int32 { return int32((1000 + i) % 3) }},
			{ProbeNCCLReduce, nReduce, 2000, 9, func(int) uint32 { return 2 }, func(i int) int32 { return int32(i % 3) }, c1,
				func(i int) uint64 { return 0x6000 + uint64(i) }, ok},
			{ProbeNCCLBroadcast, nBroadcast, 3000, 7, zero, func(int) int32 { return 1 }, c0,
				func(i int) uint64 { return 0x7000 + uint64(i) }, ok},
			{ProbeNCCLAllGather, nAllGather, 4000, 7, zero, none, c0, func(i int) uint64 { return 0x8000 + uint64(i) }, ok},
			{ProbeNCCLReduceScatter, nReduceScatter, 5000, 7, zero, none, c0, func(i int) uint64 { return 0x9000 + uint64(i) }, ok},
			{ProbeNCCLSend, nSendRecv, 6000, 7, zero, func(i int) int32 { return int32(i) }, c0, func(int) uint64 { return 0xa000 }, ok},
			{ProbeNCCLRecv, nSendRecv, 7000, 7, zero, func(i int) int32 { return int32(i + 1) }, c0, func(int) uint64 { return 0xa001 }, ok},
			{ProbeNCCLAllToAll, 1, 8000, 7, zero, none, c0, func(int) uint64 { return 0xb000 }, ok},
		}
		for _, w := range wants {
			got := byProbe[w.probe]
			if len(got) != w.n {
				t.Errorf("%s: %d events, want %d", w.probe, len(got), w.n)
				continue
			}
			for i, e := range got {
				ce, isColl := e.(*CollEvent)
				if !isColl {
					t.Fatalf("%s: %T", w.probe, e)
				}
				exp := CollEvent{Header: ce.Header, Count: w.count0 + uint64(i), Comm: w.comm, Stream: w.stream(i),
					Datatype: w.dt, RedOp: w.redop(i), Peer: w.peer(i), Ret: w.ret(i)}
				if *ce != exp {
					t.Errorf("%s #%d:\n got %+v\nwant %+v", w.probe, i, *ce, exp)
				}
				if ce.EndNs < ce.StartNs || ce.StartNs == 0 {
					t.Errorf("%s #%d: bad interval %d..%d", w.probe, i, ce.StartNs, ce.EndNs)
				}
			}
		}
	})

	t.Run("groups", func(t *testing.T) {
		gs, ge := byProbe[ProbeNCCLGroupStart], byProbe[ProbeNCCLGroupEnd]
		if len(gs) != 1 || len(ge) != 1 {
			t.Fatalf("group start/end: %d/%d events, want 1/1", len(gs), len(ge))
		}
		ar := byProbe[ProbeNCCLAllReduce]
		start, end := gs[0].(*GroupEvent), ge[0].(*GroupEvent)
		if start.HasReturn || start.StartNs != start.EndNs || !end.HasReturn {
			t.Errorf("group markers: start %+v end %+v", start, end)
		}
		if len(ar) > 0 && (start.StartNs > ar[0].Base().StartNs || end.StartNs < ar[len(ar)-1].Base().EndNs) {
			t.Errorf("allreduces not inside the group: start %d end %d first %d last %d",
				start.StartNs, end.StartNs, ar[0].Base().StartNs, ar[len(ar)-1].Base().EndNs)
		}
	})

	t.Run("comm init", func(t *testing.T) {
		one := func(id ProbeID) *CommInitEvent {
			l := byProbe[id]
			if len(l) != 1 {
				t.Fatalf("%s: %d events, want 1", id, len(l))
			}
			return l[0].(*CommInitEvent)
		}
		h0, h1 := HashUniqueID(uniqueID(0)), HashUniqueID(uniqueID(1))
		check := func(id ProbeID, got *CommInitEvent, want CommInitEvent) {
			want.Header = got.Header
			if *got != want {
				t.Errorf("%s:\n got %+v\nwant %+v", id, *got, want)
			}
		}
		check(ProbeNCCLCommInitRank, one(ProbeNCCLCommInitRank), CommInitEvent{IDHash: h0, IDValid: true,
			Comm: comms[0], CommValid: true, NRanks: 8, Rank: 3, NIDs: 1})
		check(ProbeNCCLCommInitRankConfig, one(ProbeNCCLCommInitRankConfig), CommInitEvent{IDHash: h1, IDValid: true,
			Comm: comms[1], CommValid: true, NRanks: 4, Rank: 1, NIDs: 1})
		check(ProbeNCCLCommSplit, one(ProbeNCCLCommSplit), CommInitEvent{Comm: comms[2], CommValid: true,
			Parent: comms[0], IsSplit: true, NRanks: -1, Rank: -1, Color: 2, Key: 5})
		check(ProbeNCCLCommInitAll, one(ProbeNCCLCommInitAll), CommInitEvent{Comm: comms[3], CommValid: true,
			NRanks: 2, Rank: -1})
		check(ProbeNCCLCommInitRankScalable, one(ProbeNCCLCommInitRankScalable), CommInitEvent{IDHash: h1, IDValid: true,
			Comm: comms[4], CommValid: true, NRanks: 16, Rank: 9, NIDs: 1})
		// The fake derives the handle from id byte 5 / 127: proves the by-value
		// struct was read from rsp+8 and not from a neighbouring slot.
		if comms[0] != 0xabc000+3*0x100+uint64(uniqueID(0)[5]) {
			t.Errorf("fake comm %#x not derived from id", comms[0])
		}
	})

	t.Run("sync", func(t *testing.T) {
		type want struct {
			probe  ProbeID
			n      int
			sleep  time.Duration
			handle func(i int) uint64
			ret    int32
		}
		wants := []want{
			{ProbeCUDAStreamSynchronize, 3, 20 * time.Millisecond, func(i int) uint64 { return 0xd000 + uint64(i) }, 0},
			{ProbeCUDADeviceSynchronize, 1, 5 * time.Millisecond, func(int) uint64 { return 0 }, 0},
			{ProbeCUDAEventSynchronize, 1, 5 * time.Millisecond, func(int) uint64 { return 0xe000 }, 0},
			{ProbeCuStreamSynchronize, 2, 10 * time.Millisecond, func(i int) uint64 { return 0xf000 + uint64(i) }, 0},
			{ProbeCuCtxSynchronize, 1, 10 * time.Millisecond, func(int) uint64 { return 0 }, 0},
			{ProbeCuEventSynchronize, 1, 10 * time.Millisecond, func(int) uint64 { return 0 }, 400},
		}
		for _, w := range wants {
			got := byProbe[w.probe]
			if len(got) != w.n {
				t.Errorf("%s: %d events, want %d", w.probe, len(got), w.n)
				continue
			}
			for i, e := range got {
				se := e.(*SyncEvent)
				if se.Handle != w.handle(i) || se.Ret != w.ret {
					t.Errorf("%s #%d: handle %#x ret %d, want %#x %d", w.probe, i, se.Handle, se.Ret, w.handle(i), w.ret)
				}
				// The fake sleeps w.sleep; the child's own clock brackets
				// the call. BPF must see at least the sleep, sit inside the
				// bracket, and be within 5% of the sleep of it (nanosleep
				// itself may overshoot on a loaded machine: that is the
				// scheduler, not the probe).
				d := se.Duration()
				measured := syncs[w.probe.String()]
				if i >= len(measured) {
					t.Fatalf("%s #%d: child did not report it", w.probe, i)
				}
				m := measured[i]
				t.Logf("%s #%d: bpf %v, child %v, sleep %v", w.probe, i, d, m, w.sleep)
				if d < w.sleep || d > m || m-d > w.sleep/20 {
					t.Errorf("%s #%d: bpf %v, child %v: want sleep %v <= bpf <= child, child-bpf <= 5%% of sleep",
						w.probe, i, d, m, w.sleep)
				}
				if d > w.sleep+w.sleep/20 {
					t.Logf("%s #%d: nanosleep overshot the 5%% band (%v): scheduler noise", w.probe, i, d-w.sleep)
				}
			}
		}
	})

	t.Run("torch", func(t *testing.T) {
		ar, wait, fwait := byProbe[ProbeTorchGlooAllreduce], byProbe[ProbeTorchWorkWait], byProbe[ProbeTorchFutureWait]
		if len(ar) != nTorch || len(wait) != nTorch || len(fwait) != nTorch || len(work) != nTorch || len(future) != nTorch {
			t.Fatalf("torch allreduce/wait/future wait: %d/%d/%d events, %d/%d reported, want %d",
				len(ar), len(wait), len(fwait), len(work), len(future), nTorch)
		}
		for i := range ar {
			if s := ar[i].(*TorchEvent).Self; s != pg {
				t.Errorf("allreduce #%d: self %#x, want pg %#x", i, s, pg)
			}
			if s := wait[i].(*TorchEvent).Self; s != work[i] {
				t.Errorf("wait #%d: self %#x, want work %#x", i, s, work[i])
			}
			if s := fwait[i].(*TorchEvent).Self; s != future[i] {
				t.Errorf("future wait #%d: self %#x, want future %#x", i, s, future[i])
			}
		}
	})

	t.Run("batches", func(t *testing.T) {
		got := byProbe[ProbeCUPTIEmit]
		var want [][]byte
		for i, n := range batchLens {
			if n == 0 || n > BatchMax {
				continue
			}
			b := make([]byte, n)
			for j := range b {
				b[j] = batchByte(uint32(i+1), uint32(j))
			}
			want = append(want, b)
		}
		if len(got) != len(want) {
			t.Fatalf("%d batches, want %d", len(got), len(want))
		}
		for i := range want {
			if d := got[i].(*BatchEvent).Data; !bytes.Equal(d, want[i]) {
				t.Errorf("batch %d: %d bytes differ from the %d emitted", i, len(d), len(want[i]))
			}
		}
	})

	st, err := p.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats: %+v", st)
	if st.BatchOversize != 1 || st.RingBufFull != 0 || st.MissingEntry != 0 || st.ReadFault != 0 ||
		st.EntryOverwritten != 0 || st.InflightFailed != 0 {
		t.Errorf("unexpected counters: %+v", st)
	}
	if st.Filtered < wantEvents {
		t.Errorf("filtered = %d, want >= %d (untracked child)", st.Filtered, wantEvents)
	}
	if n := len(col.of(late.pid)); n != 0 {
		t.Errorf("%d events of the untracked child", n)
	}
	if st.Events < uint64(wantEvents) {
		t.Errorf("events counter %d < %d", st.Events, wantEvents)
	}

	// Detach the injection library: the semaphore returns to 0 everywhere.
	if err := atts[LibCUPTI].Close(); err != nil {
		t.Fatal(err)
	}
	if v := c.semaphore(); v != 0 {
		t.Errorf("semaphore after detach = %d, want 0", v)
	}
	if v := late.semaphore(); v != 0 {
		t.Errorf("semaphore of late child after detach = %d, want 0", v)
	}

	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	<-col.done
	col.mu.Lock()
	if len(col.errs) > 0 {
		t.Errorf("reader errors: %v", col.errs)
	}
	col.mu.Unlock()
}

// TestCloseUnblocksRead checks the documented close order: closing the
// reader returns a pending Read with ErrClosed, and Probes.Close after that
// is clean.
func TestSemaphoreInBSS(t *testing.T) {
	requireBPF(t)
	dir := fakeLibs(t)
	p, err := Load(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer closeOK(t, p)
	bss := filepath.Join(dir, "probe", "bss")
	env := "LD_LIBRARY_PATH=" + bss // DT_RUNPATH yields to it
	early := startChild(t, dir, env)
	a, err := p.AttachLibrary(LibSource{Path: filepath.Join(bss, "libslowrank_cupti.so")}, LibCUPTI)
	if err != nil {
		t.Fatal(err)
	}
	if a.RefCtrOffset == 0 || !errors.Is(a.RefCtrErr, errRefCtrBSS) {
		t.Errorf("bss semaphore: offset %#x, err %v; want an offset and errRefCtrBSS", a.RefCtrOffset, a.RefCtrErr)
	}
	// The offset is right: a process that already ran sees the increment.
	if v := early.semaphore(); v != 1 {
		t.Errorf("bss semaphore of a running process = %d, want 1", v)
	}
	// Why it is only a warning and not fine: ld.so zeroes it in later ones.
	t.Logf("bss semaphore of a process started after attach = %d (ld.so zeroes the .bss tail)", startChild(t, dir, env).semaphore())
}

func TestCloseUnblocksRead(t *testing.T) {
	requireBPF(t)
	p, err := Load(Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := p.NewReader()
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := r.Read()
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := p.Close(); err != nil { // closes the reader first
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("Read after Close: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Read still blocked after Close")
	}
	if err := r.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	if _, err := p.NewReader(); err == nil {
		t.Error("NewReader after Close succeeded")
	}
}

func TestReadDeadline(t *testing.T) {
	requireBPF(t)
	p, err := Load(Options{PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer closeOK(t, p)
	r, err := p.NewReader()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r.SetDeadline(start.Add(100 * time.Millisecond))
	if _, err := r.Read(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read = %v, want deadline exceeded", err)
	}
	if d := time.Since(start); d < 100*time.Millisecond || d > time.Second {
		t.Errorf("deadline hit after %v", d)
	}
	r.SetDeadline(time.Time{})
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Read(); !errors.Is(err, ErrFlushed) {
		t.Errorf("Read after Flush of an empty ring = %v, want ErrFlushed", err)
	}
}

func TestTrackUntrack(t *testing.T) {
	requireBPF(t)
	p, err := Load(Options{MaxTracked: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer closeOK(t, p)
	for _, pid := range []uint32{10, 11} {
		if err := p.Track(pid, pid); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Track(12, 0); err == nil {
		t.Error("tracking beyond MaxTracked succeeded")
	}
	if err := p.Untrack(10); err != nil {
		t.Fatal(err)
	}
	if err := p.Untrack(10); err != nil {
		t.Errorf("untrack unknown: %v", err)
	}
	if err := p.Track(12, 0); err != nil {
		t.Errorf("track after untrack: %v", err)
	}
}

func TestAttachMissingAndBad(t *testing.T) {
	requireBPF(t)
	dir := fakeLibs(t)
	p, err := Load(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer closeOK(t, p)
	// A library without any NCCL symbol: everything missing, no error.
	a, err := p.AttachLibrary(LibSource{Path: filepath.Join(dir, "libcudart.so.13")}, LibNCCL)
	if err != nil {
		t.Fatalf("attach wrong kind: %v", err)
	}
	if a.Attached() != 0 {
		t.Errorf("attached %d", a.Attached())
	}
	if _, required := a.Missing(); !required {
		t.Error("required NCCL symbols not reported missing")
	}
	st, _ := p.Stats()
	if st.SymbolsMissing == 0 {
		t.Error("missing symbols not counted")
	}
	if err := a.Close(); err != nil {
		t.Error(err)
	}
	if _, err := p.AttachLibrary(LibSource{Path: filepath.Join(dir, "nonexistent.so")}, LibNCCL); err == nil {
		t.Error("attach of a missing file succeeded")
	}
	if _, err := p.AttachLibrary(LibSource{Path: filepath.Join(dir, "libnccl.so.2")}, LibKind(99)); err == nil {
		t.Error("attach with unknown kind succeeded")
	}
}

// Without privileges Load must say so with ErrPermission (the agent's doctor
// prints which capability is missing). Runs only when not root.
func TestLoadUnprivileged(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("runs only without root")
	}
	p, err := Load(Options{})
	if err == nil {
		closeOK(t, p)
		t.Skip("this kernel lets unprivileged users load these programs")
	}
	if !errors.Is(err, ErrPermission) && !errors.Is(err, ErrNotSupported) {
		t.Errorf("Load = %v, want ErrPermission or ErrNotSupported", err)
	}
	t.Log(err)
	if err := CheckSupport(); !errors.Is(err, ErrPermission) && !errors.Is(err, ErrNotSupported) {
		t.Errorf("CheckSupport = %v", err)
	}
}
