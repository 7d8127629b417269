package stepdet

import (
	"math/rand/v2"
	"testing"
)

// TestInternPredictionMatchesMap: the locked fast path of intern returns
// exactly what the map would, through locks, breaks and a reset.
func TestInternPredictionMatchesMap(t *testing.T) {
	d := newSeqDet(Params{Repeats: 3, MaxPeriod: 64, Confirm: 2, Promote: 1, NoSyncMin: 4}, false)
	rng := rand.New(rand.NewPCG(7, 8))
	key := func(i int) sigKey { return sigKey{op: "allreduce", count: uint64(i), dtype: 7} }
	n := 0
	call := func(i int) {
		t.Helper()
		id := d.intern(key(i))
		if want, ok := d.sigs[key(i)]; !ok || want != id || d.keys[id-1] != key(i) {
			t.Fatalf("call %d: intern gave %d, map has %d (%v)", n, id, want, ok)
		}
		d.push(id, int64(n)*1000, 0)
		d.events = d.events[:0]
		n++
	}
	cycle := func(calls int) {
		for j := range calls {
			if rng.IntN(500) == 0 {
				call(1000 + rng.IntN(100)) // a stray call breaks the lock
			}
			call(j % 12)
		}
	}
	cycle(5000)
	if !d.locked {
		t.Fatalf("never locked onto the cycle")
	}
	for i := range maxSigs + 10 { // more signatures than a detector keeps: a reset
		call(10_000 + i)
	}
	if d.resets == 0 {
		t.Fatalf("no reset after %d distinct signatures", maxSigs+10)
	}
	cycle(5000)
	if !d.locked {
		t.Fatalf("did not lock again after the reset")
	}
}

// seqCall is one call fed to a detector in a test: a collective of op
// and count, or a synchronisation (sync), ending at end after 1 µs.
type seqCall struct {
	op   string
	cnt  uint64
	sync bool
	end  int64
}

// feedSeq feeds calls to d, then finishes it, and returns every event.
func feedSeq(d Detector, calls []seqCall) []Event {
	var evs []Event
	for _, c := range calls {
		h := Call{Op: c.op, Count: c.cnt, Datatype: 7, StartNS: c.end - 1000, EndNS: c.end}
		if c.sync {
			d.Sync(h, false)
		} else {
			d.Collective(h, false)
		}
		evs = append(evs, d.Status().Take()...)
	}
	d.Finish(true)
	return append(evs, d.Status().Take()...)
}

// ddpIterations returns n iterations of 10 ms from t0 of three bucket
// all-reduces without a synchronisation (a DDP loop without .item()),
// the largest bucket first: iteration i ends at t0 + i·10 ms + 9 ms.
func ddpIterations(t0 int64, n int) (calls []seqCall) {
	const ms = int64(1e6)
	for i := range n {
		base := t0 + int64(i)*10*ms
		for k, cnt := range []uint64{300, 200, 100} {
			calls = append(calls, seqCall{op: "allreduce", cnt: cnt, end: base + int64(k+1)*3*ms})
		}
	}
	return calls
}

// checkFirstSteps fails t unless the events open the first step at
// start, close the first one at end, close n steps in all and withdraw
// none.
func checkFirstSteps(t *testing.T, evs []Event, start, end int64, n int) {
	t.Helper()
	first, firstEnd, got := int64(-1), int64(-1), 0
	for _, e := range evs {
		switch e.Kind {
		case Start:
			if first < 0 {
				first = e.T
			}
		case Boundary:
			if firstEnd < 0 {
				firstEnd = e.T
			}
			got++
		case Retract, Trim, Break:
			t.Fatalf("event %+v: the cycle's steps must stand", e)
		}
	}
	if first != start || firstEnd != end || got != n {
		t.Fatalf("first step %d..%d, %d steps; want %d..%d, %d steps", first, firstEnd, got, start, end, n)
	}
}

// TestNoSyncCycleAcceptedAfterConfirmSpan: a cycle without
// synchronisations is accepted once ConfirmSpan of event time has passed
// without one since the first call or the latest synchronisation, long
// before NoSyncMinCalls calls (a DDP loop with a few buckets and no
// .item() locks in seconds, not after 1024 calls: here 120 calls, which
// would make no step at all).
func TestNoSyncCycleAcceptedAfterConfirmSpan(t *testing.T) {
	const ms = int64(1e6)
	par := Params{Repeats: 3, MaxPeriod: 8, Confirm: 2, Promote: 1, NoSyncMin: 1000, ConfirmSpan: 50 * ms}
	tests := []struct {
		name       string
		pre        []seqCall // before the loop, which starts at 100 ms
		start, end int64     // the first step's (iteration 0 or 1 of the loop)
		steps      int
	}{{
		// No synchronisation since the first call: the first instance only
		// opens the first step (no stable start before it).
		name: "never a synchronisation", start: 109 * ms, end: 119 * ms, steps: 39,
	}, {
		// A synchronisation after the broadcast of the parameters, then
		// none: the first step starts at it.
		name: "none since the broadcast's",
		pre: []seqCall{{op: "broadcast", cnt: 1 << 20, end: 50 * ms},
			{op: "cudaStreamSynchronize", sync: true, end: 60 * ms}},
		start: 60 * ms, end: 109 * ms, steps: 40,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			loop := ddpIterations(100*ms, 40)
			evs := feedSeq(NewSeq(par, false, 0), append(tc.pre, loop...))
			checkFirstSteps(t, evs, tc.start, tc.end, tc.steps)
		})
	}
}

// TestFirstLockStartsAfterInitCall: a communicator's first lock onto a
// cycle without synchronisations starts at the return of the init-time
// call right before it (DDP's broadcast of the parameters), so that the
// first iteration after it is a step; without a call before it, the first
// instance only opens the first step.
func TestFirstLockStartsAfterInitCall(t *testing.T) {
	const ms = int64(1e6)
	par := Params{Repeats: 3, MaxPeriod: 8, Confirm: 2, Promote: 1, NoSyncMin: 8, ConfirmSpan: 50 * ms}
	tests := []struct {
		name       string
		pre        []seqCall
		start, end int64
		steps      int
	}{{
		name:  "after the broadcast",
		pre:   []seqCall{{op: "broadcast", cnt: 1 << 20, end: 80 * ms}},
		start: 80 * ms, end: 109 * ms, steps: 40,
	}, {
		name:  "no call before the loop",
		start: 109 * ms, end: 119 * ms, steps: 39,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			loop := ddpIterations(100*ms, 40)
			evs := feedSeq(NewSeq(par, false, 0), append(tc.pre, loop...))
			checkFirstSteps(t, evs, tc.start, tc.end, tc.steps)
		})
	}
}
