package correlate

import (
	"fmt"
	"slices"
	"strings"

	"github.com/slowrank/slowrank/detector"
)

// commGroup is one communicator as seen on this host: the members are the
// local processes that joined it (by ncclUniqueId hash, or by derivation
// for splits).
type commGroup struct {
	num     uint32
	uid     uint64
	nranks  int
	pseudo  bool // the default c10d group of a job: not in the topology
	members []*procComm
	live    int
	ops     opFlags

	// Arrival ring: per collective sequence number, the host start time
	// of each member's call, and the GPU start and end of its kernel where
	// the plugin timed it (devarrival.go).
	seqs               []uint64
	starts             []int64
	devStarts, devEnds []int64
	width              int
	// names are NCCL's names of the calls (arrival.go), nil until the
	// group's first plugin call.
	names *callNames
}

// defaultUID identifies the default c10d group of a job (calls without a
// known communicator).
func defaultUID(job string) uint64 { return mix64(fnvString("c10d-default\x00" + job)) }

func (c *Correlator) group(uid uint64, nranks int, pseudo bool) *commGroup {
	g := c.byUID[uid]
	if g == nil {
		c.nextGroup++
		g = &commGroup{num: c.nextGroup, uid: uid, pseudo: pseudo}
		c.byUID[uid] = g
		c.groups[g.num] = g
	}
	if nranks > 0 {
		g.nranks = nranks
	}
	return g
}

func (c *Correlator) join(g *commGroup, pc *procComm) {
	// Compact departed members; the arrival ring restarts with the new
	// membership.
	k := 0
	for _, m := range g.members {
		if m != nil {
			g.members[k] = m
			k++
		}
	}
	g.members = append(g.members[:k], pc)
	g.live = len(g.members)
	g.width = 0
	g.seqs, g.starts, g.devStarts, g.devEnds, g.names = nil, nil, nil, nil, nil
	pc.grp = g
}

func (c *Correlator) leave(pc *procComm) {
	g := pc.grp
	if g == nil {
		return
	}
	pc.grp = nil
	for i, m := range g.members {
		if m == pc {
			g.members[i] = nil
			g.live--
		}
	}
	if g.live == 0 {
		delete(c.byUID, g.uid)
		delete(c.groups, g.num)
	}
}

// opFlags classifies the traffic of a communicator.
type opFlags uint8

const (
	opAllReduce opFlags = 1 << iota
	opReduceScatter
	opAllGather
	opBroadcast
	opReduce
	opSendRecv
	opAllToAll
	opOther
)

// flags classifies op for the topology heuristics. Any op but the
// collectives above (a synchronisation's function, an operation of NCCL's
// plugin that correlate does not know) is other traffic.
func (op Op) flags() opFlags {
	switch op {
	case OpAllReduce:
		return opAllReduce
	case OpReduceScatter:
		return opReduceScatter
	case OpAllGather:
		return opAllGather
	case OpBroadcast:
		return opBroadcast
	case OpAllToAll:
		return opAllToAll
	case OpReduce:
		return opReduce
	case OpSend, OpRecv, OpSendRecv:
		return opSendRecv
	}
	return opOther
}

type jobState struct {
	name    string
	version int
	dirty   bool
	last    detector.Topology
	// serial counts structural changes (communicators, ranks); versions
	// maps recent serials to the version emitted for them, so that a step
	// carries the topology in effect when it closed.
	serial   int
	versions []serialVersion
}

type serialVersion struct{ serial, version int }

// versionFor is the topology version of a step closed under serial.
func (j *jobState) versionFor(serial int) int {
	for i := len(j.versions) - 1; i >= 0; i-- {
		if j.versions[i].serial == serial {
			return j.versions[i].version
		}
	}
	return j.version
}

func (c *Correlator) job(name string) *jobState {
	j := c.jobs[name]
	if j == nil {
		j = &jobState{name: name, dirty: true}
		c.jobs[name] = j
	}
	return j
}

// markDirty notes that the labels of job's groups may have changed.
func (c *Correlator) markDirty(job string) {
	if j := c.jobs[job]; j != nil {
		j.dirty = true
	}
}

// markChanged notes a structural change of job's topology.
func (c *Correlator) markChanged(job string) {
	j := c.job(job)
	j.serial++
	j.dirty = true
}

func (c *Correlator) markGroupDirty(g *commGroup) {
	for _, m := range g.members {
		if m != nil {
			c.markDirty(m.p.info.Job)
		}
	}
}

// refreshTopology emits a new topology version of j when its content
// changed since the last one (communicators created, rebuilt or gone,
// ranks replaced, group types refined).
func (c *Correlator) refreshTopology(j *jobState) {
	if !j.dirty {
		return
	}
	j.dirty = false
	t := c.buildTopology(j.name)
	if j.version > 0 && topoEqual(&t, &j.last) {
		return
	}
	if j.version == 0 && len(t.Ranks) == 0 {
		return
	}
	j.version++
	t.Version = j.version
	j.last = t
	c.topos = append(c.topos, t)
	j.versions = append(j.versions, serialVersion{j.serial, j.version})
	if len(j.versions) > 16 {
		j.versions = slices.Delete(j.versions, 0, 1)
	}
}

// buildTopology labels the job's communicators:
//   - "world": nranks equals the job's WORLD_SIZE;
//   - "pp": only point-to-point traffic; "ep": all-to-all traffic;
//   - "dp": for each rank, among the communicators that carry all-reduce
//     or reduce-scatter (gradient reduction), the one with per-step
//     traffic (a confirmed cycle) and the most ranks, unless that is the
//     world communicator (pure data parallelism: it stays "world");
//   - "tp": any other communicator with traffic; "other": no traffic yet.
//
// A group lists the global ranks of its local members (all ranks for a
// world group); the multi-host aggregator merges groups by id, which is
// derived from the communicator's unique id and is the same on every host.
func (c *Correlator) buildTopology(job string) detector.Topology {
	t := detector.Topology{Kind: detector.KindTopology, Job: job}
	ws := 0
	var procs []*proc
	for _, p := range c.procs {
		if p.hasInfo && p.info.Job == job {
			procs = append(procs, p)
			ws = max(ws, p.info.WorldSize)
		}
	}
	slices.SortFunc(procs, func(a, b *proc) int {
		if a.info.Rank != b.info.Rank {
			return a.info.Rank - b.info.Rank
		}
		return int(a.pid) - int(b.pid)
	})
	for _, p := range procs {
		t.Ranks = append(t.Ranks, detector.RankInfo{Rank: p.info.Rank, Host: p.info.Host, LocalRank: p.info.LocalRank, PID: int(p.pid),
			Placement: p.info.Placement})
	}
	var groups []*commGroup
	for _, g := range c.groups {
		if g.pseudo {
			continue
		}
		for _, m := range g.members {
			if m != nil && m.p.hasInfo && m.p.info.Job == job {
				groups = append(groups, g)
				break
			}
		}
	}
	slices.SortFunc(groups, func(a, b *commGroup) int {
		if a.uid < b.uid {
			return -1
		}
		if a.uid > b.uid {
			return 1
		}
		return 0
	})
	label := make(map[*commGroup]string, len(groups))
	for _, g := range groups {
		switch {
		case ws > 0 && g.nranks == ws:
			label[g] = "world"
		case g.ops == 0:
			label[g] = "other"
		case g.ops&^opSendRecv == 0:
			label[g] = "pp"
		case g.ops&opAllToAll != 0:
			label[g] = "ep"
		}
	}
	const reduces = opAllReduce | opReduceScatter
	regular := func(g *commGroup) bool {
		for _, m := range g.members {
			if m != nil && m.regular {
				return true
			}
		}
		return false
	}
	for _, p := range procs {
		var best *commGroup
		bestReg := false
		for _, pc := range p.commList {
			g := pc.grp
			if g == nil || g.pseudo || g.ops&reduces == 0 {
				continue
			}
			if l := label[g]; l != "" && l != "world" && l != "dp" {
				continue
			}
			reg := regular(g)
			better := best == nil || reg && !bestReg ||
				reg == bestReg && (g.nranks > best.nranks || g.nranks == best.nranks && g.uid < best.uid)
			if better {
				best, bestReg = g, reg
			}
		}
		if best != nil && label[best] != "world" {
			label[best] = "dp"
		}
	}
	for _, g := range groups {
		l := label[g]
		if l == "" {
			l = "tp"
		}
		grp := detector.Group{ID: fmt.Sprintf("%s-%08x", l, uint32(g.uid^g.uid>>32)), Type: l}
		if l == "world" {
			for r := range g.nranks {
				grp.Ranks = append(grp.Ranks, r)
			}
		} else {
			for _, m := range g.members {
				if m != nil && m.p.hasInfo && m.p.info.Job == job {
					grp.Ranks = append(grp.Ranks, m.p.info.Rank)
				}
			}
			slices.Sort(grp.Ranks)
			grp.Ranks = slices.Compact(grp.Ranks)
		}
		t.Groups = append(t.Groups, grp)
	}
	slices.SortFunc(t.Groups, func(a, b detector.Group) int { return strings.Compare(a.ID, b.ID) })
	return t
}

func topoEqual(a, b *detector.Topology) bool {
	if a.Job != b.Job || !slices.Equal(a.Ranks, b.Ranks) || len(a.Groups) != len(b.Groups) {
		return false
	}
	for i := range a.Groups {
		x, y := a.Groups[i], b.Groups[i]
		if x.ID != y.ID || x.Type != y.Type || !slices.Equal(x.Ranks, y.Ranks) {
			return false
		}
	}
	return true
}
