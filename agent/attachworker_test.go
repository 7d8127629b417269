package agent

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slowrank/slowrank/bpf"
)

// blockingAttach stands in for Probes.AttachLibrary reading a large symbol
// table: each call waits for its gate, and calls never overlap.
type blockingAttach struct {
	gate    chan struct{}
	started chan string
	running atomic.Int32
	overlap atomic.Bool
}

func newBlockingAttach() *blockingAttach {
	return &blockingAttach{gate: make(chan struct{}), started: make(chan string, 16)}
}

func (b *blockingAttach) attach(path string, _ bpf.LibKind) (*bpf.Attachment, error) {
	if b.running.Add(1) > 1 {
		b.overlap.Store(true)
	}
	defer b.running.Add(-1)
	b.started <- path
	<-b.gate
	return nil, errors.New("fake: " + path)
}

func TestAttachWorkerKeepsTheMainGoroutineFreeAndAttachesOneAtATime(t *testing.T) {
	b := newBlockingAttach()
	deliver := make(chan func())
	var got []string
	w := newAttachWorker(b.attach, deliver, func(o attachOutcome) { got = append(got, o.job.path) })
	defer w.close()

	// Three libraries mapped at once: enqueueing never waits for a parse.
	done := make(chan struct{})
	go func() {
		for _, p := range []string{"a.so", "b.so", "c.so"} {
			w.enqueue(attachJob{path: p})
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
	w := newAttachWorker(b.attach, deliver, func(attachOutcome) { t.Error("outcome delivered after stop") })
	w.enqueue(attachJob{path: "slow.so"})
	w.enqueue(attachJob{path: "queued.so"})
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
