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

	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/internal/monoclock"
	"github.com/slowrank/slowrank/otel/wire"
)

// Sink receives the aggregator's results, from the aggregator's goroutine,
// as an agent's sinks do (detector.Sink says in which order).
type Sink = detector.Sink

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
	// MaxRanks bounds the ranks with state over all jobs (default 1<<19;
	// the detector's MaxRanks bounds them per job). A rank gets state
	// from its steps only: ranks that a topology names but that send no
	// step are left out of the topology handed to the detector. Steps of
	// further ranks are refused and counted.
	MaxRanks int
	// MaxJobsPerHost and MaxRanksPerHost are one host name's quota: the
	// jobs it takes part in (default 16) and the ranks it sends steps for
	// over them (default 1024). Facts beyond them are refused and counted.
	MaxJobsPerHost, MaxRanksPerHost int
	// MaxRanksPerClient, MaxHostsPerClient and MaxJobsPerClient are one
	// client's share (a client is what the receiver authenticated: a
	// client certificate, else a source address; see clientID): the ranks
	// it sends steps for, per host name (default MaxRanks/16, at least
	// 1024), the host names it brings in (default MaxHosts/16, at least
	// 64) and the jobs those hosts are in (default a quarter of the
	// detector's MaxJobs, at least 16; none above its global bound). Host
	// names a client claims do not multiply it, and no one client fills
	// the global budgets.
	MaxRanksPerClient, MaxHostsPerClient, MaxJobsPerClient int
	// MaxQueuePerClient bounds one client's facts waiting for the detector
	// (default QueueFacts/4, at least 4096 or QueueFacts), and a client
	// may have a quarter of the queue's batches waiting: a flooding client
	// gets ErrQueueFull, the others still get in.
	MaxQueuePerClient int
	// MaxTopologyEntries bounds what the hosts' topologies store over all
	// jobs: one entry per rank a host lists and per member of each
	// distinct member list (default 1<<23, about 100 MiB). A topology
	// beyond it is refused (the host's previous one is kept).
	MaxTopologyEntries int
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
	if c.MaxRanks <= 0 {
		c.MaxRanks = 1 << 19
	}
	if c.MaxJobsPerHost <= 0 {
		c.MaxJobsPerHost = 16
	}
	if c.MaxRanksPerHost <= 0 {
		c.MaxRanksPerHost = 1024
	}
	if c.MaxTopologyEntries <= 0 {
		c.MaxTopologyEntries = 1 << 23
	}
	// A client's default share: a part of the global bound, but never
	// less than a floor an honest client (a collector relaying a fleet)
	// may need, unless the global bound itself is lower.
	share := func(global, part, floor int) int { return max(global/part, min(global, floor)) }
	if c.MaxRanksPerClient <= 0 {
		c.MaxRanksPerClient = share(c.MaxRanks, 16, 1024)
	}
	if c.MaxHostsPerClient <= 0 {
		c.MaxHostsPerClient = share(c.MaxHosts, 16, 64)
	}
	if c.MaxJobsPerClient <= 0 {
		c.MaxJobsPerClient = share(c.Detector.MaxJobs, 4, 16)
	}
	if c.MaxQueuePerClient <= 0 {
		c.MaxQueuePerClient = share(c.QueueFacts, 4, 4096)
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
func MonoNow() int64 { return monoclock.Now() }

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
	// queuedBy counts, per client, its facts and batches waiting (its share
	// of QueueFacts and of in's capacity).
	queuedMu sync.Mutex
	queuedBy map[string]queuedShare

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
	nRanks    int                   // ranks with state over all jobs (MaxRanks)
	quotas    map[string]*hostQuota // by host name
	clients   map[string]*clientQuota
	topoUsed  topoBudget
	lastStats int64
	ran       bool

	statsMu sync.Mutex
	stats   Stats
	done    chan struct{}
}

type batch struct {
	recv   int64
	client string // who sent it (Offer)
	facts  []wire.Fact
}

type queuedShare struct{ facts, batches int }

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
	// ranks counts, per rank that sent steps, the hosts that sent them: the
	// ranks the detector may know from the topology.
	ranks map[int]int
	// ranksChanged: ranks came or went since the last topology push.
	ranksChanged bool
}

type hostState struct {
	lastRecv int64
	silent   bool
	// ranks it sent steps for (its quota), each with the client charged
	// for it (the one that sent its first step).
	ranks map[int]*clientQuota
	// client brought the host in and is charged for it.
	client *clientQuota
}

// hostQuota is what one host name holds over all jobs.
type hostQuota struct{ jobs, ranks int }

// clientQuota is what one client holds over all jobs: the host states it
// brought in (per job) and the ranks it sent first steps for.
type clientQuota struct {
	id    string
	hosts int
	jobs  map[string]int // job → its hosts there
	ranks int
}

// Stats are the aggregator's counters. Times are on its CLOCK_MONOTONIC.
type Stats struct {
	Facts              int64 // step facts handed to the detector
	Topologies         int64 // topology facts received
	TopoVersions       int64 // merged versions built
	RefusedQueue       int64 // facts refused because the queue was full
	RefusedQueueClient int64 // facts refused because their client had MaxQueuePerClient waiting
	RefusedHosts       int64 // facts of hosts beyond MaxHosts / MaxHostsPerJob
	RefusedHostsClient int64 // facts of hosts beyond their client's MaxHostsPerClient
	RefusedJobs        int64 // facts of jobs beyond the detector's MaxJobs, a host's MaxJobsPerHost or a client's MaxJobsPerClient
	RefusedRanks       int64 // steps of ranks beyond MaxRanks, the detector's MaxRanks or MaxRanksPerHost
	RefusedRanksClient int64 // steps of ranks beyond their client's MaxRanksPerClient
	RefusedTopos       int64 // topologies beyond MaxTopologyEntries
	Ranks              int   // ranks with state now
	FinishedJobs       int64 // jobs forgotten after all their hosts were
	Invalid            int64 // facts the detector rejected
	Windows            int64 // windows settled
	Verdicts           int64
	Hosts              int   // hosts tracked
	SilentHosts        int   // hosts silent for more than a window plus lateness
	ForgottenHosts     int64 // hosts forgotten after HostTTL
	Queued             int64 // facts waiting now
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
	if cfg.MaxHosts < 0 || cfg.MaxHostsPerJob < 0 || cfg.QueueFacts < 0 || cfg.MaxRanks < 0 ||
		cfg.MaxJobsPerHost < 0 || cfg.MaxRanksPerHost < 0 || cfg.MaxTopologyEntries < 0 ||
		cfg.MaxRanksPerClient < 0 || cfg.MaxHostsPerClient < 0 || cfg.MaxJobsPerClient < 0 || cfg.MaxQueuePerClient < 0 {
		return nil, fmt.Errorf("aggregate: negative limit (max hosts %d, per job %d, queue %d, ranks %d, jobs per host %d, ranks per host %d, topology entries %d, per client: ranks %d, hosts %d, jobs %d, queue %d); 0 takes the default",
			cfg.MaxHosts, cfg.MaxHostsPerJob, cfg.QueueFacts, cfg.MaxRanks, cfg.MaxJobsPerHost, cfg.MaxRanksPerHost, cfg.MaxTopologyEntries,
			cfg.MaxRanksPerClient, cfg.MaxHostsPerClient, cfg.MaxJobsPerClient, cfg.MaxQueuePerClient)
	}
	if err := checkTimes(cfg); err != nil {
		return nil, err
	}
	det, err := detector.New(cfg.Detector)
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Aggregator{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "aggregate"),
		det:      det,
		lagEnds:  map[string]int64{},
		in:       make(chan batch, 4096),
		jobs:     map[string]*jobState{},
		quotas:   map[string]*hostQuota{},
		clients:  map[string]*clientQuota{},
		queuedBy: map[string]queuedShare{},
		topoUsed: topoBudget{limit: cfg.MaxTopologyEntries},
		done:     make(chan struct{}),
	}, nil
}

// maxSpan bounds the aggregator's durations (window, lateness, how long a
// host is kept) so that sums of them and of a time never overflow.
const maxSpan = 30 * 24 * time.Hour

// checkTimes refuses durations whose sums the timeline cannot hold: a
// window or lateness beyond a day, a host kept (HostTTL, or EvictAfter
// windows) beyond 30 days.
func checkTimes(cfg Config) error {
	d := cfg.Detector
	switch {
	case d.Window > 24*time.Hour || d.Lateness > 24*time.Hour:
		return fmt.Errorf("aggregate: window %s and lateness %s must be at most 24h", d.Window, d.Lateness)
	case cfg.HostTTL < 0 || cfg.HostTTL > maxSpan:
		return fmt.Errorf("aggregate: host TTL %s must be in [0, %s]", cfg.HostTTL, maxSpan)
	case cfg.HostTTL == 0 && d.Window > 0 && int64(d.EvictAfter) > int64(maxSpan/d.Window):
		return fmt.Errorf("aggregate: %d windows of %s (evict-after) is more than %s", d.EvictAfter, d.Window, maxSpan)
	case cfg.TopologyDebounce < 0 || cfg.TopologyDebounce > time.Hour || cfg.Tick < 0 || cfg.Tick > time.Hour:
		return fmt.Errorf("aggregate: topology debounce %s and tick %s must be in [0, 1h]", cfg.TopologyDebounce, cfg.Tick)
	}
	return nil
}

// Offer hands the facts of one request from client (the identity the
// receiver authenticated), received at recvMono (the aggregator's
// CLOCK_MONOTONIC), to the detector goroutine. It never blocks:
// ErrQueueFull when the detector is behind or the client has its share of
// the queue waiting (the sender should retry).
func (a *Aggregator) Offer(recvMono int64, client string, facts []wire.Fact) error {
	if len(facts) == 0 {
		return nil
	}
	if a.closed.Load() {
		return ErrQueueFull
	}
	n := int64(len(facts))
	if !a.enqueueShare(client, len(facts)) {
		a.addStat(func(s *Stats) { s.RefusedQueueClient += n })
		return ErrQueueFull
	}
	if a.queued.Add(n) > int64(a.cfg.QueueFacts) {
		a.queued.Add(-n)
		a.dequeueShare(client, len(facts))
		a.addStat(func(s *Stats) { s.RefusedQueue += n })
		return ErrQueueFull
	}
	select {
	case a.in <- batch{recvMono, client, facts}:
		return nil
	default:
		a.queued.Add(-n)
		a.dequeueShare(client, len(facts))
		a.addStat(func(s *Stats) { s.RefusedQueue += n })
		return ErrQueueFull
	}
}

// enqueueShare counts a client's batch of n facts as waiting, within its
// share of the queue's facts and of its batches.
func (a *Aggregator) enqueueShare(client string, n int) bool {
	a.queuedMu.Lock()
	defer a.queuedMu.Unlock()
	q := a.queuedBy[client]
	if q.facts+n > a.cfg.MaxQueuePerClient || q.batches+1 > max(cap(a.in)/4, 1) {
		return false
	}
	a.queuedBy[client] = queuedShare{q.facts + n, q.batches + 1}
	return true
}

func (a *Aggregator) dequeueShare(client string, n int) {
	a.queuedMu.Lock()
	defer a.queuedMu.Unlock()
	q := a.queuedBy[client]
	q.facts -= n
	if q.batches--; q.batches <= 0 {
		delete(a.queuedBy, client)
		return
	}
	a.queuedBy[client] = q
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
	j := &jobState{name: name, topo: newTopoMerge(name, &a.topoUsed), hosts: map[string]*hostState{}, ranks: map[int]int{}}
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

// hostRefusal says which bound refused a fact.
type hostRefusal int

const (
	admitted      hostRefusal = iota
	refusedHost               // MaxHosts, MaxHostsPerJob
	refusedClient             // the client's MaxHostsPerClient
	refusedJob                // the host's MaxJobsPerHost or the client's MaxJobsPerClient
)

// host returns the state of host in job, creating it within the bounds,
// charged to client (nil beyond, and which bound it was).
func (a *Aggregator) host(j *jobState, client, name string, now int64) (*hostState, hostRefusal) {
	if h, ok := j.hosts[name]; ok {
		if h.silent {
			h.silent = false
			a.log.Info("host reporting again: its ranks are judged again", "job", j.name, "host", name,
				"silent_for", time.Duration(now-h.lastRecv).Round(time.Millisecond))
		}
		h.lastRecv = now
		return h, admitted
	}
	if a.nHosts >= a.cfg.MaxHosts || len(j.hosts) >= a.cfg.MaxHostsPerJob {
		return nil, refusedHost
	}
	cq := a.client(client)
	if cq.hosts >= a.cfg.MaxHostsPerClient {
		return nil, refusedClient
	}
	if cq.jobs[j.name] == 0 && len(cq.jobs) >= a.cfg.MaxJobsPerClient {
		return nil, refusedJob
	}
	q := a.quotas[name]
	if q == nil {
		q = &hostQuota{}
		a.quotas[name] = q
	}
	if q.jobs >= a.cfg.MaxJobsPerHost {
		a.release(cq) // a client new here holds nothing
		return nil, refusedJob
	}
	q.jobs++
	cq.hosts++
	cq.jobs[j.name]++
	h := &hostState{lastRecv: now, ranks: map[int]*clientQuota{}, client: cq}
	j.hosts[name] = h
	a.nHosts++
	return h, admitted
}

// client returns a client's quota (new ones hold nothing yet; a quota that
// comes to hold nothing is dropped by release).
func (a *Aggregator) client(id string) *clientQuota {
	cq := a.clients[id]
	if cq == nil {
		cq = &clientQuota{id: id, jobs: map[string]int{}}
		a.clients[id] = cq
	}
	return cq
}

// release drops a client's quota once it holds nothing.
func (a *Aggregator) release(cq *clientQuota) {
	if cq.hosts <= 0 && cq.ranks <= 0 {
		delete(a.clients, cq.id)
	}
}

// claimRank records that host sent steps of rank r in job j, within the
// host's quota, the sending client's share, the job's MaxRanks and the
// global MaxRanks; it reports whether the step may be judged (and, when
// not, whether the client's share was the bound).
func (a *Aggregator) claimRank(j *jobState, client, name string, h *hostState, r int) (ok, clientShare bool) {
	if _, ok := h.ranks[r]; ok {
		return true, false
	}
	q := a.quotas[name]
	newRank := j.ranks[r] == 0
	if q.ranks >= a.cfg.MaxRanksPerHost ||
		newRank && (a.nRanks >= a.cfg.MaxRanks || len(j.ranks) >= a.cfg.Detector.MaxRanks) {
		return false, false
	}
	cq := a.client(client)
	if cq.ranks >= a.cfg.MaxRanksPerClient {
		a.release(cq)
		return false, true
	}
	h.ranks[r] = cq
	cq.ranks++
	q.ranks++
	if newRank {
		a.nRanks++
		j.ranksChanged = true
	}
	j.ranks[r]++
	return true, false
}

// forgetHost drops a host from a job: its topology, its ranks (a rank no
// other host of the job sends steps for leaves the topology handed to the
// detector) and its quota.
func (a *Aggregator) forgetHost(j *jobState, name string, h *hostState) {
	j.topo.forget(name)
	q := a.quotas[name]
	for r, cq := range h.ranks {
		q.ranks--
		cq.ranks--
		a.release(cq)
		if j.ranks[r]--; j.ranks[r] <= 0 {
			delete(j.ranks, r)
			a.nRanks--
			j.ranksChanged = true
		}
	}
	if q.jobs--; q.jobs <= 0 {
		delete(a.quotas, name)
	}
	cq := h.client
	cq.hosts--
	if cq.jobs[j.name]--; cq.jobs[j.name] <= 0 {
		delete(cq.jobs, j.name)
	}
	a.release(cq)
	delete(j.hosts, name)
	a.nHosts--
}

func (a *Aggregator) handle(b batch) {
	a.queued.Add(-int64(len(b.facts)))
	a.dequeueShare(b.client, len(b.facts))
	var facts, topos, refused, refusedJobs, refusedRanks, refusedTopos, invalid, late int64
	var refusedHostsClient, refusedRanksClient int64
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
		h, why := a.host(j, b.client, f.Host, b.recv)
		switch why {
		case refusedJob:
			refusedJobs++
			continue
		case refusedClient:
			refusedHostsClient++
			continue
		case refusedHost:
			refused++
			continue
		}
		if f.Topology != nil {
			topos++
			if _, err := j.topo.update(f.Host, f.Topology); err != nil {
				refusedTopos++
				a.log.Debug("topology refused", "job", j.name, "host", f.Host, "err", err)
			}
			continue
		}
		if ok, share := a.claimRank(j, b.client, f.Host, h, f.Step.Rank); !ok {
			if share {
				refusedRanksClient++
			} else {
				refusedRanks++
			}
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
		st.RefusedRanks += refusedRanks
		st.RefusedHostsClient += refusedHostsClient
		st.RefusedRanksClient += refusedRanksClient
		st.RefusedTopos += refusedTopos
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
		changed := j.topo.dirty || j.ranksChanged && len(j.topo.hosts) > 0
		if !changed || len(j.hosts) == 0 || (!force && j.lastPush != 0 && now-j.lastPush < int64(a.cfg.TopologyDebounce)) {
			continue
		}
		t := j.topo.build(func(r int) bool { return j.ranks[r] > 0 })
		j.lastPush, j.ranksChanged = now, false
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
				a.forgetHost(j, name, h)
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
	hosts, ranks := a.nHosts, a.nRanks
	a.addStat(func(s *Stats) { s.SilentHosts, s.Hosts, s.Ranks = silent, hosts, ranks })
}

func sortedRanks[V any](m map[int]V, limit int) []int {
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
		"refused_hosts", s.RefusedHosts, "refused_jobs", s.RefusedJobs, "refused_ranks", s.RefusedRanks, "refused_ranks_client", s.RefusedRanksClient, "refused_hosts_client", s.RefusedHostsClient, "refused_queue_client", s.RefusedQueueClient, "refused_topologies", s.RefusedTopos, "ranks", s.Ranks, "queued", s.Queued, "settle_ms", ms3(s.Settle), "settle_max_ms", ms3(s.SettleMax),
		"lag_ms", ms3(s.Lag), "lag_max_ms", ms3(s.LagMax), "max_age_ms", ms3(s.MaxAge),
		"heap_mib", fmt.Sprintf("%.1f", float64(ms.HeapAlloc)/(1<<20)), "sys_mib", fmt.Sprintf("%.1f", float64(ms.Sys)/(1<<20)))
	a.statsMu.Lock()
	a.stats.MaxAge = 0
	a.statsMu.Unlock()
	_ = now
}

func ms3(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/1e6) }
