package aggregate

import (
	"hash/maphash"
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
// Cost: a host's update costs O(its topology); identical member lists of a
// group (the world group every host lists in full) are stored once and
// reference-counted, so N hosts listing a world group of R ranks cost
// O(N·R) hashing but O(R) memory. Building the merged topology costs
// O(ranks + distinct member lists) and happens at most once per debounce.
type topoMerge struct {
	job     string
	hosts   map[string]*hostTopo
	ranks   map[int]rankClaim
	groups  map[string]*groupAcc
	version int  // merged version last built
	dirty   bool // the union changed since the last build
	seq     int64
	seed    maphash.Seed
}

type hostTopo struct {
	version int   // the host's own numbering
	seq     int64 // update order among hosts
	topo    detector.Topology
	// versions maps the host's recent versions to the merged version that
	// first included them (for re-tagging steps).
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

func newTopoMerge(job string) *topoMerge {
	return &topoMerge{job: job, hosts: map[string]*hostTopo{}, ranks: map[int]rankClaim{},
		groups: map[string]*groupAcc{}, seed: maphash.MakeSeed()}
}

// update takes a host's topology; it reports whether the union changed.
func (m *topoMerge) update(host string, t *detector.Topology) bool {
	h := m.hosts[host]
	if h != nil && topoEqual(&h.topo, t) {
		// The common case, a periodic re-send: no copy, no sort.
		h.version = t.Version
		m.mapVersion(h)
		return false
	}
	n := normalize(t)
	if h == nil {
		h = &hostTopo{}
		m.hosts[host] = h
	} else if topoEqual(&h.topo, &n) {
		h.version = t.Version
		m.mapVersion(h)
		return false
	} else {
		m.remove(host, h)
	}
	h.version = t.Version
	h.topo = n
	m.add(host, h)
	m.dirty = true
	return true
}

// mapVersion maps the host's current version to the merged version now in
// force when the host re-numbered an unchanged topology.
func (m *topoMerge) mapVersion(h *hostTopo) {
	if m.version == 0 || m.dirty {
		return
	}
	if n := len(h.versions); n == 0 || h.versions[n-1].host != h.version {
		h.versions = append(h.versions, versionMap{h.version, m.version})
		if len(h.versions) > 16 {
			h.versions = slices.Delete(h.versions, 0, 1)
		}
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
		m.ranks[r.Rank] = rankClaim{info: r, host: host, seq: m.seq}
	}
	for gi, g := range h.topo.Groups {
		acc := m.groups[g.ID]
		if acc == nil {
			acc = &groupAcc{types: map[string]int{}, lists: map[uint64]*memberList{}, byHost: map[string]uint64{}}
			m.groups[g.ID] = acc
		}
		acc.types[g.Type]++
		key := m.hashRanks(g.Ranks)
		l := acc.lists[key]
		for l != nil && !slices.Equal(l.ranks, g.Ranks) { // hash collision: probe
			key++
			l = acc.lists[key]
		}
		if l == nil {
			l = &memberList{ranks: g.Ranks}
			acc.lists[key] = l
		}
		l.refs++
		acc.byHost[host] = key
		// Share the stored list: a thousand hosts listing the same world
		// group hold one copy.
		h.topo.Groups[gi].Ranks = l.ranks
	}
}

func (m *topoMerge) remove(host string, h *hostTopo) {
	for _, r := range h.topo.Ranks {
		if c, ok := m.ranks[r.Rank]; ok && c.host == host {
			delete(m.ranks, r.Rank)
			// Another host may still claim it (a rank that moved): the one
			// that reported last wins.
			var best rankClaim
			for oh, ot := range m.hosts {
				if oh == host || ot.seq < best.seq {
					continue
				}
				for _, or := range ot.topo.Ranks {
					if or.Rank == r.Rank && (ot.seq > best.seq || oh < best.host) {
						best = rankClaim{info: or, host: oh, seq: ot.seq}
					}
				}
			}
			if best.host != "" {
				m.ranks[r.Rank] = best
			}
		}
	}
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
				}
			}
			delete(acc.byHost, host)
		}
		if len(acc.byHost) == 0 {
			delete(m.groups, g.ID)
		}
	}
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
// dirty. Every host's current version then maps to that version.
func (m *topoMerge) build() detector.Topology {
	m.version++
	m.dirty = false
	t := detector.Topology{Kind: detector.KindTopology, Job: m.job, Version: m.version}
	t.Ranks = make([]detector.RankInfo, 0, len(m.ranks))
	for _, c := range m.ranks {
		t.Ranks = append(t.Ranks, c.info)
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
		if len(acc.lists) == 1 {
			for _, l := range acc.lists {
				g.Ranks = slices.Clone(l.ranks)
			}
		} else {
			n := 0
			for _, l := range acc.lists {
				n += len(l.ranks)
			}
			g.Ranks = make([]int, 0, n)
			for _, l := range acc.lists {
				g.Ranks = append(g.Ranks, l.ranks...)
			}
			slices.Sort(g.Ranks)
			g.Ranks = slices.Compact(g.Ranks)
		}
		t.Groups = append(t.Groups, g)
	}
	for _, h := range m.hosts {
		if n := len(h.versions); n == 0 || h.versions[n-1].host != h.version {
			h.versions = append(h.versions, versionMap{h.version, m.version})
			if len(h.versions) > 16 {
				h.versions = slices.Delete(h.versions, 0, 1)
			}
		}
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

// mergedVersion maps a host's topology version to the merged version that
// first included it; 0 (the detector's "latest") when unknown.
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
