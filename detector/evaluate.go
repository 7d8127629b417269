package detector

import (
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/slowrank/slowrank/internal/stats"
)

// cohort is a set of ranks compared with each other in one window.
type cohort struct {
	id    string
	ranks []int // sorted
}

// member is one cohort rank's evidence in one window.
type member struct {
	rank    int
	rw      *rankWindow // nil when the rank sent nothing in the window
	fp      string
	tokens  int64
	hasWL   bool
	med     []float64          // per phase; NaN when absent
	ev      [nEvidence]float64 // evidence medians; NaN when absent
	devColl float64            // median Step.DeviceCollMS; NaN when absent
}

// evaluation is the outcome of one (member, phase) before the state machine.
type evaluation struct {
	done      bool // the phase was evaluated for this member
	outcome   outcome
	value     float64
	reference float64
	refRank   int
	deviation float64
	degraded  bool
	coverage  float64
	reason    string
	exposure  *Exposure // set when the exposure gate judged the window
	hidden    bool      // the seed's rule said slow, exposure evidence said hidden
	// hiddenByStep: hidden only because the job's step did not rise enough
	// (step_time evidence, or a capped victim_wait that alone would expose).
	hiddenByStep bool
	// weakHidden: only a baseline learned without evidence could have
	// shown it hidden, so it is uncertain.
	weakHidden bool
}

// scratch holds buffers reused from one settlement to the next, so that
// settling a window of many ranks does not churn the garbage collector.
// Nothing in them outlives a settlement: verdicts copy what they keep.
type scratch struct {
	members  []member
	meds     []float64
	evals    []evaluation
	evalRows [][]evaluation
}

// grow returns (*buf)[:n], reallocating only when the capacity is short.
func grow[T any](buf *[]T, n int) []T {
	if cap(*buf) < n {
		*buf = make([]T, n)
	}
	*buf = (*buf)[:n]
	return *buf
}

// maxSettledKept bounds the settled-window list between TakeSettled calls.
const maxSettledKept = 4096

// settle evaluates window idx of job j and returns its verdicts.
func (d *Detector) settle(j *job, idx int64) []Verdict {
	win := j.pending[idx]
	delete(j.pending, idx)
	if idx >= j.next {
		j.next = idx + 1
	}
	if win == nil {
		return nil
	}
	j.stats.windows++
	start, end := d.windowBounds(j, idx)
	if len(d.settled) >= maxSettledKept {
		d.settled = append(d.settled[:0], d.settled[len(d.settled)/2:]...) // nobody is taking them
	}
	d.settled = append(d.settled, SettledWindow{Job: j.name, Index: idx, StartNS: start, EndNS: end})
	topo := j.topology(win.topo)
	var out []Verdict
	for _, c := range d.cohorts(j, topo) {
		out = append(out, d.evaluateCohort(j, win, c, topo)...)
	}
	d.evict(j, idx)
	j.pruneTopologies()
	j.stats.verdicts += int64(len(out))
	return out
}

// topology returns the topology a window is judged under: the highest version
// not newer than the window's facts' tag, or the latest when untagged.
func (j *job) topology(tag int) *Topology {
	if len(j.topos) == 0 {
		return nil
	}
	if tag == 0 {
		return j.topos[j.latest]
	}
	best := -1
	for v := range j.topos {
		if v <= tag && v > best {
			best = v
		}
	}
	if best < 0 {
		return nil
	}
	return j.topos[best]
}

// pruneTopologies keeps the latest topology version and those still named by
// pending windows, so that state stays bounded when versions keep coming.
func (j *job) pruneTopologies() {
	if len(j.topos) <= 1 {
		return
	}
	keep := map[int]bool{j.latest: true}
	for _, w := range j.pending {
		if t := j.topology(w.topo); t != nil {
			keep[t.Version] = true
		}
	}
	for v := range j.topos {
		if !keep[v] {
			delete(j.topos, v)
		}
	}
}

func topoRanks(t *Topology) []int {
	var rs []int
	for _, r := range t.Ranks {
		rs = append(rs, r.Rank)
	}
	for _, g := range t.Groups {
		rs = append(rs, g.Ranks...)
	}
	slices.Sort(rs)
	return slices.Compact(rs)
}

// cohorts splits the job's known ranks into cohorts: groups of the configured
// type first (a rank joins the first such group by id), the rest in "world".
func (d *Detector) cohorts(j *job, topo *Topology) []cohort {
	assigned := map[int]bool{}
	var out []cohort
	if topo != nil {
		groups := slices.Clone(topo.Groups)
		sort.Slice(groups, func(a, b int) bool { return groups[a].ID < groups[b].ID })
		for _, g := range groups {
			if g.Type != d.cfg.CohortType {
				continue
			}
			c := cohort{id: g.ID}
			for _, r := range g.Ranks {
				if _, known := j.ranks[r]; known && !assigned[r] {
					assigned[r] = true
					c.ranks = append(c.ranks, r)
				}
			}
			if len(c.ranks) > 0 {
				slices.Sort(c.ranks)
				out = append(out, c)
			}
		}
	}
	rest := cohort{id: "world"}
	for r := range j.ranks {
		if !assigned[r] {
			rest.ranks = append(rest.ranks, r)
		}
	}
	if len(rest.ranks) > 0 {
		slices.Sort(rest.ranks)
		out = append(out, rest)
	}
	return out
}

func (d *Detector) members(win *window, c cohort) []member {
	nPhases := len(d.cfg.Phases)
	ms := grow(&d.scratch.members, len(c.ranks))
	meds := grow(&d.scratch.meds, len(c.ranks)*nPhases)
	for i, r := range c.ranks {
		m := member{rank: r, rw: win.ranks[r], med: meds[i*nPhases : (i+1)*nPhases : (i+1)*nPhases]}
		for p := range m.med {
			m.med[p] = math.NaN()
		}
		for k := range m.ev {
			m.ev[k] = math.NaN()
		}
		m.devColl = math.NaN()
		if m.rw != nil {
			if len(m.rw.devColl) > 0 {
				m.devColl = d.median(m.rw.devColl)
			}
			for k, vals := range m.rw.evidence {
				if len(vals) > 0 {
					m.ev[k] = d.median(vals)
				}
			}
			m.ev[evWait] = waitOf(m.ev[evSyncWait], m.ev[evCollWait])
			for p, vals := range m.rw.values {
				if len(vals) > 0 {
					m.med[p] = d.median(vals)
				}
			}
			m.fp = modeFP(m.rw.fps)
			if len(m.rw.tokens) > 0 {
				m.tokens = stats.MedianInt(slices.Clone(m.rw.tokens))
			}
			m.hasWL = m.fp != "" || m.tokens > 0
		}
		ms[i] = m
	}
	return ms
}

func (d *Detector) evaluateCohort(j *job, win *window, c cohort, topo *Topology) []Verdict {
	ms := d.members(win, c)
	nPhases := len(d.cfg.Phases)
	slab := grow(&d.scratch.evals, len(ms)*nPhases)
	clear(slab)
	evals := grow(&d.scratch.evalRows, len(ms))
	for i := range evals {
		evals[i] = slab[i*nPhases : (i+1)*nPhases : (i+1)*nPhases]
	}
	for p := 0; p < nPhases; p++ {
		d.evaluatePhase(ms, p, evals)
	}
	var peers peerEvidence
	if d.cfg.Exposure {
		peers.step = j.jobStep(ms)
		j.setHostRises(ms)
	}
	for p, phase := range d.cfg.Phases {
		if !d.cfg.exposureGated(phase) {
			continue
		}
		for i := range ms {
			rs, e := j.ranks[ms[i].rank], &evals[i][p]
			switch {
			case e.done && e.outcome == outcomeSlow:
				d.gate(phase, ms, i, rs, &rs.phases[p], win.index, e, &peers)
			case e.done && e.outcome == outcomeOK:
				rs.phases[p].carry = carried{} // the deviation is over
			}
		}
	}
	caches := make([]map[signature]*comparableSet, nPhases)
	for p := range caches {
		caches[p] = map[signature]*comparableSet{}
	}
	var out []Verdict
	for i, m := range ms {
		rs := j.ranks[m.rank]
		for p := 0; p < nPhases; p++ {
			e := evals[i][p]
			if !e.done {
				continue
			}
			if v, ok := d.transition(j, win, rs, ms, i, p, e, evals[i], caches[p]); ok {
				v.Cohort = c.id
				if topo != nil {
					v.Topo = topo.Version
				}
				out = append(out, v)
			}
		}
	}
	if teach, strict := teaching(j, ms, evals); d.cfg.Exposure && teach {
		for _, m := range ms {
			if rs := j.ranks[m.rank]; rs != nil && m.rw != nil && !math.IsNaN(m.ev[evStep]) {
				rs.addBaseline(m.ev[evStep], m.ev[evHost], strict)
			}
		}
	}
	return out
}

// waitOf is the time a member blocked per step: its sync_wait and
// coll_wait medians added, NaN when it measured neither.
func waitOf(sync, coll float64) float64 {
	switch {
	case math.IsNaN(sync):
		return coll
	case math.IsNaN(coll):
		return sync
	}
	return sync + coll
}

// teaching reports whether a cohort window may teach its members' step
// and host baselines, and whether strictly (every deviation in it had
// evidence; only a baseline of minBaseline strict windows may show a
// deviation hidden).
//
// No window teaches in which a member that is silent in it was slow when
// it was last heard (a silent host's stall shows only in its peers' steps,
// which would teach it and then hide it when the host returns), a phase was
// slow, or a phase was hidden only because the job's step did not rise
// against a strict baseline. A silent member never judged slow does not
// block: its peers' past is all there is (a rank whose steps the agent
// lost). The ranks share one step time, so one stalled member makes every
// member's step the stall's, and a stall with evidence must never become
// the past it is measured against: not as it starts, and not as it grows (a
// stall that rises a little per window is hidden by the cap until the job's
// step has risen past the threshold of a baseline it never taught).
//
// A window whose deviations lacked evidence (none, or a weak baseline's)
// teaches weakly: real jobs differ in host time between ranks behind their
// device waits in every window, and without such windows no baseline would
// ever form to show a later stall's rise. A stall present from the first
// step then becomes a weak baseline, which shows no rise for it, but which
// never hides it either: it stays uncertain until device records decide.
func teaching(j *job, ms []member, evals [][]evaluation) (teach, strict bool) {
	for _, m := range ms {
		if rs := j.ranks[m.rank]; m.rw == nil && rs != nil && rs.slowWhenLastJudged() {
			return false, false
		}
	}
	strict = true
	for _, row := range evals {
		for i := range row {
			e := &row[i]
			if (e.done && e.outcome == outcomeSlow) || e.hiddenByStep {
				return false, false
			}
			if e.weakHidden || (e.exposure != nil && e.exposure.Evidence == EvidenceNone) {
				strict = false
			}
		}
	}
	return true, strict
}

// evaluatePhase fills evals[*][p] for every member of a cohort.
func (d *Detector) evaluatePhase(ms []member, p int, evals [][]evaluation) {
	// Members that measured the phase, fastest first (ties by rank).
	var measured []int
	maxSteps := 0
	for i, m := range ms {
		if !math.IsNaN(m.med[p]) {
			measured = append(measured, i)
			if n := len(m.rw.values[p]); n > maxSteps {
				maxSteps = n
			}
		}
	}
	if len(measured) == 0 {
		return // nobody in the cohort measured it: not evaluated here
	}
	sort.Slice(measured, func(a, b int) bool {
		ma, mb := ms[measured[a]], ms[measured[b]]
		if ma.med[p] != mb.med[p] {
			return ma.med[p] < mb.med[p]
		}
		return ma.rank < mb.rank
	})
	phase := d.cfg.Phases[p]
	threshold := d.cfg.PhaseThreshold(phase)
	floorMS := float64(d.cfg.Floor) / 1e6
	for i, m := range ms {
		e := &evals[i][p]
		e.done, e.refRank = true, -1
		if math.IsNaN(m.med[p]) {
			e.outcome = outcomeUncertain
			if m.rw == nil {
				e.reason = fmt.Sprintf("no steps in window while %d peers measured %s", len(measured), phase)
			} else {
				e.reason = fmt.Sprintf("%s not measured while %d peers measured it", phase, len(measured))
			}
			continue
		}
		e.value = m.med[p]
		e.coverage = float64(len(m.rw.values[p])) / float64(maxSteps)
		ref, count, degraded := d.reference(ms, measured, i)
		e.degraded = degraded || !m.hasWL
		if count < d.cfg.MinReferences {
			e.outcome = outcomeUncertain
			if m.hasWL {
				e.reason = fmt.Sprintf("workload present but %d comparable references among %d members that measured %s (need %d)%s",
					count, len(measured)-1, phase, d.cfg.MinReferences, workloadMismatch(ms, measured, i))
			} else {
				e.reason = fmt.Sprintf("only %d other members measured %s (need %d)", count, phase, d.cfg.MinReferences)
			}
			continue
		}
		rm := ms[ref]
		e.reference, e.refRank = rm.med[p], rm.rank
		if !(e.reference > 0) {
			e.outcome = outcomeUncertain
			e.reason = fmt.Sprintf("reference %s median of rank %d is 0 ms: relative deviation undefined", phase, rm.rank)
			continue
		}
		e.deviation = e.value/e.reference - 1
		if e.deviation >= threshold && e.value-e.reference >= floorMS {
			e.outcome = outcomeSlow
		} else {
			e.outcome = outcomeOK
		}
	}
}

// workloadMismatch says why ms[self] found too few comparable peers when at
// least two peers measured the phase and all agree on one fingerprint that is
// not its own: in data parallelism every rank should run the same kernels, so a rank
// whose kernel mix alone differs is itself a finding (extra or missing work).
func workloadMismatch(ms []member, measured []int, self int) string {
	me := ms[self]
	if me.fp == "" {
		return ""
	}
	peerFP, peers := "", 0
	for _, k := range measured {
		if k == self {
			continue
		}
		fp := ms[k].fp
		if fp == "" || fp == me.fp || (peerFP != "" && fp != peerFP) {
			return ""
		}
		peerFP = fp
		peers++
	}
	if peers < 2 {
		return "" // one peer against one rank: either could be the odd one
	}
	return fmt.Sprintf("; its kernel mix (workload fingerprint %s) differs from the one all %d peers share (%s)",
		shortFP(me.fp), peers, shortFP(peerFP))
}

func shortFP(fp string) string {
	if len(fp) > 12 {
		return fp[:12]
	}
	return fp
}

// reference scans measured (fastest first) for the fastest member comparable
// with ms[self]. It counts comparable members up to MinReferences and reports
// whether the chosen reference lacked workload evidence.
func (d *Detector) reference(ms []member, measured []int, self int) (ref, count int, degraded bool) {
	ref = -1
	for _, k := range measured {
		if k == self || !d.comparable(ms[self], ms[k]) {
			continue
		}
		if ref < 0 {
			ref = k
			degraded = !ms[k].hasWL
		}
		count++
		if count >= d.cfg.MinReferences {
			break
		}
	}
	return ref, count, degraded
}

// comparable reports whether two members did comparable work. Without
// workload evidence on either side they are compared (degraded); with
// evidence, equal fingerprints or tokens within tolerance are comparable.
func (d *Detector) comparable(a, b member) bool {
	if !a.hasWL || !b.hasWL {
		return true
	}
	if a.fp != "" && a.fp == b.fp {
		return true
	}
	if a.tokens > 0 && b.tokens > 0 {
		hi, lo := max(a.tokens, b.tokens), min(a.tokens, b.tokens)
		return float64(hi-lo) <= d.cfg.TokenTolerance*float64(hi)
	}
	return false
}

// comparableSet is the comparable members of one workload signature for one
// phase: at most MaxListedComparable+1 ranks (so that removing the asking
// rank still leaves a full list) and the full count.
type comparableSet struct {
	list  []int
	count int
}

type signature struct {
	hasWL  bool
	fp     string
	tokens int64
}

// comparableRanks lists (bounded) and counts the members comparable with
// ms[self] that measured phase p, in rank order. Members with the same
// workload signature share one scan, so a window with many non-ok verdicts
// stays linear in the usual case of few distinct workloads.
func (d *Detector) comparableRanks(ms []member, self, p int, cache map[signature]*comparableSet) ([]int, int) {
	me := ms[self]
	sig := signature{me.hasWL, me.fp, me.tokens}
	set := cache[sig]
	if set == nil {
		set = &comparableSet{}
		for _, m := range ms {
			if math.IsNaN(m.med[p]) || !d.comparable(me, m) {
				continue
			}
			set.count++
			if len(set.list) <= MaxListedComparable {
				set.list = append(set.list, m.rank)
			}
		}
		cache[sig] = set
	}
	list := make([]int, 0, min(len(set.list), MaxListedComparable))
	for _, r := range set.list {
		if r != me.rank && len(list) < MaxListedComparable {
			list = append(list, r)
		}
	}
	count := set.count
	if !math.IsNaN(me.med[p]) {
		count-- // a measured member is always comparable with itself
	}
	return list, count
}

// median is the median of vals, sorted in the detector's scratch buffer.
func (d *Detector) median(vals []float64) float64 {
	d.scratchValues = append(d.scratchValues[:0], vals...)
	return stats.Median(d.scratchValues)
}

// modeFP returns the most frequent fingerprint (ties: the smallest string).
func modeFP(fps map[string]int) string {
	best, bestN := "", 0
	for fp, n := range fps {
		if n > bestN || (n == bestN && fp < best) {
			best, bestN = fp, n
		}
	}
	return best
}
