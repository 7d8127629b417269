package pipeline

import (
	"errors"
	"math"
	"slices"

	"github.com/slowrank/slowrank/detector"
)

// ErrSwapInProgress: the previous detector change has not settled its last
// window yet (at most one window plus the lateness allowance).
var ErrSwapInProgress = errors.New("a detector change is still settling its last window; retry shortly")

// detectorSwap is the pipeline's state for detector changes at run time
// (owner goroutine only).
//
// The detector's configuration is fixed at detector.New, so a change makes a
// new detector. It takes over at the next window boundary of each job: steps
// ending before the boundary still go to the old detector, which settles its
// last window as usual (window end plus lateness) and is then retired; steps
// ending at or after it go to the new one. The new detector's origin is
// chosen so that window indices continue where the old ones stop, so sinks
// see one increasing sequence of windows per job. Evidence starts afresh:
// candidate streaks and active alerts are re-established under the new
// settings (an alert needs `consecutive` slow windows again).
type detectorSwap struct {
	old *detector.Detector // draining; nil when no change is settling
	// bound is, per job, the first event time handled by the current
	// detector (kept after the old one retired, to drop stragglers).
	bound    map[string]int64
	retireAt int64
	// topos keeps the last topology versions per job, for a new detector.
	topos map[string][]detector.Topology
	// settled are windows of a retired detector not yet taken.
	settled []detector.SettledWindow
	// retired are the summaries of retired detectors, per job.
	retired       map[string]detector.Summary
	retiredOrder  []string
	swaps         int64
	lateAfterSwap int64
}

// keptTopologyVersions bounds the topology versions kept per job for a
// detector change.
const keptTopologyVersions = 8

// addTopology hands a topology to the detector(s) and remembers it.
func (p *Pipeline) addTopology(t detector.Topology) error {
	if err := p.det.AddTopology(t); err != nil {
		return err
	}
	if p.swap.old != nil {
		// The checks are on t alone, and the current detector just passed it.
		_ = p.swap.old.AddTopology(t)
	}
	if p.swap.topos == nil {
		p.swap.topos = map[string][]detector.Topology{}
	}
	ts := p.swap.topos[t.Job]
	ts = slices.DeleteFunc(ts, func(o detector.Topology) bool { return o.Version == t.Version })
	ts = append(ts, t)
	if len(ts) > keptTopologyVersions {
		ts = ts[len(ts)-keptTopologyVersions:]
	}
	p.swap.topos[t.Job] = ts
	return nil
}

// route returns the detector that owns a step of job ending at endNS, or
// nil when the step is too late for any (it ended before a change's
// boundary and the old detector has retired).
func (p *Pipeline) route(job string, endNS int64) *detector.Detector {
	b, ok := p.swap.bound[job]
	if !ok || endNS >= b {
		return p.det
	}
	return p.swap.old
}

// addStep hands a step to the detector that owns it.
func (p *Pipeline) addStep(s detector.Step) ([]detector.Verdict, error) {
	d := p.route(s.Job, s.EndNS)
	if d == nil {
		p.swap.lateAfterSwap++
		return nil, nil
	}
	return d.AddStep(s)
}

// windowOf is detector.WindowOf of the detector that owns the step.
func (p *Pipeline) windowOf(job string, endNS int64) (int64, bool) {
	d := p.route(job, endNS)
	if d == nil {
		d = p.det
	}
	return d.WindowOf(job, endNS)
}

// advance moves event time of both detectors and retires the old one once
// its last window is settled.
func (p *Pipeline) advance(now int64) []detector.Verdict {
	var out []detector.Verdict
	if p.swap.old != nil {
		out = append(out, p.swap.old.Advance(now)...)
		if now >= p.swap.retireAt {
			out = append(out, p.retireOld()...)
		}
	}
	return append(out, p.det.Advance(now)...)
}

// flushDetectors settles everything (on stop).
func (p *Pipeline) flushDetectors() []detector.Verdict {
	var out []detector.Verdict
	if p.swap.old != nil {
		out = append(out, p.retireOld()...)
	}
	return append(out, p.det.Flush()...)
}

// takeSettled returns the settled windows, the old detector's first.
func (p *Pipeline) takeSettled() []detector.SettledWindow {
	s := p.swap.settled
	p.swap.settled = nil
	if p.swap.old != nil {
		s = append(s, p.swap.old.TakeSettled()...)
	}
	return append(s, p.det.TakeSettled()...)
}

// Summaries merges the current detector's summaries with those of retired
// ones: counters add up, the state (stragglers, worst rank) is the current
// detector's, or the retired one's for a job the current one never saw.
// Owner goroutine only, or after the owner stopped (end-of-run summaries).
func (p *Pipeline) Summaries() []detector.Summary {
	cur := p.det.Summaries()
	if len(p.swap.retired) == 0 {
		return cur
	}
	seen := map[string]bool{}
	var out []detector.Summary
	for _, s := range cur {
		seen[s.Job] = true
		if r, ok := p.swap.retired[s.Job]; ok {
			if s.Facts == 0 && s.Windows == 0 {
				s.Stragglers, s.WorstRank, s.WorstPhase, s.WorstState, s.WorstDeviation = r.Stragglers, r.WorstRank, r.WorstPhase, r.WorstState, r.WorstDeviation
			}
			addSummary(&s, r)
		}
		out = append(out, s)
	}
	for _, job := range p.swap.retiredOrder {
		if !seen[job] {
			out = append(out, p.swap.retired[job])
		}
	}
	return out
}

func addSummary(s *detector.Summary, r detector.Summary) {
	s.Windows += r.Windows
	s.Facts += r.Facts
	s.Verdicts += r.Verdicts
	s.Alerts += r.Alerts
	s.Late += r.Late
	s.Duplicates += r.Duplicates
	s.Evicted += r.Evicted
	s.RejectedRanks += r.RejectedRanks
}

// retireOld settles whatever the old detector still holds, keeps its
// settled windows and counters, and drops it.
func (p *Pipeline) retireOld() []detector.Verdict {
	old := p.swap.old
	vs := old.Flush()
	p.swap.settled = append(p.swap.settled, old.TakeSettled()...)
	if p.swap.retired == nil {
		p.swap.retired = map[string]detector.Summary{}
	}
	for _, s := range old.Summaries() {
		if r, ok := p.swap.retired[s.Job]; ok {
			addSummary(&s, r)
		} else {
			p.swap.retiredOrder = append(p.swap.retiredOrder, s.Job)
		}
		p.swap.retired[s.Job] = s
	}
	p.swap.old = nil
	// Alerts are re-established by the new detector; forget the old ones
	// so that their transitions are logged again.
	clear(p.alerts)
	p.log.Info("detector change in effect: the previous detector settled its last window", "window", p.det.Config().Window)
	return vs
}

// SwapDetector starts a detector with cfg that takes over each job at its
// next window boundary after now. It fails with ErrSwapInProgress while a
// previous change is settling, with detector.New's error for a cfg that it
// refuses. Owner goroutine only.
func (p *Pipeline) SwapDetector(cfg detector.Config, now int64) error {
	if p.swap.old != nil {
		return ErrSwapInProgress
	}
	nd, err := detector.New(cfg)
	if err != nil {
		return err
	}
	old := p.det
	bound := map[string]int64{}
	retireAt := int64(math.MinInt64)
	for _, s := range old.Summaries() {
		k, ok := old.WindowOf(s.Job, now)
		if !ok {
			continue // no origin yet: the new detector picks its own
		}
		b := nextWindowStart(old, s.Job, now, k)
		bound[s.Job] = b
		// Indices continue: the window starting at b keeps index k+1.
		nd.SetOrigin(s.Job, b-(k+1)*int64(cfg.Window))
		retireAt = max(retireAt, b+int64(old.Config().Lateness))
	}
	for _, ts := range p.swap.topos {
		for _, t := range ts {
			_ = nd.AddTopology(t) // kept only once a detector accepted it: the checks are on t alone
		}
	}
	p.det = nd
	p.swap.bound = bound
	p.swap.swaps++
	if len(bound) == 0 {
		// Nothing to drain: the old detector had no job with an origin.
		p.swap.settled = append(p.swap.settled, old.TakeSettled()...)
		return nil
	}
	p.swap.old, p.swap.retireAt = old, retireAt
	return nil
}

// nextWindowStart returns the start of window k+1 of job in d, where k is
// the window of now: the smallest t > now whose window is k+1. The
// detector keeps its origin to itself, so this searches WindowOf (monotone
// in t) over (now, now+window]: at most 64 steps.
func nextWindowStart(d *detector.Detector, job string, now, k int64) int64 {
	lo, hi := now, now+int64(d.Config().Window) // WindowOf(lo) == k, WindowOf(hi) == k+1
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if w, _ := d.WindowOf(job, mid); w > k {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// DetectorConfig returns the current detector's settings (the new one's
// while a change settles). Owner goroutine only.
func (p *Pipeline) DetectorConfig() detector.Config { return p.det.Config() }

// SwapStatus is the state of detector changes at run time.
type SwapStatus struct {
	Swaps    int64 // changes made
	Settling bool  // the previous detector still settles its last window
	// LateAfterSwap counts steps that ended before a change's boundary but
	// arrived after the old detector had settled (dropped).
	LateAfterSwap int64
}

// SwapStatus returns the state of detector changes. Owner goroutine only.
func (p *Pipeline) SwapStatus() SwapStatus {
	return SwapStatus{Swaps: p.swap.swaps, Settling: p.swap.old != nil, LateAfterSwap: p.swap.lateAfterSwap}
}
