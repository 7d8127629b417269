package stepdet

import "testing"

// TestBurstGroupDelayedBelowThePaceIsHeld: after burst boundaries held,
// a boundary of normal length (a preemption delayed one of the burst's
// groups) is held too while the step it would close, the held ones
// merged, is shorter than the pace, and the end of the sequence drops it
// with the burst: the Trainer's end of training on a loaded host (a
// preemption of 1.9, 8.2 or 11 ms among its 0.3 ms groups closed a step of
// 4.5, 9.9 or 12.2 ms after the last 14.5 ms iteration: one fact too
// many). On a communicator the length alone decides (no wait rule), so
// only this one holds it (the pace: 10 ms iterations). A delay that makes
// the step as long as the pace at least closes a step: reported.
func TestBurstGroupDelayedBelowThePaceIsHeld(t *testing.T) {
	const us, ms = int64(1e3), int64(1e6)
	par := Params{Repeats: 3, MaxPeriod: 8, Confirm: 2, Promote: 1, NoSyncMin: 8, ConfirmSpan: 50 * ms}
	const iters = 30
	tests := []struct {
		name  string
		delay int64 // of the burst's sixth group
		steps int
	}{
		// The first iteration has no stable start before it: steps end
		// iterations 1..29.
		{name: "delayed 3 ms: a step of 4.8 ms", delay: 3 * ms, steps: iters - 1},
		{name: "delayed 8 ms: a step of 9.8 ms", delay: 8 * ms, steps: iters - 1},
		{name: "delayed 12 ms: a step of 13.8 ms, longer than the pace", delay: 12 * ms, steps: iters},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var calls []seqCall
			group := func(end int64) { // one instance of the cycle "allreduce S"
				calls = append(calls, seqCall{op: "allreduce", cnt: 100, end: end - 100*us},
					seqCall{op: "cudaStreamSynchronize", sync: true, end: end})
			}
			for i := range int64(iters) {
				group((i + 1) * 10 * ms)
			}
			t0 := int64(iters) * 10 * ms
			for g := range int64(20) { // the end of training: 20 groups 0.3 ms apart
				end := t0 + (g+1)*300*us
				if g >= 5 {
					end += tc.delay
				}
				group(end)
			}
			n := 0
			for _, e := range feedSeq(NewSeq(par, false, 0), calls) {
				switch e.Kind {
				case Boundary:
					n++
				case Retract, Trim, Break:
					t.Fatalf("event %+v: the cycle's steps must stand", e)
				}
			}
			if n != tc.steps {
				t.Fatalf("%d steps, want %d", n, tc.steps)
			}
		})
	}
}
