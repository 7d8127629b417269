package attach

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// blockingAttach stands in for a probe set reading a large symbol table:
// each call waits for its gate, and calls never overlap.
type blockingAttach struct {
	gate    chan struct{}
	started chan string
	running atomic.Int32
	overlap atomic.Bool
}

func newBlockingAttach() *blockingAttach {
	return &blockingAttach{gate: make(chan struct{}), started: make(chan string, 16)}
}

func (b *blockingAttach) attach(lib Library[int]) (Link, error) {
	if b.running.Add(1) > 1 {
		b.overlap.Store(true)
	}
	defer b.running.Add(-1)
	b.started <- lib.Open
	<-b.gate
	return nil, errors.New("fake: " + lib.Open)
}

func TestAttachWorkerKeepsTheMainGoroutineFreeAndAttachesOneAtATime(t *testing.T) {
	b := newBlockingAttach()
	deliver := make(chan func())
	var got []string
	w := newWorker(b.attach, deliver, func(o outcome[int]) { got = append(got, o.lib.Open) })
	defer w.close()

	// Three libraries mapped at once: enqueueing never waits for a parse.
	done := make(chan struct{})
	go func() {
		for _, p := range []string{"a.so", "b.so", "c.so"} {
			w.enqueue(Library[int]{Open: p})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("enqueue blocked behind an attach in progress")
	}
	if n := w.pending(); n != 3 {
		t.Fatalf("pending = %d, want 3 (one in flight, two queued)", n)
	}
	for _, want := range []string{"a.so", "b.so", "c.so"} {
		if p := <-b.started; p != want {
			t.Fatalf("attach started %s, want %s (first mapped, first attached)", p, want)
		}
		b.gate <- struct{}{}
		(<-deliver)() // the main goroutine takes the outcome and starts the next
	}
	if len(got) != 3 || got[0] != "a.so" || got[2] != "c.so" {
		t.Fatalf("outcomes %v, want a.so b.so c.so", got)
	}
	if b.overlap.Load() {
		t.Fatal("two attaches ran at once: the ELF reader's memory budget would be per library")
	}
	if n := w.pending(); n != 0 {
		t.Fatalf("pending = %d after every outcome, want 0", n)
	}
}

func TestAttachWorkerStopsWhileAnAttachIsInFlight(t *testing.T) {
	b := newBlockingAttach()
	deliver := make(chan func()) // nobody reads it any more: the main loop has stopped
	w := newWorker(b.attach, deliver, func(outcome[int]) { t.Error("outcome delivered after stop") })
	w.enqueue(Library[int]{Open: "slow.so"})
	w.enqueue(Library[int]{Open: "queued.so"})
	<-b.started
	closed := make(chan struct{})
	go func() { w.close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("close returned while the attach was still in flight: its attachment would leak")
	case <-time.After(50 * time.Millisecond):
	}
	b.gate <- struct{}{}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("close hung after the attach in flight returned")
	}
	select {
	case p := <-b.started:
		t.Fatalf("%s was attached after stop", p)
	default:
	}
}
