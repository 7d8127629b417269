package aggregate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/slowrank/slowrank/detector"
)

// Sink receives the aggregator's results, exactly as an agent's sinks do
// (cmd/slowrank's JSONL and OpenTelemetry sinks satisfy both): calls come
// from the aggregator's goroutine, in order; a step's Step call precedes
// the Settled call of its window. A Sink must not block for long.
type Sink interface {
	Topology(detector.Topology)
	Step(s detector.Step, window int64)
	Settled(w detector.SettledWindow, verdicts []detector.Verdict)
}

// Config configures an Aggregator.
type Config struct {
	Detector detector.Config
	Sinks    []Sink
	// Tick is how often the aggregator's clock advances event time, so that
	// windows settle (and silence is noticed) without new facts
	// (default 200ms).
	Tick time.Duration
	// QueueFacts bounds the decoded facts waiting for the detector
	// goroutine (default 1<<18); beyond it requests are refused with a
	// retryable error.
	QueueFacts int
	// MaxHosts bounds the hosts tracked over all jobs (default 65536);
	// MaxHostsPerJob per job (default 8192). Facts of further hosts are
	// refused and counted.
	MaxHosts, MaxHostsPerJob int
	// HostTTL forgets a host silent this long: its topology leaves the
	// merged one (default EvictAfter windows, when the detector evicts its
	// ranks too).
	HostTTL time.Duration
	// TopologyDebounce is the shortest time between two merged topology
	// versions of a job (default 1s): a thousand agents starting at once
	// make a handful of versions, not a thousand.
	TopologyDebounce time.Duration
	// StatsEvery logs the aggregator's counters this often (default 30s;
	// negative: never).
	StatsEvery time.Duration
	// NowMono reads the aggregator's CLOCK_MONOTONIC (the timeline of every
	// window); tests replace it.
	NowMono func() int64
	Logger  *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Tick <= 0 {
		c.Tick = 200 * time.Millisecond
	}
	if c.QueueFacts <= 0 {
		c.QueueFacts = 1 << 18
	}
	if c.MaxHosts <= 0 {
		c.MaxHosts = 1 << 16
	}
	if c.MaxHostsPerJob <= 0 {
		c.MaxHostsPerJob = 8192
	}
	if c.HostTTL <= 0 {
		c.HostTTL = time.Duration(max(c.Detector.EvictAfter, 1)) * c.Detector.Window
	}
	if c.TopologyDebounce <= 0 {
		c.TopologyDebounce = time.Second
	}
	if c.StatsEvery == 0 {
		c.StatsEvery = 30 * time.Second
	}
	if c.NowMono == nil {
		c.NowMono = MonoNow
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// MonoNow reads CLOCK_MONOTONIC in ns.
func MonoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return time.Now().UnixNano()
	}
	return ts.Nano()
}

// ErrQueueFull is returned by Offer when the detector is behind; receivers
// answer it with a retryable error.
var ErrQueueFull = errors.New("aggregator queue full")

// Aggregator runs the detector over the facts of every host of every job
// (see doc.go for the timeline). Offer is safe for concurrent use; Run owns
// the detector on one goroutine.
type Aggregator struct {
	cfg Config
	log *slog.Logger

	in     chan batch
	queued atomic.Int64
	closed atomic.Bool

	// Owned by Run's goroutine.
	// det judges every job: each job keeps its own origin, windows and
	// ranks inside it, and a finished job is dropped with ForgetJob.
	det *detector.Detector
	// verdicts were returned by det and not yet handed to the sinks.
	verdicts  []detector.Verdict
	lagEnds   map[string]int64 // scratch of settle: job → its last window's end
	jobs      map[string]*jobState
	order     []string // jobs in first-seen order
	finished  []detector.Summary
	nHosts    int
	lastStats int64
	ran       bool

	statsMu sync.Mutex
	stats   Stats
	done    chan struct{}
}

type batch struct {
	recv  int64
	facts []Fact
}

type jobState struct {
	name     string
	topo     *topoMerge
	lastPush int64
	hosts    map[string]*hostState
	// next is the lowest window index not settled yet (nextSet: known).
	next    int64
	nextSet bool
	// lastEnd is the latest end (on the aggregator's timeline) of a step
	// handed to the detector (hasSteps: any): once event time is a window
	// plus the lateness past it, the job has no pending window left.
	lastEnd  int64
	hasSteps bool
}

type hostState struct {
	lastRecv int64
	silent   bool
	ranks    map[int]struct{} // ranks seen in facts (bounded by MaxRanks per job)
}

// Stats are the aggregator's counters. Times are on its CLOCK_MONOTONIC.
type Stats struct {
	Facts          int64 // step facts handed to the detector
	Topologies     int64 // topology facts received
	TopoVersions   int64 // merged versions built
	RefusedQueue   int64 // facts refused because the queue was full
	RefusedHosts   int64 // facts of hosts beyond MaxHosts / MaxHostsPerJob
	RefusedJobs    int64 // facts of jobs beyond the detector's MaxJobs
	FinishedJobs   int64 // jobs forgotten after all their hosts were
	Invalid        int64 // facts the detector rejected
	Windows        int64 // windows settled
	Verdicts       int64
	Hosts          int   // hosts tracked
	SilentHosts    int   // hosts silent for more than a window plus lateness
	ForgottenHosts int64 // hosts forgotten after HostTTL
	Queued         int64 // facts waiting now
	// Settle is the time the detector call that settled the last windows
	// took (evaluation of every cohort and rank; a tick's call settles the
	// due windows of every job at once); SettleMax the largest so far.
	Settle, SettleMax time.Duration
	// Lag is how long after its deadline (window end + lateness) a job's
	// last settled window reached the sinks (the largest over the jobs
	// settled by one call); LagMax the largest so far.
	Lag, LagMax time.Duration
	// MaxAge is the largest sender-side age (sent − end) seen in the last
	// stats period; LateFacts counts facts whose window had settled.
	MaxAge    time.Duration
	LateFacts int64
}

// New checks cfg and builds an aggregator; start it with Run. One detector
// with cfg.Detector judges every job (cfg.Detector.MaxJobs bounds the jobs
// tracked at once; a finished job frees its slot).
func New(cfg Config) (*Aggregator, error) {
	if cfg.MaxHosts < 0 || cfg.MaxHostsPerJob < 0 || cfg.QueueFacts < 0 {
		return nil, fmt.Errorf("aggregate: negative limit (max hosts %d, per job %d, queue %d); 0 takes the default",
			cfg.MaxHosts, cfg.MaxHostsPerJob, cfg.QueueFacts)
	}
	det, err := detector.New(cfg.Detector)
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Aggregator{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "aggregate"),
		det:     det,
		lagEnds: map[string]int64{},
		in:      make(chan batch, 4096),
		jobs:    map[string]*jobState{},
		done:    make(chan struct{}),
	}, nil
}

// Offer hands the facts of one request, received at recvMono (the
// aggregator's CLOCK_MONOTONIC), to the detector goroutine. It never blocks:
// ErrQueueFull when the detector is behind (the sender should retry).
func (a *Aggregator) Offer(recvMono int64, facts []Fact) error {
	if len(facts) == 0 {
		return nil
	}
	if a.closed.Load() {
		return ErrQueueFull
	}
	n := int64(len(facts))
	if a.queued.Add(n) > int64(a.cfg.QueueFacts) {
		a.queued.Add(-n)
		a.addStat(func(s *Stats) { s.RefusedQueue += n })
		return ErrQueueFull
	}
	select {
	case a.in <- batch{recvMono, facts}:
		return nil
	default:
		a.queued.Add(-n)
		a.addStat(func(s *Stats) { s.RefusedQueue += n })
		return ErrQueueFull
	}
}

func (a *Aggregator) addStat(f func(*Stats)) {
	a.statsMu.Lock()
	f(&a.stats)
	a.statsMu.Unlock()
}

// Stats returns a snapshot of the counters.
func (a *Aggregator) Stats() Stats {
	a.statsMu.Lock()
	defer a.statsMu.Unlock()
	s := a.stats
	s.Queued = a.queued.Load()
	return s
}

// Run judges facts as they come and settles windows by the aggregator's
// clock until ctx ends; then it settles every pending window, hands it to
// the sinks and returns. Call it once.
func (a *Aggregator) Run(ctx context.Context) error {
	if a.ran {
		return errors.New("aggregator: Run called twice")
	}
	a.ran = true
	defer close(a.done)
	tick := time.NewTicker(a.cfg.Tick)
	defer tick.Stop()
	a.lastStats = a.cfg.NowMono()
	for {
		select {
		case <-ctx.Done():
			a.closed.Store(true)
			a.drain()
			now := a.cfg.NowMono()
			a.pushTopologies(now, true)
			// Every job's last windows at once: at most about
			// 1 + lateness/window of them per job, far below the
			// settled windows the detector keeps between two
			// TakeSettled calls (4096) for MaxJobs jobs (default 256).
			t0 := time.Now()
			a.verdicts = append(a.verdicts, a.det.Flush()...)
			a.settle(time.Since(t0), true)
			a.logStats(now)
			return nil
		case b := <-a.in:
			a.handle(b)
		case <-tick.C:
			a.tick(a.cfg.NowMono())
		}
	}
}

// Summaries returns one summary per job, the jobs forgotten during the run
// (at most 1024, the latest) first; call it after Run.
func (a *Aggregator) Summaries() []detector.Summary {
	<-a.done
	out := append([]detector.Summary(nil), a.finished...)
	byJob := map[string]detector.Summary{}
	for _, s := range a.det.Summaries() {
		byJob[s.Job] = s
	}
	// In the aggregator's first-seen order (a job's first fact may be a
	// topology that reaches the detector only later).
	for _, name := range a.order {
		if s, ok := byJob[name]; ok {
			out = append(out, s)
		}
	}
	return out
}

func (a *Aggregator) drain() {
	for {
		select {
		case b := <-a.in:
			a.handle(b)
		default:
			return
		}
	}
}

func (a *Aggregator) tick(now int64) {
	a.drain()
	a.pushTopologies(now, false)
	t0 := time.Now()
	a.verdicts = append(a.verdicts, a.det.Advance(now)...)
	a.settle(time.Since(t0), false)
	a.checkHosts(now)
	if a.cfg.StatsEvery > 0 && now-a.lastStats >= int64(a.cfg.StatsEvery) {
		a.logStats(now)
		a.lastStats = now
	}
}

// job returns the state of a job, creating it within MaxJobs (nil beyond).
func (a *Aggregator) job(name string) *jobState {
	if j, ok := a.jobs[name]; ok {
		return j
	}
	// The detector knows only jobs the aggregator knows, so it never
	// refuses one that passes here.
	if len(a.jobs) >= a.cfg.Detector.MaxJobs {
		return nil
	}
	j := &jobState{name: name, topo: newTopoMerge(name), hosts: map[string]*hostState{}}
	a.jobs[name] = j
	a.order = append(a.order, name)
	return j
}

// settledAll reports whether every window of j with steps has settled by
// event time now (the detector has been advanced to now): the window of the
// latest step ends at most a window after it and settles lateness later.
func (a *Aggregator) settledAll(j *jobState, now int64) bool {
	return !j.hasSteps || now-j.lastEnd >= int64(a.cfg.Detector.Window+a.cfg.Detector.Lateness)
}

// finish forgets a job whose hosts are all gone and whose windows have all
// settled (settledAll): its summary is kept for Summaries and the detector
// drops its state.
func (a *Aggregator) finish(j *jobState) {
	var sums []detector.Summary
	for _, s := range a.det.Summaries() {
		if s.Job == j.name {
			sums = append(sums, s)
		}
	}
	a.det.ForgetJob(j.name)
	a.finished = append(a.finished, sums...)
	if n := len(a.finished); n > 1024 {
		a.finished = append([]detector.Summary(nil), a.finished[n-1024:]...)
	}
	delete(a.jobs, j.name)
	for i, name := range a.order {
		if name == j.name {
			a.order = append(a.order[:i], a.order[i+1:]...)
			break
		}
	}
	a.addStat(func(s *Stats) { s.FinishedJobs++ })
	for _, sum := range sums {
		a.log.Info("job finished: all its hosts went away", "job", sum.Job, "stragglers", sum.Stragglers,
			"windows", sum.Windows, "facts", sum.Facts)
	}
}

// host returns the state of host in job, creating it within the bounds.
func (a *Aggregator) host(j *jobState, name string, now int64) *hostState {
	if h, ok := j.hosts[name]; ok {
		if h.silent {
			h.silent = false
			a.log.Info("host reporting again: its ranks are judged again", "job", j.name, "host", name,
				"silent_for", time.Duration(now-h.lastRecv).Round(time.Millisecond))
		}
		h.lastRecv = now
		return h
	}
	if a.nHosts >= a.cfg.MaxHosts || len(j.hosts) >= a.cfg.MaxHostsPerJob {
		return nil
	}
	h := &hostState{lastRecv: now, ranks: map[int]struct{}{}}
	j.hosts[name] = h
	a.nHosts++
	return h
}

func (a *Aggregator) handle(b batch) {
	a.queued.Add(-int64(len(b.facts)))
	var facts, topos, refused, refusedJobs, invalid, late int64
	var maxAge int64
	for i := range b.facts {
		f := &b.facts[i]
		var job string
		if f.Step != nil {
			job = f.Step.Job
		} else {
			job = f.Topology.Job
		}
		j := a.job(job)
		if j == nil {
			refusedJobs++
			continue
		}
		h := a.host(j, f.Host, b.recv)
		if h == nil {
			refused++
			continue
		}
		if f.Topology != nil {
			topos++
			j.topo.update(f.Host, f.Topology)
			continue
		}
		s := *f.Step
		// The timeline: the aggregator's receive time minus the age the
		// fact already had when its sender sent it (one host's clock:
		// a valid duration). Only network transit is left unaccounted.
		age := int64(0)
		if f.SentMono > 0 {
			age = f.SentMono - s.EndNS
		}
		maxAge = max(maxAge, age)
		span := s.EndNS - s.StartNS
		s.EndNS = b.recv - age
		s.StartNS = s.EndNS - span
		if s.Host == "" {
			s.Host = f.Host
		}
		s.Topo = j.topo.mergedVersion(f.Host, s.Topo)
		if _, ok := h.ranks[s.Rank]; !ok && len(h.ranks) < a.cfg.Detector.MaxRanks {
			h.ranks[s.Rank] = struct{}{}
		}
		if w, ok := a.det.WindowOf(s.Job, s.EndNS); ok && j.nextSet && w < j.next {
			late++
		}
		t0 := time.Now()
		vs, err := a.det.AddStep(s)
		elapsed := time.Since(t0)
		if err != nil {
			invalid++
			continue
		}
		facts++
		if !j.hasSteps || s.EndNS > j.lastEnd {
			j.lastEnd, j.hasSteps = s.EndNS, true
		}
		a.verdicts = append(a.verdicts, vs...)
		win, _ := a.det.WindowOf(s.Job, s.EndNS)
		for _, sk := range a.cfg.Sinks {
			sk.Step(s, win)
		}
		a.settle(elapsed, false)
	}
	a.addStat(func(st *Stats) {
		st.Facts += facts
		st.Topologies += topos
		st.RefusedHosts += refused
		st.RefusedJobs += refusedJobs
		st.Invalid += invalid
		st.LateFacts += late
		st.MaxAge = max(st.MaxAge, time.Duration(maxAge))
	})
}

// pushTopologies hands a job's merged topology to the detector and the
// sinks when it changed, at most once per TopologyDebounce (always when
// force). A job whose hosts are all gone only waits for its last windows:
// the union its hosts left empty is not pushed.
func (a *Aggregator) pushTopologies(now int64, force bool) {
	for _, name := range a.order {
		j := a.jobs[name]
		if !j.topo.dirty || len(j.hosts) == 0 || (!force && j.lastPush != 0 && now-j.lastPush < int64(a.cfg.TopologyDebounce)) {
			continue
		}
		t := j.topo.build()
		j.lastPush = now
		if err := a.det.AddTopology(t); err != nil {
			a.log.Warn("merged topology rejected", "job", j.name, "err", err)
			continue
		}
		for _, sk := range a.cfg.Sinks {
			sk.Topology(t)
		}
		a.addStat(func(s *Stats) { s.TopoVersions++ })
		a.log.Debug("merged topology", "job", j.name, "version", t.Version, "ranks", len(t.Ranks), "groups", len(t.Groups), "hosts", len(j.hosts))
	}
}

// settle hands the windows settled since the last call (of any job) to the
// sinks with their verdicts; elapsed is how long the detector call that
// settled them took.
func (a *Aggregator) settle(elapsed time.Duration, final bool) {
	windows := a.det.TakeSettled()
	if len(windows) == 0 {
		return
	}
	verdicts := a.verdicts
	a.verdicts = nil
	byWin := map[detector.SettledWindow][]detector.Verdict{}
	for _, v := range verdicts {
		k := detector.SettledWindow{Job: v.Job, Index: v.Window, StartNS: v.WindowStartNS, EndNS: v.WindowEndNS}
		byWin[k] = append(byWin[k], v)
	}
	clear(a.lagEnds)
	for _, w := range windows {
		for _, sk := range a.cfg.Sinks {
			sk.Settled(w, byWin[w])
		}
		if j := a.jobs[w.Job]; j != nil && (!j.nextSet || w.Index+1 > j.next) {
			j.next, j.nextSet = w.Index+1, true
		}
		if end, ok := a.lagEnds[w.Job]; !ok || w.EndNS > end {
			a.lagEnds[w.Job] = w.EndNS
		}
	}
	after := a.cfg.NowMono()
	var lag time.Duration
	first := true
	for _, end := range a.lagEnds {
		if l := time.Duration(after - (end + int64(a.cfg.Detector.Lateness))); first || l > lag {
			lag, first = l, false
		}
	}
	a.addStat(func(s *Stats) {
		s.Windows += int64(len(windows))
		s.Verdicts += int64(len(verdicts))
		if elapsed > 0 {
			s.Settle = elapsed
			s.SettleMax = max(s.SettleMax, elapsed)
		}
		if !final {
			s.Lag = lag
			s.LagMax = max(s.LagMax, lag)
		}
	})
}

// checkHosts notes hosts that went silent (logged once; their ranks turn
// uncertain through the detector) and forgets hosts silent past HostTTL.
func (a *Aggregator) checkHosts(now int64) {
	silentAfter := int64(a.cfg.Detector.Window + a.cfg.Detector.Lateness)
	silent := 0
	var gone []*jobState
	for _, jn := range a.order {
		j := a.jobs[jn]
		for name, h := range j.hosts {
			quiet := now - h.lastRecv
			switch {
			case quiet > int64(a.cfg.HostTTL):
				j.topo.forget(name)
				delete(j.hosts, name)
				a.nHosts--
				a.addStat(func(s *Stats) { s.ForgottenHosts++ })
				a.log.Info("host forgotten after silence", "job", j.name, "host", name, "silent_for", time.Duration(quiet).Round(time.Second))
			case quiet > silentAfter:
				silent++
				if !h.silent {
					h.silent = true
					a.log.Warn("host silent: its ranks are uncertain until it reports again", "job", j.name, "host", name,
						"ranks", sortedRanks(h.ranks, 16), "silent_for", time.Duration(quiet).Round(time.Millisecond))
				}
			}
		}
		// Run advanced the detector to now just before: a job without
		// hosts has settled all its windows once event time is past the
		// last one (at once unless HostTTL < window + lateness).
		if len(j.hosts) == 0 && a.settledAll(j, now) {
			gone = append(gone, j)
		}
	}
	for _, j := range gone {
		a.finish(j)
	}
	hosts := a.nHosts
	a.addStat(func(s *Stats) { s.SilentHosts, s.Hosts = silent, hosts })
}

func sortedRanks(m map[int]struct{}, limit int) []int {
	rs := make([]int, 0, len(m))
	for r := range m {
		rs = append(rs, r)
	}
	sort.Ints(rs)
	if len(rs) > limit {
		rs = rs[:limit]
	}
	return rs
}

func (a *Aggregator) logStats(now int64) {
	s := a.Stats()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	a.log.Info("aggregate stats", "facts", s.Facts, "hosts", s.Hosts, "silent_hosts", s.SilentHosts,
		"windows", s.Windows, "verdicts", s.Verdicts, "late", s.LateFacts, "refused_queue", s.RefusedQueue,
		"refused_hosts", s.RefusedHosts, "refused_jobs", s.RefusedJobs, "queued", s.Queued, "settle_ms", ms3(s.Settle), "settle_max_ms", ms3(s.SettleMax),
		"lag_ms", ms3(s.Lag), "lag_max_ms", ms3(s.LagMax), "max_age_ms", ms3(s.MaxAge),
		"heap_mib", fmt.Sprintf("%.1f", float64(ms.HeapAlloc)/(1<<20)), "sys_mib", fmt.Sprintf("%.1f", float64(ms.Sys)/(1<<20)))
	a.statsMu.Lock()
	a.stats.MaxAge = 0
	a.statsMu.Unlock()
	_ = now
}

func ms3(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/1e6) }
