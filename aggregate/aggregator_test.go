package aggregate

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/otel/wire"
)

// capture is a Sink that keeps everything.
type capture struct {
	mu       sync.Mutex
	steps    []detector.Step
	topos    []detector.Topology
	verdicts []detector.Verdict
	windows  []detector.SettledWindow
}

func (c *capture) Topology(t detector.Topology) {
	c.mu.Lock()
	c.topos = append(c.topos, t)
	c.mu.Unlock()
}

func (c *capture) Step(s detector.Step, _ int64) {
	c.mu.Lock()
	c.steps = append(c.steps, s)
	c.mu.Unlock()
}

func (c *capture) Settled(w detector.SettledWindow, vs []detector.Verdict) {
	c.mu.Lock()
	c.windows = append(c.windows, w)
	c.verdicts = append(c.verdicts, vs...)
	c.mu.Unlock()
}

func (c *capture) snapshot() ([]detector.Verdict, []detector.SettledWindow) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]detector.Verdict(nil), c.verdicts...), append([]detector.SettledWindow(nil), c.windows...)
}

func testDetector() detector.Config {
	d := detector.DefaultConfig()
	d.Window = time.Second
	d.Lateness = 300 * time.Millisecond
	d.EmitOK = true
	d.Phases = []string{detector.PhaseHost}
	d.CohortType = "dp"
	return d
}

// simHost is one simulated agent: its own CLOCK_MONOTONIC origin, its
// ranks, the network delay to the aggregator.
type simHost struct {
	name    string
	offset  int64 // host clock = true time + offset
	ranks   []int
	transit int64
	queue   []detector.Step
	topoVer int
}

// simulation drives an Aggregator on a fake clock: every host finishes one
// step per rank every stepNS, and forwards its queue every sendNS.
type simulation struct {
	t       *testing.T
	agg     *Aggregator
	cap     *capture
	hosts   []*simHost
	now     int64 // true time, ns
	stepNS  int64
	sendNS  int64
	step    int64
	slow    map[int]float64 // rank → host phase factor
	silent  map[string]bool // host → link down (its sends are lost, queue kept)
	aggBase int64
}

func newSimulation(t *testing.T, hosts []*simHost) *simulation {
	t.Helper()
	s := &simulation{t: t, cap: &capture{}, hosts: hosts, stepNS: int64(100 * time.Millisecond),
		sendNS: int64(200 * time.Millisecond), slow: map[int]float64{}, silent: map[string]bool{}, aggBase: 777_000_000_000}
	a, err := New(Config{Detector: testDetector(), Sinks: []Sink{s.cap}, NowMono: func() int64 { return s.now + s.aggBase }, StatsEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	s.agg = a
	var all []int
	for _, h := range hosts {
		all = append(all, h.ranks...)
	}
	sort.Ints(all)
	for _, h := range hosts {
		// Each agent lists its own ranks and the world group in full.
		h.topoVer++
		t := detector.Topology{Kind: detector.KindTopology, Job: "j", Version: h.topoVer,
			Groups: []detector.Group{{ID: "world", Type: "world", Ranks: all}}}
		for i, r := range h.ranks {
			t.Ranks = append(t.Ranks, detector.RankInfo{Rank: r, Host: h.name, LocalRank: i})
		}
		s.agg.handle(batch{recv: s.aggNow(), facts: []wire.Fact{{Host: h.name, Topology: &t}}})
	}
	return s
}

func (s *simulation) aggNow() int64 { return s.now + s.aggBase }

// run advances true time by d, 10 ms at a time.
func (s *simulation) run(d time.Duration) {
	end := s.now + int64(d)
	for s.now < end {
		s.now += int64(10 * time.Millisecond)
		if s.now%s.stepNS == 0 {
			s.step++
			slowest := 0.0
			for _, h := range s.hosts {
				for _, r := range h.ranks {
					slowest = max(slowest, 10.0*s.slowFactor(r))
				}
			}
			for _, h := range s.hosts {
				for _, r := range h.ranks {
					host := 10.0 * s.slowFactor(r)
					// The step's collectives take 1 ms on the GPU plus the
					// wait for the slowest rank (Step.DeviceCollMS).
					coll := 1 + slowest - host
					st := detector.Step{Kind: detector.KindStep, Job: "j", Rank: r, Step: s.step, Host: h.name,
						StartNS: s.now - s.stepNS + h.offset, EndNS: s.now + h.offset, Topo: h.topoVer,
						Phases: exposedHost(host, slowest), DeviceCollMS: &coll}
					h.queue = append(h.queue, st)
				}
			}
		}
		if s.now%s.sendNS == 0 {
			for _, h := range s.hosts {
				if len(h.queue) == 0 || s.silent[h.name] {
					continue // the forwarder keeps its queue while the link is down
				}
				facts := make([]wire.Fact, len(h.queue))
				for i := range h.queue {
					st := h.queue[i]
					facts[i] = wire.Fact{Host: h.name, SentMono: s.now + h.offset, Step: &st}
				}
				h.queue = h.queue[:0]
				// Arrives transit later; the aggregator stamps then.
				s.now += h.transit
				s.agg.handle(batch{recv: s.aggNow(), facts: facts})
				s.now -= h.transit
			}
		}
		if s.now%int64(200*time.Millisecond) == 0 {
			s.agg.tick(s.aggNow())
		}
	}
}

func (s *simulation) slowFactor(r int) float64 {
	if f, ok := s.slow[r]; ok {
		return f
	}
	return 1
}

// statesBetween returns rank → states of verdicts of windows that lie in
// [from, to) of true time.
func (s *simulation) statesBetween(from, to time.Duration) map[int]map[string]int {
	vs, _ := s.cap.snapshot()
	out := map[int]map[string]int{}
	for _, v := range vs {
		if v.WindowStartNS < int64(from)+s.aggBase || v.WindowEndNS > int64(to)+s.aggBase {
			continue
		}
		if out[v.Rank] == nil {
			out[v.Rank] = map[string]int{}
		}
		out[v.Rank][v.State]++
	}
	return out
}

func threeHosts() []*simHost {
	return []*simHost{
		{name: "h0", offset: 1_000_000_000, ranks: []int{0, 1}},
		{name: "h1", offset: 5_000_000_000_000_000, ranks: []int{2, 3}, transit: int64(40 * time.Millisecond)},
		{name: "h2", offset: 123, ranks: []int{4, 5}, transit: int64(5 * time.Millisecond)},
	}
}

func TestSlowRankFoundAcrossHostsWithUnrelatedClocks(t *testing.T) {
	s := newSimulation(t, threeHosts())
	s.slow[3] = 1.5
	s.run(8 * time.Second)
	got := s.statesBetween(2*time.Second, 8*time.Second)
	if got[3][detector.StateStraggler] == 0 {
		t.Fatalf("rank 3 never a straggler: %v", got)
	}
	// Its peers on the other hosts waited for it on their GPUs, which
	// their collectives' GPU time says without comparing clocks.
	vs, _ := s.cap.snapshot()
	for _, v := range vs {
		if v.Rank == 3 && v.State == detector.StateStraggler &&
			(v.DeviceCollMS == nil || *v.DeviceCollMS != 1 || *v.DeviceCollPeerMS != 6 || !strings.Contains(v.Reason, "they waited for it")) {
			t.Fatalf("rank 3's device evidence: %v of its peers' %v ms; %s", v.DeviceCollMS, v.DeviceCollPeerMS, v.Reason)
		}
	}
	for r := range 6 {
		if r == 3 {
			continue
		}
		if n := got[r][detector.StateOK]; n == 0 || len(got[r]) != 1 {
			t.Errorf("rank %d: %v (want only ok)", r, got[r])
		}
	}
	// One merged topology of all six ranks, version 1.
	if len(s.cap.topos) != 1 || len(s.cap.topos[0].Ranks) != 6 || s.cap.topos[0].Version != 1 {
		t.Fatalf("merged topologies %+v", s.cap.topos)
	}
	// Facts were rebased onto the aggregator's clock: their ends lie within
	// the run (plus the one-way transit, which nobody can subtract),
	// whatever the hosts' clocks said.
	for _, st := range s.cap.steps {
		if st.EndNS < s.aggBase || st.EndNS > s.aggNow()+int64(40*time.Millisecond) {
			t.Fatalf("step not on the aggregator's timeline: %+v", st)
		}
	}
}

func TestSilentHostMakesOnlyItsRanksUncertain(t *testing.T) {
	s := newSimulation(t, threeHosts())
	s.slow[3] = 1.5
	s.run(6 * time.Second)
	s.silent["h2"] = true
	s.run(5 * time.Second) // 6 s .. 11 s: h2's link is down
	s.silent["h2"] = false
	s.run(6 * time.Second) // 11 s .. 17 s

	during := s.statesBetween(7*time.Second, 11*time.Second)
	for _, r := range []int{4, 5} {
		if n := during[r][detector.StateUncertain]; n == 0 || len(during[r]) != 1 {
			t.Errorf("silent rank %d: %v (want only uncertain)", r, during[r])
		}
	}
	if during[3][detector.StateStraggler] == 0 || during[3][detector.StateUncertain] != 0 {
		t.Errorf("rank 3 while h2 was silent: %v", during[3])
	}
	for _, r := range []int{0, 1, 2} {
		if len(during[r]) != 1 || during[r][detector.StateOK] == 0 {
			t.Errorf("rank %d while h2 was silent: %v (want only ok)", r, during[r])
		}
	}
	after := s.statesBetween(12*time.Second, 17*time.Second)
	for _, r := range []int{4, 5} {
		if n := after[r][detector.StateOK]; n == 0 || after[r][detector.StateUncertain] != 0 {
			t.Errorf("rank %d after h2 came back: %v (want judged ok again)", r, after[r])
		}
	}
	// h2's backlog carried its true age: late, not mixed into the present.
	if st := s.agg.Stats(); st.LateFacts == 0 {
		t.Errorf("the backlog of a silent host was not counted late: %+v", st)
	}
}

func TestSilentStragglerStaysUncertainNeverRecovered(t *testing.T) {
	s := newSimulation(t, threeHosts())
	s.slow[4] = 1.5 // on h2
	s.run(6 * time.Second)
	s.silent["h2"] = true
	s.run(5 * time.Second)
	s.silent["h2"] = false
	s.run(6 * time.Second)
	vs, _ := s.cap.snapshot()
	var seq []string
	for _, v := range vs {
		if v.Rank != 4 {
			continue
		}
		in := v.WindowStartNS >= int64(7*time.Second)+s.aggBase && v.WindowEndNS <= int64(11*time.Second)+s.aggBase
		if in {
			if v.State != detector.StateUncertain || !v.AlertActive {
				t.Errorf("window %d while silent: %s alert_active=%v (want uncertain, alert kept)", v.Window, v.State, v.AlertActive)
			}
		}
		seq = append(seq, v.State)
	}
	for _, st := range seq {
		if st == detector.StateRecovered {
			t.Fatalf("a silent straggler recovered: %v", seq)
		}
	}
	after := s.statesBetween(12*time.Second, 17*time.Second)
	if after[4][detector.StateStraggler] == 0 {
		t.Errorf("rank 4 not judged again after its host returned: %v (all: %v)", after[4], seq)
	}
}

func TestHostLimitAndForgetting(t *testing.T) {
	c := &capture{}
	now := int64(1e12)
	det := testDetector()
	a, err := New(Config{Detector: det, Sinks: []Sink{c}, MaxHosts: 2, HostTTL: 3 * time.Second,
		NowMono: func() int64 { return now }, StatsEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		st := detector.Step{Kind: detector.KindStep, Job: "j", Rank: i, Step: 1, StartNS: 0, EndNS: 10, Phases: map[string]float64{}}
		a.handle(batch{recv: now, facts: []wire.Fact{{Host: fmt.Sprint("h", i), Step: &st}}})
	}
	if st := a.Stats(); st.RefusedHosts != 1 {
		t.Fatalf("refused %d, want 1", st.RefusedHosts)
	}
	now += int64(4 * time.Second)
	a.tick(now)
	if st := a.Stats(); st.ForgottenHosts != 2 || st.Hosts != 0 || st.FinishedJobs != 1 {
		t.Fatalf("after the TTL: %+v", st)
	}
	// The job went with its hosts: its summary is kept, its slot is free.
	if len(a.finished) != 1 || a.finished[0].Job != "j" || a.finished[0].Facts != 2 || len(a.jobs) != 0 {
		t.Fatalf("finished %+v, jobs %d", a.finished, len(a.jobs))
	}
}

func TestJobLimit(t *testing.T) {
	det := testDetector()
	det.MaxJobs = 2
	a, err := New(Config{Detector: det, StatsEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		st := detector.Step{Kind: detector.KindStep, Job: fmt.Sprint("job", i), Rank: 0, EndNS: 10, Phases: map[string]float64{}}
		a.handle(batch{recv: 1, facts: []wire.Fact{{Host: "h", Step: &st}}})
	}
	if st := a.Stats(); st.RefusedJobs != 1 || st.Facts != 2 {
		t.Fatalf("%+v", st)
	}
}

func TestOfferRefusesWhenQueueFull(t *testing.T) {
	a, err := New(Config{Detector: testDetector(), QueueFacts: 3, MaxQueuePerClient: 3, StatsEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	st := detector.Step{Kind: detector.KindStep, Job: "j", Rank: 1, EndNS: 10, Phases: map[string]float64{}}
	f := []wire.Fact{{Host: "h", Step: &st}, {Host: "h", Step: &st}}
	if err := a.Offer(1, "a", f); err != nil {
		t.Fatal(err)
	}
	if err := a.Offer(1, "b", f); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("second offer: %v, want ErrQueueFull", err)
	}
	if got := a.Stats(); got.RefusedQueue != 2 || got.Queued != 2 {
		t.Fatalf("%+v", got)
	}
}

func TestOneClientGetsOnlyItsShareOfTheQueue(t *testing.T) {
	a, err := New(Config{Detector: testDetector(), QueueFacts: 8, MaxQueuePerClient: 4, StatsEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	st := detector.Step{Kind: detector.KindStep, Job: "j", Rank: 1, EndNS: 10, Phases: map[string]float64{}}
	f := []wire.Fact{{Host: "h", Step: &st}, {Host: "h", Step: &st}}
	for i, want := range []bool{true, true, false} {
		if err := a.Offer(1, "flood", f); (err == nil) != want {
			t.Fatalf("flooding client's offer %d: %v, want accepted %v", i, err, want)
		}
	}
	if err := a.Offer(1, "honest", f); err != nil {
		t.Fatalf("another client behind a flooding one: %v", err)
	}
	if got := a.Stats(); got.RefusedQueue != 0 || got.RefusedQueueClient != 2 || got.Queued != 6 {
		t.Fatalf("%+v", got)
	}
	a.drain()
	if err := a.Offer(1, "flood", f); err != nil || len(a.queuedBy) != 1 {
		t.Fatalf("after the queue drained: %v, %d clients counted", err, len(a.queuedBy))
	}
}

// exposedHost gives the phases of a step whose host time is hostMS in a job
// whose slowest rank spent slowest: every rank waits for the slowest in a
// blocking collective, so a slow rank's extra host time is exposed.
func exposedHost(hostMS, slowest float64) map[string]float64 {
	return map[string]float64{detector.PhaseStep: 90 + slowest, detector.PhaseHost: hostMS, detector.PhaseCollWait: slowest - hostMS}
}

// jobFeed sends one step per rank of one job from one host, stamped on the
// aggregator's clock (age 0).
func jobFeed(a *Aggregator, job, host string, ranks []int, step int64, now int64, hostMS func(rank int) float64) {
	facts := make([]wire.Fact, 0, len(ranks))
	slowest := 0.0
	for _, r := range ranks {
		slowest = max(slowest, hostMS(r))
	}
	for _, r := range ranks {
		st := detector.Step{Kind: detector.KindStep, Job: job, Rank: r, Step: step, Host: host,
			StartNS: now - int64(100*time.Millisecond), EndNS: now,
			Phases: exposedHost(hostMS(r), slowest)}
		facts = append(facts, wire.Fact{Host: host, Step: &st})
	}
	a.handle(batch{recv: now, facts: facts})
}

// One detector judges every job: each keeps its own origin and verdicts
// (the same rank numbers in two jobs are different ranks), and a finished
// job leaves the other untouched and frees its slot.
func TestJobsJudgedApartAndForgotten(t *testing.T) {
	c := &capture{}
	base := int64(5e12)
	now := base
	det := testDetector()
	det.MaxJobs = 2
	a, err := New(Config{Detector: det, Sinks: []Sink{c}, HostTTL: 3 * time.Second,
		NowMono: func() int64 { return now }, StatsEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	slowA := func(r int) float64 {
		if r == 1 {
			return 15
		}
		return 10
	}
	even := func(int) float64 { return 10 }
	const ms = int64(time.Millisecond)
	t0b := base + 430*ms // job b starts later: its own origin
	var step int64
	aRuns := func() bool { return now < base+int64(5*time.Second) }
	for now < base+int64(14*time.Second) {
		now += 10 * ms
		if (now-base)%(100*ms) == 0 {
			step++
			if aRuns() {
				jobFeed(a, "a", "ha", []int{0, 1}, step, now, slowA)
			}
		}
		if now >= t0b && (now-t0b)%(100*ms) == 0 {
			jobFeed(a, "b", "hb", []int{0, 1}, step, now, even)
		}
		if (now-base)%(200*ms) == 0 {
			a.tick(now)
		}
	}
	vs, ws := c.snapshot()
	states := map[string]map[int]map[string]int{"a": {}, "b": {}}
	for _, v := range vs {
		if states[v.Job][v.Rank] == nil {
			states[v.Job][v.Rank] = map[string]int{}
		}
		states[v.Job][v.Rank][v.State]++
	}
	if states["a"][1][detector.StateStraggler] == 0 || states["a"][0][detector.StateStraggler] != 0 {
		t.Errorf("job a: %v", states["a"])
	}
	for r, st := range states["b"] {
		if st[detector.StateOK] == 0 || st[detector.StateStraggler]+st[detector.StateCandidate]+st[detector.StateUncertain] != 0 {
			t.Errorf("job b rank %d: %v (want only ok: job a's slow rank 1 is not b's)", r, st)
		}
	}
	var bAfter int
	for _, w := range ws {
		if w.Job == "b" {
			if (w.StartNS-t0b)%int64(det.Window) != 0 {
				t.Fatalf("job b's window %+v not on its own origin %d", w, t0b)
			}
			if w.StartNS > base+int64(10*time.Second) {
				bAfter++
			}
		}
	}
	if bAfter == 0 {
		t.Errorf("job b stopped settling after job a finished")
	}
	st := a.Stats()
	if st.FinishedJobs != 1 || len(a.finished) != 1 || a.finished[0].Job != "a" || len(a.finished[0].Stragglers) != 1 {
		t.Fatalf("finished %+v, stats %+v", a.finished, st)
	}
	if _, ok := a.det.WindowOf("a", now); ok {
		t.Fatalf("the detector still holds the finished job")
	}
	// Job a coming back takes the freed slot and starts afresh (its own
	// new origin); a third job finds no slot.
	jobFeed(a, "a", "ha", []int{0}, 1, now, even)
	if w, ok := a.det.WindowOf("a", now+int64(det.Window)/2); !ok || w != 0 {
		t.Fatalf("returning job's window %d %v, want 0 on a new origin", w, ok)
	}
	jobFeed(a, "c", "hc", []int{0}, 1, now, even)
	if st := a.Stats(); st.RefusedJobs != 1 {
		t.Fatalf("refused %d jobs with two live ones, want 1", st.RefusedJobs)
	}
}

// A host forgotten sooner than a window plus the lateness (--evict-after 1)
// leaves its job waiting for its last window, which settles on time and
// reaches the sinks before the job is finished.
func TestJobFinishedAfterItsLastWindow(t *testing.T) {
	c := &capture{}
	base := int64(7e12)
	now := base
	det := testDetector() // window 1 s, lateness 300 ms
	a, err := New(Config{Detector: det, Sinks: []Sink{c}, HostTTL: 500 * time.Millisecond,
		NowMono: func() int64 { return now }, StatsEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	const ms = int64(time.Millisecond)
	even := func(int) float64 { return 10 }
	var step int64
	for now < base+2500*ms { // steps end in windows 0, 1 and 2
		now += 100 * ms
		step++
		jobFeed(a, "j", "h", []int{0, 1}, step, now, even)
		if (now-base)%(200*ms) == 0 {
			a.tick(now)
		}
	}
	lastEnd := now
	var finishedAt int64
	for now < base+5000*ms {
		now += 100 * ms
		a.tick(now)
		if finishedAt == 0 && a.Stats().FinishedJobs == 1 {
			finishedAt = now
		}
	}
	if finishedAt == 0 {
		t.Fatalf("job never finished: %+v", a.Stats())
	}
	if finishedAt < lastEnd+int64(det.Window+det.Lateness) || a.Stats().ForgottenHosts != 1 {
		t.Errorf("finished %v after its last step, before its last window could settle", time.Duration(finishedAt-lastEnd))
	}
	_, ws := c.snapshot()
	if len(ws) != 3 || ws[2].Index != 2 {
		t.Fatalf("settled windows %+v, want 0, 1, 2", ws)
	}
	if len(a.finished) != 1 || a.finished[0].Windows != 3 || a.finished[0].Facts != 2*step {
		t.Fatalf("summary %+v", a.finished)
	}
}
