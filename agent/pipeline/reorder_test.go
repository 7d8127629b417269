package pipeline

import (
	"slices"
	"testing"

	"github.com/slowrank/slowrank/correlate"
)

func hostAt(pid uint32, end int64, op correlate.Op) Input {
	return HostInput(correlate.HostCall{PID: pid, Kind: correlate.HostSyncWait, Op: op, StartNS: end - 10, EndNS: end})
}

func ops(in []Input) []string {
	var s []string
	for _, i := range in {
		switch v := i.value().(type) {
		case correlate.HostCall:
			s = append(s, string(v.Op))
		case correlate.CommInit:
			s = append(s, "init")
		case correlate.CommDestroy:
			s = append(s, "destroy")
		}
	}
	return s
}

// The real-time synchronisations of a plugin-path process and its
// collectives, a batch later, reach the correlator in the order of their
// end; other processes' inputs are never held.
func TestReorderFeedsAPluginProcessInEndOrder(t *testing.T) {
	cnt := counts{}
	r := newPluginReorder(cnt.add)
	var fed []Input
	emit := func(in Input) { fed = append(fed, in) }
	feed := func(in Input) {
		if !r.hold(in, emit) {
			emit(in)
		}
	}
	const ms = int64(1e6)
	base := int64(10_000) * ms
	r.start(1)
	feed(hostAt(2, base+5*ms, "other")) // not on the plugin path: at once
	feed(hostAt(1, base+20*ms, "sync1"))
	feed(hostAt(1, base+60*ms, "sync2"))
	// The batch with the collectives, which ended before each sync.
	feed(OtherInput(correlate.CommInit{PID: 1, AtNS: base}))
	feed(hostAt(1, base+10*ms, "coll1"))
	feed(hostAt(1, base+50*ms, "coll2"))
	if got := ops(fed); !slices.Equal(got, []string{"other"}) {
		t.Fatalf("fed before the hold passed: %v", got)
	}
	r.release(base+30*ms+pluginHold, emit)
	r.release(base+70*ms+pluginHold, emit)
	if got, want := ops(fed), []string{"other", "init", "coll1", "sync1", "coll2", "sync2"}; !slices.Equal(got, want) {
		t.Errorf("fed %v, want %v", got, want)
	}
	// A record older than what was released is counted, and still fed.
	feed(hostAt(1, base+40*ms, "coll-late"))
	r.forget(1, emit)
	if got := ops(fed); got[len(got)-1] != "coll-late" {
		t.Errorf("the late record was not fed at the process's end: %v", got)
	}
	if n := cnt["nccl_plugin_records_late"]; n != 1 {
		t.Errorf("nccl_plugin_records_late = %d, want 1", n)
	}
	if r.held() != 0 {
		t.Errorf("%d inputs held after forget", r.held())
	}
	feed(hostAt(1, base+80*ms, "after-exit")) // a new process with the pid: not held
	if got := ops(fed); got[len(got)-1] != "after-exit" {
		t.Errorf("a forgotten pid's Input was held")
	}
}

// A process cannot make the agent hold without bound: past
// maxHeldPerProcess the oldest half is released early, in order.
func TestReorderHoldIsBounded(t *testing.T) {
	cnt := counts{}
	r := newPluginReorder(cnt.add)
	r.start(1)
	var fed []int64
	emit := func(in Input) { fed = append(fed, in.host.EndNS) }
	for i := range maxHeldPerProcess + 1 {
		r.hold(hostAt(1, int64(maxHeldPerProcess-i), ""), emit) // newest first: the worst order
	}
	if r.held() > maxHeldPerProcess {
		t.Errorf("%d held, bound %d", r.held(), maxHeldPerProcess)
	}
	if !slices.IsSorted(fed) || len(fed) == 0 {
		t.Errorf("the early release fed %d inputs, sorted %v", len(fed), slices.IsSorted(fed))
	}
	if n := cnt["nccl_plugin_reorder_overflow"]; n != int64(len(fed)) {
		t.Errorf("nccl_plugin_reorder_overflow = %d, fed early %d", n, len(fed))
	}
	r.flush(emit)
	if len(fed) != maxHeldPerProcess+1 || !slices.IsSorted(fed) {
		t.Errorf("flush: %d fed of %d, sorted %v", len(fed), maxHeldPerProcess+1, slices.IsSorted(fed))
	}
}
