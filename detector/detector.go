package detector

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
)

// ErrInvalidFact reports a fact that cannot be judged (empty job, end before
// start, a negative phase value, ...).
var ErrInvalidFact = errors.New("invalid fact")

// MaxTimeNS bounds the magnitude of every time of a fact (about 146 years
// of nanoseconds): differences of two valid times never overflow, so one
// fact with a time near 2^63 cannot wrap a job's window index.
const MaxTimeNS = int64(1) << 62

// MaxTokens bounds a step's token count (a trillion tokens in one step is
// far beyond any batch): medians and tolerance ratios of valid counts
// never overflow.
const MaxTokens = int64(1) << 40

// Detector judges step facts of any number of jobs. Not safe for concurrent use.
type Detector struct {
	cfg      Config
	phaseIdx map[string]int
	jobs     map[string]*job
	// order keeps jobs in first-seen order so output never depends on map order.
	order         []string
	rejectedJobs  int64
	totalRanks    int // ranks with state over all jobs (MaxTotalRanks)
	scratchValues []float64
	scratch       scratch
	settled       []SettledWindow
}

// SettledWindow names a window that has been judged, with or without verdicts.
type SettledWindow struct {
	Job            string
	Index          int64
	StartNS, EndNS int64
}

// TakeSettled returns the windows settled since the last call, in settlement
// order, and forgets them. Exporters use it to release buffered steps of
// windows that produced no verdicts.
func (d *Detector) TakeSettled() []SettledWindow {
	s := d.settled
	d.settled = nil
	return s
}

// WindowOf returns the window index a step of job ending at endNS falls in,
// and false when the job has no origin yet.
func (d *Detector) WindowOf(job string, endNS int64) (int64, bool) {
	j, ok := d.jobs[job]
	if !ok || !j.hasT0 {
		return 0, false
	}
	return d.windowIndex(j, endNS), true
}

// New returns a detector; it fails when cfg is invalid.
func New(cfg Config) (*Detector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("detector config: %w", err)
	}
	cfg.Phases = slices.Clone(cfg.Phases)
	cfg.PhaseThresholds = maps.Clone(cfg.PhaseThresholds)
	idx := make(map[string]int, len(cfg.Phases))
	for i, p := range cfg.Phases {
		idx[p] = i
	}
	return &Detector{cfg: cfg, phaseIdx: idx, jobs: map[string]*job{}}, nil
}

// Config returns the detector's configuration.
func (d *Detector) Config() Config {
	c := d.cfg
	c.Phases = slices.Clone(c.Phases)
	c.PhaseThresholds = maps.Clone(c.PhaseThresholds)
	return c
}

// job is the state of one job.
type job struct {
	name      string
	hasT0     bool
	t0        int64
	watermark int64
	topos     map[int]*Topology
	latest    int // highest topology version seen
	pending   map[int64]*window
	next      int64 // lowest window index not yet settled
	ranks     map[int]*rankState
	stats     jobStats
}

type jobStats struct {
	windows, facts, verdicts, alerts int64
	late, duplicates, evicted        int64
	rejectedRanks                    int64
	hidden                           int64
}

// window collects the facts of one window of one job.
type window struct {
	index int64
	ranks map[int]*rankWindow
	topo  int
}

// Evidence phases kept per rank and window for the exposure gate, whether
// or not they are evaluated phases.
const (
	evStep = iota
	evIdle
	evCollWait
	evSyncWait
	evHost
	// Derived, not recorded. evWait: a member's sync_wait + coll_wait
	// medians (members), the time it blocked per step for its device or
	// its peers. evHostRise: its host median above its own baseline
	// (job.setHostRises).
	evWait
	evHostRise
	nEvidence
)

// evidencePhases names the recorded evidence; evWait has none.
var evidencePhases = [evWait]string{PhaseStep, PhaseIdle, PhaseCollWait, PhaseSyncWait, PhaseHost}

// rankWindow is what one rank reported in one window.
type rankWindow struct {
	steps      int
	values     [][]float64 // per evaluated phase
	evidence   [nEvidence][]float64
	fps        map[string]int
	tokens     []int64
	noWorkload int
	lastArrive int
	arrivals   int
	// Device arrival (Step.DeviceLastArrival, DeviceCollMS): device.go.
	devLast, devArrivals int
	devColl              []float64
}

// SetOrigin fixes t0 of a job: window index = floor((end_ns - t0) / window).
// Replay passes the smallest end_ns of the job in its input; a streaming
// caller can leave it unset and the first fact's end_ns becomes t0.
func (d *Detector) SetOrigin(jobName string, t0 int64) {
	j := d.job(jobName)
	if j == nil {
		return
	}
	j.t0, j.hasT0 = t0, true
}

func (d *Detector) job(name string) *job {
	if j, ok := d.jobs[name]; ok {
		return j
	}
	if len(d.jobs) >= d.cfg.MaxJobs {
		d.rejectedJobs++
		return nil
	}
	j := &job{
		name:    name,
		topos:   map[int]*Topology{},
		pending: map[int64]*window{},
		ranks:   map[int]*rankState{},
	}
	d.jobs[name] = j
	d.order = append(d.order, name)
	return j
}

// AddTopology records a topology version of a job. Ranks it names become
// known members of their cohorts (a silent member is uncertain, not ignored).
func (d *Detector) AddTopology(t Topology) error {
	if t.Job == "" {
		return fmt.Errorf("%w: topology without job", ErrInvalidFact)
	}
	for _, g := range t.Groups {
		for _, r := range g.Ranks {
			if r < 0 {
				return fmt.Errorf("%w: topology group %q has negative rank %d", ErrInvalidFact, g.ID, r)
			}
		}
	}
	j := d.job(t.Job)
	if j == nil {
		return nil
	}
	tc := t
	tc.Ranks = slices.Clone(t.Ranks)
	tc.Groups = slices.Clone(t.Groups)
	j.topos[t.Version] = &tc
	if t.Version >= j.latest {
		j.latest = t.Version
		for _, r := range topoRanks(&tc) {
			d.rank(j, r, j.next)
		}
	}
	return nil
}

// ForgetJob drops all state of a job (its summary included) and frees its
// slot. Long-lived callers (the aggregator) call it when a job has ended.
func (d *Detector) ForgetJob(name string) {
	j, ok := d.jobs[name]
	if !ok {
		return
	}
	d.totalRanks -= len(j.ranks)
	delete(d.jobs, name)
	for i, n := range d.order {
		if n == name {
			d.order = append(d.order[:i], d.order[i+1:]...)
			break
		}
	}
}

// AddStep ingests one step fact and returns the verdicts of any windows that
// the fact's end time settles (those whose end plus the lateness allowance
// it passes). Late facts (for settled windows) and duplicates are counted and
// dropped.
func (d *Detector) AddStep(s Step) ([]Verdict, error) {
	if err := validateStep(s); err != nil {
		return nil, err
	}
	j := d.job(s.Job)
	if j == nil {
		return nil, nil
	}
	if !j.hasT0 {
		j.t0, j.hasT0 = s.EndNS, true
	}
	j.stats.facts++
	w := d.windowIndex(j, s.EndNS)
	if w < 0 && j.stats.windows == 0 && j.next == 0 {
		d.reorigin(j, -w)
		w = 0
	}
	if w < j.next {
		j.stats.late++
		return nil, nil
	}
	rs := d.rank(j, s.Rank, w)
	if rs == nil {
		return nil, nil
	}
	if rs.seen(s.Epoch, s.Step) {
		j.stats.duplicates++
		return nil, nil
	}
	rs.lastSeen, rs.heard = w, true
	d.record(j, w, s)
	if s.EndNS > j.watermark {
		j.watermark = s.EndNS
	}
	return d.settleUntil(j, j.watermark), nil
}

func validateStep(s Step) error {
	switch {
	case s.Job == "":
		return fmt.Errorf("%w: step without job", ErrInvalidFact)
	case s.Rank < 0:
		return fmt.Errorf("%w: negative rank %d", ErrInvalidFact, s.Rank)
	case s.EndNS < s.StartNS:
		return fmt.Errorf("%w: end_ns %d before start_ns %d", ErrInvalidFact, s.EndNS, s.StartNS)
	case s.StartNS <= -MaxTimeNS || s.EndNS >= MaxTimeNS:
		return fmt.Errorf("%w: start_ns %d, end_ns %d outside (-2^62, 2^62)", ErrInvalidFact, s.StartNS, s.EndNS)
	}
	for p, v := range s.Phases {
		if !(v >= 0) || v > 1e12 {
			return fmt.Errorf("%w: phase %q has value %g (want a finite, non-negative number of ms)", ErrInvalidFact, p, v)
		}
	}
	if s.Workload != nil && (s.Workload.Tokens < 0 || s.Workload.Tokens > MaxTokens) {
		return fmt.Errorf("%w: token count %d outside [0, 2^40]", ErrInvalidFact, s.Workload.Tokens)
	}
	return nil
}

// reorigin moves a job's origin k windows earlier while none of its windows
// has been settled, so that a fact that ends before the first one received
// (a streaming caller's facts of several ranks and threads arrive a little
// out of order, and its origin is the first received) is judged instead of
// dropped as late. Windows stay aligned to the old origin's grid.
func (d *Detector) reorigin(j *job, k int64) {
	j.t0 -= k * int64(d.cfg.Window)
	moved := make(map[int64]*window, len(j.pending))
	for idx, w := range j.pending {
		w.index = idx + k
		moved[idx+k] = w
	}
	j.pending = moved
	for _, rs := range j.ranks {
		rs.lastSeen += k
	}
}

func (d *Detector) windowIndex(j *job, end int64) int64 {
	w := int64(d.cfg.Window)
	delta := end - j.t0
	idx := delta / w
	if delta < 0 && delta%w != 0 {
		idx--
	}
	return idx
}

func (d *Detector) windowBounds(j *job, idx int64) (int64, int64) {
	start := j.t0 + idx*int64(d.cfg.Window)
	return start, start + int64(d.cfg.Window)
}

func (d *Detector) record(j *job, idx int64, s Step) {
	win := j.pending[idx]
	if win == nil {
		win = &window{index: idx, ranks: map[int]*rankWindow{}}
		j.pending[idx] = win
	}
	if s.Topo > win.topo {
		win.topo = s.Topo
	}
	rw := win.ranks[s.Rank]
	if rw == nil {
		rw = &rankWindow{values: make([][]float64, len(d.cfg.Phases))}
		win.ranks[s.Rank] = rw
	}
	rw.steps++
	for p, v := range s.Phases {
		if i, ok := d.phaseIdx[p]; ok {
			rw.values[i] = append(rw.values[i], v)
		}
	}
	if d.cfg.Exposure {
		for k, p := range evidencePhases {
			if v, ok := s.Phases[p]; ok {
				rw.evidence[k] = append(rw.evidence[k], v)
			}
		}
	}
	switch {
	case s.Workload == nil || (s.Workload.FP == "" && s.Workload.Tokens == 0):
		rw.noWorkload++
	default:
		if s.Workload.FP != "" {
			if rw.fps == nil {
				rw.fps = map[string]int{}
			}
			rw.fps[s.Workload.FP]++
		}
		if s.Workload.Tokens > 0 {
			rw.tokens = append(rw.tokens, s.Workload.Tokens)
		}
	}
	if s.LastArrival != nil {
		rw.arrivals++
		if *s.LastArrival {
			rw.lastArrive++
		}
	}
	rw.recordDevice(&s)
}

// Advance tells the detector that event time has reached watermark (for
// example the agent's CLOCK_MONOTONIC now): every window whose end plus the
// lateness allowance is at or before it is settled even if no newer fact
// arrives. It returns the verdicts of those windows.
func (d *Detector) Advance(watermark int64) []Verdict {
	var out []Verdict
	for _, name := range d.order {
		j := d.jobs[name]
		if watermark > j.watermark {
			j.watermark = watermark
		}
		out = append(out, d.settleUntil(j, j.watermark)...)
	}
	return out
}

// Flush settles every pending window of every job, the last partial one
// included, and returns their verdicts. Call it on stop.
func (d *Detector) Flush() []Verdict {
	var out []Verdict
	for _, name := range d.order {
		j := d.jobs[name]
		for _, idx := range sortedWindows(j) {
			out = append(out, d.settle(j, idx)...)
		}
	}
	return out
}

// startupWindows is how many of a job's first windows wait one window
// longer while a rank its topology names has sent nothing yet.
const startupWindows = 2

// settleUntil settles the windows of j whose end plus lateness <= watermark.
// A job's first startupWindows windows wait one window more while a rank
// that its topology names has not been heard from: at a job's start the
// ranks' step detection locks at different times, and one rank's steps can
// reach the detector seconds of steps ahead of the others' (83 steps of a
// 4-rank fake job, ~2 s), which would settle the first windows without
// them. The wait is bounded, so a rank that never reports (a remote rank of
// a multi-host communicator) delays only those windows.
func (d *Detector) settleUntil(j *job, watermark int64) []Verdict {
	if !j.hasT0 {
		return nil
	}
	var out []Verdict
	for _, idx := range sortedWindows(j) {
		_, end := d.windowBounds(j, idx)
		wait := int64(d.cfg.Lateness)
		if j.stats.windows < startupWindows && j.unheard() {
			wait += int64(d.cfg.Window)
		}
		if end+wait > watermark {
			break
		}
		out = append(out, d.settle(j, idx)...)
	}
	return out
}

// unheard reports whether a rank of the job has sent no fact yet.
func (j *job) unheard() bool {
	for _, rs := range j.ranks {
		if !rs.heard {
			return true
		}
	}
	return false
}

func sortedWindows(j *job) []int64 {
	if len(j.pending) == 0 {
		return nil
	}
	idx := make([]int64, 0, len(j.pending))
	for k := range j.pending {
		idx = append(idx, k)
	}
	sort.Slice(idx, func(a, b int) bool { return idx[a] < idx[b] })
	return idx
}
