package correlate

import (
	"slices"
	"testing"

	"github.com/slowrank/slowrank/correlate/stepdet"
)

// A first alignment to a peer's tentative step that the peer's lock then
// withdraws numbers nothing (unanchor): the aligned process's steps take
// its own count, and a process aligned to those steps follows them. Events
// as a token detector (stepdet) emits them: q's tentative step ends at 10 ms with index 5
// (its lock counted init-time calls); p's first step ends at 11 ms, r's at
// 11.5 ms, each within a quarter of a step of the closest; q's regroup
// withdraws its step, and q's own next step matches none.
func TestAlignedToWithdrawnStepTakesOwnCount(t *testing.T) {
	c := New(Config{})
	procs := map[uint32]*proc{}
	for r, pid := range []uint32{101, 102, 103} {
		c.SetRank(RankInfo{PID: pid, Rank: r, LocalRank: r, WorldSize: 3, Host: "h0", Job: "j1"})
		p := c.proc(pid)
		p.clock = &procComm{p: p}
		p.align = pid != 101
		procs[pid] = p
	}
	q, p, r := procs[101], procs[102], procs[103]
	bound := func(t, idx int64, gen uint32) stepdet.Event {
		return stepdet.Event{Kind: stepdet.Boundary, Tentative: true, Gen: gen, T: t * ms / 10, Idx: idx}
	}
	start := func(t int64) stepdet.Event { return stepdet.Event{Kind: stepdet.Start, T: t * ms / 10} }
	c.apply(q, []stepdet.Event{start(0), bound(100, 5, 1)})
	c.apply(p, []stepdet.Event{start(10), bound(110, 0, 1)})
	c.apply(r, []stepdet.Event{start(20), bound(115, 0, 1)})
	idx := func(p *proc) []int64 {
		var v []int64
		for _, s := range p.pending {
			v = append(v, s.idx)
		}
		return v
	}
	if got := idx(p)[0]; got != 5 {
		t.Fatalf("p's first step aligned to %d, want q's 5", got)
	}
	if got := idx(r)[0]; got != 5 {
		t.Fatalf("r's first step aligned to %d, want p's 5", got)
	}
	c.apply(p, []stepdet.Event{bound(260, 1, 1)})
	c.apply(q, []stepdet.Event{{Kind: stepdet.Retract, Gen: 1}})
	if got := idx(p); len(got) != 2 || got[0] != 0 || got[1] != 1 {
		t.Errorf("p's steps after q's retract: %v, want [0 1]", got)
	}
	if got := idx(r); len(got) != 1 || got[0] != 0 {
		t.Errorf("r's steps after q's retract: %v, want [0]", got)
	}
	c.apply(r, []stepdet.Event{bound(265, 1, 1)})
	c.apply(p, []stepdet.Event{bound(410, 2, 1)})
	if got := idx(p); len(got) != 3 || got[2] != 2 {
		t.Errorf("p's next step: %v, want index 2", got)
	}
	if got := idx(r); len(got) != 2 || got[1] != 1 {
		t.Errorf("r's next step: %v, want index 1", got)
	}
	// q aligns again after its retract: to p's renumbered steps.
	c.apply(q, []stepdet.Event{start(110), bound(412, 0, 2)})
	if got := idx(q); len(got) != 1 || got[0] != 2 {
		t.Errorf("q's first step after its retract: %v, want p's index 2", got)
	}
}

// A peer's tentative step that its lock confirms stands: the aligned
// process keeps its index through the peer's later withdrawals, also once
// that step was emitted (no longer pending).
func TestAlignedToConfirmedStepKeepsIndex(t *testing.T) {
	c := New(Config{})
	for r, pid := range []uint32{101, 102} {
		c.SetRank(RankInfo{PID: pid, Rank: r, LocalRank: r, WorldSize: 2, Host: "h0", Job: "j1"})
		p := c.proc(pid)
		p.clock = &procComm{p: p}
		p.align = pid != 101
	}
	q, p := c.proc(101), c.proc(102)
	c.apply(q, []stepdet.Event{{Kind: stepdet.Start}, {Kind: stepdet.Boundary, Tentative: true, Gen: 1, T: 10 * ms, Idx: 5}})
	c.apply(p, []stepdet.Event{{Kind: stepdet.Start, T: 1 * ms}, {Kind: stepdet.Boundary, Tentative: true, Gen: 1, T: 11 * ms, Idx: 0}})
	c.apply(q, []stepdet.Event{{Kind: stepdet.Confirm, Gen: 1}})
	s := q.pending[0]
	q.emitIdx, q.emitEnd = s.idx, s.end // as emitReady does once it is measured
	c.recycle(q, 0)
	c.apply(q, []stepdet.Event{{Kind: stepdet.Boundary, Tentative: true, Gen: 2, T: 20 * ms, Idx: 6}, {Kind: stepdet.Retract, Gen: 2}})
	if got := p.pending[0].idx; got != 5 {
		t.Errorf("p's step: index %d, want q's 5 (confirmed)", got)
	}
}

// TestAlignmentRearmedAfterWithdrawal: a retract, or a trim that leaves
// none of the lock's steps standing, withdraws the aligned first step of a
// clock that no confirmation settled: the next step aligns to a peer
// again, from the clock's own count (a rank would else number its next
// lock by an offset taken for another iteration: one iteration behind its
// peer in TestCutPointAlignedWhateverTheAttach). A re-armed alignment that
// finds no peer's step continues after the steps standing (those of the
// clock before) instead of numbering below them and dropping every step
// up to them (the Trainer lost 69 iterations, testdata/trainer-2ranks).
// Events as a token detector emits them; q's confirmed steps 5..9 end
// every 10 ms from 10 ms.
func TestAlignmentRearmedAfterWithdrawal(t *testing.T) {
	start := func(t int64) stepdet.Event { return stepdet.Event{Kind: stepdet.Start, T: t} }
	bound := func(t, idx int64, gen uint32, tentative bool) stepdet.Event {
		return stepdet.Event{Kind: stepdet.Boundary, Tentative: tentative, Gen: gen, T: t, Idx: idx}
	}
	tests := []struct {
		name string
		// withdraw: p's first lock (gen 1) closed steps 0, 1 and 2 at 11,
		// 13 and 15 ms (init-time steps), the first aligned to q's 5 (the
		// next ones 6 and 7 by its count); these events withdraw them and
		// close p's next steps.
		withdraw []stepdet.Event
		// before: p's steps 0..9 of an earlier clock, emitted, and no peer.
		before bool
		want   []int64 // p's pending steps' indices at the end
	}{{
		name: "a retract re-arms the alignment",
		withdraw: []stepdet.Event{{Kind: stepdet.Retract, Gen: 1},
			start(31 * ms), bound(41*ms, 0, 2, true)},
		want: []int64{8},
	}, {
		name: "a trim of every step re-arms the alignment",
		withdraw: []stepdet.Event{{Kind: stepdet.Trim, Gen: 1, T: 1000 * ms}, {Kind: stepdet.Confirm, Gen: 1},
			bound(31*ms, 3, 1, false), bound(41*ms, 4, 1, false)},
		want: []int64{7, 8},
	}, {
		name:   "without a peer's step the count continues after the steps standing",
		before: true,
		withdraw: []stepdet.Event{{Kind: stepdet.Retract, Gen: 1},
			start(31 * ms), bound(41*ms, 0, 2, true)},
		want: []int64{10},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := New(Config{})
			for r, pid := range []uint32{101, 102} {
				c.SetRank(RankInfo{PID: pid, Rank: r, LocalRank: r, WorldSize: 2, Host: "h0", Job: "j1"})
				c.proc(pid).clock = &procComm{p: c.proc(pid)}
			}
			q, p := c.proc(101), c.proc(102)
			if tc.before {
				q.info.Job = "j2" // no peer
				evs := []stepdet.Event{start(-100 * ms)}
				for i := range int64(10) {
					evs = append(evs, bound(-90*ms+i*10*ms, i, 1, false))
				}
				c.apply(p, evs)
				p.emitIdx, p.emitEnd, p.pending = p.lastIdx, p.lastEnd, nil // as emitReady does
			} else {
				evs := []stepdet.Event{start(0)}
				for i := range int64(5) {
					evs = append(evs, bound(10*ms+i*10*ms, 5+i, 1, false))
				}
				c.apply(q, evs)
			}
			// p's clock changes (as takeClock does): its first step aligns.
			p.clock, p.clockSerial, p.switched, p.haveOpen = &procComm{p: p}, p.clockSerial+1, true, false
			p.align, p.alignOff, p.clockConfirmed = true, p.idxOffset, false
			c.apply(p, []stepdet.Event{start(1 * ms), bound(11*ms, 0, 1, true), bound(13*ms, 1, 1, true), bound(15*ms, 2, 1, true)})
			c.apply(p, tc.withdraw)
			var got []int64
			for _, s := range p.pending {
				got = append(got, s.idx)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("p's steps %v, want %v", got, tc.want)
			}
		})
	}
}
