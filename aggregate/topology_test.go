package aggregate

import (
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

func TestTopologyMergeUnion(t *testing.T) {
	m := newTopoMerge("j")
	world := detector.Group{ID: "w", Type: "world", Ranks: []int{0, 1, 2, 3}}
	if !m.update("a", hostTopology(1, "a", []int{0, 1}, world, detector.Group{ID: "dp0", Type: "dp", Ranks: []int{1, 0}})) {
		t.Fatal("first topology is no change")
	}
	m.update("b", hostTopology(7, "b", []int{2, 3}, world, detector.Group{ID: "dp0", Type: "other", Ranks: []int{2, 3}}))
	got := m.build()
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
	if !m.update("a", hostTopology(2, "a", nil, world, detector.Group{ID: "dp0", Type: "dp", Ranks: []int{0, 1}})) {
		t.Fatal("dropping ranks is no change")
	}
	m.update("a", hostTopology(3, "a", []int{0, 1}, world, detector.Group{ID: "dp0", Type: "dp", Ranks: []int{0, 1}}))
	// ... the same content again (a periodic re-send, renumbered) is not.
	if m.update("a", hostTopology(4, "a", []int{0, 1}, world, detector.Group{ID: "dp0", Type: "dp", Ranks: []int{1, 0}})) {
		t.Fatal("identical content reported as a change")
	}
	if v := m.build().Version; v != 2 {
		t.Fatalf("version %d, want 2", v)
	}
	if v := m.mergedVersion("a", 4); v != 2 {
		t.Errorf("a's version 4 maps to %d, want 2", v)
	}
	// A host that goes away leaves the union; its world list reference too.
	m.forget("b")
	got = m.build()
	if len(got.Ranks) != 2 || got.Version != 3 || !reflect.DeepEqual(got.Groups[0].Ranks, []int{0, 1}) {
		t.Fatalf("after forgetting b: %+v", got)
	}
	if len(m.groups["w"].lists) != 1 || m.groups["w"].lists[m.groups["w"].byHost["a"]].refs != 1 {
		t.Fatalf("world list refs: %+v", m.groups["w"])
	}
}

func TestTopologyMergeSharesIdenticalMemberLists(t *testing.T) {
	m := newTopoMerge("j")
	all := make([]int, 4096)
	for i := range all {
		all[i] = i
	}
	for h := 0; h < 512; h++ {
		host := string(rune('A'+h%26)) + string(rune('a'+h/26))
		m.update(host, hostTopology(1, host, all[h*8:h*8+8], detector.Group{ID: "w", Type: "world", Ranks: all}))
	}
	if n := len(m.groups["w"].lists); n != 1 {
		t.Fatalf("%d stored lists for one world group, want 1", n)
	}
	got := m.build()
	if len(got.Ranks) != 4096 || len(got.Groups[0].Ranks) != 4096 {
		t.Fatalf("merged %d ranks, %d members", len(got.Ranks), len(got.Groups[0].Ranks))
	}
}

func TestTopologyRankMovesBetweenHosts(t *testing.T) {
	m := newTopoMerge("j")
	m.update("a", hostTopology(1, "a", []int{0, 1}))
	m.update("b", hostTopology(1, "b", []int{1, 2})) // rank 1 restarted on b
	got := m.build()
	if got.Ranks[1].Host != "b" {
		t.Fatalf("rank 1 on %q, want b (reported last)", got.Ranks[1].Host)
	}
	m.update("b", hostTopology(2, "b", []int{2})) // b lets go of rank 1: a still claims it
	got = m.build()
	if len(got.Ranks) != 3 || got.Ranks[1].Host != "a" {
		t.Fatalf("after b dropped rank 1: %+v", got.Ranks)
	}
}
