package correlate

import (
	"math"
	"slices"

	"github.com/slowrank/slowrank/correlate/stepdet"
	"github.com/slowrank/slowrank/detector"
)

// pendingStep is a closed step awaiting its records and its peers.
type pendingStep struct {
	start, end int64
	idx        int64
	clock, gen uint32
	serial     int    // topology serial when the step closed
	serialJob  string // the job of that serial
	tentative  bool
	// Settling stages, in order: host records, arrival, device records.
	hostDone, arrDone, devDone bool

	valid bool // host records complete
	gpu   bool
	ph    [nPhases]float64
	has   uint16 // bit per phase
	fp    string
	colls []collRef

	// Arrival evidence gathered at the arrival stage; ties are resolved
	// with the peers' device measurements at emission.
	lagMS            float64
	hasLag           bool
	votes, lastVotes int
	ties             []tieSet
	self             *proc

	// Device arrival evidence (devarrival.go), gathered at the device
	// stage.
	devLagMS, collDevMS    float64
	hasDevLag, hasCollDev  bool
	devVotes, devLastVotes int
}

const (
	phStep = iota
	phHost
	phSync
	phCollWait
	phCompute
	phComm
	phExposed
	phIdle
	phAttn
	phMoE
	nPhases
)

var phaseNames = [nPhases]string{
	phStep:     detector.PhaseStep,
	phHost:     detector.PhaseHost,
	phSync:     detector.PhaseSyncWait,
	phCollWait: detector.PhaseCollWait,
	phCompute:  detector.PhaseCompute,
	phComm:     detector.PhaseComm,
	phExposed:  detector.PhaseExposedComm,
	phIdle:     detector.PhaseIdle,
	phAttn:     detector.PhaseAttention,
	phMoE:      detector.PhaseMoE,
}

func (s *pendingStep) set(ph int, ns int64) {
	s.ph[ph] = float64(ns) / 1e6
	s.has |= 1 << ph
}

// onEvents hands the step detector's events of pc to the process's step
// timeline when pc is (or becomes) the process's clock.
func (c *Correlator) onEvents(p *proc, pc *procComm) {
	evs := pc.det.Status().Take()
	if len(evs) == 0 {
		return
	}
	if !pc.regular && pc.det.HasKnown() {
		pc.regular = true
		if pc.grp != nil {
			c.markGroupDirty(pc.grp)
		}
	}
	if p.markerMode {
		return
	}
	if p.clock != pc && !c.takeClock(p, pc, evs) {
		return
	}
	c.apply(p, evs)
}

// takeClock decides whether pc becomes the clock of p. The clock is the
// first communicator that locks. A communicator with more ranks (more
// ranks agree on its step numbering) takes over once confirmed, or at once
// while the clock is itself tentative or unlocked; any confirmed lock takes
// over from the synchronisation fallback at once and from a clock that has
// stayed unlocked for PromoteCycles of its cycles.
func (c *Correlator) takeClock(p *proc, pc *procComm, evs []stepdet.Event) bool {
	d := pc.det.Status()
	if !d.Locked() {
		return false
	}
	cur := p.clock
	confirmed := !d.Tentative()
	curSettled := cur != nil && cur.det.Status().Locked() && !cur.det.Status().Tentative()
	switch {
	case cur == nil:
	case pc.sync:
		return false
	case cur.sync:
		if (p.clockConfirmed || cur.det.EvenSteps()) && c.coarser(p, pc, evs) {
			// A regular synchronisation clock stays against an occasional
			// collective (logging every N iterations), also through the
			// longer step of that logging iteration (regular).
			return false
		}
		if c.spansIterations(p, pc, evs) {
			// An irregular one too, when each of pc's steps holds more
			// of its steps than an iteration holds instances of a cycle.
			return false
		}
	case pc.nranks() > cur.nranks() && (confirmed || !curSettled):
	case c.quietClock(p, pc, evs):
		// The job's cycle moved to pc (a process group created mid-run,
		// ncclCommSplit at step 200: no step after it), and the clock's
		// communicator went quiet without leaving its lock. pc may be
		// tentative still: its first lock waits ConfirmSpan, whose steps
		// would be lost; withdrawn, they go with it.
	case confirmed && !cur.det.Status().Locked():
		for _, e := range evs {
			if e.Kind == stepdet.Boundary {
				p.clockIdle++
			}
		}
		if p.clockIdle < c.cfg.PromoteCycles {
			return false
		}
	default:
		return false
	}
	c.dropTentative(p)
	p.clock = pc
	p.clockSerial++
	p.clockIdle = 0
	p.switched = true
	p.haveOpen = false
	p.align, p.alignOff, p.clockConfirmed, p.anchor = !pc.sync, p.idxOffset, false, alignAnchor{}
	return true
}

// quietClock reports whether p's clock made no step for PromoteCycles of
// pc's steps and of its own, as of pc's latest boundary in evs.
func (c *Correlator) quietClock(p *proc, pc *procComm, evs []stepdet.Event) bool {
	if p.lastEnd == math.MinInt64 {
		return false
	}
	last := int64(math.MinInt64)
	for _, e := range evs {
		if e.Kind == stepdet.Boundary {
			last = max(last, e.T)
		}
	}
	step, ok := pc.det.LatestStep()
	if !ok || last == math.MinInt64 {
		return false
	}
	if own, ok := p.clock.det.LatestStep(); ok {
		step = max(step, own)
	}
	return last-p.lastEnd > int64(c.cfg.PromoteCycles)*step
}

// spansIterations reports whether each step of pc that evs report (and
// its latest), as far back as p remembers its own steps (endsN), holds
// more than stepdet.MaxGroup steps of p: pc's cycle spans many iterations (the
// collective of a logging step every N iterations), since an iteration
// holds at most stepdet.MaxGroup instances of a cycle (group.go), so that p's
// steps cannot be instances inside one of pc's. A clock that ticks
// several times per iteration (synchronisations that no grouping
// resolved) holds a few steps in each of the job's per-iteration
// collective steps, and gives way.
func (c *Correlator) spansIterations(p *proc, pc *procComm, evs []stepdet.Event) bool {
	oldest := int64(math.MaxInt64)
	for _, e := range p.ends {
		if e.end != 0 {
			oldest = min(oldest, e.end)
		}
	}
	judged, all := false, true
	note := func(from, to int64) {
		if to < oldest {
			return // before p's remembered steps
		}
		n := 0
		for _, e := range p.ends {
			if e.end > from && e.end <= to {
				n++
			}
		}
		if n <= stepdet.MaxGroup && from < oldest {
			return // a lower bound only
		}
		judged, all = true, all && n > stepdet.MaxGroup
	}
	last, lastB := int64(-1), int64(-1)
	for _, e := range evs {
		switch e.Kind {
		case stepdet.Start:
			last = e.T
		case stepdet.Boundary:
			if last >= 0 {
				note(last, e.T)
			}
			last, lastB = e.T, e.T
		}
	}
	if ns, ok := pc.det.LatestStep(); ok && lastB >= 0 {
		note(lastB-ns, lastB)
	}
	return judged && all
}

// coarser reports whether the steps of pc (its latest, or the shortest
// that evs report) are more than twice as long as the latest step of p's
// clock.
func (c *Correlator) coarser(p *proc, pc *procComm, evs []stepdet.Event) bool {
	prev := p.ends[uint64(p.lastIdx-1)%endsN]
	if p.lastIdx < 1 || prev.idx != p.lastIdx-1 || prev.end == 0 {
		return false
	}
	clk := p.lastEnd - prev.end
	shortest := int64(-1)
	if ns, ok := pc.det.LatestStep(); ok {
		shortest = ns
	}
	last := int64(-1)
	for _, e := range evs {
		switch e.Kind {
		case stepdet.Start:
			last = e.T
		case stepdet.Boundary:
			if d := e.T - last; last >= 0 && (shortest < 0 || d < shortest) {
				shortest = d
			}
			last = e.T
		}
	}
	return shortest > 2*clk
}

// alignToPeers returns the index of a step of another process of the same
// job that ends within a quarter of the step's duration of end. Used for
// the first step under each clock: counted from the lock, indices depend
// on what the process's recording saw (the communicator's creation and an
// init-time prefix or not, a late dlopen of NCCL, an agent restarted
// mid-run), while ranks coupled by their collectives end the same
// iteration together. The first process of a job to close a step numbers
// it, the others follow. The closest end wins, ties to the lowest pid, so
// that the result does not depend on map order. ok is false without a
// match; a is the match when it is a tentative step (its lock may still
// be withdrawn, see unanchor).
func (c *Correlator) alignToPeers(p *proc, end, dur int64) (idx int64, a alignAnchor, ok bool) {
	tol := dur / 4
	best, bestPID := int64(-1), uint32(0)
	var from *proc
	var fromEnd int64
	for _, q := range c.procs {
		if q == p || !q.hasInfo || q.info.Job != p.info.Job || q.clock == nil {
			continue
		}
		for _, e := range q.ends {
			if e.end == 0 {
				continue
			}
			d := e.end - end
			if d < 0 {
				d = -d
			}
			if d > tol || (best >= 0 && (d > best || d == best && q.pid > bestPID)) {
				continue
			}
			best, bestPID, idx, ok, from, fromEnd = d, q.pid, e.idx, true, q, e.end
		}
	}
	if ok {
		for _, s := range from.pending {
			if s.idx == idx && s.end == fromEnd && s.tentative {
				a = alignAnchor{ok: true, pid: from.pid, clock: s.clock, gen: s.gen, idx: idx}
			}
		}
	}
	return idx, a, ok
}

// unanchor follows the withdrawal of tentative steps of q (a retract, a
// trim, a change of clock): a process whose first alignment took its
// index from one of them (anchor) and whose clock is not confirmed yet
// numbers its steps from the aligned one by its own count, the index it
// had without a peer, as if it had closed that step first: the peer's
// index is of a cut that its lock withdrew. Rank 0 of the fake trainer
// took index 2 from a tentative step of rank 1's one-instance lock, 1.8 ms
// before its own first iteration's end, which rank 1's regroup withdrew
// right after; rank 1's own first step matched no peer and counted from
// 0: step k was iteration k−2 on rank 0 (TestReplayTrainerSpeedup's
// 10-loaded-aligned-to-withdrawn). Processes aligned to the renumbered steps
// follow them (renumber).
func (c *Correlator) unanchor(q *proc) {
	for _, p := range c.procs {
		a := p.anchor
		if !a.ok || a.pid != q.pid || p == q {
			continue
		}
		if !c.pendingStep(q, a) {
			p.anchor = alignAnchor{}
			if !p.clockConfirmed && p.clockSerial == a.serial && a.own != a.at {
				c.renumber(p, a.at, a.own-a.at, len(c.procs))
			}
		}
	}
}

// pendingStep reports whether the step of anchor a is a pending step of q.
func (c *Correlator) pendingStep(q *proc, a alignAnchor) bool {
	for _, s := range q.pending {
		if s.idx == a.idx && s.clock == a.clock && s.gen == a.gen {
			return true
		}
	}
	return false
}

// renumber moves the indices of p's steps under its clock from index from
// on by d, and those of the processes aligned to them (up to depth of them
// in a chain).
func (c *Correlator) renumber(p *proc, from, d int64, depth int) {
	if depth <= 0 {
		return
	}
	var moved []int64
	for _, s := range p.pending {
		if s.clock == p.clockSerial && s.idx >= from {
			moved = append(moved, s.idx)
			s.idx += d
		}
	}
	p.idxOffset += d
	if p.lastIdx >= from {
		p.lastIdx += d
	}
	var ends []stepEnd
	for i, e := range p.ends {
		if e.end != 0 && e.idx >= from {
			ends = append(ends, e)
			p.ends[i] = stepEnd{}
		}
	}
	for _, e := range ends {
		p.ends[uint64(e.idx+d)%endsN] = stepEnd{idx: e.idx + d, end: e.end}
	}
	for _, r := range c.procs {
		if a := &r.anchor; a.ok && r != p && a.pid == p.pid && a.clock == p.clockSerial && slices.Contains(moved, a.idx) {
			a.idx += d
			c.renumber(r, a.at, d, depth-1) // r's clock is not confirmed: r would hold no anchor
			a.at += d
		}
	}
}

func (c *Correlator) apply(p *proc, evs []stepdet.Event) {
	for _, e := range evs {
		switch e.Kind {
		case stepdet.Start:
			p.open(e.T)
		case stepdet.Boundary:
			p.clockIdle = 0
			if !e.Tentative {
				p.clockConfirmed, p.anchor = true, alignAnchor{}
			}
			if p.haveOpen && e.T > p.openStart {
				idx := e.Idx + p.idxOffset
				realign := false
				var anchor alignAnchor
				if p.align && p.hasInfo {
					own := idx
					if own <= p.lastIdx && (p.switched || e.T > p.lastEnd) {
						own = p.lastIdx + 1 // as below
					}
					if peer, a, ok := c.alignToPeers(p, e.T, e.T-p.openStart); ok && peer > p.lastIdx {
						p.idxOffset += peer - idx
						idx = peer
						if a.ok && e.Tentative && own > p.lastIdx {
							a.serial, a.at, a.own = p.clockSerial, peer, own
							anchor = a
						}
					}
					p.align, realign = false, true
				}
				// A step after the last one standing gets a later index, also
				// when the alignment re-armed by a retract or a trim found no
				// peer's step (the peer has not closed that iteration yet): the
				// lock's own count from alignOff is then behind the steps a trim
				// left, and every step up to them would be dropped.
				if idx <= p.lastIdx && (p.switched || realign && e.T > p.lastEnd) {
					p.idxOffset += p.lastIdx + 1 - idx
					idx = p.lastIdx + 1
				}
				if idx > p.lastIdx {
					p.switched = false
					c.closeStep(p, p.openStart, e.T, idx, e.Gen, e.Tentative)
					if anchor.ok {
						p.anchor = anchor
					}
				}
			}
			p.open(e.T)
		case stepdet.Break:
			p.haveOpen = false
		case stepdet.Retract:
			c.retractGen(p, p.clockSerial, e.Gen)
			p.haveOpen = false
			if !p.clockConfirmed && p.hasInfo {
				// The aligned step was withdrawn: align the next one.
				p.align, p.idxOffset, p.anchor = true, p.alignOff, alignAnchor{}
			}
		case stepdet.Trim:
			if c.trimGen(p, p.clockSerial, e.Gen, e.T) && !p.clockConfirmed && p.hasInfo && !standing(p, p.clockSerial, e.Gen) {
				// The lock's first steps, the aligned one among them, were
				// withdrawn: align the next one, as after a retract. Steps
				// that stand after the trim are consecutive iterations,
				// numbered: the next one continues them (aligned again to a
				// peer's step within a quarter of a step, an uncoupled
				// rank one iteration behind its peer skipped an index:
				// testdata trainer-speedup10-loaded-new-pace-by-count).
				p.align, p.idxOffset, p.anchor = true, p.alignOff, alignAnchor{}
			}
		case stepdet.Burst:
			p.stats.BurstSteps += uint64(e.Idx)
		case stepdet.Confirm:
			p.clockConfirmed, p.anchor = true, alignAnchor{}
			for _, s := range p.pending {
				if s.clock == p.clockSerial && s.gen == e.Gen {
					s.tentative = false
				}
			}
			for _, q := range c.procs {
				if a := q.anchor; a.ok && a.pid == p.pid && a.clock == p.clockSerial && a.gen == e.Gen {
					q.anchor = alignAnchor{} // the peer's step stands
				}
			}
		}
	}
}

func (c *Correlator) closeStep(p *proc, start, end, idx int64, gen uint32, tentative bool) {
	var s *pendingStep
	if n := len(p.free); n > 0 {
		s, p.free = p.free[n-1], p.free[:n-1]
		colls, ties := s.colls[:0], s.ties[:0]
		*s = pendingStep{colls: colls, ties: ties}
	} else {
		s = &pendingStep{}
	}
	s.start, s.end, s.idx, s.self = start, end, idx, p
	s.clock, s.gen, s.tentative = p.clockSerial, gen, tentative
	s.serial, s.serialJob = c.job(p.info.Job).serial, p.info.Job
	p.pending = append(p.pending, s)
	p.lastIdx, p.lastEnd = idx, end
	p.ends[uint64(idx)%endsN] = stepEnd{idx: idx, end: end}
	if len(p.pending) > c.cfg.MaxPending {
		p.stats.Evicted++
		c.recycle(p, 0)
	}
}

func (c *Correlator) recycle(p *proc, i int) {
	s := p.pending[i]
	p.pending = slices.Delete(p.pending, i, i+1)
	if len(p.free) < 16 {
		p.free = append(p.free, s)
	}
}

// retractGen withdraws the tentative steps of one lock.
func (c *Correlator) retractGen(p *proc, clock, gen uint32) {
	for i := 0; i < len(p.pending); {
		s := p.pending[i]
		if s.tentative && s.clock == clock && s.gen == gen {
			p.stats.Retracted++
			c.recycle(p, i)
			continue
		}
		i++
	}
	c.rewind(p)
}

// trimGen withdraws the tentative steps of one lock up to its latest
// init-time step (a synchronisation per parameter copied to the GPU, by
// stepdet.InitTime's rule) and reports whether it withdrew any.
func (c *Correlator) trimGen(p *proc, clock, gen uint32, minNS int64) bool {
	var idx []int    // the lock's tentative steps in p.pending
	var durs []int64 // their durations
	for i, s := range p.pending {
		if s.tentative && s.clock == clock && s.gen == gen {
			idx = append(idx, i)
			durs = append(durs, s.end-s.start)
		}
	}
	cut := stepdet.InitTime(durs, minNS)
	if cut < 0 {
		return false
	}
	cut = idx[cut]
	for i := 0; i <= cut && i < len(p.pending); {
		s := p.pending[i]
		if s.tentative && s.clock == clock && s.gen == gen {
			p.stats.Retracted++
			c.recycle(p, i)
			cut--
			continue
		}
		i++
	}
	c.rewind(p)
	return true
}

// standing reports whether a tentative step of the lock gen of clock is
// pending.
func standing(p *proc, clock, gen uint32) bool {
	for _, s := range p.pending {
		if s.tentative && s.clock == clock && s.gen == gen {
			return true
		}
	}
	return false
}

// dropTentative withdraws every tentative step of p.
func (c *Correlator) dropTentative(p *proc) {
	for i := 0; i < len(p.pending); {
		if p.pending[i].tentative {
			p.stats.Retracted++
			c.recycle(p, i)
			continue
		}
		i++
	}
	c.rewind(p)
}

func (c *Correlator) rewind(p *proc) {
	p.lastIdx, p.lastEnd = p.emitIdx, p.emitEnd
	if n := len(p.pending); n > 0 {
		p.lastIdx, p.lastEnd = p.pending[n-1].idx, p.pending[n-1].end
	}
	for i := range p.ends {
		if p.ends[i].idx > p.lastIdx {
			p.ends[i] = stepEnd{} // withdrawn: no peer aligns to it
		}
	}
	c.unanchor(p)
}

// pump settles due steps: first every process measures its due steps, then
// steps whose peers have reported are emitted, so that arrival evidence can
// use the peers' measurements of the same step.
func (c *Correlator) pump(force bool) {
	c.refreshOrder()
	for _, p := range c.order {
		c.measureDue(p, force)
	}
	for _, p := range c.order {
		c.emitReady(p, force)
	}
}

// due is when a step can be measured: HostReorder after its end, and for
// a covered step once device records reached DeviceSlack past its end or,
// failing that, DeviceReorder after its end.
func (c *Correlator) due(p *proc, s *pendingStep) int64 {
	d := s.end + int64(c.cfg.HostReorder)
	if p.cov.contains(s.start, s.end) && p.maxDevEnd < s.end+int64(c.cfg.DeviceSlack) {
		d = max(d, s.end+int64(c.cfg.DeviceReorder))
	}
	return d
}

// measureDue runs the settling stages of p's steps in order, as far as
// their allowances have passed (all of them when force).
func (c *Correlator) measureDue(p *proc, force bool) {
	for i, s := range p.pending {
		if s.devDone {
			continue
		}
		if s.tentative {
			return
		}
		if !s.hostDone {
			if !force && c.now < s.end+int64(c.cfg.HostReorder) {
				return
			}
			c.measureHost(p, s)
		}
		if !s.arrDone {
			if !c.arrivalReady(p, s) {
				if !force && c.now < s.end+int64(c.cfg.ArrivalWait) && len(p.pending)-1-i < c.cfg.ArrivalWaitSteps {
					return
				}
				p.stats.ArrivalTimeout++
			}
			c.arrivalStage(p, s)
			s.arrDone = true
		}
		if !force && c.now < c.due(p, s) {
			return
		}
		if ready, expected := c.kernelsReady(p, s); !ready {
			limit := s.end + kernelGrace
			if expected {
				limit = s.end + int64(c.cfg.DeviceReorder)
			}
			if !force && c.now < limit {
				return
			}
			if expected {
				p.stats.DeviceArrivalTimeout++
			}
		}
		c.deviceArrival(p, s)
		c.measureDevice(p, s)
	}
}

func (c *Correlator) emitReady(p *proc, _ bool) {
	for len(p.pending) > 0 {
		s := p.pending[0]
		if !s.devDone {
			return
		}
		c.emit(p, s)
		p.emitIdx, p.emitEnd = s.idx, s.end
		c.recycle(p, 0)
	}
}

// measureHost assigns the buffered host records that end inside the step
// (an interval belongs to the step in which it ended; it is clipped to the
// step for the union arithmetic) and computes the host phases.
func (c *Correlator) measureHost(p *proc, s *pendingStep) {
	sc := &c.sc
	sc.sync, sc.blocked, sc.collWait = sc.sync[:0], sc.blocked[:0], sc.collWait[:0]
	for p.host.len() > 0 {
		r := p.host.front()
		if r.end > s.end {
			break
		}
		if r.end <= s.start {
			p.stats.Unassigned++
			p.host.pop()
			continue
		}
		sp := span{max(r.start, s.start), r.end}
		switch r.kind {
		case rSync:
			sc.sync = append(sc.sync, sp)
			sc.blocked = append(sc.blocked, sp)
		case rCollWait:
			sc.collWait = append(sc.collWait, sp)
			sc.blocked = append(sc.blocked, sp)
		case rColl:
			s.colls = append(s.colls, collRef{grp: r.ref, seq: r.aux, start: r.start})
		}
		p.host.pop()
	}
	s.valid = p.host.holeEnd <= s.start && !p.hostHoles.overlaps(s.start, s.end)

	stepNS := s.end - s.start
	s.set(phStep, stepNS)
	syncOn := p.info.Probes&ProbeSync != 0 || (p.info.Probes == 0 && p.sawSync)
	collOn := p.info.Probes&ProbeCollWait != 0 || (p.info.Probes == 0 && p.sawCollWait)
	if syncOn {
		s.set(phSync, unionNS(sc.sync))
	}
	if collOn {
		s.set(phCollWait, unionNS(sc.collWait))
	}
	if syncOn || collOn {
		s.set(phHost, stepNS-unionNS(sc.blocked))
	}
	s.hostDone = true
	p.hostConsumed = s.end
	p.hostHoles.prune(s.end)
}

// measureDevice assigns the buffered device records that end inside the
// step and computes the device phases and the fingerprint.
func (c *Correlator) measureDevice(p *proc, s *pendingStep) {
	sc := &c.sc
	stepNS := s.end - s.start

	// Device records.
	sc.compute, sc.comm, sc.attn, sc.moe = sc.compute[:0], sc.comm[:0], sc.attn[:0], sc.moe[:0]
	var fp fingerprint
	for p.dev.len() > 0 {
		r := p.dev.front()
		if r.end > s.end {
			break
		}
		if r.end <= s.start {
			p.stats.Unassigned++
			p.dev.pop()
			continue
		}
		sp := span{max(r.start, s.start), r.end}
		switch r.kind {
		case rComm:
			sc.comm = append(sc.comm, sp)
		case rCopy:
			sc.compute = append(sc.compute, sp)
		default:
			sc.compute = append(sc.compute, sp)
			if r.kind == rAttn {
				sc.attn = append(sc.attn, sp)
			} else if r.kind == rMoE {
				sc.moe = append(sc.moe, sp)
			}
			fp.add(r.aux)
		}
		p.dev.pop()
	}
	covered := p.cov.contains(s.start, s.end)
	s.gpu = covered && p.dev.holeEnd <= s.start && !p.devHoles.overlaps(s.start, s.end)
	if covered && !s.gpu {
		p.stats.DegradedSteps++
	}
	var commNS int64
	if s.gpu {
		computeNS := unionNS(sc.compute)
		commNS = unionNS(sc.comm)
		allNS := unionMergedNS(sc.compute, sc.comm)
		s.set(phCompute, computeNS)
		s.set(phComm, commNS)
		s.set(phExposed, allNS-computeNS)
		s.set(phIdle, stepNS-allNS)
		if len(sc.attn) > 0 {
			s.set(phAttn, unionNS(sc.attn))
		}
		if len(sc.moe) > 0 {
			s.set(phMoE, unionNS(sc.moe))
		}
		s.fp = fp.hex()
	}
	p.recent[uint64(s.idx)%recentN] = recentComm{idx: s.idx, commNS: commNS, ok: s.gpu}

	s.devDone = true
	p.consumed = s.end
	p.cov.prune(s.end)
	p.devHoles.prune(s.end)
}

func (c *Correlator) emit(p *proc, s *pendingStep) {
	if !s.valid {
		p.stats.InvalidSteps++
		return
	}
	if !p.hasInfo {
		p.stats.NoRankSteps++
		return
	}
	j := c.job(p.info.Job)
	c.refreshTopology(j)
	topo := j.version
	if s.serialJob == p.info.Job {
		topo = j.versionFor(s.serial)
	}
	phases := make(map[string]float64, 10)
	for i := range nPhases {
		if s.has&(1<<i) != 0 {
			phases[phaseNames[i]] = s.ph[i]
		}
	}
	st := detector.Step{
		Kind:    detector.KindStep,
		Job:     p.info.Job,
		Topo:    topo,
		Rank:    p.info.Rank,
		Step:    s.idx,
		Host:    p.info.Host,
		StartNS: s.start,
		EndNS:   s.end,
		Phases:  phases,
		GPU:     s.gpu,
		Epoch:   p.info.Epoch,
	}
	if s.fp != "" {
		st.Workload = &detector.Workload{FP: s.fp}
	}
	st.LastArrival, st.ArrivalLagMS = c.arrivalFields(s)
	st.DeviceLastArrival, st.DeviceArrivalLagMS, st.DeviceCollMS = deviceFields(s)
	c.steps = append(c.steps, st)
	p.stats.Steps++
}
