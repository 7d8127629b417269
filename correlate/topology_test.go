package correlate

import (
	"fmt"
	"testing"
	"time"

	"github.com/slowrank/slowrank/detector"
)

// TP=2 × DP=4 on one host of 8 ranks: the world communicator, two DP
// communicators carrying the gradient all-reduce, four TP communicators.
func TestTopologyLabels(t *testing.T) {
	ranks := []int{0, 1, 2, 3, 4, 5, 6, 7}
	c := newTest(Config{}, ranks...)
	var b batch
	for _, r := range ranks {
		p := pid(r)
		c.AddCommInit(CommInit{PID: p, Comm: 0x100, NRanks: 8, Rank: r, UniqueIDHash: 0xaaaa})
		c.AddCommInit(CommInit{PID: p, Comm: 0x200, NRanks: 2, Rank: r % 2, Parent: 0x100, Color: r / 2})
		c.AddCommInit(CommInit{PID: p, Comm: 0x300, NRanks: 4, Rank: r / 2, Parent: 0x100, Color: r % 2})
		b.coll(p, 0x100, "allreduce", 1, 0, 10*us) // barrier
	}
	for i := range 12 {
		base := ms + int64(i)*10*ms
		for _, r := range ranks {
			p := pid(r)
			b.coll(p, 0x200, "allreduce", 4096, base+1*ms, base+1*ms+10*us)
			b.coll(p, 0x200, "allreduce", 4096, base+2*ms, base+2*ms+10*us)
			b.coll(p, 0x300, "allreduce", 1<<20, base+5*ms, base+5*ms+10*us)
			b.sync(p, base+8*ms, base+10*ms)
		}
	}
	b.feed(c)
	steps, topos := c.Flush()
	if len(topos) != 1 {
		t.Fatalf("%d topology facts: %+v", len(topos), topos)
	}
	top := topos[0]
	if top.Kind != detector.KindTopology || top.Job != "j1" || top.Version != 1 || len(top.Ranks) != 8 {
		t.Fatalf("topology %+v", top)
	}
	count := map[string][]string{}
	for _, g := range top.Groups {
		count[g.Type] = append(count[g.Type], fmt.Sprint(g.Ranks))
	}
	want := map[string][]string{
		"world": {"[0 1 2 3 4 5 6 7]"},
		"dp":    {"[0 2 4 6]", "[1 3 5 7]"},
		"tp":    {"[0 1]", "[2 3]", "[4 5]", "[6 7]"},
	}
	for typ, groups := range want {
		got := count[typ]
		if len(got) != len(groups) {
			t.Fatalf("%s groups %v, want %v", typ, got, groups)
		}
		for _, g := range groups {
			found := false
			for _, x := range got {
				found = found || x == g
			}
			if !found {
				t.Fatalf("%s groups %v lack %v", typ, got, g)
			}
		}
	}
	if len(top.Groups) != 7 {
		t.Fatalf("groups %+v", top.Groups)
	}
	m := byRank(steps)
	for _, r := range ranks {
		if len(m[r]) < 9 {
			t.Fatalf("rank %d: %d steps", r, len(m[r]))
		}
		for _, s := range m[r] {
			if s.Topo != 1 {
				t.Fatalf("step topo %d", s.Topo)
			}
		}
		// All ranks number the same iteration alike.
		if m[r][0].Step != m[0][0].Step || m[r][0].EndNS != m[0][0].EndNS {
			t.Fatalf("rank %d first step %d@%d, rank 0 %d@%d", r, m[r][0].Step, m[r][0].EndNS, m[0][0].Step, m[0][0].EndNS)
		}
	}
}

// A communicator rebuilt mid-run (elastic restart inside the processes:
// destroy, then a new unique id) gives a new topology version; steps are
// tagged with the version in effect when they ended, and indices go on.
func TestCommunicatorRebuilt(t *testing.T) {
	c := newTest(Config{}, 0, 1)
	for r := range 2 {
		c.AddCommInit(CommInit{PID: pid(r), Comm: uint64(0x10 + r), NRanks: 2, Rank: r, UniqueIDHash: 0x1111})
	}
	var b batch
	simulate(&b, []uint32{pid(0), pid(1)}, 0, repeat("AB S", 20), 0, 10*ms, nil)
	commOf(&b)
	b.feed(c)
	steps1, topos1 := c.Drain()
	for r := range 2 {
		c.AddCommDestroy(CommDestroy{PID: pid(r), Comm: uint64(0x10 + r), AtNS: 201 * ms})
		c.AddCommInit(CommInit{PID: pid(r), Comm: uint64(0x20 + r), NRanks: 2, Rank: r, UniqueIDHash: 0x2222, AtNS: 202 * ms})
	}
	simulate(&b, []uint32{pid(0), pid(1)}, 0, repeat("AB S", 20), 300*ms, 10*ms, nil)
	for i := range b.host {
		if b.host[i].Kind == HostCollective {
			b.host[i].Comm = uint64(0x20 + b.host[i].PID - 100)
		}
	}
	b.feed(c)
	steps2, topos2 := c.Flush()
	topos := append(topos1, topos2...)
	if len(topos) != 2 || topos[0].Version != 1 || topos[1].Version != 2 {
		t.Fatalf("topologies %+v", topos)
	}
	if topos[0].Groups[0].ID == topos[1].Groups[0].ID {
		t.Fatalf("same group id after rebuild: %+v", topos)
	}
	m := byRank(append(steps1, steps2...))
	for r := range 2 {
		checkContiguous(t, m[r])
		var v1, v2 int
		for _, s := range m[r] {
			switch {
			case s.EndNS <= 200*ms && s.Topo == 1:
				v1++
			case s.StartNS >= 300*ms && s.Topo == 2:
				v2++
			default:
				t.Fatalf("rank %d step %d [%d,%d] topo %d", r, s.Step, s.StartNS, s.EndNS, s.Topo)
			}
		}
		// Iteration 0 starts at the first creation; the second one came
		// 98 ms before its first iteration, an idle wait and no step.
		if v1 != 20 || v2 != 19 {
			t.Fatalf("rank %d: %d steps before, %d after", r, v1, v2)
		}
	}
}

// Processes replaced (elastic restart with new pids) bump the version too.
func TestRanksReplaced(t *testing.T) {
	c := newTest(Config{}, 0)
	c.AddCommInit(CommInit{PID: pid(0), Comm: 1, NRanks: 1, UniqueIDHash: 0x1})
	var b batch
	simulate(&b, []uint32{pid(0)}, 1, repeat("AB S", 10), 0, 10*ms, nil)
	b.feed(c)
	c.Forget(pid(0))
	c.SetRank(RankInfo{PID: 999, Rank: 0, Job: "j1", Host: "h0"})
	c.AddCommInit(CommInit{PID: 999, Comm: 1, NRanks: 1, UniqueIDHash: 0x2, AtNS: 200 * ms})
	simulate(&b, []uint32{999}, 1, repeat("AB S", 10), 200*ms, 10*ms, nil)
	b.feed(c)
	steps, topos := c.Flush()
	if len(topos) != 2 || topos[1].Version != 2 || topos[1].Ranks[0].PID != 999 {
		t.Fatalf("topologies %+v", topos)
	}
	if len(steps) != 20 { // each process's iteration 0 starts at its creation
		t.Fatalf("%d steps", len(steps))
	}
	st := c.Stats()
	if len(st) != 1 || st[0].Steps != 20 || st[0].PID != 999 {
		t.Fatalf("stats %+v", st)
	}
}

// A process that any local user starts can claim any WORLD_SIZE and call a
// fake ncclCommInitRank with any nranks: a "world" group of 2^31 ranks
// would be 16 GiB of rank numbers in the agent. Sizes beyond MaxRanks are
// not believed (the group is sized by its members) and counted.
func TestImplausibleCommunicatorSizeIsNotBelieved(t *testing.T) {
	const huge = 1<<31 - 1
	c := New(Config{ConfirmSpan: testSpan})
	c.SetRank(RankInfo{PID: pid(0), Rank: 0, WorldSize: huge, Host: "h0", Job: "j1"})
	c.AddCommInit(CommInit{PID: pid(0), Comm: 0x100, NRanks: huge, Rank: 0, UniqueIDHash: 0xaaaa})
	var b batch
	for i := range 12 {
		base := ms + int64(i)*10*ms
		b.coll(pid(0), 0x100, "allreduce", 4096, base+1*ms, base+1*ms+10*us)
		b.sync(pid(0), base+8*ms, base+10*ms)
	}
	b.feed(c)
	_, topos := c.Flush()
	for _, top := range topos {
		for _, g := range top.Groups {
			if len(g.Ranks) > MaxRanks {
				t.Fatalf("group %s lists %d ranks (more than MaxRanks %d)", g.ID, len(g.Ranks), MaxRanks)
			}
		}
	}
	var implausible uint64
	for _, st := range c.Stats() {
		implausible += st.ImplausibleSizes
	}
	if implausible != 2 {
		t.Fatalf("ImplausibleSizes = %d, want 2 (the world size and the communicator's)", implausible)
	}
}

// A rank's placement reaches the topology as given; sending it again with the
// GPU that NVML found later makes a new version, sending it unchanged does not.
func TestPlacementInTopology(t *testing.T) {
	pod := detector.Placement{
		K8s:         detector.K8sPod{PodName: "llama-worker-1", PodUID: "6f1c0e4a-2b8d-4c7e-9a51-3d2f8b7e1c90", Namespace: "train", ContainerName: "pytorch"},
		ContainerID: "4f3a1d2e9b8c7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f",
	}
	info := RankInfo{PID: 100, Rank: 0, WorldSize: 1, Host: "h0", Job: "j1", Placement: pod}
	c := New(Config{})
	c.SetRank(info)
	_, topos := c.Flush() // the first version waits for steps or the end
	if len(topos) != 1 || topos[0].Ranks[0].Placement != pod {
		t.Fatalf("first topology %+v, want the placement %+v", topos, pod)
	}

	c.SetRank(info)
	if _, topos := c.Drain(); len(topos) != 0 {
		t.Fatalf("unchanged placement made topology %+v", topos)
	}

	info.Placement.GPU = detector.RankGPU{Index: 3, UUID: "GPU-5b1e3a8c-0d2f-4e6a-8b9c-1a2b3c4d5e6f", PCIBusID: "00000000:3B:00.0"}
	c.SetRank(info)
	_, topos = c.Drain()
	if len(topos) != 1 || topos[0].Version != 2 || topos[0].Ranks[0].Placement != info.Placement {
		t.Fatalf("after the GPU was found: %+v, want version 2 with %+v", topos, info.Placement)
	}
}

// A communicator destroyed at the end of training (torch's
// destroy_process_group) ends its cycle like the process's exit: steps
// of a lock still held back by ConfirmSpan are confirmed, not withdrawn.
func TestCommDestroyedUnderATentativeLockKeepsItsSteps(t *testing.T) {
	for _, tc := range []struct {
		name    string
		destroy bool
	}{{"destroyed", true}, {"left to the exit", false}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTest(Config{ConfirmSpan: time.Hour}, 0)
			var b batch
			const comm = uint64(0x10)
			c.AddCommInit(CommInit{PID: pid(0), Comm: comm, NRanks: 1, Rank: 0, UniqueIDHash: 0xfeed, AtNS: 0})
			at := int64(ms)
			for range 40 {
				for k := range 3 {
					b.coll(pid(0), comm, "allreduce", uint64(100+k), at, at+100*us)
					at += ms
				}
				b.sync(pid(0), at, at+5*ms)
				at += 10 * ms
			}
			b.feed(c)
			if tc.destroy {
				c.AddCommDestroy(CommDestroy{PID: pid(0), Comm: comm, AtNS: at})
			}
			c.Forget(pid(0))
			steps, _ := c.Flush()
			if len(steps) < 36 {
				t.Errorf("%d steps for 40 iterations", len(steps))
			}
		})
	}
}
