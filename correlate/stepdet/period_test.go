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
