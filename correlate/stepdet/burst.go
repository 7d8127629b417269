package stepdet

import "slices"

// Step detection for collectives that carry no sizes.
//
// The torch c10d probes (ProcessGroupGloo::allreduce, ...) see no tensor
// sizes: every DDP bucket all-reduce has the same signature, so the token
// detector of period.go finds a cycle of one call and cuts a step per
// bucket. The synchronisation token does not rescue it: gloo's CUDA path
// synchronises a stream once per bucket on its worker threads, and many
// loops make no per-step synchronisation at all. A communicator whose
// collectives have no size (Call.Count == 0) is therefore handed to a
// burstDet, which takes the period from timing.
//
// Why call timing and not the period of synchronisation calls: the
// synchronisations a loop makes are optional and data dependent (.item(),
// timers, gloo's per-bucket stream syncs from other threads), while the
// collective bursts are structural. DDP issues one all-reduce per bucket
// from the backward pass, in the same order on every rank, and after the
// bucket rebuild of the first iteration the bucket count is constant. The
// forward pass, the optimizer and data loading leave one gap per iteration
// that is much longer than the gaps between buckets. So the period is
// counted in calls (identical on all ranks) and timing only says where in
// the call sequence an iteration starts.
//
// Per call i: gap(i) = start(i) − return(i−1), less the time the thread
// of both calls spent in collective waits between them (gloo's Work::wait
// after each all-reduce blocks until the slowest peer has called it, so
// the raw gap before a bucket holds the peers' backward pass and can reach
// the boundary's; only the host's own time tells the burst apart; DDP's
// reducer waits from the autograd thread, which is not the collectives'
// one, and does not count); reach(i) = how many gaps
// right before i are shorter than gap(i)/burstRatio. A burst of P calls
// that starts at i is dominated by the gap before the next burst:
// reach(i+P) ≥ P−1. Candidates, in order of preference:
//
//   - byGap: P = reach(n)+1 ≥ 2 at the latest call n, and Repeats bursts
//     back every burst start has reach ≥ P−1 and the bursts carry equal
//     tokens: one dominant gap per period at a fixed phase, which
//     multiples of the period fail. A divisor can pass when stalls sit in
//     the middle of bursts, so a period shorter than the latest lock's must
//     hold over Repeats−1 of the latest period. The lock's first step
//     reaches back from the burst after the earliest dominated one (the
//     earliest start whose gap dominates the calls before it: a stall
//     inside a longer first iteration dominates the few calls before it
//     too) over the earlier bursts that are whole iterations: the cycle's
//     tokens, and a gap before each that dominates every gap inside it
//     and is of a boundary's size (at least 1/burstRatio of the lock's
//     shortest boundary gap); a burst's end is the next one's verified
//     start. So the first iterations are steps although no gap after them
//     dominates them: iteration 0's burst may hold the first forward pass
//     (the H200 gloo captures: first facts in iterations 3 and 4 without
//     the reach-back, 1 with it). The walk stops at a burst of other
//     tokens, at one whose start gap does not dominate every gap inside it
//     or is of a bucket's size (init-time all-reduces close together)
//     and at the calls of reported steps; it is done before the lock
//     reports its first step, so that steps stay in order. The walk's
//     earliest burst rests on its own start gap alone: a stall inside a
//     longer iteration 0 (DDP's buckets before their rebuild) at the
//     cycle's phase makes that iteration's tail a step, which ends where
//     the iteration ends.
//   - a confirmed cycle, as soon as one burst of it is seen again.
//   - byTokens: the tokens themselves have a cycle with at least two
//     distinct signatures (torch's broadcast of buffers before the bucket
//     all-reduces, say), found as in period.go; the step starts at the
//     phase whose smallest gap is largest.
//   - byFlat: flatCalls evenly spaced calls of one signature: one call per
//     step (a single-bucket model). Many calls are required so that a long
//     burst of equal buckets is not taken for it.
//
// A step is one burst: it ends at the stable point after the burst's last
// call, the return of the first synchronisation after that call's return
// and before the next call, else that call's return (what the token
// detector does with its S token). The boundary is reported when the next
// burst's first call arrives and its gap confirmed that the burst was
// complete, so a step never ends inside a burst; a process's last burst
// is reported when the process is forgotten.
//
// Confirmation follows period.go: a fresh lock is tentative for
// ConfirmCycles (PromoteCycles once a cycle was confirmed) further bursts
// and withdrawn with its steps if it breaks before. A token mismatch
// breaks a lock. A cycle of two or more signatures is kept by its tokens
// alone (timing only chose where it starts). A cycle of one signature is
// kept by its gaps: a burst whose following gap does not dominate it is
// held; if the next burst is dominated again and the gap that ended the
// held burst has the size of a boundary gap, the held burst had a stall
// inside its backward pass (a preempted rank) and is cut by count,
// otherwise the bucket count changed and the lock breaks without
// reporting it. A confirmed lock keeps a burst by its count at once when
// its boundary gap still dominates every other gap but one, or is of a
// boundary's size, and the burst's long gaps do not split it into equal
// parts (keptByCount): a host stall at a fixed point of every iteration
// makes a second long gap per burst, so that no burst is dominated again
// while it lasts. Once the lock misses, or a gap dominates more than one
// burst, the search runs again and a different structure replaces it.
//
// Steps are numbered by call count: idx = base + (b−anchor)/P for the burst
// starting at call b. A lock that comes back with the same period and
// phase keeps the numbering, so a rank that lost its lock to a local stall
// skips indices instead of shifting them and step k stays the same
// iteration on every rank. The first structure is numbered from call 0
// (b/P, whatever burst a rank locks on first); a new structure continues
// the previous numbering extended to its first burst, backwards too when
// it reached back before that numbering's anchor (a relock of the old
// cycle that broke again). Like the token detector's, the numbering
// counts calls since the attach.

const (
	// burstRatio: a boundary gap is at least this many times every gap of
	// the burst before it. Bucket gaps are host launch time of a slice of
	// the backward pass; the boundary holds the forward pass, the optimizer
	// and data loading, usually far more than twice any bucket gap.
	burstRatio = 2
	// flatCalls is how many evenly spaced calls of one signature make a
	// cycle of one call per step.
	flatCalls = 64
	// maxMisses: consecutive bursts without a dominant gap that break a
	// lock of one signature.
	maxMisses = 2
)

type burstMode uint8

const (
	byGap burstMode = iota + 1
	byTokens
	byFlat
)

// burstIndex numbers bursts: the one starting at call b (b ≡ anchor mod p)
// is step base + (b−anchor)/p.
type burstIndex struct{ p, anchor, base int64 }

func (x burstIndex) of(b int64) int64 { return x.base + (b-x.anchor)/x.p }

type burstCycle struct {
	mode    burstMode
	ids     []int32 // tokens of one burst from its first call
	lastUse uint64
}

type burstDet struct {
	State
	par  Params
	sigs map[string]int32

	// Rings of the latest calls, indexed by absolute call number & mask.
	ids        []int32
	start, end []int64
	waited     []int64 // collective waits of the thread between call i−1 and i
	cut        []int64 // stable point after the call (see above)
	reach      []int32 // -1: gap unknown
	mask       int64
	max        int
	n          int64  // calls seen
	cutOpen    bool   // the latest call's cut may still move to a sync return
	tid        uint32 // thread of the latest call
	waiting    int64  // its thread's collective waits since its return

	runs             []int32 // as seqDet.runs, kept once two signatures were seen
	runsOn           bool
	bestP, bestRun   int64
	flat             int64 // latest calls evenly spaced with one signature
	scratch          []int64
	floor            int64 // calls before this belong to reported steps
	lastIdx, genLast int64 // latest reported index; its value when the lock was taken
	genFloor         int64

	mode        burstMode
	timed       bool // the lock is checked by its gaps: a byGap cycle of one signature
	cycle       []int32
	num         burstIndex
	latest      *burstIndex // numbering of the latest confirmed lock
	pos         int64       // position of the latest call in its burst
	misses      int         // latest bursts without a dominant gap after them
	held        int64       // start of a burst whose boundary waits for the next one, -1: none
	lastP       int64       // period of the latest lock, held or not
	bgaps       [4]int64    // gaps before the latest verified burst starts (any lock)
	nb          int
	since, need int
	gen         uint32

	known []burstCycle
	clock uint64
}

func newBurstDet(par Params) *burstDet {
	capacity := 1
	for capacity < (par.Repeats+2)*par.MaxPeriod+1 {
		capacity <<= 1
	}
	d := &burstDet{par: par, sigs: make(map[string]int32), max: capacity, lastIdx: -1, held: -1}
	d.alloc(min(64, capacity))
	d.runs = make([]int32, par.MaxPeriod+1)
	return d
}

func (d *burstDet) alloc(size int) {
	ids, reach := make([]int32, size), make([]int32, size)
	start, end, cut := make([]int64, size), make([]int64, size), make([]int64, size)
	waited := make([]int64, size)
	// Not wrapped yet when growing: absolute numbers equal positions.
	copy(ids, d.ids)
	copy(reach, d.reach)
	copy(start, d.start)
	copy(end, d.end)
	copy(cut, d.cut)
	copy(waited, d.waited)
	d.ids, d.reach, d.start, d.end, d.cut, d.waited = ids, reach, start, end, cut, waited
	d.mask = int64(size - 1)
}

// intern maps an op to its token; beyond maxSigs ops share one token.
func (d *burstDet) intern(op string) int32 {
	if id, ok := d.sigs[op]; ok {
		return id
	}
	if len(d.sigs) >= maxSigs {
		return maxSigs + 1
	}
	id := int32(len(d.sigs) + 1)
	d.sigs[op] = id
	return id
}

func (d *burstDet) HasKnown() bool { return len(d.known) > 0 }

func (d *burstDet) at(i int64) int32 { return d.ids[i&d.mask] }
func (d *burstDet) oldest() int64 {
	return max(0, d.n-int64(len(d.ids)))
}

// gap is the host's own time between the return of call i−1 and the
// entry of call i (without its collective waits); ok is false when call
// i−1 is unknown.
func (d *burstDet) gap(i int64) (int64, bool) {
	if i < 1 || i-1 < d.oldest() {
		return 0, false
	}
	return max(0, d.start[i&d.mask]-d.end[(i-1)&d.mask]-d.waited[i&d.mask]), true
}

// collective pushes a call; its op is its token. The waits since the
// previous call count when both are on one thread.
func (d *burstDet) Collective(h Call, _ bool) {
	w := d.waiting
	if d.n == 0 || h.TID != d.tid {
		w = 0
	}
	d.tid, d.waiting = h.TID, 0
	d.push(d.intern(h.Op), h.StartNS, h.EndNS, w)
}

// wait notes a collective wait of the latest call's thread after that
// call's return: time blocked on the peers, not in the gap.
func (d *burstDet) Wait(h Call) {
	if d.n == 0 || h.TID != d.tid {
		return
	}
	if lo := max(h.StartNS, d.end[(d.n-1)&d.mask]); h.EndNS > lo {
		d.waiting += h.EndNS - lo
	}
}

// sync notes the return of a synchronisation, never a token: the stable
// point after the latest call when it is the first one after that call's
// return.
func (d *burstDet) Sync(h Call, _ bool) {
	if t := h.EndNS; d.cutOpen && d.n > 0 && t > d.end[(d.n-1)&d.mask] {
		d.cut[(d.n-1)&d.mask] = t
		d.cutOpen = false
	}
}

// push adds one call and runs the detector.
func (d *burstDet) push(id int32, start, end, waited int64) {
	if d.n >= int64(len(d.ids)) && len(d.ids) < d.max {
		d.alloc(2 * len(d.ids))
	}
	n := d.n
	if n > 0 {
		// A synchronisation that returned after this call began belongs to
		// its burst, not to the end of the previous one.
		if p := (n - 1) & d.mask; d.cut[p] > start {
			d.cut[p] = d.end[p]
		}
	}
	i := n & d.mask
	d.ids[i], d.start[i], d.end[i], d.cut[i], d.waited[i] = id, start, end, end, waited
	d.n++
	d.cutOpen = true
	d.reach[i] = d.reachOf(n)
	d.updateRuns(n)
	d.updateFlat(n)
	if d.locked {
		d.check(n)
	} else {
		d.Irregular++
	}
	if d.locked {
		switch {
		case d.mode == byFlat: // one call per step until bursts show up
		case !d.timed:
			return // tokens tell the cycle: only a mismatch breaks it
		case d.misses == 0 && int64(d.reach[i]) < d.num.p:
			// A gap lock that holds needs no search, unless a gap
			// dominates more than one burst (a multiple of the period).
			return
		}
	}
	d.search(n)
}

func (d *burstDet) reachOf(n int64) int32 {
	g, ok := d.gap(n)
	if !ok {
		return -1
	}
	var r int32
	for k := n - 1; k >= 1 && int(r) < d.par.MaxPeriod; k-- {
		gk, ok := d.gap(k)
		if !ok || gk*burstRatio >= g {
			break
		}
		r++
	}
	return r
}

// updateRuns keeps runs[p] (consecutive latest calls with t[i] == t[i-p])
// once the sequence has two signatures; before that every p runs alike.
func (d *burstDet) updateRuns(n int64) {
	if !d.runsOn {
		if len(d.sigs) < 2 {
			return
		}
		d.runsOn = true
		d.bestP, d.bestRun = 0, 0
		oldest := d.oldest()
		for p := int64(1); p <= min(int64(d.par.MaxPeriod), n-oldest); p++ {
			var r int32
			for i := n; i-p >= oldest && d.at(i) == d.at(i-p); i-- {
				r++
			}
			d.runs[p] = r
			if int64(r) > d.bestRun {
				d.bestP, d.bestRun = p, int64(r)
			}
		}
		return
	}
	d.bestP, d.bestRun = 0, 0
	x := d.at(n)
	for p := int64(1); p <= min(int64(d.par.MaxPeriod), n); p++ {
		r := d.runs[p]
		if d.at(n-p) == x {
			r++
		} else {
			r = 0
		}
		d.runs[p] = r
		if int64(r) > d.bestRun {
			d.bestP, d.bestRun = p, int64(r)
		}
	}
}

func (d *burstDet) updateFlat(n int64) {
	g, ok1 := d.gap(n)
	gp, ok2 := d.gap(n - 1)
	if !ok1 || !ok2 || g == 0 || gp == 0 || g > burstRatio*gp || gp > burstRatio*g || d.at(n) != d.at(n-1) {
		d.flat = 0
		return
	}
	if d.flat == 0 {
		d.flat = 2
	}
	d.flat++
}

// check advances a lock by call n.
func (d *burstDet) check(n int64) {
	p := d.num.p
	d.pos++
	if d.pos == p {
		d.pos = 0
		// The burst before n is complete; its end is a step boundary when
		// the gap before n still dominates it, or when a confirmed lock
		// keeps it by its count through a host stall (keptByCount).
		dom := !d.timed || int64(d.reach[n&d.mask]) >= p-1
		ok := dom || d.keptByCount(n)
		switch {
		case ok && d.held >= 0 && d.inside(d.held+p):
			// The held burst ended at a gap of bucket size: it and the
			// burst after it were one (the bucket count grew).
			d.breakLock()
			return
		case ok:
			d.misses = 0
			if dom {
				d.noteGap(n)
			}
			if d.held >= 0 {
				d.boundary(d.held, true)
				d.held = -1
			}
			d.boundary(n-p, true)
		case d.misses+1 < maxMisses:
			// Hold the boundary: the next burst tells a stall inside this
			// one (cut it by count) from a changed bucket count (drop it).
			d.misses++
			d.held = n - p
		default:
			d.breakLock()
			return
		}
	}
	if d.at(n) != d.cycle[d.pos] {
		d.breakLock()
	}
}

// noteGap keeps the gap before call n, a verified burst start.
func (d *burstDet) noteGap(n int64) {
	if g, ok := d.gap(n); ok && d.mode == byGap {
		d.bgaps[d.nb%len(d.bgaps)] = g
		d.nb++
	}
}

// keptByCount reports whether a confirmed lock keeps the burst that call
// n ends by its count although the gap before n dominates it no longer.
// A host stall at a fixed point of the iteration (a data loader before the
// forward pass, a sleep after the optimizer) makes a second gap per burst
// as long as the boundary's, so that neither dominates the other while
// the boundary's stays what it was. The burst is kept when its gap at n
// still dominates every other gap but one, or is of a boundary's size
// (see inside: a second stall, or a preemption), and those long gaps do
// not split the burst into equal parts. A changed bucket count still
// misses: the count drifts into the bursts, onto gaps of a bucket's size
// that dominate nothing, or, when the new count divides the period, every
// burst is equal parts (a halved bucket count; a stall at the middle of
// a burst, which no timing tells from it, is lost the same way). Only
// dominated bursts feed bgaps, so a kept burst cannot lower the boundary
// size it is measured by.
func (d *burstDet) keptByCount(n int64) bool {
	g, ok := d.gap(n)
	if d.tentative || !ok {
		return false
	}
	p := d.num.p
	b := n - p
	var first int64 // position of the first long gap inside the burst
	long := 0
	for j := int64(1); j < p; j++ {
		if d.longBeside(b+j, g) {
			long++
			if first == 0 {
				first = j
			}
		}
	}
	if long > 1 && (d.nb == 0 || d.inside(n)) {
		return false // several long gaps, and no boundary's size at n
	}
	return !d.splitEvenly(b, p, g, first, long)
}

// longBeside reports whether the gap before call i is not dominated by a
// gap g (unknown gaps are long).
func (d *burstDet) longBeside(i, g int64) bool {
	gi, ok := d.gap(i)
	return !ok || gi*burstRatio >= g
}

// splitEvenly reports whether the long gaps beside g of the burst of p
// calls from b (long of them, the first at position q) are those at every
// q-th call: the burst is p/q equal parts.
func (d *burstDet) splitEvenly(b, p, g, q int64, long int) bool {
	if q == 0 || p%q != 0 || int64(long) != p/q-1 {
		return false
	}
	for j := 2 * q; j < p; j += q {
		if !d.longBeside(b+j, g) {
			return false
		}
	}
	return true
}

// inside reports whether the gap before call b is of the size of a gap
// inside a burst: less than 1/burstRatio of every recent boundary gap.
// Preemption only lengthens gaps, so a stalled step still passes.
func (d *burstDet) inside(b int64) bool {
	g, ok := d.gap(b)
	if !ok || d.nb == 0 {
		return false
	}
	for i := range min(d.nb, len(d.bgaps)) {
		if g*burstRatio >= d.bgaps[i] {
			return false
		}
	}
	return true
}

// boundary reports the end of the burst starting at call b.
func (d *burstDet) boundary(b int64, counts bool) {
	p := d.num.p
	idx := d.num.of(b)
	d.emit(Event{Kind: Boundary, Tentative: d.tentative, Gen: d.gen, T: d.cut[(b+p-1)&d.mask], Idx: idx})
	d.lastIdx = idx
	d.floor = b + p
	if !counts || !d.tentative {
		return
	}
	d.since++
	if d.since >= d.need {
		d.tentative = false
		d.emit(Event{Kind: Confirm, Gen: d.gen})
		num := d.num
		d.latest = &num
		d.remember()
	}
}

func (d *burstDet) breakLock() {
	d.Irregular += uint64(d.pos) + 1
	if d.held >= 0 {
		d.Irregular += uint64(d.num.p)
	}
	d.unlock()
}

// unlock leaves the lock: a tentative one is withdrawn with its steps.
func (d *burstDet) unlock() {
	if !d.locked {
		return
	}
	if d.tentative {
		d.emit(Event{Kind: Retract, Gen: d.gen})
		d.floor, d.lastIdx = d.genFloor, d.genLast
	} else {
		d.emit(Event{Kind: Break})
	}
	d.locked, d.tentative, d.misses, d.held = false, false, 0, -1
}

// yield gives up the communicator at the first call with a size: the
// token detector can tell its steps.
func (d *burstDet) Yield(h Call) bool {
	if h.Count == 0 {
		return false
	}
	d.unlock()
	return true
}

// latestStep: a burstDet keeps no step times.
func (d *burstDet) LatestStep() (int64, bool) { return 0, false }

// evenSteps: a burstDet keeps no step times.
func (d *burstDet) EvenSteps() bool { return false }

// finish reports the latest burst when it is complete by count and the
// process exited: no next burst will confirm it. When the agent stops, the
// burst stays open.
func (d *burstDet) Finish(exited bool) {
	if exited && d.locked && !d.tentative && d.held < 0 && d.pos == d.num.p-1 {
		d.boundary(d.n-d.num.p, false)
		d.unlock()
	}
}

// search looks for a structure at call n and locks onto it when it is not
// the current one.
func (d *burstDet) search(n int64) {
	if p, b0, ok := d.gapCandidate(n); ok {
		if d.locked {
			if p == d.num.p && d.pos == 0 {
				return
			}
			d.unlock()
		}
		// The bursts are alike: the latest complete one is the cycle. The
		// first step is the burst after the earliest dominated one, or
		// an earlier one that it reaches back to over whole iterations.
		cyc := d.window(n-p, p)
		d.lockAt(byGap, cyc, d.reachBack(cyc, b0, n), n)
		return
	}
	// A known cycle comes back after one burst; after the gap candidate,
	// which has seen several and tells a multiple of the period.
	if d.locked || d.relockKnown(n) {
		return
	}
	if p, b0, ok := d.tokenCandidate(n); ok {
		d.lockAt(byTokens, d.window(b0, p), b0, n)
		return
	}
	if d.flat >= flatCalls {
		b0 := max(n-d.flat+2, d.floor, d.oldest()+1)
		d.lockAt(byFlat, d.window(n, 1), b0, n)
	}
}

// gapCandidate: the period from the reach of call n, confirmed by Repeats
// bursts; b0 is the earliest burst start whose gap dominates. A period
// shorter than the latest lock's must hold over Repeats−1 of the latest
// period too: a stall in the middle of a burst looks like two bursts of
// half its length.
func (d *burstDet) gapCandidate(n int64) (p, b0 int64, ok bool) {
	r := int64(d.reach[n&d.mask])
	p = r + 1
	k := int64(d.par.Repeats)
	if p < d.lastP {
		k = max(k, (k-1)*d.lastP/p+1)
	}
	if r < 1 || p > int64(d.par.MaxPeriod) || n-(k-1)*p < max(1, d.oldest()+1) {
		return 0, 0, false
	}
	for j := int64(1); j < k; j++ {
		if int64(d.reach[(n-j*p)&d.mask]) < r {
			return 0, 0, false
		}
	}
	for i := n - (k-2)*p; i <= n; i++ {
		if d.at(i) != d.at(i-p) {
			return 0, 0, false
		}
	}
	b0 = n - (k-1)*p
	// Extend back over earlier bursts of the same structure (the burst of
	// the earliest is not reported, so it may be the latest reported one).
	for b := b0 - p; b >= max(d.floor-p, 1, d.oldest()+1); b -= p {
		if int64(d.reach[b&d.mask]) < r {
			break
		}
		same := true
		for i := b; i < b+p; i++ {
			if d.at(i) != d.at(i+p) {
				same = false
				break
			}
		}
		if !same {
			break
		}
		b0 = b
	}
	if b0 < d.floor-p {
		b0 += (d.floor - p - b0 + p - 1) / p * p
	}
	return p, b0, true
}

// reachBack returns the first call of the first step of a gap lock on
// bursts cyc whose earliest dominated burst starts at call b0 (n the
// latest call): b0+p, or the start of an earlier burst when every burst
// from it to b0+p is a whole iteration of the cycle (wholeBurst). The
// first iterations are the ones that need it: the first forward pass, or
// a longer first backward pass, lies inside iteration 0's burst and no
// gap after it dominates it, so that the earliest dominated burst comes
// one or two iterations later (the H200 gloo captures' first facts were
// in iterations 3 and 4). A burst's start counts as verified when the gap
// before it dominates every gap inside it and is of a boundary's size
// (at least 1/burstRatio of the shortest boundary gap of the lock's
// dominated bursts); its end is the next burst's verified start. The
// walk stops at the calls of reported steps (floor), so that steps stay
// in order and numbered by count from the earlier start.
func (d *burstDet) reachBack(cyc []int32, b0, n int64) int64 {
	p := int64(len(cyc))
	first := b0 + p
	bound, ok := d.gap(b0)
	if !ok {
		return first
	}
	for s := b0 + p; s <= n; s += p {
		if g, ok := d.gap(s); ok {
			bound = min(bound, g)
		}
	}
	for b := first - p; b >= max(d.floor, d.oldest()+1, 1) && d.wholeBurst(cyc, b, bound); b -= p {
		first = b
	}
	return first
}

// wholeBurst reports whether the p calls from b are a burst of the
// tokens cyc whose start is verified: the gap before b is at least
// bound/burstRatio and dominates every gap inside the burst.
func (d *burstDet) wholeBurst(cyc []int32, b, bound int64) bool {
	g, ok := d.gap(b)
	if !ok || g*burstRatio < bound {
		return false
	}
	for j, id := range cyc {
		i := b + int64(j)
		if d.at(i) != id {
			return false
		}
		if gi, ok := d.gap(i); j > 0 && (!ok || gi*burstRatio >= g) {
			return false
		}
	}
	return true
}

// tokenCandidate: a token cycle with two or more signatures; the step
// starts at the phase whose smallest gap is the largest.
func (d *burstDet) tokenCandidate(n int64) (p, b0 int64, ok bool) {
	p, run := d.bestP, d.bestRun
	if !d.runsOn || p == 0 || run < int64(d.par.Repeats-1)*p {
		return 0, 0, false
	}
	distinct := false
	for i := n - p + 1; i < n; i++ {
		if d.at(i) != d.at(n) {
			distinct = true
			break
		}
	}
	if !distinct {
		return 0, 0, false
	}
	j := max(n-run-p+1, d.oldest())
	if cap(d.scratch) < int(p) {
		d.scratch = make([]int64, p)
	}
	minGap := d.scratch[:p]
	for q := range minGap {
		minGap[q] = -1
	}
	for i := j + 1; i <= n; i++ {
		if g, ok := d.gap(i); ok {
			if q := i % p; minGap[q] < 0 || g < minGap[q] {
				minGap[q] = g
			}
		}
	}
	var phase int64
	for q := range minGap {
		if minGap[q] > minGap[phase] {
			phase = int64(q)
		}
	}
	b0 = max(j+1, d.floor, 1)
	b0 += ((phase-b0%p)%p + p) % p
	return p, b0, b0+p-1 <= n
}

// relockKnown locks at once when the burst that call n ends is a
// confirmed cycle and n starts the next one.
func (d *burstDet) relockKnown(n int64) bool {
	for k := range d.known {
		kc := &d.known[k]
		p := int64(len(kc.ids))
		b := n - p
		if b < max(d.floor, 1, d.oldest()) || d.at(n) != kc.ids[0] {
			continue
		}
		// A cycle of one signature comes back with its timing: a dominant
		// gap after the burst (or even spacing for one call per step).
		if single(kc.ids) && (kc.mode == byGap && int64(d.reach[n&d.mask]) < p-1 ||
			kc.mode == byFlat && d.flat < int64(d.par.Repeats)) {
			continue
		}
		match := true
		for i := int64(0); i < p; i++ {
			if d.at(b+i) != kc.ids[i] {
				match = false
				break
			}
		}
		if !match {
			continue
		}
		d.clock++
		kc.lastUse = d.clock
		d.Relocks++
		d.lockAt(kc.mode, kc.ids, n, n)
		return true
	}
	return false
}

// single reports whether a cycle has one signature only.
func single(cyc []int32) bool {
	return !slices.ContainsFunc(cyc, func(id int32) bool { return id != cyc[0] })
}

// isKnown reports whether a burst of these tokens was confirmed, found by
// gaps or by tokens alike.
func (d *burstDet) isKnown(cyc []int32) bool {
	for _, k := range d.known {
		if equalIDs(k.ids, cyc) {
			return true
		}
	}
	return false
}

// window copies the tokens of calls [from, from+p).
func (d *burstDet) window(from, p int64) []int32 {
	out := make([]int32, p)
	for i := range out {
		out[i] = d.at(from + int64(i))
	}
	return out
}

// lockAt locks onto bursts with the tokens cyc; b0 is the first call of
// the first burst whose step can be cut (call b0−1 ended a burst) and n
// the latest call. Bursts completed before n are reported at once.
func (d *burstDet) lockAt(mode burstMode, cyc []int32, b0, n int64) {
	p := int64(len(cyc))
	if b0-1 < d.oldest() || b0 < 1 {
		b0 += p // the first burst only opens the first step
	}
	if b0 > n {
		return
	}
	d.cycle = append(d.cycle[:0], cyc...)
	d.timed = mode == byGap && single(cyc)
	d.locked, d.mode, d.lastP = true, mode, p
	d.tentative = !d.isKnown(d.cycle)
	d.gen++
	d.genFloor, d.genLast = d.floor, d.lastIdx
	d.since, d.misses, d.held = 0, 0, -1
	d.need = d.par.Confirm
	if len(d.known) > 0 {
		d.need = d.par.Promote
	}
	d.num = d.numbering(p, b0)
	d.emit(Event{Kind: Start, T: d.cut[(b0-1)&d.mask]})
	for b := b0; b+p <= n; b += p {
		d.boundary(b, false)
		if int64(d.reach[(b+p)&d.mask]) >= p-1 {
			d.noteGap(b + p) // a burst reached back to need not be dominated
		}
	}
	d.pos = (n - b0) % p
	if !d.tentative {
		num := d.num
		d.latest = &num
		d.remember()
	}
}

// numbering returns the step numbering of a lock whose first burst starts
// at call b0 (see the package comment of this file).
func (d *burstDet) numbering(p, b0 int64) burstIndex {
	var x burstIndex
	switch l := d.latest; {
	case l == nil:
		x = burstIndex{p: p, anchor: b0, base: b0 / p}
	case l.p == p && (b0-l.anchor)%p == 0:
		x = *l
	default:
		// The first burst of the latest numbering's count at or after
		// b0; before its anchor too, where a lock reached back to.
		k := (b0 - l.anchor + l.p - 1) / l.p
		if b0 < l.anchor {
			k = -((l.anchor - b0) / l.p)
		}
		x = burstIndex{p: p, anchor: b0, base: l.base + k}
	}
	if lo := d.lastIdx + 1; x.of(b0) < lo {
		x.base += lo - x.of(b0) // never reuse an index
	}
	return x
}

func (d *burstDet) remember() {
	d.clock++
	for i := range d.known {
		if k := &d.known[i]; equalIDs(k.ids, d.cycle) {
			k.mode, k.lastUse = d.mode, d.clock
			return
		}
	}
	k := burstCycle{mode: d.mode, ids: append([]int32(nil), d.cycle...), lastUse: d.clock}
	d.known = remember(d.known, k, func(k burstCycle) uint64 { return k.lastUse })
}
