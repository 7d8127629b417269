package aggregate

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/otel/wire"
)

// hugeTopology is the hostile record: a topology whose one group
// lists 2^17 - 1 ranks, about 0.8 MB of JSON, decoded as the receiver does.
func hugeTopology(t testing.TB, job string) wire.Fact {
	t.Helper()
	members := make([]int, 1<<17-1)
	for i := range members {
		members[i] = i
	}
	topo := detector.Topology{Kind: detector.KindTopology, Job: job, Version: 1,
		Ranks: []detector.RankInfo{{Rank: 0}}, Groups: []detector.Group{{ID: "w", Type: "world", Ranks: members}}}
	d := wire.DecodeLogs(wire.EncodeLogs("evil", []detector.Topology{topo}, nil, nil), wire.Limits{})
	if len(d.Facts) != 1 {
		t.Fatalf("hostile topology not decoded: %v", d.FirstErr)
	}
	return d.Facts[0]
}

func heapAfterGC() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func TestTopologyAloneCreatesNoRankState(t *testing.T) {
	c := &capture{}
	now := int64(1e12)
	a, err := New(Config{Detector: testDetector(), Sinks: []Sink{c}, StatsEvery: -1, NowMono: func() int64 { return now }})
	if err != nil {
		t.Fatal(err)
	}
	f := hugeTopology(t, "j")
	before := heapAfterGC()
	a.handle(batch{recv: now, facts: []wire.Fact{f}})
	a.tick(now)
	grown := int64(heapAfterGC()) - int64(before)
	runtime.KeepAlive(a)
	// What is stored is the topology itself (2^17 ints and its maps), not
	// state for 2^17 ranks (today ≈62 MiB).
	if grown > 8<<20 {
		t.Errorf("one 0.8 MB topology record grew the heap by %.1f MiB, want under 8 MiB", float64(grown)/(1<<20))
	}
	t.Logf("heap grown by %.1f MiB", float64(grown)/(1<<20))
	// Ranks that send steps join the topology handed to the detector, with
	// their group; the others stay out.
	for r := range 2 {
		st := detector.Step{Kind: detector.KindStep, Job: "j", Rank: r, Step: 1, StartNS: now - 2e6, EndNS: now - 1e6,
			Phases: map[string]float64{detector.PhaseHost: 1}}
		a.handle(batch{recv: now, facts: []wire.Fact{{Host: "h", Step: &st}}})
	}
	now += int64(a.cfg.TopologyDebounce)
	a.tick(now)
	c.mu.Lock()
	defer c.mu.Unlock()
	last := c.topos[len(c.topos)-1]
	if len(last.Ranks) != 1 || len(last.Groups) != 1 || !slices.Equal(last.Groups[0].Ranks, []int{0, 1}) {
		t.Fatalf("topology handed on: %d ranks, groups %+v; want rank 0 and the group of ranks 0 and 1", len(last.Ranks), last.Groups)
	}
	if st := a.Stats(); st.Ranks != 2 {
		t.Errorf("ranks with state: %d, want 2", st.Ranks)
	}
}

func TestRankAndJobQuotas(t *testing.T) {
	step := func(job string, rank int) *detector.Step {
		return &detector.Step{Kind: detector.KindStep, Job: job, Rank: rank, Step: 1, StartNS: 0, EndNS: 10, Phases: map[string]float64{}}
	}
	tests := []struct {
		name                  string
		cfg                   Config
		facts                 []wire.Fact
		facts_, ranks_, jobs_ int64
	}{
		{"global rank budget", Config{MaxRanks: 3},
			[]wire.Fact{{Host: "a", Step: step("j1", 0)}, {Host: "b", Step: step("j1", 1)}, {Host: "c", Step: step("j2", 0)},
				{Host: "c", Step: step("j2", 1)}, {Host: "a", Step: step("j1", 0)}},
			4, 1, 0},
		{"a rank two hosts send counts once", Config{MaxRanks: 1, MaxRanksPerClient: 4},
			[]wire.Fact{{Host: "a", Step: step("j1", 0)}, {Host: "b", Step: step("j1", 0)}, {Host: "b", Step: step("j1", 1)}},
			2, 1, 0},
		{"ranks per host over its jobs", Config{MaxRanksPerHost: 2},
			[]wire.Fact{{Host: "a", Step: step("j1", 0)}, {Host: "a", Step: step("j2", 0)}, {Host: "a", Step: step("j2", 1)},
				{Host: "b", Step: step("j2", 1)}},
			3, 1, 0},
		{"jobs per host", Config{MaxJobsPerHost: 2},
			[]wire.Fact{{Host: "a", Step: step("j1", 0)}, {Host: "a", Step: step("j2", 0)}, {Host: "a", Step: step("j3", 0)},
				{Host: "b", Step: step("j3", 0)}},
			3, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Detector, tt.cfg.StatsEvery = testDetector(), -1
			a, err := New(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			a.handle(batch{recv: 1, facts: tt.facts})
			if st := a.Stats(); st.Facts != tt.facts_ || st.RefusedRanks != tt.ranks_ || st.RefusedJobs != tt.jobs_ {
				t.Errorf("facts %d, refused ranks %d, refused jobs %d; want %d, %d, %d",
					st.Facts, st.RefusedRanks, st.RefusedJobs, tt.facts_, tt.ranks_, tt.jobs_)
			}
		})
	}
}

func TestForgottenHostGivesItsQuotaBack(t *testing.T) {
	now := int64(1e12)
	a, err := New(Config{Detector: testDetector(), StatsEvery: -1, MaxRanks: 2, MaxJobsPerHost: 1,
		HostTTL: 3e9, NowMono: func() int64 { return now }})
	if err != nil {
		t.Fatal(err)
	}
	for r := range 2 {
		st := detector.Step{Kind: detector.KindStep, Job: "j1", Rank: r, Step: 1, StartNS: now - 2, EndNS: now - 1, Phases: map[string]float64{}}
		a.handle(batch{recv: now, facts: []wire.Fact{{Host: "a", Step: &st}}})
	}
	now += 4e9
	a.tick(now)
	st := detector.Step{Kind: detector.KindStep, Job: "j2", Rank: 7, Step: 1, StartNS: now - 2, EndNS: now - 1, Phases: map[string]float64{}}
	a.handle(batch{recv: now, facts: []wire.Fact{{Host: "a", Step: &st}}})
	if s := a.Stats(); s.Facts != 3 || s.RefusedRanks != 0 || s.RefusedJobs != 0 || len(a.quotas) != 1 || a.nRanks != 1 {
		t.Fatalf("after host a was forgotten: %+v, quotas %d, ranks %d", s, len(a.quotas), a.nRanks)
	}
}

func TestTopologyBudgetCountsSharedListsOnce(t *testing.T) {
	world := make([]int, 100)
	for i := range world {
		world[i] = i
	}
	a, err := New(Config{Detector: testDetector(), StatsEvery: -1, MaxTopologyEntries: 150})
	if err != nil {
		t.Fatal(err)
	}
	var facts []wire.Fact
	for h := range 10 {
		host := fmt.Sprint("h", h)
		facts = append(facts, wire.Fact{Host: host, Topology: hostTopology(1, host, []int{h}, detector.Group{ID: "w", Type: "world", Ranks: world})})
	}
	// A host whose own list does not fit is refused; the others are kept.
	other := slices.Clone(world[:60])
	facts = append(facts, wire.Fact{Host: "big", Topology: hostTopology(1, "big", nil, detector.Group{ID: "dp", Type: "dp", Ranks: other})})
	a.handle(batch{recv: 1, facts: facts})
	if st := a.Stats(); st.RefusedTopos != 1 || a.topoUsed.used != 110 {
		t.Fatalf("refused %d topologies, %d entries in use; want 1 and 110 (100 shared members + 10 ranks)", st.RefusedTopos, a.topoUsed.used)
	}
	j := a.jobs["j"]
	a.forgetHost(j, "h0", j.hosts["h0"])
	if a.topoUsed.used != 109 {
		t.Errorf("after forgetting a host: %d entries, want 109", a.topoUsed.used)
	}
}

func TestNewRefusesNonsenseLimits(t *testing.T) {
	det := testDetector()
	longWindow := det
	longWindow.Window = 48 * time.Hour
	manyWindows := det
	manyWindows.EvictAfter = 1 << 40
	tests := []struct {
		name string
		cfg  Config
	}{
		{"negative rank budget", Config{Detector: det, MaxRanks: -1}},
		{"negative ranks per host", Config{Detector: det, MaxRanksPerHost: -1}},
		{"negative jobs per host", Config{Detector: det, MaxJobsPerHost: -1}},
		{"negative topology entries", Config{Detector: det, MaxTopologyEntries: -1}},
		{"two-day window", Config{Detector: longWindow}},
		{"evict-after overflowing the host TTL", Config{Detector: manyWindows}},
		{"negative host TTL", Config{Detector: det, HostTTL: -time.Second}},
		{"year-long host TTL", Config{Detector: det, HostTTL: 365 * 24 * time.Hour}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.cfg); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func TestClientSharesBoundWhatClaimedHostNamesAdd(t *testing.T) {
	step := func(job string, rank int) *detector.Step {
		return &detector.Step{Kind: detector.KindStep, Job: job, Rank: rank, Step: 1, StartNS: 0, EndNS: 10, Phases: map[string]float64{}}
	}
	// manyHosts is one client claiming a new host name for every rank, as
	// the client did to multiply the per-host quota.
	manyHosts := func(client, job string, n, first int) batch {
		b := batch{recv: 1, client: client}
		for i := range n {
			b.facts = append(b.facts, wire.Fact{Host: fmt.Sprint(client, "-h", i), Step: step(job, first+i)})
		}
		return b
	}
	tests := []struct {
		name    string
		cfg     Config
		batches []batch
		want    Stats // Facts, RefusedHosts(Client), RefusedJobs and RefusedRanks(Client) compared
	}{
		{"ranks per client, whatever the host names",
			Config{MaxRanks: 64, MaxRanksPerClient: 8},
			[]batch{manyHosts("evil", "j", 100, 0), manyHosts("honest", "j", 4, 1000)},
			Stats{Facts: 12, RefusedRanksClient: 92}},
		{"hosts per client",
			Config{MaxHosts: 64, MaxHostsPerClient: 10},
			[]batch{manyHosts("evil", "j", 30, 0), manyHosts("honest", "j", 4, 1000)},
			Stats{Facts: 14, RefusedHostsClient: 20}},
		{"jobs per client",
			Config{MaxJobsPerClient: 2},
			[]batch{manyHosts("evil", "j1", 1, 0), manyHosts("evil", "j2", 1, 0), manyHosts("evil", "j3", 1, 0),
				manyHosts("honest", "j3", 1, 0)},
			Stats{Facts: 3, RefusedJobs: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Detector, tt.cfg.StatsEvery = testDetector(), -1
			a, err := New(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range tt.batches {
				a.handle(b)
			}
			st := a.Stats()
			got := Stats{Facts: st.Facts, RefusedHosts: st.RefusedHosts, RefusedHostsClient: st.RefusedHostsClient,
				RefusedJobs: st.RefusedJobs, RefusedRanks: st.RefusedRanks, RefusedRanksClient: st.RefusedRanksClient}
			if got != tt.want {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestForgottenHostGivesItsClientShareBack(t *testing.T) {
	now := int64(1e12)
	a, err := New(Config{Detector: testDetector(), StatsEvery: -1, MaxRanksPerClient: 2, MaxHostsPerClient: 1,
		HostTTL: 3e9, NowMono: func() int64 { return now }})
	if err != nil {
		t.Fatal(err)
	}
	send := func(client, host, job string, rank int) {
		st := detector.Step{Kind: detector.KindStep, Job: job, Rank: rank, Step: 1, StartNS: now - 2, EndNS: now - 1, Phases: map[string]float64{}}
		a.handle(batch{recv: now, client: client, facts: []wire.Fact{{Host: host, Step: &st}}})
	}
	send("c", "a", "j1", 0)
	send("c", "a", "j1", 1)
	// Another client's step for host a is charged to that client.
	send("d", "a", "j1", 2)
	if s := a.Stats(); s.Facts != 3 || a.clients["c"].ranks != 2 || a.clients["d"].ranks != 1 || a.clients["d"].hosts != 0 {
		t.Fatalf("before: %+v, client c %+v, d %+v", s, a.clients["c"], a.clients["d"])
	}
	now += 4e9
	a.tick(now)
	if len(a.clients) != 0 {
		t.Fatalf("after host a was forgotten, %d clients still hold quota", len(a.clients))
	}
	send("c", "b", "j2", 7)
	send("c", "b", "j2", 8)
	if s := a.Stats(); s.Facts != 5 || s.RefusedRanks != 0 || s.RefusedHosts != 0 {
		t.Fatalf("after host a was forgotten: %+v", s)
	}
}

func TestRefusedClientsHoldNoQuotaEntry(t *testing.T) {
	a, err := New(Config{Detector: testDetector(), StatsEvery: -1, MaxJobsPerHost: 1, MaxRanksPerClient: 1})
	if err != nil {
		t.Fatal(err)
	}
	step := func(job string, rank int) *detector.Step {
		return &detector.Step{Kind: detector.KindStep, Job: job, Rank: rank, Step: 1, StartNS: 0, EndNS: 10, Phases: map[string]float64{}}
	}
	a.handle(batch{recv: 1, client: "a", facts: []wire.Fact{{Host: "h", Step: step("j1", 0)}}})
	// Refused by host h's job quota, and by client c's rank share on a host
	// that another client brought in: neither keeps an entry for its client.
	for i := range 100 {
		a.handle(batch{recv: 1, client: fmt.Sprint("b", i), facts: []wire.Fact{{Host: "h", Step: step("j2", 0)}}})
	}
	a.handle(batch{recv: 1, client: "c", facts: []wire.Fact{{Host: "h", Step: step("j1", 1)}}})
	a.handle(batch{recv: 1, client: "c", facts: []wire.Fact{{Host: "h", Step: step("j1", 2)}}})
	if st := a.Stats(); st.RefusedJobs != 100 || st.RefusedRanksClient != 1 || len(a.clients) != 2 {
		t.Fatalf("refused jobs %d, by rank share %d, client entries %d; want 100, 1, 2 (a and c)", st.RefusedJobs, st.RefusedRanksClient, len(a.clients))
	}
}
