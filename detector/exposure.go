package detector

import (
	"fmt"
	"math"
	"slices"
	"sort"
)

// peerEvidence holds, per evidence phase, the sorted medians of the cohort
// members that measured it, built on first use within one cohort's window.
type peerEvidence struct {
	built  [nEvidence]bool
	sorted [nEvidence][]float64
	step   jobStep // the job's step against its past, for the whole cohort window
}

// median returns the median of the members' values of evidence k without
// one occurrence of own (own is NaN when self did not measure it), or NaN
// when no other member measured it.
func (pe *peerEvidence) median(ms []member, k int, own float64) float64 {
	if !pe.built[k] {
		pe.built[k] = true
		for _, m := range ms {
			if !math.IsNaN(m.ev[k]) {
				pe.sorted[k] = append(pe.sorted[k], m.ev[k])
			}
		}
		slices.Sort(pe.sorted[k])
	}
	s := pe.sorted[k]
	skip := -1 // index of own in s
	if !math.IsNaN(own) {
		skip = sort.SearchFloat64s(s, own)
	}
	n := len(s)
	if skip >= 0 {
		n--
	}
	if n <= 0 {
		return math.NaN()
	}
	at := func(i int) float64 {
		if skip >= 0 && i >= skip {
			return s[i+1]
		}
		return s[i]
	}
	if n%2 == 1 {
		return at(n / 2)
	}
	return (at(n/2-1) + at(n/2)) / 2
}

// jobStep is the job's step time in one cohort window against its recent
// past. The ranks of a synchronous job share one step time, so every member
// with a baseline measures the same rise, each against its own clean windows.
type jobStep struct {
	riseMS, baseMS float64
	ranks          int // members with minBaseline windows; 0: no baseline yet
}

// jobStep measures the job's step rise over the members of a cohort window
// that have a step-time baseline.
func (j *job) jobStep(ms []member) jobStep {
	var rises, bases []float64
	for _, m := range ms {
		rs := j.ranks[m.rank]
		if rs == nil || math.IsNaN(m.ev[evStep]) {
			continue
		}
		if base, n := rs.baseline(); n >= minBaseline {
			rises = append(rises, m.ev[evStep]-base)
			bases = append(bases, base)
		}
	}
	if len(rises) == 0 {
		return jobStep{}
	}
	return jobStep{riseMS: medianOf(rises), baseMS: medianOf(bases), ranks: len(rises)}
}

// counts reports whether the job's step rose by the seed's rule against its
// own past (threshold and floor of phase): a smaller rise is the step's own
// noise from window to window, not a step that got longer.
func (d *Detector) counts(phase string, js jobStep) bool {
	return js.ranks > 0 && js.riseMS >= d.cfg.PhaseThreshold(phase)*js.baseMS &&
		js.riseMS >= float64(d.cfg.Floor)/1e6
}

// passes applies the seed's rule to the exposed part of an excess.
func (d *Detector) passes(phase string, exposedMS, reference float64) bool {
	return exposedMS/reference >= d.cfg.PhaseThreshold(phase) && exposedMS >= float64(d.cfg.Floor)/1e6
}

// gate decides whether the excess of a slow window of a gated phase is
// exposed, i.e. lengthens a step, and rewrites the outcome when it is not
// (DESIGN.md section 4). The shown exposure, larger of what exists:
//   - idle: the rank's GPU idled longer than its peers' (device records),
//     measured on the rank's own device, so taken as it is;
//   - victim_wait: its peers waited longer in blocking collectives than it
//     did, bounded by the job's step rise once the job has a baseline: peers
//     that would have waited anyway (another cause, a shared GPU) overstate;
//   - otherwise step_time: the job's step rise itself, once it has a baseline;
//   - otherwise none: the window is uncertain.
//
// A step rise within the threshold of its baseline counts as 0. Only the
// exposed part of the excess is held against the threshold and the floor;
// when all of it is exposed this is the seed's rule.
func (d *Detector) gate(phase string, ms []member, self int, rs *rankState, e *evaluation, peers *peerEvidence) {
	excess := e.value - e.reference
	ex := &Exposure{Evidence: EvidenceNone, ExcessMS: excess}
	e.exposure = ex
	describeSteps(ex, ms[self], rs, peers.step)
	shown, uncapped := d.shownExposure(phase, ms, self, ex, peers)
	if ex.Evidence == EvidenceNone {
		e.outcome = outcomeUncertain
		e.reason = fmt.Sprintf("%s median %.2f ms is %.1f%% above rank %d (%.2f ms), but nothing shows whether it lengthens a step: "+
			"no GPU idle time (device records) or collective waits on both sides, and %d of %d windows of step-time baseline",
			phase, e.value, e.deviation*100, e.refRank, e.reference, ex.BaselineWindows, minBaseline)
		return
	}
	ex.ExposedMS = min(max(shown, 0), excess)
	ex.Exposed = d.passes(phase, ex.ExposedMS, e.reference)
	if !ex.Exposed {
		e.outcome, e.hidden = outcomeOK, true
		// Hidden by the job's step alone: rank-specific evidence would have
		// exposed it, or there was none. Such a window must not teach the
		// baseline, or a stall that grows slowly would hide itself.
		e.hiddenByStep = ex.Evidence == EvidenceStepTime || d.passes(phase, min(max(uncapped, 0), excess), e.reference)
	}
}

// shownExposure returns the exposure that the evidence shows and what the
// rank-specific evidence alone showed (-Inf: none), and sets ex's evidence
// and medians (EvidenceNone when nothing tells).
func (d *Detector) shownExposure(phase string, ms []member, self int, ex *Exposure, peers *peerEvidence) (shown, uncapped float64) {
	me := ms[self]
	rise, haveRise := 0.0, peers.step.ranks > 0
	if d.counts(phase, peers.step) {
		rise = peers.step.riseMS
	}
	shown, uncapped = math.Inf(-1), math.Inf(-1)
	if v := me.ev[evIdle]; !math.IsNaN(v) {
		if peer := peers.median(ms, evIdle, v); !math.IsNaN(peer) {
			ex.IdleMS, ex.PeerIdleMS = ptr(v), ptr(peer)
			shown, uncapped, ex.Evidence = v-peer, v-peer, EvidenceIdle
		}
	}
	if v := me.ev[evCollWait]; !math.IsNaN(v) {
		if peer := peers.median(ms, evCollWait, v); !math.IsNaN(peer) {
			ex.CollWaitMS, ex.PeerCollWaitMS = ptr(v), ptr(peer)
			w := peer - v
			uncapped = max(uncapped, w)
			capped := haveRise && rise < w && w > 0
			if capped {
				w = rise
			}
			// On a tie the capped wait names the evidence: the cap decided.
			if ex.Evidence == EvidenceNone || w > shown || (capped && w == shown) {
				shown, ex.Evidence, ex.Capped = w, EvidenceVictimWait, capped
			}
		}
	}
	if ex.Evidence == EvidenceNone && haveRise {
		shown, ex.Evidence = rise, EvidenceStepTime
	}
	return shown, uncapped
}

// describeSteps records the step times looked at: the rank's own against
// its clean windows, and the job's rise.
func describeSteps(ex *Exposure, me member, rs *rankState, js jobStep) {
	base, n := 0.0, 0
	if rs != nil {
		base, n = rs.baseline()
	}
	ex.BaselineWindows = n
	if step := me.ev[evStep]; !math.IsNaN(step) {
		ex.StepMS = ptr(step)
		if n > 0 {
			ex.BaselineStepMS = ptr(base)
		}
	}
	if js.ranks > 0 {
		ex.StepRiseMS, ex.StepRiseBaselineMS, ex.StepRiseRanks = ptr(js.riseMS), ptr(js.baseMS), js.ranks
	}
}

func ptr(v float64) *float64 { return &v }

func medianOf(vals []float64) float64 {
	s := slices.Clone(vals)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// exposureText says in words what the exposure evidence of phase showed.
func (d *Detector) exposureText(ex *Exposure, phase string) string {
	switch ex.Evidence {
	case EvidenceIdle:
		return fmt.Sprintf("its GPU idled %.2f ms per step against its peers' %.2f ms", *ex.IdleMS, *ex.PeerIdleMS)
	case EvidenceVictimWait:
		s := fmt.Sprintf("its peers waited %.2f ms per step in collectives against its own %.2f ms", *ex.PeerCollWaitMS, *ex.CollWaitMS)
		if ex.Capped {
			s += ", but " + d.stepRiseText(ex, phase, "only ")
		}
		return s
	case EvidenceStepTime:
		return d.stepRiseText(ex, phase, "")
	}
	return ""
}

// stepRiseText says how far the job's step rose above its baseline, and
// when the rise is too small to count, why.
func (d *Detector) stepRiseText(ex *Exposure, phase, only string) string {
	rise, base := *ex.StepRiseMS, *ex.StepRiseBaselineMS
	ranks := fmt.Sprintf("%d ranks", ex.StepRiseRanks)
	if ex.StepRiseRanks == 1 {
		ranks = "1 rank"
	}
	of := fmt.Sprintf("its %.2f ms baseline (the last clean windows of %s)", base, ranks)
	if rise < 0 {
		return fmt.Sprintf("the job's step did not rise: %.2f ms (%.1f%%) below %s", -rise, -100*rise/base, of)
	}
	s := fmt.Sprintf("the job's step rose %s%.2f ms (%.1f%%) above %s", only, rise, 100*rise/base, of)
	if !d.counts(phase, jobStep{riseMS: rise, baseMS: base, ranks: ex.StepRiseRanks}) {
		s += fmt.Sprintf(", within the %.1f%% threshold or the %.2f ms floor: no step got longer",
			100*d.cfg.PhaseThreshold(phase), float64(d.cfg.Floor)/1e6)
	}
	return s
}
