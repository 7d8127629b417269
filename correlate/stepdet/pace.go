package stepdet

import "slices"

// Bursts: boundaries far shorter than the pace of the steps.
//
// A boundary that ends a step much shorter than the lock's recent steps is
// no end of a training iteration: the transformers Trainer's end of
// training (on the H200, after its last 37 ms iteration and a 341 ms
// step, 67 groups of five synchronisations within 11 ms, then four more
// under 5 ms: 71 facts outside the iterations), a burst of calls inside an
// iteration or between two (a recompilation, a checkpoint's copies). On a
// confirmed lock, a boundary whose own step (from the latest boundary,
// held or not) is shorter than 1/paceRatio of the median of the latest
// paceRef steps reported (paceMinRef of them at least) is held: it is not
// reported and consumes no index. The next boundary of normal length
// closes the open step with the held ones merged into it: one step, one
// index. The end of the lock (a break, the end of the sequence) drops them
// with the open step. Either way they are counted (Burst events, which
// correlate counts as BurstSteps).
//
// A genuine change of pace (iterations that get shorter after a warm-up,
// a smaller batch) is held at first too, but does not end: once paceRegime
// boundaries have been held over ConfirmSpan, or paceRegime of them while
// the caller's buffers fill up, they are reported after all, as the steps
// they are (late by ConfirmSpan at most, as a first lock's), and become
// the pace. A burst is brief (the Trainer's: 17 ms), as init-time bursts
// are for the confirmation of a first lock; one that lasts longer than
// ConfirmSpan becomes steps. A new pace has its longer steps too (a
// logging step every 50 iterations: 10x shorter iterations make 49 short
// steps and one or two of normal length, and ConfirmSpan is never held
// without them): after paceRegime short boundaries, up to paceNormal
// consecutive boundaries of normal length are held as well, and the chain
// goes on with the next short one. Only a further one of normal length
// ends it as a burst: each held boundary of normal length is then reported
// with the short ones before it merged into its step, as if they had not
// been held (late by paceNormal steps); the end of the lock drops them all
// (a burst at the end of training whose groups a preemption delays). Before
// paceRegime short ones, a boundary of normal length is held as well when
// the step it would close, the held ones merged, is still shorter than
// the pace (a preemption of 2 to 11 ms among a burst's 0.3 ms groups at
// the end of training). At
// most maxHeld boundaries are held; beyond that they are settled as a
// burst.
//
// On the synchronisation clock (the fallback, whose ranks no collective
// couples), where the steps' ends wait for their GPU work (the closing
// calls of the latest steps reported last a quarter of their steps at
// least), the wait decides before the length, which a loaded host's
// preemptions stretch. (On a communicator the ranks wait for the slowest
// one, whose calls return at once, and must hold alike: length alone.) A
// boundary of normal length after held short ones whose call returned at
// once (below 1/paceRatio of the ends' median wait and 1/groupRatio² of
// their median share of the step) is a preemption of the host between a
// burst's brief calls: short; before any short one, up to paceNormal such
// boundaries are held until the next one tells (a burst's first groups,
// late: dropped with it; one of normal length: reported). And a boundary
// whose call waited for as large a share of its step as the ends' calls
// do (half at least) is an iteration's end however short: iterations that
// got shorter and still wait for their GPU work, reported at once, not
// held for ConfirmSpan. A burst's synchronisations (a checkpoint's copies,
// the end of training's groups) wait for a far smaller share, or nothing.
//
// Held boundaries consume no index: the detector's count stays the step
// index, and the alignment across ranks (correlate's steps.go) sees only
// reported steps. The decisions depend on one rank's timing, as the grouping of
// group.go does; ranks coupled by their collectives see the same burst
// (the same calls, far below the threshold) and hold alike once their
// locks are confirmed. A sequence's first lock holds nothing while it is
// tentative: its init-time steps are withdrawn or trimmed by confirmation,
// which hold decisions would change. (So a burst while one member's lock
// is confirmed and another's is still tentative, within ConfirmSpan of
// their first locks, would number their later steps apart.) A later lock
// (a new cycle after a confirmed one) holds from its start, against the
// pace of the steps before it, and its held boundaries do not count
// towards its PromoteCycles: a burst of another cycle is no new cycle of
// iterations (seqDet.boundary); its break or retraction drops them.

const (
	// paceRatio: a held step is shorter than the pace by this factor.
	paceRatio = 8
	// paceRef: the pace is the median of this many latest steps reported.
	paceRef = 8
	// paceMinRef: steps reported before any is held.
	paceMinRef = 4
	// paceRegime: held boundaries that may become the new pace.
	paceRegime = 16
	// paceNormal: consecutive boundaries of normal length held after
	// paceRegime short ones (an iteration with other calls, a logging
	// step, can make two: the cut point lies inside it).
	paceNormal = 3
	// maxHeld: boundaries held at most.
	maxHeld = 1024
)

type paceState struct {
	ref     [paceRef]int64 // durations of the latest steps reported, a ring
	nRef    int
	waits   [paceRef][2]int64 // their closing calls' durations and shares of the step (per waitScale), a ring
	nWait   int
	open    int64      // start of the open step: the latest start or boundary reported
	last    int64      // the latest boundary, held or not, or the start
	held    []heldStep // boundaries held, in order
	short   int        // those of them far shorter than the pace
	normals int        // the latest of them of normal length, consecutive
	chainT  int64      // start of the first held step
}

// heldStep is a held boundary at t, whose closing call lasted w; normal:
// one of normal length after paceRegime short ones (a logging step of a
// new pace, or a burst's end).
type heldStep struct {
	t, w   int64
	normal bool
}

// pace is the median of the latest steps reported; ok once there are
// paceMinRef.
func (ps *paceState) pace() (int64, bool) {
	if ps.nRef < paceMinRef {
		return 0, false
	}
	n := min(ps.nRef, paceRef)
	var ds [paceRef]int64
	copy(ds[:n], ps.ref[:n])
	slices.Sort(ds[:n])
	return ds[n/2], true
}

// noteWait notes the duration w of the call that closed a step of
// duration d reported (w < 0: unknown).
func (ps *paceState) noteWait(w, d int64) {
	if w < 0 || d <= 0 {
		return
	}
	ps.waits[ps.nWait%paceRef] = [2]int64{w, w * waitScale / d}
	ps.nWait++
}

// endWaits returns the median duration of the calls that closed the
// latest steps reported and the median of their shares of those steps
// (per waitScale); ok when the ends wait for their GPU work: that share is
// a quarter at least (as group.go's waited), not a host-bound loop's.
func (ps *paceState) endWaits() (wait, share int64, ok bool) {
	if ps.nWait < paceMinRef {
		return 0, 0, false
	}
	n := min(ps.nWait, paceRef)
	var ws, sh [paceRef]int64
	for i := range n {
		ws[i], sh[i] = ps.waits[i][0], ps.waits[i][1]
	}
	slices.Sort(ws[:n])
	slices.Sort(sh[:n])
	wait, share = ws[n/2], sh[n/2]
	return wait, share, share*groupRatio*groupRatio >= waitScale
}

// waitedAsEnds reports whether the call that closed a boundary of
// duration d after w waited for as large a share of its step as the
// steps' ends do (half at least): an iteration's end, however short.
func (ps *paceState) waitedAsEnds(w, d int64) bool {
	_, share, ok := ps.endWaits()
	return ok && w >= 0 && w*waitScale*groupRatio >= share*max(d, 1)
}

// noWait reports whether the call that closed a boundary of duration d
// after w returned at once where the steps' ends wait: for less than
// 1/paceRatio of their median wait and less than 1/groupRatio² of their
// median share.
func (ps *paceState) noWait(w, d int64) bool {
	wait, share, ok := ps.endWaits()
	return ok && w >= 0 && w*paceRatio < wait && w*waitScale*groupRatio*groupRatio < share*max(d, 1)
}

// startStep opens a step at t; boundaries held in a previous open step
// are dropped with it.
func (d *seqDet) startStep(t int64) {
	d.dropHeld()
	d.pace.open, d.pace.last = t, t
	d.emit(Event{Kind: Start, T: t})
}

// dropHeld drops the held boundaries with the open step (the lock or the
// sequence ends, or a step opens): a burst at the end of training, its
// groups delayed by a preemption here and there.
func (d *seqDet) dropHeld() {
	ps := &d.pace
	if n := len(ps.held); n > 0 {
		d.emit(Event{Kind: Burst, Idx: int64(n)})
	}
	ps.held, ps.short, ps.normals = ps.held[:0], 0, 0
}

// settleHeld settles the held boundaries as a burst: each held boundary of
// normal length is reported, with the short ones before it merged into
// its step; the short ones after the last are merged into the open step.
func (d *seqDet) settleHeld() {
	ps := &d.pace
	var n int64
	for _, h := range ps.held {
		if !h.normal {
			n++
			continue
		}
		if n > 0 {
			d.emit(Event{Kind: Burst, Idx: n})
			n = 0
		}
		d.report(h.t, h.w, true)
	}
	if n > 0 {
		d.emit(Event{Kind: Burst, Idx: n})
	}
	ps.held, ps.short, ps.normals = ps.held[:0], 0, 0
}

// hold reports whether the boundary at t of a confirmed lock, whose
// closing call lasted w, is held; it reports the held boundaries when they
// become the new pace.
func (d *seqDet) hold(t, w int64) bool {
	ps := &d.pace
	p, ok := ps.pace()
	// The waits decide on the synchronisation clock only, whose ranks no
	// collective couples: on a communicator the ranks wait for the slowest
	// one, whose calls return at once, and must hold alike. There a
	// step whose closing call waited as the ends' do is an iteration that
	// got shorter, whatever its length: the Trainer's 10x shorter
	// iterations on a loaded host, after a lock confirmed before them
	// (their steps 0.8 of 1.8 ms waiting, against 8.2 of 15.8), were held
	// for ConfirmSpan, longer than they lasted (101 facts for 400), or,
	// straddling 1/paceRatio of the pace, merged into the next (397).
	normal := !ok || (t-ps.last)*paceRatio >= p || d.syncOnly && ps.waitedAsEnds(w, t-ps.last)
	if normal && d.syncOnly && ps.short > 0 && ps.noWait(w, t-ps.last) {
		// A preemption of the host between a burst's brief calls, not an
		// iteration's end, whose call waits for the GPU: short. (On a
		// loaded 2-core host the end-of-training burst's 67 groups took
		// 160 ms, delays of 3.6 to 19 ms among 0.35 ms groups, their
		// calls 9 to 17 µs against the ends' 8.3 ms: two or three facts
		// after the last iteration.)
		normal = false
	}
	// brief: t would close a step, the held ones merged, still shorter
	// than the pace: a burst's group that a preemption delayed (1.9, 8.2
	// or 11 ms after 0.3 ms ones, 4.5, 9.9 and 12.2 ms merged, against
	// 14.5 ms iterations: a step after the last iteration of training).
	// Held as one of normal length; the end of the lock drops it with the
	// burst, and a boundary that ends an iteration settles it (reported,
	// one boundary late).
	brief := ok && ps.short > 0 && t-ps.open < p
	// doubt: a boundary of normal length whose call returned at once,
	// before any short one is held: held, up to paceNormal of them, to see
	// whether a burst follows (the end-of-training burst's first group
	// came 15.9 ms after the step up to it on a loaded host, its call 42
	// µs, and ended a step after the last iteration's). A boundary of
	// normal length next reports them (host stalls that left the GPU idle
	// are iterations), the end of the lock drops them with the burst.
	doubt := normal && d.syncOnly && ps.short == 0 && ps.normals < paceNormal && ps.noWait(w, t-ps.last)
	switch {
	case normal && !doubt && (ps.short < paceRegime && !brief || ps.normals == paceNormal):
		// A burst ends: merged into the step that t closes.
		d.settleHeld()
		return false
	case len(ps.held) == 0:
		ps.chainT = ps.last
	case len(ps.held) == maxHeld:
		if d.settleHeld(); normal {
			return false
		}
	}
	ps.held = append(ps.held, heldStep{t: t, w: w, normal: normal})
	ps.last = t
	if normal {
		ps.normals++
		return true
	}
	ps.normals = 0
	if ps.short++; ps.short < paceRegime || !d.urgent && t-ps.chainT < d.par.ConfirmSpan {
		return true
	}
	// A new pace: the held boundaries are steps.
	held := ps.held
	for _, h := range held {
		d.report(h.t, h.w, true)
	}
	ps.held, ps.short, ps.normals = held[:0], 0, 0
	return true
}
