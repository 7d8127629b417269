package detector

import "fmt"

// transition runs the state machine of (m, phase p) on evaluation e and
// builds the verdict; ok is false for a plain ok that need not be emitted.
// mine holds all phase evaluations of the member, for hints.
func (d *Detector) transition(j *job, win *window, rs *rankState, ms []member, self, p int, e evaluation, mine []evaluation, cache map[signature]*comparableSet) (Verdict, bool) {
	m := ms[self]
	ps := &rs.phases[p]
	wasAlert := ps.alert
	state := ps.step(win.index, e.outcome, d.cfg.Consecutive, d.cfg.CarryWindows)
	if ps.alert && !wasAlert {
		j.stats.alerts++
		ps.alertSince = ps.since
	}
	ps.lastState, ps.lastDev, ps.lastWindow = state, e.deviation, win.index
	if e.hidden {
		j.stats.hidden++
	}
	if state == StateOK && !d.cfg.EmitOK {
		return Verdict{}, false
	}
	start, end := d.windowBounds(j, win.index)
	phase := d.cfg.Phases[p]
	v := Verdict{
		Kind:                     KindVerdict,
		Job:                      j.name,
		Window:                   win.index,
		WindowStartNS:            start,
		WindowEndNS:              end,
		Rank:                     m.rank,
		State:                    state,
		Phase:                    phase,
		ValueMS:                  e.value,
		ReferenceMS:              e.reference,
		ReferenceRank:            e.refRank,
		Deviation:                e.deviation,
		ComparableRanks:          []int{},
		Consecutive:              int(ps.streak),
		Coverage:                 e.coverage,
		WorkloadEvidenceDegraded: e.degraded,
		AlertActive:              ps.alert,
		Exposure:                 e.exposure,
	}
	if e.refRank >= 0 || e.outcome != outcomeUncertain {
		v.ComparableRanks, v.ComparableCount = d.comparableRanks(ms, self, p, cache)
	}
	switch state {
	case StateCandidate:
		since := ps.since
		v.SinceWindow = &since
	case StateStraggler:
		since := ps.alertSince
		v.SinceWindow = &since
	}
	if state != StateRecovered && state != StateOK && (e.outcome == outcomeSlow || ps.alert) {
		v.Hint = d.hint(phase, mine)
	}
	if m.rw != nil && m.rw.arrivals > 0 {
		share := float64(m.rw.lastArrive) / float64(m.rw.arrivals)
		v.LastArrivalShare = &share
	}
	d.deviceEvidence(&v, ms, self)
	v.Reason = d.reason(v, e)
	return v, true
}

// hint names the likely kind of stall. Hints never claim a root cause.
func (d *Detector) hint(phase string, mine []evaluation) string {
	switch phase {
	case PhaseCompute:
		return HintGPUStreamStall
	case PhaseHost:
		if c, ok := d.phaseIdx[PhaseCompute]; ok && mine[c].done && mine[c].outcome == outcomeOK {
			return HintHostOnlyStall
		}
	}
	return ""
}

func (d *Detector) reason(v Verdict, e evaluation) string {
	if e.outcome == outcomeUncertain {
		if v.AlertActive {
			return e.reason + "; alert kept: uncertain evidence is not recovery"
		}
		return e.reason
	}
	var s string
	switch {
	case e.hidden:
		s = fmt.Sprintf("%s median %.2f ms is %.1f%% above rank %d (%.2f ms) but hidden: %s, so at most %.2f of its %.2f ms excess lengthens a step",
			v.Phase, v.ValueMS, v.Deviation*100, v.ReferenceRank, v.ReferenceMS, d.exposureText(e.exposure, v.Phase), e.exposure.ExposedMS, e.exposure.ExcessMS)
	case v.State == StateRecovered:
		s = fmt.Sprintf("%s median %.2f ms is back within %.1f%% of rank %d (%.2f ms)", v.Phase, v.ValueMS, d.cfg.PhaseThreshold(v.Phase)*100, v.ReferenceRank, v.ReferenceMS)
	default:
		s = fmt.Sprintf("%s median %.2f ms is %.1f%% above rank %d (%.2f ms), the fastest of %d comparable ranks",
			v.Phase, v.ValueMS, v.Deviation*100, v.ReferenceRank, v.ReferenceMS, v.ComparableCount)
		if ex := e.exposure; ex != nil {
			if ex.ExposedMS < ex.ExcessMS {
				s += fmt.Sprintf("; %.2f of its %.2f ms excess exposed: %s", ex.ExposedMS, ex.ExcessMS, d.exposureText(ex, v.Phase))
			} else {
				s += "; exposed: " + d.exposureText(ex, v.Phase)
			}
		}
		if v.State == StateCandidate {
			s += fmt.Sprintf("; slow window %d of %d needed", v.Consecutive, d.cfg.Consecutive)
		}
	}
	if v.WorkloadEvidenceDegraded {
		s += "; workload evidence missing: compared with the cohort by time only"
	}
	if v.LastArrivalShare != nil && v.State != StateRecovered {
		s += fmt.Sprintf("; arrived last at collectives in %.0f%% of its steps", *v.LastArrivalShare*100)
	}
	if v.State != StateRecovered {
		s += deviceText(v)
	}
	return s
}
