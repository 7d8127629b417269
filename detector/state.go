package detector

import (
	"math"

	"github.com/slowrank/slowrank/internal/stats"
)

// dedupeRing is the number of recent (epoch, step) keys remembered per rank to
// recognise duplicates. Facts of one rank arrive roughly in step order, so a
// short ring suffices and keeps state per rank small and bounded.
const dedupeRing = 16

// baselineRing is the number of recent clean windows whose median step time
// form a rank's step-time baseline; minBaseline is how many it needs before
// the baseline is evidence.
const (
	baselineRing = 8
	minBaseline  = 3
)

// rankState is the bounded, long-lived state of one rank of one job.
type rankState struct {
	lastSeen int64 // last window with a fact (or the window the rank became known)
	heard    bool  // it has sent a fact
	recent   [dedupeRing]stepKey
	nRecent  uint8
	head     uint8
	phases   []phaseState
	// The rank's median step and host times of its last baselineRing
	// windows that taught (cleanWindow); strict marks those in which every
	// deviation had evidence (a baseline may hide a deviation only when
	// minBaseline of its windows are strict). host is NaN where the rank
	// did not report it.
	base     [baselineRing]float64
	host     [baselineRing]float64
	strict   [baselineRing]bool
	nBase    uint8
	baseHead uint8
}

// addBaseline records the median step and host times of a window that
// teaches; strict when every deviation in it had evidence.
func (r *rankState) addBaseline(stepMS, hostMS float64, strict bool) {
	r.base[r.baseHead], r.host[r.baseHead], r.strict[r.baseHead] = stepMS, hostMS, strict
	r.baseHead = (r.baseHead + 1) % baselineRing
	if r.nBase < baselineRing {
		r.nBase++
	}
}

// slowWhenLastJudged reports whether any phase of the rank was slow in its
// latest judged window (a streak under way) or holds an active alert.
func (r *rankState) slowWhenLastJudged() bool {
	for i := range r.phases {
		if ps := &r.phases[i]; ps.alert || ps.streak > 0 {
			return true
		}
	}
	return false
}

// baseline returns the median step time of the recorded windows, their
// number, and whether minBaseline of them are strict.
func (r *rankState) baseline() (ms float64, n int, strict bool) {
	n = int(r.nBase)
	if n == 0 {
		return 0, 0, false
	}
	var s [baselineRing]float64
	copy(s[:], r.base[:n])
	strictN := 0
	for _, ok := range r.strict[:n] {
		if ok {
			strictN++
		}
	}
	all := stats.Median(s[:n])
	if n <= minBaseline {
		return all, n, strictN >= minBaseline
	}
	var last [minBaseline]float64
	for i := range last {
		last[i] = r.base[(int(r.baseHead)+baselineRing-1-i)%baselineRing]
	}
	return min(all, stats.Median(last[:])), n, strictN >= minBaseline
}

// hostBaseline returns the median host time of the recorded windows that
// have one, or NaN with fewer than minBaseline.
func (r *rankState) hostBaseline() float64 {
	var s [baselineRing]float64
	k := 0
	for _, v := range r.host[:r.nBase] {
		if !math.IsNaN(v) {
			s[k] = v
			k++
		}
	}
	if k < minBaseline {
		return math.NaN()
	}
	return stats.Median(s[:k])
}

type stepKey struct {
	epoch int64
	step  int64
}

// seen records (epoch, step) and reports whether it was already there.
func (r *rankState) seen(epoch int, step int64) bool {
	k := stepKey{int64(epoch), step}
	for i := 0; i < int(r.nRecent); i++ {
		if r.recent[i] == k {
			return true
		}
	}
	r.recent[r.head] = k
	r.head = (r.head + 1) % dedupeRing
	if r.nRecent < dedupeRing {
		r.nRecent++
	}
	return false
}

// phaseState is the state machine of one (rank, phase). The candidate streak
// and the active alert are kept apart: uncertainty breaks a streak but never
// ends an alert; only valid evidence within threshold recovers.
type phaseState struct {
	streak     int32 // consecutive slow windows
	alert      bool  // an active straggler alert
	evaluated  bool  // lastWin is meaningful
	lastWin    int64 // last window in which the phase was evaluated
	since      int64 // first window of the current streak
	alertSince int64 // first window of the streak that raised the active alert
	// carry: the last direct evidence (idle, slack) of a slow window,
	// which stands for a deviation that persists into windows without it.
	carry carried
	// Kept for the summary.
	lastState  string
	lastDev    float64
	lastWindow int64
}

// outcome is the evidence of one window for one (rank, phase).
type outcome uint8

const (
	outcomeOK outcome = iota
	outcomeSlow
	outcomeUncertain
)

// step advances the state machine by one window of evidence and returns the
// state to report and the number of consecutive slow windows.
//
// A gap of more than bridge windows in which nobody in the cohort measured
// the phase breaks a candidate's streak; a shorter one neither breaks nor
// lengthens it (device phases are measured only in duty-cycle on-phases,
// and the windows between them say nothing). A gap is no recovery.
func (p *phaseState) step(win int64, o outcome, consecutive, bridge int) string {
	if p.evaluated && win-p.lastWin-1 > int64(bridge) {
		p.streak = 0
	}
	p.evaluated, p.lastWin = true, win
	switch o {
	case outcomeSlow:
		if p.streak == 0 {
			p.since = win
		}
		p.streak++
		if p.alert || int(p.streak) >= consecutive {
			p.alert = true
			return StateStraggler
		}
		return StateCandidate
	case outcomeUncertain:
		p.streak = 0
		return StateUncertain
	default:
		p.streak = 0
		if p.alert {
			p.alert = false
			return StateRecovered
		}
		return StateOK
	}
}

func (d *Detector) rank(j *job, r int, win int64) *rankState {
	if rs, ok := j.ranks[r]; ok {
		return rs
	}
	if len(j.ranks) >= d.cfg.MaxRanks || d.totalRanks >= d.cfg.MaxTotalRanks {
		j.stats.rejectedRanks++
		return nil
	}
	rs := &rankState{lastSeen: win, phases: make([]phaseState, len(d.cfg.Phases))}
	j.ranks[r] = rs
	d.totalRanks++
	return rs
}

// evict forgets ranks silent for EvictAfter windows before win.
func (d *Detector) evict(j *job, win int64) {
	for r, rs := range j.ranks {
		if win-rs.lastSeen > int64(d.cfg.EvictAfter) {
			delete(j.ranks, r)
			d.totalRanks--
			j.stats.evicted++
		}
	}
}
