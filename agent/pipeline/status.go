package pipeline

import (
	"sort"

	"github.com/slowrank/slowrank/correlate"
	"github.com/slowrank/slowrank/detector"
)

// status is what Snapshot shows: written by the owner goroutine, read by
// any, under Pipeline.mu.
type status struct {
	steps    map[rankKey]detector.Step
	verdicts map[rankKey]detector.Verdict // latest non-ok verdict per rank
	recent   []detector.Verdict           // last verdicts, newest last
	windows  int64
	facts    int64
	verdictN int64
}

type rankKey struct {
	job  string
	rank int
}

// recentVerdicts is how many of the last verdicts Snapshot keeps.
const recentVerdicts = 64

func newStatus() status {
	return status{steps: map[rankKey]detector.Step{}, verdicts: map[rankKey]detector.Verdict{}}
}

func (p *Pipeline) noteStep(st detector.Step) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.status.steps[rankKey{st.Job, st.Rank}] = st
	p.status.facts++
}

// noteSettled records the verdicts of the windows settled. A rank's row
// keeps its latest non-ok verdict only while it is current: a later window
// of its job that settled without one for it was ok (or had no steps of
// it), so the row reads ok again, unless an alert is active, which only
// "recovered" ends. (The demo's healthy ranks read "uncertain" to the end
// from their job's first window.)
func (p *Pipeline) noteSettled(windows []detector.SettledWindow, verdicts []detector.Verdict) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.status.windows += int64(len(windows))
	p.status.verdictN += int64(len(verdicts))
	for _, w := range windows {
		for k, v := range p.status.verdicts {
			if k.job == w.Job && v.Window < w.Index && !v.AlertActive {
				delete(p.status.verdicts, k)
			}
		}
	}
	for _, v := range verdicts {
		p.status.verdicts[rankKey{v.Job, v.Rank}] = v
	}
	p.status.recent = append(p.status.recent, verdicts...)
	if n := len(p.status.recent); n > recentVerdicts {
		p.status.recent = append([]detector.Verdict(nil), p.status.recent[n-recentVerdicts:]...)
	}
}

// RankView is one row of the live view: a rank's latest step and verdict.
type RankView struct {
	Job     string
	Rank    int
	Host    string
	Step    detector.Step
	Verdict *detector.Verdict // latest non-ok verdict, if any
}

// Snapshot is the live view of the pipeline's results.
type Snapshot struct {
	Ranks    []RankView         // ordered by (job, rank)
	Recent   []detector.Verdict // the last verdicts, newest last
	Windows  int64              // windows settled
	Facts    int64              // steps handed to the sinks
	Verdicts int64              // verdicts handed to the sinks
}

// Snapshot returns the live view. Safe from any goroutine.
func (p *Pipeline) Snapshot() Snapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	rows := make([]RankView, 0, len(p.status.steps))
	for k, st := range p.status.steps {
		row := RankView{Job: k.job, Rank: k.rank, Host: st.Host, Step: st}
		if v, ok := p.status.verdicts[k]; ok {
			row.Verdict = &v
		}
		rows = append(rows, row)
	}
	sort.Slice(rows, func(a, b int) bool {
		if rows[a].Job != rows[b].Job {
			return rows[a].Job < rows[b].Job
		}
		return rows[a].Rank < rows[b].Rank
	})
	return Snapshot{
		Ranks: rows, Recent: append([]detector.Verdict(nil), p.status.recent...),
		Windows: p.status.windows, Facts: p.status.facts, Verdicts: p.status.verdictN,
	}
}

// Counters returns the correlator's and the detector's own loss counters
// under the agent's metric names: the correlator's summed over ranks,
// including processes that have exited; the current detector's summed over
// jobs. Owner goroutine only.
func (p *Pipeline) Counters() map[string]int64 {
	t := p.retired
	for _, st := range p.corr.Stats() {
		t.Add(st)
	}
	c := map[string]int64{
		"correlate_late":           int64(t.Late),
		"correlate_duplicate":      int64(t.Duplicate),
		"correlate_evicted":        int64(t.Evicted),
		"correlate_dropped_host":   int64(t.DroppedHost),
		"correlate_dropped_device": int64(t.DroppedDevice),
		"correlate_invalid_steps":  int64(t.InvalidSteps),
		"correlate_degraded_steps": int64(t.DegradedSteps),
		"correlate_norank_steps":   int64(t.NoRankSteps),
		"correlate_unassigned":     int64(t.Unassigned),
		// Step detection quality: calls outside a locked cycle, tentative
		// steps withdrawn, locks regained; and records placed after
		// reordering or steps emitted before every local peer reported.
		"correlate_irregular_calls": int64(t.IrregularCalls),
		"correlate_retracted_steps": int64(t.Retracted),
		"correlate_relocks":         int64(t.Relocks),
		// Collectives before each communicator's first confirmed cycle
		// (parameter broadcasts, barrier storms, warm-up): cut into no
		// steps.
		"correlate_init_calls":       int64(t.InitCalls),
		"correlate_reordered":        int64(t.Reordered),
		"correlate_arrival_timeouts": int64(t.ArrivalTimeout),
		// The NCCL plugin's kernel records: joined with their calls for
		// the device arrival order, or not (their call never came), and
		// steps emitted before every local peer's kernels came.
		"correlate_kernel_records":          int64(t.KernelRecords),
		"correlate_kernels_unmatched":       int64(t.KernelsUnmatched),
		"correlate_device_arrival_timeouts": int64(t.DeviceArrivalTimeout),
		// Calls NCCL names differently from a peer's call of the same
		// ordinal (one rank's capture saw a call its peers' did not):
		// their arrival rows are not compared.
		"correlate_arrival_misaligned": int64(t.ArrivalMisaligned),
		"correlate_arrival_realigned":  int64(t.ArrivalRealigned),
		"correlate_implausible_sizes":  int64(t.ImplausibleSizes),
		// Boundaries of bursts far shorter than the steps (the Trainer's
		// end-of-training calls): merged into the next step or dropped.
		"correlate_burst_steps": int64(t.BurstSteps),
	}
	// Counters, not gauges: the retired detectors' counts and those of the
	// one retiring during a swap are included, so that a detector change
	// never takes a count back (Prometheus would read a reset).
	sums := p.Summaries()
	if p.swap.old != nil {
		sums = append(sums, p.swap.old.Summaries()...)
	}
	var late, dup, evicted, rejected int64
	for _, s := range sums {
		late += s.Late
		dup += s.Duplicates
		evicted += s.Evicted
		rejected += s.RejectedRanks
	}
	c["detector_late"] = late
	c["detector_duplicates"] = dup
	c["detector_evicted"] = evicted
	c["detector_rejected_ranks"] = rejected
	c["detector_late_after_swap"] = p.swap.lateAfterSwap
	return c
}

// LiveStats returns the correlator's statistics of the processes it still
// follows. Owner goroutine only.
func (p *Pipeline) LiveStats() []correlate.RankStats { return p.corr.Stats() }
