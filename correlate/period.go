package correlate

import (
	"cmp"
	"math"
)

// Step detection on one communicator's call sequence.
//
// Every collective call becomes a token: an interned signature (op, count,
// datatype). A synchronisation that follows at least one collective of the
// communicator becomes the sync token S (consecutive synchronisations
// collapse into one). A seqDet finds the cycle of that token sequence and
// reports step boundaries as events; it looks only at token equality, so
// every member of a communicator, which sees the same sequence, reaches the
// same decisions at the same tokens: step k is the same iteration on all.
//
// Search (unlocked): runs[p] is the number of consecutive latest tokens t
// with t[i] == t[i-p]. The candidate period is the p with the longest run
// (ties: smallest p), accepted when the run covers Repeats cycles
// (runs[p] >= (Repeats-1)*p), the cycle contains S (unless the sequence
// has had no S for NoSyncMinCalls tokens), and it starts after the last
// settled boundary. The cycle is rotated to start at the first collective
// of the periodic region, so a step ends with its trailing synchronisation.
//
// Lock: each token must equal the expected cycle token; a completed cycle
// is a boundary at the time of its last token (the return of the
// synchronisation that follows the step's last collective, or that
// collective's return when the cycle has no S). A mismatch breaks the lock:
// the partial cycle is irregular and the search resumes.
//
// Confirmation: a fresh lock is tentative; its steps are held until it has
// held ConfirmCycles more cycles (PromoteCycles when the communicator
// already has a known cycle), and withdrawn with their indices if it breaks
// before. Confirmed cycles are remembered (up to maxKnown); a known cycle
// is re-locked as soon as one full instance of it is seen (KMP matching),
// without waiting for repetitions.

const (
	tokS     int32 = 0 // the synchronisation token
	maxKnown       = 8
	maxSigs        = 4096
)

type sigKey struct {
	op     string
	count  uint64
	dtype  uint32
	stream uint64
}

type detEventKind uint8

const (
	evStart    detEventKind = iota + 1 // a step opens at t
	evBoundary                         // the open step closes at t with index idx; the next opens
	evBreak                            // the sequence left the cycle: the open step is irregular
	evConfirm                          // the tentative lock gen is confirmed
	evRetract                          // the tentative lock gen is withdrawn with its steps
)

type detEvent struct {
	kind      detEventKind
	tentative bool
	gen       uint32
	t         int64
	idx       int64
}

type knownCycle struct {
	ids     []int32
	fail    []int32
	state   int32
	lastUse uint64
}

func newKnown(ids []int32) *knownCycle {
	k := &knownCycle{ids: append([]int32(nil), ids...), fail: make([]int32, len(ids))}
	// KMP failure function.
	var l int32
	for i := 1; i < len(ids); i++ {
		for l > 0 && ids[i] != ids[l] {
			l = k.fail[l-1]
		}
		if ids[i] == ids[l] {
			l++
		}
		k.fail[i] = l
	}
	return k
}

// step advances the matcher by one token and reports a full match.
func (k *knownCycle) step(x int32) bool {
	s := k.state
	for s > 0 && k.ids[s] != x {
		s = k.fail[s-1]
	}
	if k.ids[s] == x {
		s++
	}
	if int(s) == len(k.ids) {
		k.state = k.fail[s-1]
		return true
	}
	k.state = s
	return false
}

type detParams struct {
	repeats, maxPeriod, confirm, promote, noSyncMin int
}

// detState is what a step detector (seqDet, burstDet) shows the step
// timeline: its pending events, its lock and its counters.
type detState struct {
	events            []detEvent
	locked, tentative bool
	irregular         uint64 // calls outside a locked cycle
	relocks           uint64
}

func (d *detState) emit(e detEvent) { d.events = append(d.events, e) }

type seqDet struct {
	detState
	par      detParams
	syncOnly bool // every token is a synchronisation (fallback clock)
	midRun   bool // the sequence is seen from the middle (midRunStart)

	sigs map[sigKey]int32
	keys []sigKey // keys[id-1] is the key of token id

	ids  []int32 // ring of the latest tokens, indexed by absolute token number & mask
	ts   []int64 // token times
	mask int64
	max  int   // ring capacity when fully grown
	n    int64 // tokens seen

	runs      []int32
	runsFresh bool
	lastS     int64 // absolute number of the latest S, -1 when none
	floor     int64 // tokens before this belong to settled cycles

	cycle            []int32
	pos              int
	gen              uint32
	since            int // cycles completed since the lock
	need             int // cycles needed to confirm
	nextIdx, genBase int64
	genFloor         int64 // floor when the tentative lock was taken

	known []*knownCycle
	clock uint64 // use counter for known-cycle LRU

	resets uint64
}

func newSeqDet(par detParams, syncOnly bool) *seqDet {
	size := 64
	want := (par.repeats + 1) * par.maxPeriod
	capacity := 1
	for capacity < want+1 {
		capacity <<= 1
	}
	if size > capacity {
		size = capacity
	}
	d := &seqDet{
		par:      par,
		syncOnly: syncOnly,
		sigs:     make(map[sigKey]int32),
		max:      capacity,
		lastS:    -1,
	}
	d.ids = make([]int32, size)
	d.ts = make([]int64, size)
	d.mask = int64(size - 1)
	d.runs = make([]int32, par.maxPeriod+1)
	d.runsFresh = true
	return d
}

func (d *seqDet) intern(k sigKey) int32 {
	// Locked, the cycle predicts the next token: one comparison instead of
	// hashing the key (the map lookup was a quarter of the agent's CPU at
	// 100,000 calls/s).
	if d.locked {
		if id := d.cycle[d.pos]; id > 0 && int(id) <= len(d.keys) && d.keys[id-1] == k {
			return id
		}
	}
	if id, ok := d.sigs[k]; ok {
		return id
	}
	if len(d.sigs) >= maxSigs {
		d.reset()
	}
	id := int32(len(d.sigs) + 1)
	d.sigs[k] = id
	d.keys = append(d.keys, k)
	return id
}

// reset forgets everything except the index counter, so that indices
// stay increasing.
func (d *seqDet) reset() {
	d.resets++
	clear(d.sigs)
	d.keys = d.keys[:0]
	d.n, d.floor, d.lastS = 0, 0, -1
	clear(d.runs)
	d.runsFresh = true
	if d.locked {
		if d.tentative {
			d.emit(detEvent{kind: evRetract, gen: d.gen})
			d.nextIdx = d.genBase
		} else {
			d.emit(detEvent{kind: evBreak})
		}
	}
	d.locked, d.tentative = false, false
	d.known = d.known[:0]
}

func (d *seqDet) at(abs int64) int32  { return d.ids[abs&d.mask] }
func (d *seqDet) tAt(abs int64) int64 { return d.ts[abs&d.mask] }
func (d *seqDet) oldest() int64 {
	o := d.n - int64(len(d.ids))
	if o < 0 {
		return 0
	}
	return o
}

func (d *seqDet) grow() {
	if d.n < int64(len(d.ids)) || len(d.ids) >= d.max {
		return
	}
	// Not wrapped yet: absolute numbers equal positions.
	nl := len(d.ids) * 2
	ids := make([]int32, nl)
	ts := make([]int64, nl)
	copy(ids, d.ids)
	copy(ts, d.ts)
	d.ids, d.ts, d.mask = ids, ts, int64(nl-1)
}

// hasKnown reports whether a cycle has been confirmed on this sequence.
func (d *seqDet) hasKnown() bool { return len(d.known) > 0 }

// push appends one token at time t and runs the detector.
func (d *seqDet) push(id int32, t int64) {
	d.grow()
	n := d.n
	d.ids[n&d.mask] = id
	d.ts[n&d.mask] = t
	d.n++
	if id == tokS && !d.syncOnly {
		d.lastS = n
	}
	if d.locked {
		if id == d.cycle[d.pos] {
			d.pos++
			if d.pos == len(d.cycle) {
				d.pos = 0
				d.cycleDone(t)
			}
			if d.tentative {
				d.stepKnown(id, n)
			}
			return
		}
		d.breakLock(n)
	} else {
		d.irregular++
	}
	var best int64
	var bestRun int32
	if d.runsFresh {
		best, bestRun = d.updateRuns(n)
	} else {
		best, bestRun = d.recomputeRuns(n)
	}
	if d.stepKnown(id, n) {
		return
	}
	d.search(n, best, bestRun)
}

func (d *seqDet) cycleDone(t int64) {
	d.emit(detEvent{kind: evBoundary, tentative: d.tentative, gen: d.gen, t: t, idx: d.nextIdx})
	d.nextIdx++
	d.floor = d.n
	if !d.tentative {
		return
	}
	d.since++
	if d.since >= d.need {
		d.tentative = false
		d.emit(detEvent{kind: evConfirm, gen: d.gen})
		d.remember(d.cycle)
	}
}

// settled is the first token not part of a confirmed cycle instance.
func (d *seqDet) settled() int64 {
	if d.locked && d.tentative {
		return d.genFloor
	}
	return d.floor
}

// retract withdraws the tentative lock: its steps and indices are
// forgotten and its tokens are unsettled again.
func (d *seqDet) retract() {
	d.emit(detEvent{kind: evRetract, gen: d.gen})
	d.nextIdx = d.genBase
	d.floor = d.genFloor
}

func (d *seqDet) breakLock(n int64) {
	d.irregular += uint64(d.pos) + 1
	if d.tentative {
		d.retract()
	} else {
		d.emit(detEvent{kind: evBreak})
	}
	d.locked, d.tentative = false, false
	d.runsFresh = false
	// Known-cycle matchers restart on the tokens after the last settled
	// boundary, the mismatching one included.
	for _, k := range d.known {
		k.state = 0
		from := max(d.floor, n-int64(len(k.ids))+1, d.oldest())
		for i := from; i < n; i++ {
			// A full match cannot complete here: it would have been the
			// locked cycle's instance.
			k.step(d.at(i))
		}
	}
}

// updateRuns extends runs by token n and returns the period with the
// longest run (ties: the smallest).
func (d *seqDet) updateRuns(n int64) (best int64, bestRun int32) {
	lim := int64(d.par.maxPeriod)
	if n < lim {
		lim = n
	}
	x := d.ids[n&d.mask]
	runs := d.runs[:lim+1]
	ids := d.ids
	mask := d.mask
	for p := int64(1); p <= lim; p++ {
		r := runs[p]
		if ids[(n-p)&mask] == x {
			if r < math.MaxInt32 {
				r++
			}
		} else {
			r = 0
		}
		runs[p] = r
		if r > bestRun {
			best, bestRun = p, r
		}
	}
	return best, bestRun
}

// recomputeRuns rebuilds runs from the history, after a lock during
// which they were not maintained.
func (d *seqDet) recomputeRuns(n int64) (best int64, bestRun int32) {
	oldest := d.oldest()
	lim := int64(d.par.maxPeriod)
	if n-oldest < lim {
		lim = n - oldest
	}
	for p := int64(1); p <= lim; p++ {
		var r int32
		for i := n; i-p >= oldest && d.at(i) == d.at(i-p); i-- {
			r++
		}
		d.runs[p] = r
		if r > bestRun {
			best, bestRun = p, r
		}
	}
	clear(d.runs[lim+1:])
	d.runsFresh = true
	return best, bestRun
}

// stepKnown advances the known-cycle matchers and re-locks on a full match.
func (d *seqDet) stepKnown(id int32, n int64) bool {
	for _, k := range d.known {
		if !k.step(id) {
			continue
		}
		p := int64(len(k.ids))
		j := n - p + 1
		if j < d.settled() || j < d.oldest() {
			continue
		}
		if d.locked && d.tentative {
			d.retract()
		}
		d.clock++
		k.lastUse = d.clock
		d.relocks++
		d.lockAt(k.ids, j, n, false)
		return true
	}
	return false
}

// search locks onto the period with the longest run when that run covers
// Repeats cycles and the cycle qualifies.
func (d *seqDet) search(n, best int64, bestRun int32) {
	if best == 0 || int64(bestRun) < int64(d.par.repeats-1)*best {
		return
	}
	p := best
	j := n - int64(bestRun) - p + 1
	j = max(j, d.floor, d.oldest())
	if n-j+1 < p {
		return
	}
	if !d.syncOnly {
		// Rotate: the cycle starts with a collective.
		for k := int64(0); k < p-1 && d.at(j) == tokS; k++ {
			j++
		}
		if n-j+1 < p {
			return
		}
		if d.midRun {
			if j = d.midRunStart(j, p, n); n-j+1 < p {
				return
			}
		}
		hasS := false
		for i := j; i < j+p; i++ {
			if d.at(i) == tokS {
				hasS = true
				break
			}
		}
		if !hasS && !d.noSyncAllowed(n) {
			return
		}
	}
	cyc := make([]int32, p)
	for i := range cyc {
		cyc[i] = d.at(j + int64(i))
	}
	confirmed := false
	for _, k := range d.known {
		if equalIDs(k.ids, cyc) {
			d.clock++
			k.lastUse = d.clock
			confirmed = true
			d.relocks++
			break
		}
	}
	d.lockAt(cyc, j, n, !confirmed)
}

// midRunStart rotates a cycle found in a sequence seen from the middle of
// an iteration (the agent attached mid-run): the periodic region then
// starts wherever the first recorded call fell, and every rank would cut
// its steps elsewhere. The cycle starts instead right after one of its
// synchronisations, so that a step ends with one, as it does when the
// sequence is seen from the start; with several, after the one whose
// rotation has the smallest signatures, a choice every rank makes alike
// (token ids differ between ranks, signatures do not). j is the first token
// of the periodic region, p the period.
func (d *seqDet) midRunStart(j, p, n int64) int64 {
	best := int64(-1)
	// Candidates r whose preceding S lies in the region, so that every
	// rank weighs the same p rotations wherever its recording began.
	for r := j + 1; r <= min(j+p, n); r++ {
		if d.at(r-1) != tokS || d.at(r) == tokS {
			continue
		}
		if best < 0 || d.lessRotation(r, best, p) {
			best = r
		}
	}
	if best < 0 {
		return j // no synchronisation in the cycle: keep the first collective
	}
	return best
}

// lessRotation orders the rotations starting at tokens a and b by their
// signatures, token by token (S sorts first).
func (d *seqDet) lessRotation(a, b, p int64) bool {
	for i := range p {
		ka, kb := d.keyAt(a+i), d.keyAt(b+i)
		if c := compareKeys(ka, kb); c != 0 {
			return c < 0
		}
	}
	return false
}

// keyAt is the signature of token i (zero for S).
func (d *seqDet) keyAt(i int64) sigKey {
	if id := d.at(i); id != tokS && int(id) <= len(d.keys) {
		return d.keys[id-1]
	}
	return sigKey{}
}

func compareKeys(a, b sigKey) int {
	return cmp.Or(cmp.Compare(a.op, b.op), cmp.Compare(a.count, b.count), cmp.Compare(a.dtype, b.dtype), cmp.Compare(a.stream, b.stream))
}

func (d *seqDet) noSyncAllowed(n int64) bool {
	if d.lastS < 0 {
		return n+1 >= int64(d.par.noSyncMin)
	}
	return n-d.lastS >= int64(d.par.noSyncMin)
}

// lockAt locks onto cyc whose first instance starts at token j; tokens up
// to n have been seen. Completed instances are reported retroactively.
func (d *seqDet) lockAt(cyc []int32, j, n int64, tentative bool) {
	p := int64(len(cyc))
	d.locked, d.tentative = true, tentative
	d.cycle = append(d.cycle[:0], cyc...)
	d.gen++
	d.genBase = d.nextIdx
	d.genFloor = d.floor
	d.since = 0
	if tentative {
		d.need = d.par.confirm
		if len(d.known) > 0 {
			d.need = d.par.promote
		}
	}
	// The token before the first instance is a stable start when it is a
	// synchronisation (for the sync-only clock every token is one).
	if j-1 >= d.oldest() && j-1 >= 0 && (d.syncOnly || d.at(j-1) == tokS) {
		d.emit(detEvent{kind: evStart, t: d.tAt(j - 1)})
	} else {
		d.emit(detEvent{kind: evStart, t: d.tAt(j + p - 1)})
		j += p // the first instance only opens the first step
	}
	d.floor = max(d.floor, j)
	for e := j + p - 1; e <= n; e += p {
		d.emit(detEvent{kind: evBoundary, tentative: tentative, gen: d.gen, t: d.tAt(e), idx: d.nextIdx})
		d.nextIdx++
		d.floor = e + 1
	}
	d.pos = int((n + 1 - j) % p)
	if !tentative {
		d.remember(cyc)
	}
	for _, k := range d.known {
		k.state = 0
	}
}

func (d *seqDet) remember(cyc []int32) {
	d.clock++
	for _, k := range d.known {
		if equalIDs(k.ids, cyc) {
			k.lastUse = d.clock
			return
		}
	}
	k := newKnown(cyc)
	k.lastUse = d.clock
	d.known = remember(d.known, k, func(k *knownCycle) uint64 { return k.lastUse })
}

// remember adds k to known, in place of the least recently used entry once
// known holds maxKnown.
func remember[T any](known []T, k T, lastUse func(T) uint64) []T {
	if len(known) < maxKnown {
		return append(known, k)
	}
	lru := 0
	for i, o := range known {
		if lastUse(o) < lastUse(known[lru]) {
			lru = i
		}
	}
	known[lru] = k
	return known
}

func equalIDs(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
