package detector

import (
	"slices"
)

// stateRank orders states for the summary's worst rank: a confirmed straggler
// always outranks a candidate, which outranks an uncertain rank, whatever the
// deviations. This closes the seed's gap where an uncertain verdict with a
// large deviation could mask a confirmed straggler.
func stateRank(s string, alert bool) int {
	switch {
	case alert:
		return 3
	case s == StateCandidate:
		return 2
	case s == StateUncertain:
		return 1
	default:
		return 0
	}
}

// Summaries returns one summary per job, in first-seen order. Call it after
// Flush for end-of-stream summaries; it may be called at any time.
func (d *Detector) Summaries() []Summary {
	out := make([]Summary, 0, len(d.order))
	for _, name := range d.order {
		out = append(out, d.summary(d.jobs[name]))
	}
	return out
}

func (d *Detector) summary(j *job) Summary {
	s := Summary{
		Kind:          KindSummary,
		Job:           j.name,
		Stragglers:    []int{},
		Windows:       j.stats.windows,
		Facts:         j.stats.facts,
		Verdicts:      j.stats.verdicts,
		Alerts:        j.stats.alerts,
		Late:          j.stats.late,
		Duplicates:    j.stats.duplicates,
		Evicted:       j.stats.evicted,
		RejectedRanks: j.stats.rejectedRanks,

		HiddenDeviations: j.stats.hidden,
	}
	ranks := make([]int, 0, len(j.ranks))
	for r := range j.ranks {
		ranks = append(ranks, r)
	}
	slices.Sort(ranks)
	bestClass, bestDev := 0, 0.0
	for _, r := range ranks {
		rs := j.ranks[r]
		straggler := false
		for p := range rs.phases {
			ps := &rs.phases[p]
			straggler = straggler || ps.alert
			class := stateRank(ps.lastState, ps.alert)
			if class == 0 {
				continue
			}
			if class > bestClass || (class == bestClass && ps.lastDev > bestDev) {
				rank, dev := r, ps.lastDev
				s.WorstRank, s.WorstPhase, s.WorstDeviation = &rank, d.cfg.Phases[p], &dev
				s.WorstState = ps.lastState
				if ps.alert {
					s.WorstState = StateStraggler
				}
				bestClass, bestDev = class, ps.lastDev
			}
		}
		if straggler {
			s.Stragglers = append(s.Stragglers, r)
		}
	}
	return s
}
