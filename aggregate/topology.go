package aggregate

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"sort"

	"github.com/slowrank/slowrank/detector"
)

// topoMerge merges the topologies that the hosts of one job report. Each
// agent numbers its own versions and lists only what it sees: its own ranks,
// and for each communicator its local members (all ranks for a world
// communicator). The merged topology is the union over every host's latest
// topology: ranks by rank number (a rank claimed by two hosts goes to the
// one that reported last), groups by id with the union of their members, a
// group's type by majority (ties: the smallest name, "other" only when no
// host knows better). Its version grows by one whenever the union changes.
//
// Cost: a host's update costs O(its topology), whatever the other hosts
// hold: each rank keeps the list of its claims (usually one), so a host
// that lets go of its ranks finds their next owners without looking at
// other hosts. Identical member lists of a group (the world group every
// host lists in full) are stored once and reference-counted, so N hosts
// listing a world group of R ranks cost O(N·R) hashing but O(R) memory.
// Building the merged topology costs O(ranks + distinct member lists) and
// happens at most once per debounce. visits counts the rank entries and
// claims that updates touched (the tests' measure of that cost).
//
// What is stored counts against a budget shared by every job (entries: one
// per rank a host lists, one per member of each distinct list): an update
// beyond it is refused.
type topoMerge struct {
	job     string
	hosts   map[string]*hostTopo
	claims  map[int][]rankClaim // every host's claim of a rank; the latest seq wins
	groups  map[string]*groupAcc
	version int  // merged version last built
	dirty   bool // the union changed since the last build
	seq     int64
	seed    maphash.Seed
	entries *topoBudget
	visits  int64
}

// topoBudget is the number of stored topology entries over all jobs and
// its limit (owned by the aggregator's goroutine).
type topoBudget struct{ used, limit int }

// errTopologyBudget refuses a topology that would not fit in the budget.
var errTopologyBudget = errors.New("topology budget spent")

type hostTopo struct {
	version int   // the host's own numbering
	seq     int64 // update order among hosts
	topo    detector.Topology
	// versions maps the host's recent versions to the latest merged
	// version that included them (for re-tagging steps).
	versions []versionMap
}

type versionMap struct{ host, merged int }

type rankClaim struct {
	info detector.RankInfo
	host string
	seq  int64
}

type groupAcc struct {
	types map[string]int
	lists map[uint64]*memberList
	// byHost is the list hash each host contributes.
	byHost map[string]uint64
}

type memberList struct {
	ranks []int // sorted, unique
	refs  int
}

func newTopoMerge(job string, entries *topoBudget) *topoMerge {
	if entries == nil {
		entries = &topoBudget{limit: math.MaxInt}
	}
	return &topoMerge{job: job, hosts: map[string]*hostTopo{}, claims: map[int][]rankClaim{},
		groups: map[string]*groupAcc{}, seed: maphash.MakeSeed(), entries: entries}
}

// update takes a host's topology; it reports whether the union changed,
// and errTopologyBudget (the host's previous topology kept) when the new
// one does not fit.
func (m *topoMerge) update(host string, t *detector.Topology) (bool, error) {
	h := m.hosts[host]
	if h != nil && topoEqual(&h.topo, t) {
		// The common case, a periodic re-send: no copy, no sort.
		h.version = t.Version
		m.mapVersion(h)
		return false, nil
	}
	n := normalize(t)
	if h != nil && topoEqual(&h.topo, &n) {
		h.version = t.Version
		m.mapVersion(h)
		return false, nil
	}
	// Conservative: what the old topology frees is not counted.
	if cost := m.cost(&n); m.entries.used+cost > m.entries.limit {
		return false, fmt.Errorf("%w: host %s's topology needs %d entries, %d of %d in use", errTopologyBudget, host, cost, m.entries.used, m.entries.limit)
	}
	if h == nil {
		h = &hostTopo{}
		m.hosts[host] = h
	} else {
		m.remove(host, h)
	}
	h.version = t.Version
	h.topo = n
	m.add(host, h)
	m.dirty = true
	return true, nil
}

// cost is the number of entries a normalized topology adds: its ranks and
// the members of the lists not stored yet.
func (m *topoMerge) cost(t *detector.Topology) int {
	n := len(t.Ranks)
	for _, g := range t.Groups {
		acc := m.groups[g.ID]
		if acc == nil {
			n += len(g.Ranks)
		} else if _, l := acc.slot(m.hashRanks(g.Ranks), g.Ranks); l == nil {
			n += len(g.Ranks)
		}
	}
	return n
}

// slot returns the key of the stored list equal to ranks (hash key) and
// the list, or the free key where it belongs and nil.
func (acc *groupAcc) slot(key uint64, ranks []int) (uint64, *memberList) {
	for l := acc.lists[key]; l != nil; l = acc.lists[key] {
		if slices.Equal(l.ranks, ranks) {
			return key, l
		}
		key++ // hash collision: probe
	}
	return key, nil
}

// mapVersion maps the host's current version to the merged version now in
// force when the host re-numbered an unchanged topology.
func (m *topoMerge) mapVersion(h *hostTopo) {
	if m.version == 0 || m.dirty {
		return
	}
	h.mapTo(m.version)
}

// mapTo records that merged version v includes the host's current version:
// the latest merged version including it is what its steps are tagged with.
func (h *hostTopo) mapTo(v int) {
	if n := len(h.versions); n > 0 && h.versions[n-1].host == h.version {
		h.versions[n-1].merged = v
		return
	}
	h.versions = append(h.versions, versionMap{h.version, v})
	if len(h.versions) > 16 {
		h.versions = slices.Delete(h.versions, 0, 1)
	}
}

// forget removes a host's contribution (the host went away).
func (m *topoMerge) forget(host string) {
	h := m.hosts[host]
	if h == nil {
		return
	}
	m.remove(host, h)
	delete(m.hosts, host)
	m.dirty = true
}

func (m *topoMerge) add(host string, h *hostTopo) {
	m.seq++
	h.seq = m.seq
	for _, r := range h.topo.Ranks {
		m.visits++
		m.claims[r.Rank] = append(m.claims[r.Rank], rankClaim{info: r, host: host, seq: m.seq})
	}
	m.entries.used += len(h.topo.Ranks)
	for gi, g := range h.topo.Groups {
		acc := m.groups[g.ID]
		if acc == nil {
			acc = &groupAcc{types: map[string]int{}, lists: map[uint64]*memberList{}, byHost: map[string]uint64{}}
			m.groups[g.ID] = acc
		}
		acc.types[g.Type]++
		key, l := acc.slot(m.hashRanks(g.Ranks), g.Ranks)
		if l == nil {
			l = &memberList{ranks: g.Ranks}
			acc.lists[key] = l
			m.entries.used += len(l.ranks)
		}
		l.refs++
		acc.byHost[host] = key
		// Share the stored list: a thousand hosts listing the same world
		// group hold one copy.
		h.topo.Groups[gi].Ranks = l.ranks
	}
}

// remove takes a host's contribution out: its claims (a rank another host
// still claims goes to it) and its references to member lists.
func (m *topoMerge) remove(host string, h *hostTopo) {
	for _, r := range h.topo.Ranks {
		cs := m.claims[r.Rank]
		m.visits += int64(len(cs))
		cs = slices.DeleteFunc(cs, func(c rankClaim) bool { return c.host == host })
		if len(cs) == 0 {
			delete(m.claims, r.Rank)
		} else {
			m.claims[r.Rank] = cs
		}
	}
	m.entries.used -= len(h.topo.Ranks)
	for _, g := range h.topo.Groups {
		acc := m.groups[g.ID]
		if acc == nil {
			continue
		}
		if acc.types[g.Type]--; acc.types[g.Type] <= 0 {
			delete(acc.types, g.Type)
		}
		if key, ok := acc.byHost[host]; ok {
			if l := acc.lists[key]; l != nil {
				if l.refs--; l.refs <= 0 {
					delete(acc.lists, key)
					m.entries.used -= len(l.ranks)
				}
			}
			delete(acc.byHost, host)
		}
		if len(acc.byHost) == 0 {
			delete(m.groups, g.ID)
		}
	}
}

// winner is the claim of the host that reported last.
func winner(cs []rankClaim) rankClaim {
	best := cs[0]
	for _, c := range cs[1:] {
		if c.seq > best.seq {
			best = c
		}
	}
	return best
}

func (m *topoMerge) hashRanks(rs []int) uint64 {
	var h maphash.Hash
	h.SetSeed(m.seed)
	var b [8]byte
	for _, r := range rs {
		for i := range b {
			b[i] = byte(uint64(r) >> (8 * i))
		}
		h.Write(b[:])
	}
	return h.Sum64()
}

// build returns the merged topology with the next version; call it when
// dirty. Only ranks for which known is true (all when nil) are in it, as
// ranks and as group members: the aggregator passes the ranks that sent
// steps, so that a topology alone creates no rank state. Every host's
// current version then maps to that version.
func (m *topoMerge) build(known func(rank int) bool) detector.Topology {
	if known == nil {
		known = func(int) bool { return true }
	}
	m.version++
	m.dirty = false
	t := detector.Topology{Kind: detector.KindTopology, Job: m.job, Version: m.version}
	t.Ranks = make([]detector.RankInfo, 0, len(m.claims))
	for r, cs := range m.claims {
		if known(r) {
			t.Ranks = append(t.Ranks, winner(cs).info)
		}
	}
	sort.Slice(t.Ranks, func(a, b int) bool { return t.Ranks[a].Rank < t.Ranks[b].Rank })
	ids := make([]string, 0, len(m.groups))
	for id := range m.groups {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		acc := m.groups[id]
		g := detector.Group{ID: id, Type: acc.majorityType()}
		for _, l := range acc.lists {
			for _, r := range l.ranks {
				if known(r) {
					g.Ranks = append(g.Ranks, r)
				}
			}
		}
		if len(g.Ranks) == 0 {
			continue
		}
		if len(acc.lists) > 1 {
			slices.Sort(g.Ranks)
			g.Ranks = slices.Compact(g.Ranks)
		}
		t.Groups = append(t.Groups, g)
	}
	for _, h := range m.hosts {
		h.mapTo(m.version)
	}
	return t
}

func (acc *groupAcc) majorityType() string {
	best, bestN := "", -1
	for typ, n := range acc.types {
		if typ == "other" && len(acc.types) > 1 {
			continue
		}
		if n > bestN || (n == bestN && typ < best) {
			best, bestN = typ, n
		}
	}
	return best
}

// mergedVersion maps a host's topology version to the latest merged version
// that included it; 0 (the detector's "latest") when unknown.
func (m *topoMerge) mergedVersion(host string, v int) int {
	if v == 0 {
		return 0
	}
	h := m.hosts[host]
	if h == nil {
		return 0
	}
	for i := len(h.versions) - 1; i >= 0; i-- {
		if h.versions[i].host == v {
			return h.versions[i].merged
		}
	}
	return 0
}

// normalize copies t with one entry per rank (the last wins), one group
// per id (members merged, the first type) and sorted, unique members.
func normalize(t *detector.Topology) detector.Topology {
	c := *t
	byRank := make(map[int]int, len(t.Ranks))
	c.Ranks = make([]detector.RankInfo, 0, len(t.Ranks))
	for _, r := range t.Ranks {
		if i, ok := byRank[r.Rank]; ok {
			c.Ranks[i] = r
			continue
		}
		byRank[r.Rank] = len(c.Ranks)
		c.Ranks = append(c.Ranks, r)
	}
	byID := make(map[string]int, len(t.Groups))
	c.Groups = make([]detector.Group, 0, len(t.Groups))
	for _, g := range t.Groups {
		if i, ok := byID[g.ID]; ok {
			c.Groups[i].Ranks = append(c.Groups[i].Ranks, g.Ranks...)
			continue
		}
		byID[g.ID] = len(c.Groups)
		g.Ranks = slices.Clone(g.Ranks)
		c.Groups = append(c.Groups, g)
	}
	for i := range c.Groups {
		slices.Sort(c.Groups[i].Ranks)
		c.Groups[i].Ranks = slices.Compact(c.Groups[i].Ranks)
	}
	return c
}

// topoEqual compares two normalized topologies, ignoring the version.
func topoEqual(stored, t *detector.Topology) bool {
	if len(stored.Ranks) != len(t.Ranks) || len(stored.Groups) != len(t.Groups) {
		return false
	}
	if !slices.Equal(stored.Ranks, t.Ranks) {
		return false
	}
	for i, g := range t.Groups {
		s := stored.Groups[i]
		if s.ID != g.ID || s.Type != g.Type || len(s.Ranks) != len(g.Ranks) {
			return false
		}
		if !slices.Equal(s.Ranks, g.Ranks) {
			return false
		}
	}
	return true
}
