package duty

import (
	"slices"

	"github.com/slowrank/slowrank/detector"
)

// jobSlack is the host's lead over the device, step by step, that uprobe
// traps hide in (Traps). A wait at the step's synchronisation says the
// device still had that much work queued when the host arrived. That the
// device also had work queued while the host ran, so that a trap delayed
// nothing the device waited for, the device records say: the device was
// idle for little of the step (a launch-bound job's device idles between
// launches; its host has no lead). So a step's slack is its least wait
// over the host's ranks (in synchronous training the rank that arrives
// last sets the step), counted while the median idle share of the latest
// collected steps is at most maxIdleShare, and none while it is more.
// Before any step was collected, a wait counts only when it is at least
// minLeadShare of the step: a short wait is also what the work queued last
// looks like (the step's final all-reduce, which the traps delayed), and
// the share it buys collects the steps that decide.
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
	// idle is the device's idle share of the latest collected steps (a
	// ring of stepWindow).
	idle   []float64
	idleAt int
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
	// maxIdleShare is the most device idle time, as a share of the step
	// (median of the latest collected steps), with which waits count.
	maxIdleShare = 0.10
)

// observe takes one rank's step fact; ranks is how many ranks the host has.
func (s *jobSlack) observe(st detector.Step, ranks int) {
	stepMS := st.Phases[detector.PhaseStep]
	if st.GPU {
		s.idle, s.idleAt = pushRing(s.idle, s.idleAt, st.Phases[detector.PhaseIdle]/stepMS)
	}
	ms := min(max(st.Phases[detector.PhaseSyncWait], 0), stepMS)
	if known, waits := s.deviceWaits(); waits || !known && ms < minLeadShare*stepMS {
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

// deviceWaits tells whether device records are known and whether they
// show the device waiting for the host.
func (s *jobSlack) deviceWaits() (known, waits bool) {
	if len(s.idle) == 0 {
		return false, false
	}
	return true, median(slices.Clone(s.idle)) > maxIdleShare
}

// low is the lower quartile of the recent steps' slack, in seconds.
func (s *jobSlack) low() float64 { return quantile(slices.Clone(s.ring), 0.25) / 1e3 }

// hide spends the credit on up to want seconds of traps and returns what
// it hid.
func (s *jobSlack) hide(want float64) float64 {
	hidden := min(want, s.credit)
	s.credit = min(s.credit-hidden, s.low()*stepWindow)
	if _, waits := s.deviceWaits(); waits {
		s.credit = 0
	}
	return hidden
}
