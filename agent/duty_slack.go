package agent

import (
	"slices"

	"github.com/slowrank/slowrank/detector"
)

// jobSlack is the host's lead over the device, step by step, that uprobe
// traps hide in (Traps). A wait at the step's synchronisation says the
// device still had that much work queued when the host arrived; it says
// the device had work queued while the host ran (so that a trap delayed no
// work the device waited for) only when the wait is a large part of the
// step: a short wait is also what work queued last, after the traps (the
// step's final all-reduce), looks like. So a step's slack is its least
// wait over the host's ranks (in synchronous training the rank that
// arrives last sets the step), counted only when it is at least
// minLeadShare of the step, and nothing at all while the device records
// of the latest collected step show the device idle for more than
// maxIdleShare of it (it waited for the host: a launch-bound job).
//
// Each step that every rank reported credits the lower quartile of the
// latest stepWindow steps' slack (a quartile, not the step's own, so that
// a few long waits, a checkpoint or a logging step, hide nothing of the
// steps around them); traps spend the credit, and what a report leaves
// carries over up to stepWindow steps' worth, so that a long stretch
// without traps banks nothing for a burst.
type jobSlack struct {
	pending []stepWait // steps not yet reported by every rank, oldest first
	ring    []float64  // the latest complete steps' slack, ms
	at      int
	credit  float64 // seconds traps may still hide in, per process
	// deviceWaits: the latest step with device records had the device
	// idle for more than maxIdleShare of it.
	deviceWaits bool
}

type stepWait struct {
	step int64
	ms   float64 // least counted wait of the ranks that reported it
	n    int     // ranks that reported it
}

const (
	// maxPendingSteps bounds the steps waiting for their other ranks.
	maxPendingSteps = 64
	// minLeadShare is the least wait, as a share of the step, that counts.
	minLeadShare = 0.25
	// maxIdleShare is the most device idle time, as a share of the step,
	// with which waits count.
	maxIdleShare = 0.10
)

// observe takes one rank's step fact; ranks is how many ranks the host has.
func (s *jobSlack) observe(st detector.Step, ranks int) {
	stepMS := st.Phases[detector.PhaseStep]
	if st.GPU {
		s.deviceWaits = st.Phases[detector.PhaseIdle] > maxIdleShare*stepMS
	}
	ms := min(max(st.Phases[detector.PhaseSyncWait], 0), stepMS)
	if ms < minLeadShare*stepMS || s.deviceWaits {
		ms = 0
	}
	i := slices.IndexFunc(s.pending, func(w stepWait) bool { return w.step == st.Step })
	if i < 0 {
		if len(s.pending) == maxPendingSteps {
			s.pending = slices.Delete(s.pending, 0, 1)
		}
		s.pending = append(s.pending, stepWait{step: st.Step, ms: ms})
		i = len(s.pending) - 1
	}
	w := &s.pending[i]
	w.ms, w.n = min(w.ms, ms), w.n+1
	if w.n < ranks {
		return
	}
	s.ring, s.at = pushRing(s.ring, s.at, w.ms)
	s.pending = slices.Delete(s.pending, i, i+1)
	s.credit += s.low()
}

// low is the lower quartile of the recent steps' slack, in seconds.
func (s *jobSlack) low() float64 { return quantile(slices.Clone(s.ring), 0.25) / 1e3 }

// hide spends the credit on up to want seconds of traps and returns what
// it hid.
func (s *jobSlack) hide(want float64) float64 {
	hidden := min(want, s.credit)
	s.credit = min(s.credit-hidden, s.low()*stepWindow)
	if s.deviceWaits {
		s.credit = 0
	}
	return hidden
}
