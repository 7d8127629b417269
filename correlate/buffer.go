package correlate

import (
	"cmp"
	"math"
	"slices"
)

type recKind uint8

const (
	rSync recKind = iota + 1
	rCollWait
	rColl
	rKernel // non-communication kernel that is neither attention nor MoE
	rAttn
	rMoE
	rCopy
	rComm
)

// rec is a host or device interval waiting for its step.
type rec struct {
	start, end int64
	aux        uint64 // kernel: fingerprint contribution (0: unnamed); collective: seq
	ref        uint32 // collective: group number
	kind       recKind
}

// recBuf holds records sorted by end time. Records arrive nearly in end
// order; a late one is inserted in place. When full, the oldest record is
// pushed out and holeEnd remembers how far records may be missing.
type recBuf struct {
	recs    []rec
	head    int
	limit   int
	holeEnd int64
}

func (b *recBuf) len() int { return len(b.recs) - b.head }

func (b *recBuf) front() *rec { return &b.recs[b.head] }

func (b *recBuf) pop() {
	b.head++
	if b.head == len(b.recs) {
		b.recs, b.head = b.recs[:0], 0
	}
}

// insert adds r in end order; it reports whether r was out of order and
// whether an older record was evicted.
func (b *recBuf) insert(r rec) (reordered, evicted bool) {
	if b.len() >= b.limit {
		if o := b.recs[b.head]; o.end > b.holeEnd {
			b.holeEnd = o.end
		}
		b.pop()
		evicted = true
	}
	if len(b.recs) == cap(b.recs) && b.head > 0 {
		n := copy(b.recs, b.recs[b.head:])
		b.recs, b.head = b.recs[:n], 0
	}
	l := len(b.recs)
	if l == b.head || b.recs[l-1].end <= r.end {
		b.recs = append(b.recs, r)
		return false, evicted
	}
	i, _ := slices.BinarySearchFunc(b.recs[b.head:], r.end, func(x rec, t int64) int {
		if x.end <= t {
			return -1
		}
		return 1
	})
	i += b.head
	b.recs = append(b.recs, rec{})
	copy(b.recs[i+1:], b.recs[i:l])
	b.recs[i] = r
	return true, evicted
}

type span struct{ s, e int64 }

const openEnd = math.MaxInt64

// spanSet is a small bounded list of time spans sorted by start.
type spanSet struct {
	v []span
}

const maxSpans = 256

func (ss *spanSet) add(s, e int64) {
	if e <= 0 {
		e = openEnd
	}
	if e < s {
		return
	}
	// Close an open span with the same start.
	for i := range ss.v {
		if ss.v[i].s == s && ss.v[i].e == openEnd {
			ss.v[i].e = e
			return
		}
	}
	i, _ := slices.BinarySearchFunc(ss.v, s, func(x span, t int64) int { return cmp.Compare(x.s, t) })
	ss.v = slices.Insert(ss.v, i, span{s, e})
	if len(ss.v) > maxSpans {
		ss.v = slices.Delete(ss.v, 0, 1)
	}
}

// contains reports whether [s, e] lies inside the union of the spans.
func (ss *spanSet) contains(s, e int64) bool {
	var cs, ce int64
	have := false
	for _, v := range ss.v {
		if !have || v.s > ce {
			if v.s > s {
				break // a block starting after s cannot contain it
			}
			cs, ce, have = v.s, v.e, true
		} else if v.e > ce {
			ce = v.e
		}
		if cs <= s && ce >= e {
			return true
		}
	}
	return false
}

// overlaps reports whether some span meets (s, e].
func (ss *spanSet) overlaps(s, e int64) bool {
	for _, v := range ss.v {
		if v.s > e {
			break
		}
		if v.e > s {
			return true
		}
	}
	return false
}

// prune drops spans that end before t.
func (ss *spanSet) prune(t int64) {
	k := 0
	for _, v := range ss.v {
		if v.e >= t {
			ss.v[k] = v
			k++
		}
	}
	ss.v = ss.v[:k]
}

// dedup is a direct-mapped table of recently seen (corr, start) keys of
// device records. A collision overwrites: duplicates of records seen long
// ago may go unnoticed, but a new record is never taken for a duplicate.
type dedup struct {
	t []dedupSlot
}

type dedupSlot struct {
	start int64
	corr  uint32
	used  bool
}

const dedupBits = 14

func (d *dedup) seen(corr uint32, start int64) bool {
	if d.t == nil {
		d.t = make([]dedupSlot, 1<<dedupBits)
	}
	h := uint64(start)*0x9E3779B97F4A7C15 ^ uint64(corr)*0xC2B2AE3D27D4EB4F
	s := &d.t[h>>(64-dedupBits)]
	if s.used && s.start == start && s.corr == corr {
		return true
	}
	*s = dedupSlot{start: start, corr: corr, used: true}
	return false
}

// unionNS sorts xs by start and returns the length of their union.
func unionNS(xs []span) int64 {
	if len(xs) == 0 {
		return 0
	}
	if !slices.IsSortedFunc(xs, cmpSpan) {
		slices.SortFunc(xs, cmpSpan)
	}
	var total int64
	cs, ce := xs[0].s, xs[0].e
	for _, x := range xs[1:] {
		if x.s > ce {
			total += ce - cs
			cs, ce = x.s, x.e
		} else if x.e > ce {
			ce = x.e
		}
	}
	return total + ce - cs
}

// unionMergedNS is the length of the union of a and b, both sorted by start.
func unionMergedNS(a, b []span) int64 {
	var total int64
	var cs, ce int64
	started := false
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		var x span
		if j >= len(b) || (i < len(a) && a[i].s <= b[j].s) {
			x = a[i]
			i++
		} else {
			x = b[j]
			j++
		}
		switch {
		case !started:
			cs, ce, started = x.s, x.e, true
		case x.s > ce:
			total += ce - cs
			cs, ce = x.s, x.e
		case x.e > ce:
			ce = x.e
		}
	}
	if started {
		total += ce - cs
	}
	return total
}

func cmpSpan(a, b span) int { return cmp.Compare(a.s, b.s) }
