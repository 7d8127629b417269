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

// gate decides whether the excess of a slow window of a gated phase is
// exposed, i.e. lengthens a step, and rewrites the outcome when it is not
// (DESIGN.md section 4). The evidence, strongest first:
//   - rank-specific, in the same window: the rank's GPU idled longer than its
//     peers' (idle), or its peers waited longer in blocking collectives than
//     it did (victim_wait). The larger of the two when both exist.
//   - otherwise, the rank's step time against the median of its own recent
//     clean windows (step_time), once it has minBaseline of them.
//   - otherwise none: the window is uncertain.
//
// Only the exposed part of the excess is held against the threshold and the
// floor; when all of it is exposed this is the seed's rule.
func (d *Detector) gate(phase string, ms []member, self int, rs *rankState, e *evaluation, peers *peerEvidence) {
	me := ms[self]
	excess := e.value - e.reference
	ex := &Exposure{Evidence: EvidenceNone, ExcessMS: excess}
	e.exposure = ex
	shown, have := math.Inf(-1), false
	if v := me.ev[evIdle]; !math.IsNaN(v) {
		if peer := peers.median(ms, evIdle, v); !math.IsNaN(peer) {
			ex.IdleMS, ex.PeerIdleMS = ptr(v), ptr(peer)
			shown, have, ex.Evidence = v-peer, true, EvidenceIdle
		}
	}
	if v := me.ev[evCollWait]; !math.IsNaN(v) {
		if peer := peers.median(ms, evCollWait, v); !math.IsNaN(peer) {
			ex.CollWaitMS, ex.PeerCollWaitMS = ptr(v), ptr(peer)
			if w := peer - v; !have || w > shown {
				shown, ex.Evidence = w, EvidenceVictimWait
			}
			have = true
		}
	}
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
		if !have && n >= minBaseline {
			shown, have, ex.Evidence = step-base, true, EvidenceStepTime
		}
	}
	if !have {
		e.outcome = outcomeUncertain
		e.reason = fmt.Sprintf("%s median %.2f ms is %.1f%% above rank %d (%.2f ms), but nothing shows whether it lengthens a step: "+
			"no GPU idle time (device records) or collective waits on both sides, and %d of %d windows of step-time baseline",
			phase, e.value, e.deviation*100, e.refRank, e.reference, n, minBaseline)
		return
	}
	ex.ExposedMS = min(max(shown, 0), excess)
	floorMS := float64(d.cfg.Floor) / 1e6
	ex.Exposed = ex.ExposedMS/e.reference >= d.cfg.PhaseThreshold(phase) && ex.ExposedMS >= floorMS
	if !ex.Exposed {
		e.outcome, e.hidden = outcomeOK, true
	}
}

func ptr(v float64) *float64 { return &v }

// exposureText says in words what the exposure evidence showed.
func exposureText(ex *Exposure) string {
	switch ex.Evidence {
	case EvidenceIdle:
		return fmt.Sprintf("its GPU idled %.2f ms per step against its peers' %.2f ms", *ex.IdleMS, *ex.PeerIdleMS)
	case EvidenceVictimWait:
		return fmt.Sprintf("its peers waited %.2f ms per step in collectives against its own %.2f ms", *ex.PeerCollWaitMS, *ex.CollWaitMS)
	case EvidenceStepTime:
		return fmt.Sprintf("its step took %.2f ms against %.2f ms in its last %d clean windows", *ex.StepMS, *ex.BaselineStepMS, ex.BaselineWindows)
	}
	return ""
}
