package correlate

import (
	"math"
	"slices"

	"github.com/slowrank/slowrank/internal/stats"
)

// Arrival order: every local member of a communicator notes the host
// start of its call with each sequence number in the group's arrival ring
// (commGroup.noteStart); a step settles its collectives against the other
// members' (arrivalStage) and resolves near ties with their device
// communication time of the same step (arrivalFields, recentComm).

const (
	arrivalSlots = 4096          // sequence numbers in a group's arrival ring
	absent       = math.MinInt64 // a member's call not seen in a ring row
)

// collRef is one collective of a step: its group and sequence number, and
// its host start.
type collRef struct {
	grp   uint32
	seq   uint64
	start int64
}

// tieSet counts collectives at which this rank and the listed peers
// arrived within ArrivalTie of each other and last.
type tieSet struct {
	procs []*proc // self included
	n     int
}

// recentComm is the device communication time of a measured step, which
// the peers' ties read (proc.recent, by step index % recentN).
type recentComm struct {
	idx    int64
	commNS int64
	ok     bool
}

const recentN = 64

func (g *commGroup) memberIndex(p *proc) int {
	for i, m := range g.members {
		if m != nil && m.p == p {
			return i
		}
	}
	return -1
}

// noteStart notes the host start of pc's call with sequence number seq,
// which NCCL names key (callKey; 0: not known). It reports false when the
// call is not the one the other members noted under seq: their sequence
// numbers count different calls (one rank's capture saw a call the others'
// did not), and the row is not compared.
func (g *commGroup) noteStart(pc *procComm, seq uint64, start int64, key uint64) bool {
	if g.width != len(g.members) {
		g.width = len(g.members)
		g.seqs = make([]uint64, arrivalSlots)
		g.starts = make([]int64, arrivalSlots*g.width)
		g.devStarts, g.devEnds, g.names = nil, nil, nil // made on first use
	}
	mi := slices.Index(g.members, pc)
	if mi < 0 {
		return true
	}
	w := int(seq % arrivalSlots)
	row := g.starts[w*g.width : (w+1)*g.width]
	if g.seqs[w] != seq {
		g.seqs[w] = seq
		for i := range row {
			row[i] = absent
		}
		if g.devStarts != nil {
			for i := w * g.width; i < (w+1)*g.width; i++ {
				g.devStarts[i], g.devEnds[i] = absent, absent
			}
		}
		if g.names != nil {
			g.names.rows[w] = rowName{}
		}
	}
	row[mi] = start
	if key == 0 {
		return true
	}
	if g.names == nil {
		g.names = new(callNames) // made at the group's first plugin call
	}
	return g.names.note(w, seq, key)
}

// callNames are NCCL's names of a group's calls (plugin path): per row
// the name the first member that knew it noted and whether a member noted
// another, and the row each name was noted at (by name, direct-mapped: a
// name pushed out only costs one realignment chance).
type callNames struct {
	rows [arrivalSlots]rowName
	at   [arrivalSlots]namedRow
}

type rowName struct {
	key uint64
	bad bool
}

type namedRow struct{ key, seq uint64 }

// note notes the name key of the call at row w (sequence number seq);
// false when another member noted another name there.
func (n *callNames) note(w int, seq, key uint64) bool {
	n.at[key%arrivalSlots] = namedRow{key, seq}
	r := &n.rows[w]
	switch {
	case r.key == 0:
		r.key = key
	case r.key != key:
		ok := r.bad
		r.bad = true
		return ok
	}
	return true
}

// seqOf returns the row at which a member noted the call named key.
func (n *callNames) seqOf(key uint64) (uint64, bool) {
	if n == nil {
		return 0, false
	}
	r := n.at[key%arrivalSlots]
	return r.seq, r.key == key
}

// callKey is NCCL's name of a plugin call, (op, NCCL seq), as a nonzero
// number; 0 when the call has none.
func callKey(h *HostCall) uint64 {
	if !h.HasNCCLSeq {
		return 0
	}
	return mix64(h.NCCLSeq^fnvString(string(h.Op))) | 1
}

// row is the members' starts of the calls with sequence number seq, nil
// when it left the ring.
func (g *commGroup) row(seq uint64) []int64 {
	if g.width == 0 {
		return nil
	}
	w := int(seq % arrivalSlots)
	if g.seqs[w] != seq || g.names != nil && g.names.rows[w].bad {
		return nil
	}
	return g.starts[w*g.width : (w+1)*g.width]
}

// arrivalReady reports whether every other local member of the step's
// communicators has issued the step's collectives.
func (c *Correlator) arrivalReady(p *proc, s *pendingStep) bool {
	for _, cr := range s.colls {
		g := c.groups[cr.grp]
		if g == nil {
			continue
		}
		for _, m := range g.members {
			if m != nil && m.p != p && m.seq < cr.seq {
				return false
			}
		}
	}
	return true
}

// arrivalStage gathers the step's collective arrival evidence against the
// other local members: the lag behind the first arrival (median over the
// step's collectives) and, per collective, whether this rank arrived last.
// Arrivals closer than ArrivalTie are ties, kept for arrivalFields.
func (c *Correlator) arrivalStage(p *proc, s *pendingStep) {
	lags := c.sc.lags[:0]
	tie := int64(c.cfg.ArrivalTie)
	for _, cr := range s.colls {
		g := c.groups[cr.grp]
		if g == nil {
			continue
		}
		row := g.row(cr.seq)
		self := g.memberIndex(p)
		if row == nil || self < 0 || self >= len(row) || row[self] == absent {
			continue
		}
		mine := row[self]
		lo, hi, n := g.span(row)
		if n < 2 {
			continue
		}
		lags = append(lags, mine-lo)
		if hi-mine >= tie {
			s.votes++ // someone clearly arrived later
			continue
		}
		var mask uint64
		tied := 0
		for i, v := range row {
			if v != absent && g.members[i] != nil && hi-v < tie {
				tied++
				if i < 64 {
					mask |= 1 << i
				}
			}
		}
		if tied == 1 {
			s.votes++
			s.lastVotes++
			continue
		}
		c.addTie(s, g, mask)
	}
	c.sc.lags = lags
	if len(lags) > 0 {
		s.lagMS, s.hasLag = stats.MedianIntFloat(lags)/1e6, true
	}
}

// span is the earliest and latest of a row's times (host or kernel
// starts) of live members, and how many there are.
func (g *commGroup) span(row []int64) (lo, hi int64, n int) {
	lo, hi = math.MaxInt64, math.MinInt64
	for i, v := range row {
		if v != absent && g.members[i] != nil {
			n++
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	return lo, hi, n
}

func (c *Correlator) addTie(s *pendingStep, g *commGroup, mask uint64) {
	var procs []*proc
	for i, m := range g.members {
		if i < 64 && mask&(1<<i) != 0 && m != nil {
			procs = append(procs, m.p)
		}
	}
	for i := range s.ties {
		if slices.Equal(s.ties[i].procs, procs) {
			s.ties[i].n++
			return
		}
	}
	if len(s.ties) < 16 {
		s.ties = append(s.ties, tieSet{procs: procs, n: 1})
	}
}

// arrivalFields resolves ties with device communication time (the last
// to arrive waits least; undecided ties do not vote) and returns the
// step's LastArrival and ArrivalLagMS.
func (c *Correlator) arrivalFields(s *pendingStep) (*bool, *float64) {
	votes, lastVotes := s.votes, s.lastVotes
	for _, t := range s.ties {
		var best *proc
		bestNS, decided := int64(math.MaxInt64), true
		for _, q := range t.procs {
			rc := q.recent[uint64(s.idx)%recentN]
			if !rc.ok || rc.idx != s.idx {
				decided = false
				break
			}
			switch {
			case rc.commNS < bestNS:
				best, bestNS = q, rc.commNS
			case rc.commNS == bestNS:
				best = nil
			}
		}
		if decided && best != nil {
			votes += t.n
			if best == s.self {
				lastVotes += t.n
			}
		}
	}
	var last *bool
	var lag *float64
	if votes > 0 {
		v := 2*lastVotes > votes
		last = &v
	}
	if s.hasLag {
		v := s.lagMS
		lag = &v
	}
	return last, lag
}
