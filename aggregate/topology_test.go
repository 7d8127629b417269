package aggregate

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/slowrank/slowrank/detector"
)

func hostTopology(version int, host string, ranks []int, groups ...detector.Group) *detector.Topology {
	t := &detector.Topology{Kind: detector.KindTopology, Job: "j", Version: version, Groups: groups}
	for i, r := range ranks {
		t.Ranks = append(t.Ranks, detector.RankInfo{Rank: r, Host: host, LocalRank: i, PID: 100 + r})
	}
	return t
}

// changed updates m and reports whether the union changed (no budget here).
func changed(m *topoMerge, host string, t *detector.Topology) bool {
	c, err := m.update(host, t)
	if err != nil {
		panic(err)
	}
	return c
}

func TestTopologyMergeUnion(t *testing.T) {
	m := newTopoMerge("j", nil)
	world := detector.Group{ID: "w", Type: "world", Ranks: []int{0, 1, 2, 3}}
	if !changed(m, "a", hostTopology(1, "a", []int{0, 1}, world, detector.Group{ID: "dp0", Type: "dp", Ranks: []int{1, 0}})) {
		t.Fatal("first topology is no change")
	}
	changed(m, "b", hostTopology(7, "b", []int{2, 3}, world, detector.Group{ID: "dp0", Type: "other", Ranks: []int{2, 3}}))
	got := m.build(nil)
	want := detector.Topology{Kind: detector.KindTopology, Job: "j", Version: 1,
		Ranks: []detector.RankInfo{{Rank: 0, Host: "a", PID: 100}, {Rank: 1, Host: "a", LocalRank: 1, PID: 101},
			{Rank: 2, Host: "b", PID: 102}, {Rank: 3, Host: "b", LocalRank: 1, PID: 103}},
		Groups: []detector.Group{{ID: "dp0", Type: "dp", Ranks: []int{0, 1, 2, 3}}, {ID: "w", Type: "world", Ranks: []int{0, 1, 2, 3}}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("merged\n got %+v\nwant %+v", got, want)
	}
	// Steps tagged with a host's own version map to the merged one.
	if v := m.mergedVersion("b", 7); v != 1 {
		t.Errorf("b's version 7 maps to %d, want 1", v)
	}
	if v := m.mergedVersion("b", 6); v != 0 {
		t.Errorf("unknown version maps to %d, want 0 (latest)", v)
	}
	// A change of a's content is a change of the union ...
	if !changed(m, "a", hostTopology(2, "a", nil, world, detector.Group{ID: "dp0", Type: "dp", Ranks: []int{0, 1}})) {
		t.Fatal("dropping ranks is no change")
	}
	changed(m, "a", hostTopology(3, "a", []int{0, 1}, world, detector.Group{ID: "dp0", Type: "dp", Ranks: []int{0, 1}}))
	// ... the same content again (a periodic re-send, renumbered) is not.
	if changed(m, "a", hostTopology(4, "a", []int{0, 1}, world, detector.Group{ID: "dp0", Type: "dp", Ranks: []int{1, 0}})) {
		t.Fatal("identical content reported as a change")
	}
	if v := m.build(nil).Version; v != 2 {
		t.Fatalf("version %d, want 2", v)
	}
	if v := m.mergedVersion("a", 4); v != 2 {
		t.Errorf("a's version 4 maps to %d, want 2", v)
	}
	// A host that goes away leaves the union; its world list reference too.
	m.forget("b")
	got = m.build(nil)
	if len(got.Ranks) != 2 || got.Version != 3 || !reflect.DeepEqual(got.Groups[0].Ranks, []int{0, 1}) {
		t.Fatalf("after forgetting b: %+v", got)
	}
	if len(m.groups["w"].lists) != 1 || m.groups["w"].lists[m.groups["w"].byHost["a"]].refs != 1 {
		t.Fatalf("world list refs: %+v", m.groups["w"])
	}
}

func TestTopologyMergeSharesIdenticalMemberLists(t *testing.T) {
	m := newTopoMerge("j", nil)
	all := make([]int, 4096)
	for i := range all {
		all[i] = i
	}
	for h := 0; h < 512; h++ {
		host := string(rune('A'+h%26)) + string(rune('a'+h/26))
		changed(m, host, hostTopology(1, host, all[h*8:h*8+8], detector.Group{ID: "w", Type: "world", Ranks: all}))
	}
	if n := len(m.groups["w"].lists); n != 1 {
		t.Fatalf("%d stored lists for one world group, want 1", n)
	}
	got := m.build(nil)
	if len(got.Ranks) != 4096 || len(got.Groups[0].Ranks) != 4096 {
		t.Fatalf("merged %d ranks, %d members", len(got.Ranks), len(got.Groups[0].Ranks))
	}
}

func TestTopologyRankMovesBetweenHosts(t *testing.T) {
	m := newTopoMerge("j", nil)
	changed(m, "a", hostTopology(1, "a", []int{0, 1}))
	changed(m, "b", hostTopology(1, "b", []int{1, 2})) // rank 1 restarted on b
	got := m.build(nil)
	if got.Ranks[1].Host != "b" {
		t.Fatalf("rank 1 on %q, want b (reported last)", got.Ranks[1].Host)
	}
	changed(m, "b", hostTopology(2, "b", []int{2})) // b lets go of rank 1: a still claims it
	got = m.build(nil)
	if len(got.Ranks) != 3 || got.Ranks[1].Host != "a" {
		t.Fatalf("after b dropped rank 1: %+v", got.Ranks)
	}
}

// shiftedTopologies gives each of hosts a block of perHost ranks, shifted
// by shift: with shift 1 every host takes over the first rank of the next.
func shiftedTopologies(hosts, perHost, shift, version int) []*detector.Topology {
	out := make([]*detector.Topology, hosts)
	for h := range hosts {
		ranks := make([]int, perHost)
		for i := range ranks {
			ranks[i] = h*perHost + i + shift
		}
		out[h] = hostTopology(version, fmt.Sprint("h", h), ranks)
	}
	return out
}

func TestTopologyUpdateCostDoesNotGrowWithOtherHosts(t *testing.T) {
	const perHost = 5000
	for _, hosts := range []int{2, 4, 8} {
		t.Run(fmt.Sprint(hosts, " hosts"), func(t *testing.T) {
			m := newTopoMerge("j", nil)
			for h, topo := range shiftedTopologies(hosts, perHost, 0, 1) {
				changed(m, fmt.Sprint("h", h), topo)
			}
			m.build(nil)
			m.visits = 0
			// Every host re-sends a changed topology: it lets go of its
			// first rank (the previous host takes it over) and takes the
			// next host's first.
			for h, topo := range shiftedTopologies(hosts, perHost, 1, 2) {
				changed(m, fmt.Sprint("h", h), topo)
			}
			// Each update removes perHost claims and adds perHost: the
			// work is per entry of the host's own topology.
			t.Logf("%d visits", m.visits)
			if limit := int64(hosts * perHost * 3); m.visits > limit {
				t.Errorf("%d visits for %d hosts × %d ranks re-sent, want at most %d", m.visits, hosts, perHost, limit)
			}
			got := m.build(nil)
			if len(got.Ranks) != hosts*perHost {
				t.Fatalf("%d ranks, want %d", len(got.Ranks), hosts*perHost)
			}
			for _, r := range got.Ranks {
				owner := max(0, (r.Rank-1)/perHost)
				if r.Host != fmt.Sprint("h", owner) {
					t.Fatalf("rank %d on %s, want h%d", r.Rank, r.Host, owner)
				}
			}
		})
	}
}

// BenchmarkTopologyResend measures one round of changed topologies from 4
// hosts with 5,000 ranks each (20,000 in the job).
func BenchmarkTopologyResend(b *testing.B) {
	const hosts, perHost = 4, 5000
	rounds := [2][]*detector.Topology{shiftedTopologies(hosts, perHost, 0, 1), shiftedTopologies(hosts, perHost, 1, 2)}
	m := newTopoMerge("j", nil)
	for i := 0; b.Loop(); i++ {
		for h, topo := range rounds[i%2] {
			topo.Version = i + 1
			changed(m, fmt.Sprint("h", h), topo)
		}
		m.build(nil)
	}
}

// The merged topology keeps each rank's placement as its host sent it, and a
// host that sends its ranks again with a GPU found since changes the union.
func TestTopologyMergeKeepsPlacement(t *testing.T) {
	m := newTopoMerge("j", nil)
	a := hostTopology(1, "a", []int{0, 1})
	a.Ranks[1].K8s = detector.K8sPod{PodName: "w-1", Namespace: "train"}
	changed(m, "a", a)
	b := hostTopology(1, "b", []int{2})
	changed(m, "b", b)
	got := m.build(nil)
	if len(got.Ranks) != 3 || got.Ranks[1].Placement != a.Ranks[1].Placement || got.Ranks[0].Placement != (detector.Placement{}) {
		t.Fatalf("merged ranks %+v", got.Ranks)
	}
	b2 := hostTopology(2, "b", []int{2})
	b2.Ranks[0].GPU = detector.RankGPU{Index: 0, UUID: "GPU-2"}
	if !changed(m, "b", b2) {
		t.Fatal("a rank's new GPU is no change of the union")
	}
	if got := m.build(nil); got.Ranks[2].GPU != b2.Ranks[0].GPU {
		t.Fatalf("rank 2's GPU %+v, want %+v", got.Ranks[2].GPU, b2.Ranks[0].GPU)
	}
}
