package correlate

import (
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
