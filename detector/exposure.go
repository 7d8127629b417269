package detector

import (
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/slowrank/slowrank/internal/stats"
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
	ranks          int  // members with minBaseline windows; 0: no baseline yet
	strict         bool // every such baseline may hide a deviation
}

// jobStep measures the job's step rise over the members of a cohort window
// that have a step-time baseline.
func (j *job) jobStep(ms []member) jobStep {
	var rises, bases []float64
	strict := true
	for _, m := range ms {
		rs := j.ranks[m.rank]
		if rs == nil || math.IsNaN(m.ev[evStep]) {
			continue
		}
		if base, n, s := rs.baseline(); n >= minBaseline {
			rises = append(rises, m.ev[evStep]-base)
			bases = append(bases, base)
			strict = strict && s
		}
	}
	if len(rises) == 0 {
		return jobStep{}
	}
	return jobStep{riseMS: medianOf(rises), baseMS: medianOf(bases), ranks: len(rises), strict: strict}
}

// setHostRises fills each member's evHostRise: its host median above the
// median of its baseline windows' (NaN without minBaseline of them).
func (j *job) setHostRises(ms []member) {
	for i := range ms {
		m := &ms[i]
		if rs := j.ranks[m.rank]; rs != nil && !math.IsNaN(m.ev[evHost]) {
			m.ev[evHostRise] = m.ev[evHost] - rs.hostBaseline()
		}
	}
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
//   - slack: the rank blocked less than the floor per step while its peers
//     waited: nothing it waited for hid its host time, taken as it is;
//   - victim_wait: its peers waited longer in blocking collectives than it
//     did, bounded by the job's step rise that its host accounts for once
//     the job has a baseline: peers that would have waited anyway (another
//     cause, a shared GPU) overstate;
//   - otherwise step_time: that rise itself, once the job has a baseline;
//   - carried: idle or slack of one of the last CarryWindows windows, for
//     the same deviation, where this window has neither;
//   - otherwise none: the window is uncertain.
//
// A step rise within the threshold of its baseline counts as 0. Only the
// exposed part of the excess is held against the threshold and the floor;
// when all of it is exposed this is the seed's rule. A baseline learned in
// windows without evidence exposes a rise but hides nothing: a deviation
// that only it would hide stays uncertain.
func (d *Detector) gate(phase string, ms []member, self int, rs *rankState, ps *phaseState, win int64, e *evaluation, peers *peerEvidence) {
	excess := e.value - e.reference
	ex := &Exposure{Evidence: EvidenceNone, ExcessMS: excess}
	e.exposure = ex
	describeSteps(ex, ms[self], rs, peers.step)
	shown, uncapped := d.shownExposure(phase, ms, self, ex, peers)
	if ex.Evidence == EvidenceNone && !d.carry(phase, ex, ps.carry, win, e.reference) {
		e.outcome = outcomeUncertain
		e.reason = fmt.Sprintf("%s median %.2f ms is %.1f%% above rank %d (%.2f ms), but nothing shows whether it lengthens a step: "+
			"no GPU idle time (device records), slack or collective waits on both sides, and %d of %d windows of step-time baseline",
			phase, e.value, e.deviation*100, e.refRank, e.reference, ex.BaselineWindows, minBaseline)
		return
	}
	if ex.Evidence != EvidenceCarried {
		ex.ExposedMS = min(max(shown, 0), excess)
		ex.Exposed = d.passes(phase, ex.ExposedMS, e.reference)
	}
	if ex.Evidence == EvidenceIdle || ex.Evidence == EvidenceSlack {
		ps.carry = carried{valid: true, win: win, excessMS: excess, frac: ex.ExposedMS / excess, evidence: ex.Evidence}
	}
	if ex.Exposed {
		return
	}
	// Hidden by the job's step alone: rank-specific evidence would have
	// exposed it, or there was none. Such a window must not teach the
	// baseline, or a stall that grows slowly would hide itself.
	byStep := ex.Evidence == EvidenceStepTime || d.passes(phase, min(max(uncapped, 0), excess), e.reference)
	if byStep && peers.step.ranks > 0 && !peers.step.strict {
		ex.WeakBaseline = true
		if d.carry(phase, ex, ps.carry, win, e.reference) {
			if ex.Exposed {
				return
			}
			e.outcome, e.hidden = outcomeOK, true
			return
		}
		e.outcome, e.weakHidden = outcomeUncertain, true
		e.reason = fmt.Sprintf("%s median %.2f ms is %.1f%% above rank %d (%.2f ms), and only the job's step time could show it hidden: %s; "+
			"but that baseline was learned in windows whose deviations lacked evidence, so it shows a rise, not a deviation hidden",
			phase, e.value, e.deviation*100, e.refRank, e.reference, d.exposureText(ex, phase))
		return
	}
	e.outcome, e.hidden, e.hiddenByStep = outcomeOK, true, byStep
}

// carried is the direct exposure evidence (idle, slack) of a slow window,
// kept for the windows after it that have none.
type carried struct {
	valid    bool
	win      int64   // the window it was measured in
	excessMS float64 // the excess it judged
	frac     float64 // the exposed part of that excess
	evidence string
}

// carry lets the direct evidence of one of the last CarryWindows windows
// judge the same deviation (at least half its excess) where this window
// cannot decide: no evidence, or only a weak baseline's step time. Evidence
// that decides (direct, peers' waits, a strict baseline's step time) is
// never overruled: on a shared GPU idle time overstates, and a carried
// overstatement would outlive the window that measured it.
func (d *Detector) carry(phase string, ex *Exposure, c carried, win int64, reference float64) bool {
	if !c.valid || win <= c.win || win-c.win > int64(d.cfg.CarryWindows) || ex.ExcessMS < c.excessMS/2 {
		return false
	}
	from := c.win
	ex.Evidence, ex.CarriedFrom, ex.CarriedWindow, ex.Capped = EvidenceCarried, c.evidence, &from, false
	ex.ExposedMS = c.frac * ex.ExcessMS
	ex.Exposed = d.passes(phase, ex.ExposedMS, reference)
	return true
}

// shownExposure returns the exposure that the evidence shows and what the
// rank-specific evidence alone showed (-Inf: none), and sets ex's evidence
// and medians (EvidenceNone when nothing tells).
func (d *Detector) shownExposure(phase string, ms []member, self int, ex *Exposure, peers *peerEvidence) (shown, uncapped float64) {
	me := ms[self]
	bound, haveRise := d.attributedRise(phase, ms, self, ex, peers)
	shown, uncapped = math.Inf(-1), math.Inf(-1)
	if v := me.ev[evIdle]; !math.IsNaN(v) {
		if peer := peers.median(ms, evIdle, v); !math.IsNaN(peer) {
			ex.IdleMS, ex.PeerIdleMS = ptr(v), ptr(peer)
			shown, uncapped, ex.Evidence = v-peer, v-peer, EvidenceIdle
		}
	}
	if v := me.ev[evWait]; !math.IsNaN(v) {
		if peer := peers.median(ms, evWait, v); !math.IsNaN(peer) && v < float64(d.cfg.Floor)/1e6 && peer > v {
			ex.WaitMS, ex.PeerWaitMS = ptr(v), ptr(peer)
			if w := peer - v; ex.Evidence == EvidenceNone || w > shown {
				shown, ex.Evidence = w, EvidenceSlack
			}
			uncapped = max(uncapped, peer-v)
		}
	}
	if v := me.ev[evCollWait]; !math.IsNaN(v) {
		if peer := peers.median(ms, evCollWait, v); !math.IsNaN(peer) {
			ex.CollWaitMS, ex.PeerCollWaitMS = ptr(v), ptr(peer)
			w := peer - v
			uncapped = max(uncapped, w)
			capped := haveRise && bound < w && w > 0
			if capped {
				w = bound
			}
			// On a tie the capped wait names the evidence: the cap decided.
			if ex.Evidence == EvidenceNone || w > shown || (capped && w == shown) {
				shown, ex.Evidence, ex.Capped = w, EvidenceVictimWait, capped
			}
		}
	}
	if ex.Evidence == EvidenceNone && haveRise {
		shown, ex.Evidence = bound, EvidenceStepTime
	}
	return shown, uncapped
}

// attributedRise returns the part of the job's step rise that the rank's
// host can account for, and whether the job has a baseline: the rise (0
// when it does not count), at most as much as the rank's host rose above
// its own baseline beyond its peers' median rise above theirs. A job-wide
// rise that its host did not grow with (another rank's stall, everyone's
// GPU work) or grew with no more than its peers' (a host-wide slowdown)
// exposes nothing of a deviation it already had.
func (d *Detector) attributedRise(phase string, ms []member, self int, ex *Exposure, peers *peerEvidence) (float64, bool) {
	if peers.step.ranks == 0 {
		return 0, false
	}
	rise := 0.0
	if d.counts(phase, peers.step) {
		rise = peers.step.riseMS
	}
	own := ms[self].ev[evHostRise]
	if math.IsNaN(own) {
		return rise, true
	}
	if peer := peers.median(ms, evHostRise, own); !math.IsNaN(peer) {
		own -= peer
	}
	ex.HostRiseMS = ptr(own)
	return min(rise, max(own, 0)), true
}

// describeSteps records the step times looked at: the rank's own against
// its clean windows, and the job's rise.
func describeSteps(ex *Exposure, me member, rs *rankState, js jobStep) {
	base, n := 0.0, 0
	if rs != nil {
		base, n, _ = rs.baseline()
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

func medianOf(vals []float64) float64 { return stats.Median(slices.Clone(vals)) }

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
	case EvidenceSlack:
		return fmt.Sprintf("it blocked %.2f ms per step against its peers' %.2f ms: its GPU and its peers were done before its host",
			*ex.WaitMS, *ex.PeerWaitMS)
	case EvidenceStepTime:
		return d.stepRiseText(ex, phase, "") + hostRiseText(ex)
	case EvidenceCarried:
		return fmt.Sprintf("the same deviation's %s evidence of window %d (%.0f%% of the excess exposed) stands: this window has none",
			ex.CarriedFrom, *ex.CarriedWindow, 100*ex.ExposedMS/ex.ExcessMS)
	}
	return ""
}

// hostRiseText says how much of the job's rise the rank's host accounts for.
func hostRiseText(ex *Exposure) string {
	if ex.HostRiseMS == nil {
		return ""
	}
	return fmt.Sprintf(", and its host rose %.2f ms more than its peers' above their own baselines", *ex.HostRiseMS)
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
