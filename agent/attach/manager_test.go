package attach

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"
)

// The manager's state machine with a fake probe set: no root, no BPF.
// Files and processes are ints; the test goroutine is the owner.

// fakeLink is one attachment the fake probe set made.
type fakeLink struct {
	file, via int
	closes    int // guarded by fakeProbes.mu
	probes    *fakeProbes
	// The collective probes (collectives.go), guarded by fakeProbes.mu:
	// off while closed, the changes made in order ("off", or the open
	// path of a re-attach).
	off     bool
	changes []string
}

func (l *fakeLink) DetachCollectives() error {
	l.probes.mu.Lock()
	defer l.probes.mu.Unlock()
	l.changes = append(l.changes, "off")
	if l.probes.failDetach > 0 {
		l.probes.failDetach--
		return errBusy
	}
	l.off = true
	return nil
}

func (l *fakeLink) ReattachCollectives(via Library[int]) error {
	l.probes.mu.Lock()
	defer l.probes.mu.Unlock()
	l.changes = append(l.changes, via.Open)
	if l.probes.failReattach > 0 {
		l.probes.failReattach--
		return errExited
	}
	l.off = false
	return nil
}

func (l *fakeLink) Close() error {
	l.probes.mu.Lock()
	defer l.probes.mu.Unlock()
	l.closes++
	return nil
}

// fakeProbes attaches every library except through the PIDs in fail, and
// fails the first failFirst attaches whatever the PID (another agent
// attaching or detaching at the same time); with gate, each attach waits
// for it (a long symbol read).
type fakeProbes struct {
	mu        sync.Mutex
	fail      map[int]bool
	failFirst int
	gate      chan struct{}
	started   chan int // files, as their attach starts (when gate is set)
	tries     []int    // PIDs through which Attach ran, in order
	links     []*fakeLink
	// failDetach, failReattach: how many of the next changes of the
	// collective probes fail.
	failDetach, failReattach int
}

// errExited is what an attach through a process that exited meanwhile
// gives: its /proc/PID/root no longer resolves.
var errExited = errors.New("open /proc/PID/root/lib.so: no such file or directory")

// errBusy is what creating a uprobe gives while another agent's uprobes on
// the file are being created or closed.
var errBusy = errors.New("create uprobe: no such file or directory")

func (f *fakeProbes) Attach(lib Library[int]) (Link, error) {
	if f.gate != nil {
		f.started <- lib.File
		<-f.gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tries = append(f.tries, lib.PID)
	if f.fail[lib.PID] {
		return nil, errExited
	}
	if f.failFirst > 0 {
		f.failFirst--
		return nil, errBusy
	}
	l := &fakeLink{file: lib.File, via: lib.PID, probes: f}
	f.links = append(f.links, l)
	return l, nil
}

// fakeSink keeps the counters and the attachments reported (owner
// goroutine only).
type fakeSink struct {
	counts   map[string]int64
	attached []Library[int]
}

func (s *fakeSink) Count(name string, n int64) { s.counts[name] += n }

func (s *fakeSink) Attached(lib Library[int], _ Link, _ time.Duration) {
	s.attached = append(s.attached, lib)
}

type harness struct {
	t       *testing.T
	m       *Manager[int, int]
	probes  *fakeProbes
	sink    *fakeSink
	deliver chan func()
	now     int64 // the fake monotonic clock
}

func newHarness(t *testing.T, failVia ...int) *harness {
	h := &harness{
		t:       t,
		probes:  &fakeProbes{fail: map[int]bool{}},
		sink:    &fakeSink{counts: map[string]int64{}},
		deliver: make(chan func()),
		now:     int64(time.Hour), // never 0: 0 means "in use"
	}
	for _, pid := range failVia {
		h.probes.fail[pid] = true
	}
	h.m = New[int, int](Config[int]{
		Probes: h.probes, Sink: h.sink, Deliver: h.deliver,
		Now: func() int64 { return h.now },
	})
	return h
}

func lib(pid, file int) Library[int] {
	return Library[int]{File: file, Name: fmt.Sprintf("/usr/lib/lib%d.so", file), Open: fmt.Sprintf("/proc/%d/root/lib.so", pid), PID: pid}
}

// use: pid maps a probed library file.
func (h *harness) use(pid, file int) { h.m.Use(pid, lib(pid, file), true) }

// follow: pid maps a library that is followed, not probed.
func (h *harness) follow(pid, file int) { h.m.Use(pid, lib(pid, file), false) }

func (h *harness) release(pid, file int) { h.m.Release(pid, file) }

// settle runs the worker's outcomes on the owner (this) goroutine until
// nothing is queued or in flight.
func (h *harness) settle() {
	h.t.Helper()
	for h.m.Pending() > 0 || h.changing() {
		select {
		case f := <-h.deliver:
			f()
		case <-time.After(5 * time.Second):
			h.t.Fatal("no attach or change outcome for 5 s")
		}
	}
}

// changing: a change of some file's collective probes is in flight.
func (h *harness) changing() bool {
	for _, e := range h.m.libs {
		if e.changing {
			return true
		}
	}
	return false
}

// advance moves the clock by d, retries the failed attaches that are due
// and detaches what has been idle long enough (the agent's tick).
func (h *harness) advance(d time.Duration) {
	h.now += int64(d)
	h.m.RetryFailed(h.now)
	h.m.DetachIdle(h.now)
}

// attached lists those of files that have an attachment.
func (h *harness) attached(files ...int) []int {
	var out []int
	for _, f := range files {
		if h.m.Attached(f) {
			out = append(out, f)
		}
	}
	return out
}

// waitClosed waits up to 5 s for n links to be closed (detach closes them
// in the background) and returns how many are.
func (h *harness) waitClosed(n int) int {
	deadline := time.Now().Add(5 * time.Second)
	for h.closed() < n && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	return h.closed()
}

// closed counts the links closed, and fails on a link closed twice.
func (h *harness) closed() int {
	h.probes.mu.Lock()
	defer h.probes.mu.Unlock()
	n := 0
	for _, l := range h.probes.links {
		if l.closes > 1 {
			h.t.Errorf("link of file %d via %d closed %d times", l.file, l.via, l.closes)
		}
		n += min(l.closes, 1)
	}
	return n
}

const linger = DefaultLinger

func TestManagerStateMachine(t *testing.T) {
	type want struct {
		counts   map[string]int64 // every counter reported; absent ones must be 0
		tries    []int            // PIDs through which an attach ran, in order
		attached []int            // files 10 and 11 with an attachment at the end
		closed   int              // links closed before Close
	}
	cases := []struct {
		name    string
		failVia []int
		run     func(h *harness)
		want    want
	}{
		{
			name: "processes mapping one file share one attachment",
			run: func(h *harness) {
				h.use(1, 10)
				h.use(2, 10) // while the first attach is in flight
				h.settle()
				h.use(3, 10)
				h.use(3, 10) // mapped again at a new base
				h.settle()
			},
			want: want{counts: map[string]int64{"libraries_attached": 1}, tries: []int{1}, attached: []int{10}},
		},
		{
			name: "each file is attached once",
			run: func(h *harness) {
				h.use(1, 10)
				h.use(1, 11)
				h.use(2, 11)
				h.settle()
			},
			want: want{counts: map[string]int64{"libraries_attached": 2}, tries: []int{1, 1}, attached: []int{10, 11}},
		},
		{
			name: "the attachment stays while another process maps the file",
			run: func(h *harness) {
				h.use(1, 10)
				h.use(2, 10)
				h.settle()
				h.release(1, 10)
				h.advance(2 * linger)
			},
			want: want{counts: map[string]int64{"libraries_attached": 1}, tries: []int{1}, attached: []int{10}},
		},
		{
			name: "the last process's exit detaches after the linger",
			run: func(h *harness) {
				h.use(1, 10)
				h.use(2, 10)
				h.settle()
				h.release(1, 10)
				h.release(2, 10)
				h.advance(linger - 1)
				if !h.m.Attached(10) {
					h.t.Error("detached before the linger was over")
				}
				h.advance(1)
			},
			want: want{counts: map[string]int64{"libraries_attached": 1, "libraries_detached": 1}, tries: []int{1}, closed: 1},
		},
		{
			name: "a process mapping the file within the linger reuses the attachment",
			run: func(h *harness) {
				h.use(1, 10)
				h.settle()
				h.release(1, 10)
				h.advance(linger / 2)
				h.use(2, 10) // an elastic restart's new process
				h.settle()
				h.advance(linger)
			},
			want: want{counts: map[string]int64{"libraries_attached": 1, "attachments_reused": 1}, tries: []int{1}, attached: []int{10}},
		},
		{
			name:    "a failed attach is retried through the next process that maps the file",
			failVia: []int{1}, // pid 1 exited mid-attach
			run: func(h *harness) {
				h.use(1, 10)
				h.settle()
				if h.m.Attached(10) {
					h.t.Error("attached although the attach failed")
				}
				h.use(2, 10)
				h.settle()
			},
			want: want{counts: map[string]int64{"attach_errors": 1, "attach_retries": 1, "libraries_attached": 1},
				tries: []int{1, 2}, attached: []int{10}},
		},
		{
			name:    "a process already mapping the file when the attach failed does not retry it at once",
			failVia: []int{1},
			run: func(h *harness) {
				h.use(1, 10)
				h.use(2, 10) // in flight: only counted as a user
				h.settle()
			},
			want: want{counts: map[string]int64{"attach_errors": 1}, tries: []int{1}},
		},
		{
			name: "a failed attach is retried through a process already mapping the file after the backoff",
			run: func(h *harness) {
				h.probes.failFirst = 1
				h.use(2, 10)
				h.use(1, 10) // in flight: a user
				h.settle()
				h.advance(RetryBackoff - 1)
				h.settle()
				if h.m.Attached(10) || len(h.probes.tries) != 1 {
					h.t.Errorf("retried before the backoff: tries %v", h.probes.tries)
				}
				h.advance(1)
				h.settle()
			},
			want: want{counts: map[string]int64{"attach_errors": 1, "attach_retries": 1, "libraries_attached": 1},
				tries: []int{2, 1}, attached: []int{10}}, // through the lowest PID
		},
		{
			// A process's path may name another file than the one it maps
			// (bpf.ErrFileChanged): its failures must not keep the file
			// unattached for the processes that already map it.
			name:    "a timed retry goes through another process than the one that failed",
			failVia: []int{1},
			run: func(h *harness) {
				h.use(1, 10)
				h.use(2, 10) // in flight: a user
				h.settle()
				h.advance(RetryBackoff)
				h.settle()
			},
			want: want{counts: map[string]int64{"attach_errors": 1, "attach_retries": 1, "libraries_attached": 1},
				tries: []int{1, 2}, attached: []int{10}},
		},
		{
			name:    "timed retries back off and stop after MaxRetries",
			failVia: []int{1},
			run: func(h *harness) {
				h.use(1, 10)
				h.settle()
				for i := range MaxRetries + 3 {
					h.advance(RetryBackoff<<i - 1)
					h.settle()
					if n := len(h.probes.tries); n != min(i, MaxRetries)+1 {
						h.t.Errorf("before retry %d: %d tries", i+1, n)
					}
					h.advance(1)
					h.settle()
				}
			},
			want: want{counts: map[string]int64{"attach_errors": 1 + MaxRetries, "attach_retries": MaxRetries},
				tries: slices.Repeat([]int{1}, 1+MaxRetries)},
		},
		{
			name: "a successful retry forgets the failures",
			run: func(h *harness) {
				h.probes.failFirst = 1
				h.use(1, 10)
				h.settle()
				h.advance(RetryBackoff)
				h.settle()
				h.release(1, 10)
				h.advance(linger) // detached
				h.probes.failFirst = 1
				h.use(2, 10) // a new job: its first failure waits one backoff again
				h.settle()
				h.advance(RetryBackoff)
				h.settle()
			},
			want: want{counts: map[string]int64{"attach_errors": 2, "attach_retries": 2, "libraries_attached": 2, "libraries_detached": 1},
				tries: []int{1, 1, 2, 2}, attached: []int{10}, closed: 1},
		},
		{
			name:    "one retry at a time",
			failVia: []int{1},
			run: func(h *harness) {
				h.use(1, 10)
				h.settle()
				h.use(2, 10)
				h.use(3, 10) // the retry through 2 is in flight
				h.settle()
			},
			want: want{counts: map[string]int64{"attach_errors": 1, "attach_retries": 1, "libraries_attached": 1},
				tries: []int{1, 2}, attached: []int{10}},
		},
		{
			name:    "a retry that fails too waits for yet another process",
			failVia: []int{1, 2},
			run: func(h *harness) {
				for pid := 1; pid <= 3; pid++ {
					h.use(pid, 10)
					h.settle()
				}
			},
			want: want{counts: map[string]int64{"attach_errors": 2, "attach_retries": 2, "libraries_attached": 1},
				tries: []int{1, 2, 3}, attached: []int{10}},
		},
		{
			name:    "a failed attach whose processes all went is forgotten",
			failVia: []int{1},
			run: func(h *harness) {
				h.use(1, 10)
				h.release(1, 10) // exited while its attach was in flight
				h.settle()
				if _, ok := h.m.Name(10); ok {
					h.t.Error("a failed library without users is still known")
				}
				h.use(2, 10) // a first attach again, not a retry
				h.settle()
			},
			want: want{counts: map[string]int64{"attach_errors": 1, "libraries_attached": 1}, tries: []int{1, 2}, attached: []int{10}},
		},
		{
			name: "an attach that succeeds after its processes went lingers, then detaches",
			run: func(h *harness) {
				h.use(1, 10)
				h.release(1, 10)
				h.settle()
				h.advance(linger - 1)
				if !h.m.Attached(10) {
					h.t.Error("detached before the linger was over")
				}
				h.advance(1)
			},
			want: want{counts: map[string]int64{"libraries_attached": 1, "libraries_detached": 1}, tries: []int{1}, closed: 1},
		},
		{
			name: "a followed library is never attached and is forgotten with its last user",
			run: func(h *harness) {
				h.follow(1, 10)
				h.follow(2, 10)
				if name, ok := h.m.Name(10); !ok || name != "/usr/lib/lib10.so" {
					h.t.Errorf("Name(10) = %q, %v while mapped", name, ok)
				}
				h.release(1, 10)
				h.release(2, 10)
				if _, ok := h.m.Name(10); ok {
					h.t.Error("a followed library without users is still known")
				}
			},
			want: want{counts: map[string]int64{}},
		},
		{
			name: "releasing an unknown file or a process that is no user changes nothing",
			run: func(h *harness) {
				h.release(1, 10)
				h.use(1, 10)
				h.settle()
				h.release(2, 10)
				h.release(1, 11)
				h.advance(2 * linger)
			},
			want: want{counts: map[string]int64{"libraries_attached": 1}, tries: []int{1}, attached: []int{10}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.failVia...)
			tc.run(h)
			if !maps.Equal(nonZero(h.sink.counts), tc.want.counts) {
				t.Errorf("counters %v, want %v", nonZero(h.sink.counts), tc.want.counts)
			}
			if !slices.Equal(h.probes.tries, tc.want.tries) {
				t.Errorf("attaches through PIDs %v, want %v", h.probes.tries, tc.want.tries)
			}
			if got := h.attached(10, 11); !slices.Equal(got, tc.want.attached) {
				t.Errorf("attached files %v, want %v", got, tc.want.attached)
			}
			if got := h.waitClosed(tc.want.closed); got != tc.want.closed {
				t.Errorf("%d links closed, want %d", got, tc.want.closed)
			}
			if n := int64(len(h.sink.attached)); n != h.sink.counts["libraries_attached"] {
				t.Errorf("%d attachments reported to the sink, %d counted", n, h.sink.counts["libraries_attached"])
			}
			h.m.Close()
			if got, made := h.closed(), len(h.probes.links); got != made {
				t.Errorf("after Close %d of %d links closed", got, made)
			}
		})
	}
}

func nonZero(m map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

// Close detaches every attachment, in use or lingering, and counts each.
func TestManagerCloseDetachesEverything(t *testing.T) {
	h := newHarness(t)
	h.use(1, 10)
	h.use(2, 11)
	h.settle()
	h.release(2, 11) // lingering
	h.m.Close()
	if got := h.closed(); got != 2 {
		t.Errorf("%d links closed, want 2", got)
	}
	if n := h.sink.counts["libraries_detached"]; n != 2 {
		t.Errorf("libraries_detached = %d, want 2", n)
	}
}

// Stopping while a library is being attached waits for that attach, closes
// what it made without reporting it, and makes none of the queued ones.
func TestManagerStopsWhileAnAttachIsInFlight(t *testing.T) {
	h := newHarness(t)
	h.probes.gate, h.probes.started = make(chan struct{}), make(chan int, 4)
	h.use(1, 10)
	h.use(1, 11) // queued behind 10
	if f := <-h.probes.started; f != 10 {
		t.Fatalf("attach of file %d started first, want 10", f)
	}
	if !h.m.Attaching(10) || !h.m.Attaching(11) || h.m.Pending() != 2 {
		t.Fatalf("attaching 10: %v, 11: %v, pending %d; want both, 2", h.m.Attaching(10), h.m.Attaching(11), h.m.Pending())
	}
	// The owner stops reading Deliver and closes the manager.
	closed := make(chan struct{})
	go func() { h.m.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while an attach was in flight: its attachment would leak")
	case <-time.After(50 * time.Millisecond):
	}
	close(h.probes.gate)
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung after the attach in flight returned")
	}
	if got := h.closed(); got != 1 || len(h.probes.links) != 1 {
		t.Errorf("%d of %d links closed, want the one in flight made and closed", got, len(h.probes.links))
	}
	if len(h.probes.tries) != 1 {
		t.Errorf("attaches through %v, want only the one in flight", h.probes.tries)
	}
	if len(h.sink.attached) != 0 || len(nonZero(h.sink.counts)) != 0 {
		t.Errorf("reported %v and %v after stop, want nothing", h.sink.attached, h.sink.counts)
	}
}

// A library queued through a slow owner's processes that a process of
// another owner maps as well is attached in that owner's turn (worker.go):
// mapping a real job's library behind one's own slow files holds it back
// by one attach, not by all of them.
func TestManagerSharedLibraryTakesTheMappingOwnersTurn(t *testing.T) {
	h := newHarness(t)
	h.probes.gate, h.probes.started = make(chan struct{}), make(chan int, 16)
	slow := func(file int) Library[int] { l := lib(1, file); l.Owner = "uid:1000"; return l }
	for f := 10; f < 20; f++ {
		h.m.Use(1, slow(f), true) // 10 in flight, 11-19 queued
	}
	h.m.Use(1, slow(50), true) // the real job's library, mapped by the slow owner first
	real := lib(2, 50)
	real.Owner = "cgroup:/kubepods.slice/pod-a"
	h.m.Use(2, real, true)
	var order []int
	for len(order) < 11 {
		select {
		case f := <-h.probes.started:
			order = append(order, f)
			h.probes.gate <- struct{}{}
		case f := <-h.deliver:
			f()
		case <-time.After(5 * time.Second):
			t.Fatalf("attaches stalled after %v", order)
		}
	}
	if i := slices.Index(order, 50); i != 2 {
		t.Errorf("the shared library was attached %dth, want 3rd: %v", i+1, order)
	}
	h.settle()
}
