package export

import (
	"cmp"
	"slices"

	"github.com/slowrank/slowrank/detector"
)

// Categories of a selected step fact, in export priority order.
const (
	catAnomalous = iota // the rank has a non-ok verdict in the window
	catCompare          // another rank of the same step holds an alert: side by side
	catBaseline         // the step is in the deterministic baseline sample
)

var categoryNames = [...]string{"anomalous", "compare", "baseline"}

type windowKey struct {
	job    string
	window int64
}

// decision is what a settled window's verdicts say about exporting it.
type decision struct {
	byRank map[int][]detector.Verdict // non-ok verdicts per rank
	worst  map[int]detector.Verdict   // the verdict that labels the rank's spans
	alert  map[int]bool               // ranks holding an active alert
	// settled is true when the detector settled the window (decide), false
	// for windows settled by lag, eviction of order or shutdown.
	settled bool
}

// stateRank orders states for "worst verdict of a rank": an active alert
// first, then candidate, uncertain, recovered, ok.
func stateRank(v detector.Verdict) int {
	switch {
	case v.State == detector.StateStraggler:
		return 5
	case v.AlertActive:
		return 4
	case v.State == detector.StateCandidate:
		return 3
	case v.State == detector.StateUncertain:
		return 2
	case v.State == detector.StateRecovered:
		return 1
	}
	return 0
}

func alertActive(v detector.Verdict) bool {
	return v.State == detector.StateStraggler || v.AlertActive
}

// decide reads a window's verdicts. Plain ok verdicts label nothing.
func decide(vs []detector.Verdict) *decision {
	d := &decision{byRank: map[int][]detector.Verdict{}, worst: map[int]detector.Verdict{}, alert: map[int]bool{}, settled: true}
	for _, v := range vs {
		if v.State == detector.StateOK && !v.AlertActive {
			continue
		}
		d.byRank[v.Rank] = append(d.byRank[v.Rank], v)
		w, ok := d.worst[v.Rank]
		if !ok || stateRank(v) > stateRank(w) || (stateRank(v) == stateRank(w) && v.Deviation > w.Deviation) {
			d.worst[v.Rank] = v
		}
		if alertActive(v) {
			d.alert[v.Rank] = true
		}
	}
	return d
}

type selectedFact struct {
	step detector.Step
	cat  int
}

// spanCost is the number of spans one fact turns into.
func spanCost(s *detector.Step, phaseSpans bool) int {
	n := 1
	if phaseSpans {
		for name := range s.Phases {
			if name != detector.PhaseStep {
				n++
			}
		}
	}
	return n
}

// selectFacts applies the export policy to one settled window: full span
// trees for every step of a rank with a non-ok verdict, every rank of a step
// in which some rank holds an alert (side by side), and every rank of a
// baseline-sampled step; at most budget spans, in that priority, then by
// step and rank. It returns the selection and how many facts fell out of the
// budget. Pure.
func selectFacts(facts []detector.Step, d *decision, sampleEvery, budget int, phaseSpans bool) ([]selectedFact, int) {
	alertSteps := map[int64]bool{}
	for i := range facts {
		if d != nil && d.alert[facts[i].Rank] {
			alertSteps[facts[i].Step] = true
		}
	}
	sel := make([]selectedFact, 0, len(facts))
	for i := range facts {
		s := &facts[i]
		switch {
		case d != nil && len(d.byRank[s.Rank]) > 0:
			sel = append(sel, selectedFact{*s, catAnomalous})
		case alertSteps[s.Step]:
			sel = append(sel, selectedFact{*s, catCompare})
		case sampled(TraceID(s.Job, s.Step), sampleEvery):
			sel = append(sel, selectedFact{*s, catBaseline})
		}
	}
	slices.SortStableFunc(sel, func(a, b selectedFact) int {
		return cmp.Or(cmp.Compare(a.cat, b.cat), cmp.Compare(a.step.Step, b.step.Step), cmp.Compare(a.step.Rank, b.step.Rank))
	})
	spent := 0
	for i := range sel {
		c := spanCost(&sel[i].step, phaseSpans)
		if spent+c > budget {
			return sel[:i], len(sel) - i
		}
		spent += c
	}
	return sel, 0
}

// pendingWindow holds the step facts of one unsettled window.
type pendingWindow struct {
	facts  []detector.Step
	maxEnd int64
	seq    uint64
}

// stepBuffer holds step facts per (job, window) until the window settles.
// Not safe for concurrent use; Exporter guards it.
type stepBuffer struct {
	max     int
	lag     int64
	keep    int
	n       int
	seq     uint64
	pending map[windowKey]*pendingWindow
	newest  map[string]int64 // newest window seen per job
	settled map[string]*settledJob
}

// settledJob remembers the last windows of a job that settled, with their
// decisions, so that late facts are still exported as the verdicts say.
type settledJob struct {
	upTo      int64 // every window <= upTo is settled
	decisions map[int64]*decision
	order     []int64
}

func newStepBuffer(p Policy) *stepBuffer {
	return &stepBuffer{
		max: p.MaxBufferedSteps, lag: p.SettleLag, keep: p.KeepSettled,
		pending: map[windowKey]*pendingWindow{},
		newest:  map[string]int64{},
		settled: map[string]*settledJob{},
	}
}

// addResult says what add did with a fact.
type addResult struct {
	late     *decision // non-nil: window already settled; export the fact now with this decision
	isLate   bool
	evicted  int         // facts dropped from the oldest windows
	forced   []windowKey // windows to settle now (baseline) because the job moved SettleLag ahead
	buffered bool
}

func (b *stepBuffer) add(s detector.Step, window int64) addResult {
	var r addResult
	key := windowKey{s.Job, window}
	if sj := b.settled[s.Job]; sj != nil && window <= sj.upTo {
		r.isLate = true
		r.late = sj.decisions[window]
		if r.late == nil {
			r.late = &decision{}
		}
		return r
	}
	if n, ok := b.newest[s.Job]; !ok || window > n {
		b.newest[s.Job] = window
		for k := range b.pending {
			if k.job == s.Job && window-k.window >= b.lag {
				r.forced = append(r.forced, k)
			}
		}
		slices.SortFunc(r.forced, func(a, b windowKey) int { return cmp.Compare(a.window, b.window) })
	}
	pw := b.pending[key]
	if pw == nil {
		b.seq++
		pw = &pendingWindow{seq: b.seq}
		b.pending[key] = pw
	}
	pw.facts = append(pw.facts, s)
	pw.maxEnd = max(pw.maxEnd, s.EndNS)
	b.n++
	r.buffered = true
	for b.n > b.max {
		r.evicted += b.evictOldest(key)
	}
	return r
}

// evictOldest drops the oldest pending window other than keep (unless keep
// is the only one, then it goes too).
func (b *stepBuffer) evictOldest(keep windowKey) int {
	var oldest windowKey
	var found bool
	var oseq uint64
	for k, pw := range b.pending {
		if k == keep && len(b.pending) > 1 {
			continue
		}
		if !found || pw.seq < oseq {
			oldest, oseq, found = k, pw.seq, true
		}
	}
	if !found {
		return 0
	}
	n := len(b.pending[oldest].facts)
	delete(b.pending, oldest)
	b.n -= n
	return n
}

// settle removes the window (and every older pending window of the job,
// which cannot get verdicts any more) and records the decision. It returns
// the windows taken out, oldest first; the last one is key itself (possibly
// with no facts).
func (b *stepBuffer) settle(key windowKey, d *decision) []settledWindow {
	var out []settledWindow
	for k, pw := range b.pending {
		if k.job == key.job && k.window < key.window {
			out = append(out, settledWindow{key: k, facts: pw.facts, maxEnd: pw.maxEnd, d: &decision{}})
			b.n -= len(pw.facts)
			delete(b.pending, k)
		}
	}
	slices.SortFunc(out, func(a, b settledWindow) int { return cmp.Compare(a.key.window, b.key.window) })
	sw := settledWindow{key: key, d: d}
	if pw := b.pending[key]; pw != nil {
		sw.facts, sw.maxEnd = pw.facts, pw.maxEnd
		b.n -= len(pw.facts)
		delete(b.pending, key)
	}
	out = append(out, sw)

	sj := b.settled[key.job]
	if sj == nil {
		sj = &settledJob{upTo: key.window - 1, decisions: map[int64]*decision{}}
		b.settled[key.job] = sj
	}
	for _, w := range out {
		if _, ok := sj.decisions[w.key.window]; !ok {
			sj.order = append(sj.order, w.key.window)
		}
		sj.decisions[w.key.window] = w.d
	}
	sj.upTo = max(sj.upTo, key.window)
	for len(sj.order) > b.keep {
		delete(sj.decisions, sj.order[0])
		sj.order = sj.order[1:]
	}
	return out
}

// drainAll takes every pending window out (shutdown), oldest first.
func (b *stepBuffer) drainAll() []settledWindow {
	var out []settledWindow
	for k, pw := range b.pending {
		out = append(out, settledWindow{key: k, facts: pw.facts, maxEnd: pw.maxEnd, d: &decision{}})
	}
	clear(b.pending)
	b.n = 0
	slices.SortFunc(out, func(a, b settledWindow) int {
		return cmp.Or(cmp.Compare(a.key.job, b.key.job), cmp.Compare(a.key.window, b.key.window))
	})
	return out
}

// takeJob takes the pending windows of one job out, oldest first.
func (b *stepBuffer) takeJob(job string) []settledWindow {
	var out []settledWindow
	for k, pw := range b.pending {
		if k.job == job {
			out = append(out, settledWindow{key: k, facts: pw.facts, maxEnd: pw.maxEnd, d: &decision{}})
			b.n -= len(pw.facts)
			delete(b.pending, k)
		}
	}
	slices.SortFunc(out, func(a, b settledWindow) int { return cmp.Compare(a.key.window, b.key.window) })
	return out
}

func (b *stepBuffer) forget(job string) {
	for k, pw := range b.pending {
		if k.job == job {
			b.n -= len(pw.facts)
			delete(b.pending, k)
		}
	}
	delete(b.newest, job)
	delete(b.settled, job)
}

// settledWindow is a window ready for span building.
type settledWindow struct {
	key    windowKey
	facts  []detector.Step
	maxEnd int64
	d      *decision
	// verdicts, when non-nil, is the verdict batch (for latency and events).
	verdicts []detector.Verdict
	// lateFact marks a single late fact exported on its own.
	lateFact bool
	// flushed, when set, marks a ForceFlush barrier: closed when reached.
	flushed chan struct{}
}
