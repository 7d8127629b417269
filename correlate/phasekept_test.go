package correlate

import "testing"

// fastTrainerIter is trainerIter at the fake trainer's pace (2/5: 14.8 ms
// iterations), 10x shorter from iteration 100 on but its logging steps (every
// 50, full length): --speedup-at 100 --speedup 10. Iteration 99, a
// logging step, loses the groups' phase right before the change of pace.
func fastTrainerIter(i int) ([]loopCall, int64) {
	cs, d := trainerIter(max(i, 1)) // no long iteration 0: the lock is still tentative at 100
	f := int64(5)
	if i >= 100 && i%50 != 49 {
		f = 50
	}
	for k := range cs {
		cs[k].at, cs[k].dur = cs[k].at*2/f, max(1, cs[k].dur*2/f)
	}
	return cs, d * 2 / f
}

// delayFrom delays the calls of cs that start at from or later by by (a
// preemption of the host before the first of them).
func delayFrom(cs []loopCall, from, by int64) {
	for k := range cs {
		if cs[k].at >= from {
			cs[k].at += by
		}
	}
}

// loggingSpike is fastTrainerIter with a preemption of 1.2 ms (as long as
// an iteration's end) before synchronisation k of every logging step after
// the speed-up.
func loggingSpike(k int64) func(i int) ([]loopCall, int64) {
	return func(i int) ([]loopCall, int64) {
		cs, d := fastTrainerIter(i)
		if i >= 100 && i%50 == 49 {
			delayFrom(cs, 14*ms+k*88*us, 1200*us)
			d += 1200 * us
		}
		return cs, d
	}
}

// loggingCallsLong is fastTrainerIter with logging synchronisations
// lengthened (preempted inside the call, so that each waited): after the
// speed-up, in every logging step, synchronisation k of long lasts
// long[k] more.
func loggingCallsLong(long map[int64]int64) func(i int) ([]loopCall, int64) {
	return func(i int) ([]loopCall, int64) {
		cs, d := fastTrainerIter(i)
		if i < 100 || i%50 != 49 {
			return cs, d
		}
		var shift int64 // of the later calls, by the earlier ones lengthened
		for _, k := range []int64{40, 45, 50} {
			at := 14*ms + k*88*us + shift
			shift += long[k]
			for j := range cs {
				if cs[j].at == at && cs[j].sync {
					cs[j].dur += long[k]
				}
			}
			delayFrom(cs, at+1, long[k])
			d += long[k]
		}
		return cs, d
	}
}

// TestGroupPhaseKeptUnderPreemptions: the phase of groups of five
// synchronisations (the Trainer's, 1.3 ms iterations after a 10x
// speed-up) is kept by the count of calls per iteration through what a
// loaded host does to the calls' timing. Every iteration is one fact.
func TestGroupPhaseKeptUnderPreemptions(t *testing.T) {
	tests := []struct {
		name string
		iter func(i int) ([]loopCall, int64)
	}{{
		name: "the speed-up right after a logging step",
		iter: fastTrainerIter,
	}, {
		// two instances of a group delayed as long as its end, after two
		// stalls of the iteration's end (8x) among three iterations: the
		// stalls do not set the dominant duration, and the end at the
		// count, delayed or not, stays an end
		name: "groups with two delayed instances after stalls",
		iter: func(i int) ([]loopCall, int64) {
			cs, d := fastTrainerIter(i)
			switch {
			case i < 110 || i%50 == 49:
			case i%10 == 1 || i%10 == 3:
				delayFrom(cs, 1*ms, 8*ms) // the end's wait 8x
				d += 8 * ms
			case i%10 >= 4 && i%10 <= 6:
				delayFrom(cs, 8*us, 1000*us)  // the first synchronisation
				delayFrom(cs, 96*us, 1000*us) // and the third
				d += 2 * ms
			}
			return cs, d
		},
	}, {
		// a preemption before the logging step's 99th synchronisation:
		// its instance as long as an iteration's end, one group before the
		// next iteration's end, and its call returns at once
		name: "a spike without a wait one group before the next end",
		iter: loggingSpike(98),
	}, {
		// the first logging synchronisation at the count delayed as long
		// as an iteration's end
		name: "a spike without a wait at the count in a logging step",
		iter: loggingSpike(3),
	}, {
		// a preemption of 4 ms inside a logging synchronisation off the
		// count (a step end candidate: it dominates its group and lasts
		// as long as the dominant instances), then two of 0.7 ms a group
		// apart, each dominating its group and half as long as the
		// dominant instances (1.2 ms): the first of them is too brief to
		// confirm the candidate, a quarter of it (briefAfter)
		name: "a long spike followed by brief ones in a logging step",
		iter: loggingCallsLong(map[int64]int64{40: 4 * ms, 45: 700 * us, 50: 700 * us}),
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, starts, ends := runTrainerLoop(100*ms, 400, tc.iter)
			checkIterations(t, c, starts, ends, 0, 0)
		})
	}
}
