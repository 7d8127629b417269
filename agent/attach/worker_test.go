package attach

import (
	"errors"
	"fmt"
	"slices"
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
		for i, p := range []string{"a.so", "b.so", "c.so"} {
			w.enqueue(Library[int]{File: i + 1, Open: p}) // one job per file, as the manager queues them
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
	w.enqueue(Library[int]{File: 1, Open: "slow.so"})
	w.enqueue(Library[int]{File: 2, Open: "queued.so"})
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

// The low of issue 34: processes that set the selection environment map
// many slow files named like a CUDA library (huge ELF files, each about
// 0.5 s in the bounded symbol reader), all queued before a real job maps
// its libraries. The real job's owner gets its turn after at most one of
// them beyond the one in flight, however many are queued: the wait of its
// first attach does not grow with their number, and all its libraries are
// attached one turn apart.
func TestAttachWorkerServesOwnersInTurn(t *testing.T) {
	const (
		hostile  = "uid:1000"
		real     = "cgroup:/kubepods.slice/kubepods-pod1.slice/cri-containerd-1.scope"
		realLibs = 5 // nccl, cudart, cuda, the injection library, libcupti
		slow     = 5 * time.Millisecond
	)
	for _, n := range []int{1, 10, 100} {
		t.Run(fmt.Sprintf("%d hostile files", n), func(t *testing.T) {
			deliver := make(chan func())
			var order []string
			var firstReal time.Duration
			start := time.Now()
			w := newWorker(func(lib Library[int]) (Link, error) {
				if lib.Owner == hostile {
					time.Sleep(slow)
				}
				return nil, errors.New("fake")
			}, deliver, func(o outcome[int]) {
				order = append(order, o.lib.Owner)
				if o.lib.Owner == real && firstReal == 0 {
					firstReal = time.Since(start)
				}
			})
			defer w.close()
			for i := range n {
				w.enqueue(Library[int]{File: i + 1, Owner: hostile})
			}
			for i := range realLibs {
				w.enqueue(Library[int]{File: 1000 + i, Owner: real})
			}
			for len(order) < n+realLibs {
				(<-deliver)()
			}
			// Hostile attaches before each of the real job's.
			var before []int
			h := 0
			for _, o := range order {
				if o == hostile {
					h++
				} else {
					before = append(before, h)
				}
			}
			t.Logf("first real attach after %v (%d hostile attaches of %v before it)", firstReal.Round(time.Millisecond), before[0], slow)
			for i, b := range before {
				if want := min(i+2, n); b > want {
					t.Errorf("real library %d attached after %d hostile ones, want at most %d (order %v)", i, b, want, order)
				}
			}
		})
	}
}

// A file queued through one owner's lane that another owner's process maps
// as well is attached at the first of their turns: an owner that maps a real
// job's library behind its own slow files cannot hold that library back.
func TestAttachWorkerSharedFileTakesTheEarlierTurn(t *testing.T) {
	deliver := make(chan func())
	var order []int
	w := newWorker(func(Library[int]) (Link, error) { return nil, errors.New("fake") },
		deliver, func(o outcome[int]) { order = append(order, o.lib.File) })
	defer w.close()
	for i := range 20 {
		w.enqueue(Library[int]{File: i + 1, Owner: "uid:1000"})
	}
	shared := Library[int]{File: 500, Owner: "uid:1000"}
	w.enqueue(shared)
	shared.Owner = "uid:2000" // the real job's process maps it too
	w.join(shared)
	w.join(shared) // twice: no second place in the lane
	for len(order) < 21 {
		(<-deliver)()
	}
	if i := slices.Index(order, 500); i != 2 {
		t.Errorf("the shared file was attached %dth, want 3rd (in flight, the first owner's next, then the second owner's turn): %v", i+1, order)
	}
	if n := w.pending(); n != 0 {
		t.Errorf("pending = %d after every outcome, want 0", n)
	}
	select {
	case <-deliver:
		t.Error("an attach ran twice")
	case <-time.After(20 * time.Millisecond):
	}
}
