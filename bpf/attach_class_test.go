package bpf

import (
	"path/filepath"
	"testing"
	"time"
)

// TestDetachClassKeepsTheOthers closes the collective uprobes of libnccl and
// makes them again: while they are closed a run of the child reports its
// groups and communicator inits and no collective; once made again, every
// collective.
func TestDetachClassKeepsTheOthers(t *testing.T) {
	requireBPF(t)
	p, err := Load(Options{RingBufferSize: 1 << 20})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	defer closeOK(t, p)
	dir := fakeLibs(t)
	r, err := p.NewReader()
	if err != nil {
		t.Fatal(err)
	}
	col := collect(r)
	c := startChild(t, dir)
	path := filepath.Join(dir, "libnccl.so.2")
	a, err := p.AttachLibrary(LibSource{Path: path}, LibNCCL)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Track(uint32(c.pid), 1); err != nil {
		t.Fatal(err)
	}
	const colls = nAllReduce + nReduce + nBroadcast + nAllGather + nReduceScatter + 2*nSendRecv + 1
	run := func(want map[EventType]int) {
		t.Helper()
		before := len(col.of(c.pid))
		c.send("run")
		for c.line() != "done" {
		}
		total := 0
		for _, n := range want {
			total += n
		}
		col.waitFor(c.pid, 10*time.Second, func(e []Event) bool { return len(e)-before >= total })
		time.Sleep(50 * time.Millisecond) // nothing more may come
		got := map[EventType]int{}
		for _, e := range col.of(c.pid)[before:] {
			got[e.Base().Probe.Class().EventType()]++
		}
		for typ, n := range want {
			if got[typ] != n {
				t.Errorf("%s: %d events, want %d (all: %v)", typ, got[typ], n, got)
			}
		}
	}
	n, err := a.DetachClass(ClassCollective)
	if err != nil || n != fakeNCCLColls { // every collective of the fake
		t.Fatalf("DetachClass: %d functions, %v; want %d", n, err, fakeNCCLColls)
	}
	if got := a.Detached(ClassCollective); got != n {
		t.Errorf("Detached = %d, want %d", got, n)
	}
	run(map[EventType]int{EventColl: 0, EventGroup: 2, EventCommInit: 5})
	n2, err := a.ReattachClass(ClassCollective, LibSource{Path: path})
	if err != nil || n2 != n {
		t.Fatalf("ReattachClass: %d functions, %v; want %d", n2, err, n)
	}
	if got := a.Detached(ClassCollective); got != 0 {
		t.Errorf("Detached after ReattachClass = %d, want 0", got)
	}
	run(map[EventType]int{EventColl: colls, EventGroup: 2, EventCommInit: 5})
	if n, err := a.ReattachClass(ClassCollective, LibSource{Path: path}); n != 0 || err != nil {
		t.Errorf("a second ReattachClass made %d, %v", n, err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if n, err := a.ReattachClass(ClassCollective, LibSource{Path: path}); n != 0 || err != nil {
		t.Errorf("ReattachClass after Close made %d, %v", n, err)
	}
}
