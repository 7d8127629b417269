package stepdet

import (
	"cmp"
	"math"
	"slices"
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
// settled boundary. The cycle is rotated to a cut point that depends on the
// cycle alone (canonStart), so a step ends with a synchronisation and
// every member cuts at the same call whatever its recording saw.
//
// Lock: each token must equal the expected cycle token; a completed cycle
// is a boundary at the time of its last token (the return of the
// synchronisation that follows the step's last collective, or that
// collective's return when the cycle has no S). A mismatch breaks the lock:
// the partial cycle is irregular and the search resumes.
//
// Confirmation: a fresh lock is tentative; its steps are held until it has
// held ConfirmCycles more cycles and ConfirmSpan of event time
// (PromoteCycles when the communicator already has a known cycle), and
// withdrawn with their indices if it breaks before: init-time bursts are
// periodic but brief. Confirmed cycles are remembered (up to maxKnown); a known cycle
// is re-locked as soon as one full instance of it is seen (KMP matching),
// without waiting for repetitions.

const tokS int32 = 0 // the synchronisation token

const maxSigs = 4096

type sigKey struct {
	op     string
	count  uint64
	dtype  uint32
	stream uint64
}

type knownCycle struct {
	grp     int64 // instances per step (group.go)
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

type seqDet struct {
	State
	par      Params
	syncOnly bool // every token is a synchronisation (fallback clock)
	// fromCreation: the communicator's creation was seen at createdAt, so
	// token 0 is its first call and the creation is a stable start before
	// it, like a synchronisation.
	fromCreation bool
	createdAt    int64
	// urgent: the caller's buffers fill up, so that a first lock must not
	// be held for ConfirmSpan any longer (set before each push).
	urgent     bool
	collSinceS bool // a collective came since the latest S token

	sigs map[sigKey]int32
	keys []sigKey // keys[id-1] is the key of token id

	ids  []int32 // ring of the latest tokens, indexed by absolute token number & mask
	ts   []int64 // token times
	ws   []int64 // token calls' durations (a synchronisation's wait)
	mask int64
	max  int   // ring capacity when fully grown
	n    int64 // tokens seen

	runs      []int32
	runsFresh bool
	lastS     int64 // absolute number of the latest S, -1 when none
	lastST    int64 // its time
	firstT    int64 // time of token 0
	floor     int64 // tokens before this belong to settled cycles

	cycle            []int32
	noS              bool // the cycle has no synchronisation token
	pos              int
	gen              uint32
	since            int    // cycles completed since the lock
	need             int    // cycles needed to confirm
	first            bool   // the lock is the sequence's first cycle: it must also hold ConfirmSpan
	procColl         *bool  // the fallback clock's process made a collective (proc.everColl); nil for a communicator
	afterColl        bool   // it had when the lock was taken (held)
	lone             bool   // the lock passed over a lone call (passLone)
	lockT            int64  // time of the first token of the lock's first instance
	lockJ            int64  // that token's number
	colls            uint64 // collective tokens seen
	confirmedOnce    bool
	nextIdx, genBase int64
	genFloor         int64 // floor when the tentative lock was taken

	known []*knownCycle
	clock uint64 // use counter for known-cycle LRU

	resets uint64

	// Instances of the locked cycle per iteration, from timing (group.go).
	inst     int64           // cycle instances completed
	instFrom int64           // first instance of the lock whose duration is known
	instT    [instRing]int64 // end of instance k at k%instRing (instFrom-1: the lock's start)
	instW    [instRing]int64 // the duration of the call that ended instance k (its wait)
	grp      int64           // instances per step; <= 1: one
	anchor   int64           // an instance that ends a step
	resync   bool            // the groups' phase is unknown: wait for a dominant instance
	domDur   int64           // the dominant duration: a low quantile of doms
	doms     [domN]int64     // the latest instances that ended steps of groups, a ring
	domWait  int64           // the median wait of their ending calls
	domShare int64           // the median of their waits' shares of them, per waitScale
	waits    [domN][2]int64  // those waits and shares, a ring
	nWait    int             // waits noted since the lock
	nDom     int
	grpEnds  int                 // steps of groups ended since the regroup (noteDom); > domQ: domDur is theirs
	runFrom  int64               // resync: a run of shorter dominant instances (a new pace?), -1 when none
	runLast  int64               // its latest instance
	runSlid  int64               // groups of the run that slid out of the instance ring
	stepInst int64               // the instance that ended (or started) the latest step of groups
	pend     int64               // resync: an instance that ends a step if the next group holds, -1 when none
	pendFrom int64               // the first instance that ends a step with it (firstOfRun)
	pendHeld int64               // the groups after pend that ended steps by the count so far
	kept     bool                // resync: the phase was lost by the count, whose position anchor still holds
	keptFrom int64               // kept: a run of instances at the count's position that end steps, -1 when none
	keptLast int64               // its latest instance
	lost     int64               // the instance at the count that lost the phase
	grpOpen  bool                // a step of groups is open
	stepT    [regularN + 1]int64 // latest boundary times, for steadiness (steadyN+1 of them) and regularity
	nStep    int

	pace paceState // boundaries far shorter than the steps are held (pace.go)
}

func newSeqDet(par Params, syncOnly bool) *seqDet {
	size := 64
	want := (par.Repeats + 1) * par.MaxPeriod
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
	d.ws = make([]int64, size)
	d.mask = int64(size - 1)
	d.runs = make([]int32, par.MaxPeriod+1)
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
	d.fromCreation = false // token 0 is no longer the first call
	clear(d.sigs)
	d.keys = d.keys[:0]
	d.n, d.floor, d.lastS = 0, 0, -1
	clear(d.runs)
	d.runsFresh = true
	if d.locked {
		d.dropHeld()
		if d.tentative {
			d.emit(Event{Kind: Retract, Gen: d.gen})
			d.nextIdx = d.genBase
		} else {
			d.emit(Event{Kind: Break})
		}
	}
	d.locked, d.tentative = false, false
	d.known = d.known[:0]
	d.grp, d.resync = 0, false
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
	ws := make([]int64, nl)
	copy(ids, d.ids)
	copy(ts, d.ts)
	copy(ws, d.ws)
	d.ids, d.ts, d.ws, d.mask = ids, ts, ws, int64(nl-1)
}

// hasKnown reports whether a cycle has been confirmed on this sequence.
func (d *seqDet) HasKnown() bool { return len(d.known) > 0 }

// collective pushes the token of a collective's signature.
func (d *seqDet) Collective(h Call, urgent bool) {
	d.collSinceS = true
	d.urgent = urgent
	d.push(d.intern(sigKey{op: h.Op, count: h.Count, dtype: h.Datatype}), h.EndNS, h.EndNS-h.StartNS)
}

// sync pushes S for the first synchronisation after a collective; on the
// fallback clock, every synchronisation is a token of its function. The
// stream is no part of the token: a loop that synchronises on a side
// stream for its first iterations (CUDA graph warm-up) is still the same
// loop.
// wait: the token sequence does not depend on timing.
func (*seqDet) Wait(Call) {}

func (d *seqDet) Sync(h Call, urgent bool) {
	switch {
	case d.syncOnly:
		d.urgent = urgent
		d.push(d.intern(sigKey{op: h.Op}), h.EndNS, h.EndNS-h.StartNS)
	case d.collSinceS:
		d.collSinceS = false
		d.urgent = urgent
		d.push(tokS, h.EndNS, h.EndNS-h.StartNS)
	}
}

// yield is false: every call, with a size or not, is a token.
func (d *seqDet) Yield(Call) bool { return false }

// latestStep is the duration of the latest step reported.
func (d *seqDet) LatestStep() (int64, bool) {
	if d.nStep < 2 {
		return 0, false
	}
	return d.stepT[(d.nStep-1)%len(d.stepT)] - d.stepT[(d.nStep-2)%len(d.stepT)], true
}

// push appends one token, of a call that ended at t after w, and runs the
// detector.
func (d *seqDet) push(id int32, t, w int64) {
	if id == tokS && d.locked && d.noS {
		// A cycle without synchronisations (DDP buckets, no .item()) keeps
		// its lock through an occasional one (logging every N iterations):
		// it is no token of the cycle.
		return
	}
	d.grow()
	n := d.n
	d.ids[n&d.mask] = id
	d.ts[n&d.mask] = t
	d.ws[n&d.mask] = w
	d.n++
	if n == 0 {
		d.firstT = t
	}
	if id == tokS && !d.syncOnly {
		d.lastS, d.lastST = n, t
	} else if !d.syncOnly {
		d.colls++
	}
	if d.locked {
		if id == d.cycle[d.pos] {
			d.pos++
			if d.pos == len(d.cycle) {
				d.pos = 0
				d.cycleDone(t, w)
			}
			if d.tentative {
				d.stepKnown(id, n)
			}
			return
		}
		if d.passLone() {
			return
		}
		d.breakLock(n)
	} else {
		d.Irregular++
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

func (d *seqDet) cycleDone(t, w int64) {
	d.floor = d.n
	d.instance(t, w, true)
}

// boundary reports the end of a step at t; counts: it counts towards the
// confirmation of a tentative lock (instances reported at the lock do not).
// A boundary far shorter than the recent steps is held instead (pace.go),
// on a confirmed lock and on a tentative one after a confirmed cycle: held
// boundaries do not count, so that a burst of another cycle inside an
// iteration does not hold the PromoteCycles that confirm it (the Trainer's
// logging step on the H200: some 70 cuStreamSynchronize without the
// cudaStreamSynchronize around them, 0.2 ms apart in a 466 ms iteration,
// were a cycle of one call, confirmed 3.4 ms after it began; then a known
// cycle, it matched the first call of every later synchronisation before
// the Trainer's cycle could: three facts per iteration). A sequence's
// first lock holds nothing while tentative: its init-time steps are
// withdrawn by the confirmation's trim.
func (d *seqDet) boundary(t, w int64, counts bool) {
	if (!d.tentative || !d.first) && d.hold(t, w) {
		return
	}
	d.report(t, w, counts)
}

// report reports a boundary at t, whose closing call lasted w (< 0:
// unknown).
func (d *seqDet) report(t, w int64, counts bool) {
	ps := &d.pace
	ps.ref[ps.nRef%paceRef] = t - ps.open
	ps.nRef++
	ps.noteWait(w, t-ps.open)
	ps.open, ps.last = t, t
	d.emit(Event{Kind: Boundary, Tentative: d.tentative, Gen: d.gen, T: t, Idx: d.nextIdx})
	d.nextIdx++
	d.stepT[d.nStep%len(d.stepT)] = t
	d.nStep++
	if !d.tentative || !counts {
		return
	}
	d.since++
	if d.since >= d.need && d.held(t) {
		if d.syncOnly && d.first && !d.urgent {
			// Synchronisations alone repeat in init bursts too (a copy per
			// parameter, a period of one call that never breaks): the first
			// lock of the fallback clock is confirmed once its steps are
			// steady, without the shorter steps before them.
			thr, ok := d.steady()
			if !ok {
				return
			}
			d.emit(Event{Kind: Trim, Gen: d.gen, T: thr})
		}
		d.confirm()
	}
}

// held reports whether a tentative lock that has held its cycles may be
// confirmed at t: a communicator's first cycle must also have lasted
// ConfirmSpan of event time (init-time bursts — parameter broadcasts,
// barrier storms, checkpoint loads — repeat many times but briefly, and
// are followed by the training cycle), unless the caller's buffers fill up.
//
// The fallback clock's first lock taken after a collective of its process
// (afterColl) is confirmed only at the end (finish) or while the buffers
// are half full, not after ConfirmSpan: a
// process that made collectives before (DDP's broadcast of the parameters)
// has a communicator whose per-iteration collectives will make its steps,
// and its synchronisations before those start are no iterations but a
// warm-up, as periodic and as long as a loop: torch.compile's autotuning
// benchmarks in the first iteration, groups of four device
// synchronisations every 8 ms for 9 s (151 facts in that iteration on the
// H200, TestReplayH200CompilingIterationMakesNoSteps). The communicator's
// lock takes the clock over and withdraws the tentative steps; a process
// whose collectives never make a cycle gets its steps late, not lost.
func (d *seqDet) held(t int64) bool {
	return !d.first || d.urgent || t-d.lockT >= d.par.ConfirmSpan && !d.afterColl
}

func (d *seqDet) confirm() {
	d.tentative = false
	d.emit(Event{Kind: Confirm, Gen: d.gen})
	d.remember(d.cycle)
	d.noteInit()
}

// noteInit counts, at the first confirmation, the collectives that came
// before the confirmed cycle's first instance: calls skipped as init.
func (d *seqDet) noteInit() {
	if d.confirmedOnce || d.syncOnly {
		return
	}
	d.confirmedOnce = true
	var in uint64
	for i := max(d.lockJ, d.oldest()); i < d.n; i++ {
		if d.at(i) != tokS {
			in++
		}
	}
	if d.colls > in {
		d.InitCalls = d.colls - in
	}
}

// finish is the end of the sequence (the process exited, or the agent
// stops: alike): a tentative lock that held its cycles is confirmed, since
// a cycle that lasted until the end is no init-time burst.
func (d *seqDet) Finish(bool) {
	if d.locked && d.tentative && d.since >= d.need {
		if d.syncOnly && d.first {
			// as at a confirmation within the sequence (report): the
			// shorter steps before the steady ones are init-time
			if thr, ok := d.steady(); ok {
				d.emit(Event{Kind: Trim, Gen: d.gen, T: thr})
			}
		}
		d.confirm()
	}
	d.dropHeld() // the open step never closes
}

// settled is the first token not part of a confirmed cycle instance.
func (d *seqDet) settled() int64 {
	if d.locked && d.tentative {
		return d.genFloor
	}
	return d.floor
}

// retract withdraws the tentative lock: its steps and indices are
// forgotten, with the boundaries it held (a later lock holds, see boundary),
// and its tokens are unsettled again.
func (d *seqDet) retract() {
	d.dropHeld()
	d.emit(Event{Kind: Retract, Gen: d.gen})
	d.nextIdx = d.genBase
	d.floor = d.genFloor
}

// passLone reports whether the fallback clock's first tentative lock
// passes over a call outside its cycle, between two instances, instead of
// breaking: once per lock, and not after a collective of the process
// (held). A CUDA graph's capture makes one cudaDeviceSynchronize between
// the eager warm-up iterations and the graph's, which end with the same
// synchronisations; breaking there withdrew the warm-ups' steps with the
// lock. A call that is no lone one breaks the lock at the next mismatch.
func (d *seqDet) passLone() bool {
	if !d.syncOnly || !d.first || !d.tentative || d.afterColl || d.lone || d.pos != 0 {
		return false
	}
	d.lone = true
	d.Irregular++
	return true
}

func (d *seqDet) breakLock(n int64) {
	d.Irregular += uint64(d.pos) + 1
	if d.tentative {
		d.retract()
	} else {
		d.dropHeld()
		d.emit(Event{Kind: Break})
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
	lim := int64(d.par.MaxPeriod)
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
	lim := int64(d.par.MaxPeriod)
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
		d.Relocks++
		d.lockAt(k.ids, j, n, false)
		return true
	}
	return false
}

// search locks onto the period with the longest run when that run covers
// Repeats cycles and the cycle qualifies.
func (d *seqDet) search(n, best int64, bestRun int32) {
	if best == 0 || int64(bestRun) < int64(d.par.Repeats-1)*best {
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
		if j = d.canonStart(j, p, n); n-j+1 < p {
			return
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
	if !d.syncOnly && !slices.Contains(cyc, tokS) {
		j = d.backOverS(j, cyc)
	}
	confirmed := false
	for _, k := range d.known {
		if equalIDs(k.ids, cyc) {
			d.clock++
			k.lastUse = d.clock
			confirmed = true
			d.Relocks++
			break
		}
	}
	d.lockAt(cyc, j, n, !confirmed)
}

// canonStart rotates a cycle found at token j (the first token of the
// periodic region; p the period) to a cut point that is a function of the
// cycle alone, so that every member of a communicator cuts its steps at
// the same call whatever its recording saw: the communicator's creation or
// not, an init-time prefix, an agent that attached in the middle of an
// iteration. The cycle starts right after one of its synchronisations, so
// that a step ends with one; with several, after the one followed by the
// most collectives before the next (the gradient buckets of the backward
// pass follow the previous iteration's last synchronisation), ties to the
// rotation with the largest signatures (token ids differ between ranks,
// signatures do not; DDP issues its full buckets first and the remainder
// last). Without a synchronisation in the cycle, the largest rotation. The first instance is the earliest one at that phase
// that starts after a stable start: a synchronisation, or the creation
// before token 0.
func (d *seqDet) canonStart(j, p, n int64) int64 {
	stable := func(r int64) bool {
		if r == 0 {
			return d.fromCreation
		}
		return r-1 >= d.oldest() && d.at(r-1) == tokS
	}
	best, bestSeg := int64(-1), int64(-1)
	// Candidates r in (j, j+p] weigh every phase of the cycle wherever the
	// region began; r == j (the same phase as j+p) only gives an earlier
	// first instance.
	for r := j; r <= min(j+p, n); r++ {
		if d.at(r) == tokS || !(r > j && d.at(r-1) == tokS || r == j && stable(r)) {
			continue
		}
		var seg int64
		for seg < p && r+seg <= n && d.at(r+seg) != tokS {
			seg++
		}
		if best < 0 || seg > bestSeg || seg == bestSeg && d.lessRotation(best, r, p) {
			best, bestSeg = r, seg
		}
	}
	if best >= 0 {
		return best
	}
	for i := j; i < j+p; i++ {
		if d.at(i) == tokS {
			return j // a synchronisation that starts no candidate: keep the first collective
		}
	}
	// No synchronisation: the largest rotation, earliest instance.
	best = j
	for r := j + 1; r < j+p && r <= n; r++ {
		if d.lessRotation(best, r, p) {
			best = r
		}
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

// backOverS returns the first token of the earliest instance of cyc, a
// cycle without synchronisations found at token j, that the instances
// before j reach back to when the synchronisations between them are left
// out: the lock ignores an occasional one (logging every N iterations), so
// the search must not start after it. Lightning's DDP loop on the H200
// synchronises in its first 10 iterations and every 100th: the region of
// the no-sync cycle began after the latest of them, and the iterations
// before it made no step (first fact at iteration 100). Whole instances
// at the same phase only: the cut point stays a function of the cycle.
func (d *seqDet) backOverS(j int64, cyc []int32) int64 {
	lim := max(d.floor, d.oldest())
	for {
		i, k := j-1, len(cyc)-1
		for ; i >= lim && k >= 0; i-- {
			if x := d.at(i); x == tokS {
				continue
			} else if x != cyc[k] {
				break
			}
			k--
		}
		if k >= 0 {
			return j
		}
		j = i + 1
	}
}

// noSyncAllowed reports whether a cycle without synchronisations may be
// locked at token n: after NoSyncMinCalls calls without one, or ConfirmSpan
// of event time (a DDP loop with a few buckets and no .item(): Lightning).
func (d *seqDet) noSyncAllowed(n int64) bool {
	if d.lastS < 0 {
		return n+1 >= int64(d.par.NoSyncMin) || d.tAt(n)-d.firstT >= d.par.ConfirmSpan
	}
	return n-d.lastS >= int64(d.par.NoSyncMin) || d.tAt(n)-d.lastST >= d.par.ConfirmSpan
}

// lockAt locks onto cyc whose first instance starts at token j; tokens up
// to n have been seen. Completed instances are reported retroactively.
func (d *seqDet) lockAt(cyc []int32, j, n int64, tentative bool) {
	p := int64(len(cyc))
	d.locked, d.tentative = true, tentative
	d.cycle = append(d.cycle[:0], cyc...)
	d.noS = !d.syncOnly && !slices.Contains(cyc, tokS)
	d.gen++
	d.genBase = d.nextIdx
	d.genFloor = d.floor
	d.since = 0
	d.first = len(d.known) == 0
	d.afterColl = d.procColl != nil && *d.procColl
	d.lone = false
	d.lockJ, d.lockT = j, d.tAt(j)
	if tentative {
		d.need = d.par.Confirm
		if len(d.known) > 0 {
			d.need = d.par.Promote
		}
	}
	known := d.knownGroup(cyc)
	d.grp, d.resync, d.grpOpen, d.runFrom, d.runLast, d.pend = known, known > 1, false, -1, -1, -1
	d.grpEnds = domN // a confirmed grouping's dominant duration was held (ungroup)
	d.kept = false   // a new lock's instances: no count carries over
	d.nWait = 0      // nor do the waits of another lock's calls (waited)
	d.stepInst = d.inst - 1
	// The token before the first instance is a stable start when it is a
	// synchronisation (for the sync-only clock every token is one), or a
	// call outside the cycle before a communicator's first lock (the last
	// init-time call: the first iteration starts after it); so is the
	// communicator's creation before its first call.
	var startT int64
	partial := false // the token before j ends a partial instance
	switch {
	case j-1 >= d.oldest() && j-1 >= 0 && (d.syncOnly || d.at(j-1) == tokS || d.initBefore(j, p)):
		startT = d.tAt(j - 1)
	case j == 0 && d.creationStarts(p, n):
		startT = d.createdAt
	case d.endsPartialInstance(j, cyc):
		startT, partial = d.tAt(j-1), true
	default:
		e := d.skipS(j, p) - 1
		startT = d.tAt(e)
		j = e + 1 // the first instance only opens the first step
	}
	if d.grp <= 1 {
		if s, ok := d.firstIterationStart(j, partial); ok {
			// The iteration before the first instance: from the latest
			// synchronisation to the call that ends it.
			d.startStep(s)
			d.report(startT, -1, false)
		} else {
			d.startStep(startT)
		}
	}
	d.nStep = 0
	d.instFrom = d.inst
	d.setInstT(d.inst-1, startT)
	d.floor = max(d.floor, j)
	var cnt int64
	for e := j; e <= n; e++ {
		if d.noS && d.at(e) == tokS {
			continue // ignored by a cycle without synchronisations
		}
		if cnt++; cnt == p {
			cnt = 0
			d.floor = e + 1
			d.instance(d.tAt(e), d.ws[e&d.mask], false)
		}
	}
	d.pos = int(cnt)
	if !tentative {
		d.remember(cyc)
	}
	for _, k := range d.known {
		k.state = 0
	}
}

// endsPartialInstance reports whether, on a communicator's first lock, the
// token before the first instance at j is the cycle's own last call: an
// iteration whose calls differ only before it (DDP rebuilds its buckets
// after iteration 0) still ends with the call that ends every later one,
// a boundary of the same phase. Without this the first instance only
// opened the first step, and its iteration had none.
func (d *seqDet) endsPartialInstance(j int64, cyc []int32) bool {
	return !d.confirmedOnce && len(d.known) == 0 && !d.syncOnly && j-1 >= d.oldest() && j-1 >= 0 &&
		d.at(j-1) == cyc[len(cyc)-1]
}

// firstIterationStart: when the lock starts at a partial instance's end
// (partial: endsPartialInstance chose the start) and a synchronisation
// precedes it with only collectives between, the time of that
// synchronisation: the first iteration, whose calls were another cycle's,
// runs from there (DDP's iteration 0 before the buckets are rebuilt, after
// the init-time broadcast's synchronisation).
func (d *seqDet) firstIterationStart(j int64, partial bool) (int64, bool) {
	if !partial || d.nextIdx != 0 {
		return 0, false
	}
	for i := j - 2; i >= d.oldest() && i >= 0; i-- {
		if d.at(i) == tokS {
			return d.tAt(i), true
		}
	}
	return 0, false
}

// skipS returns the token after the p tokens of the cycle from j (S
// tokens do not count when the cycle has none).
func (d *seqDet) skipS(j, p int64) int64 {
	if !d.noS {
		return j + p
	}
	for cnt := int64(0); cnt < p; j++ {
		if d.at(j) != tokS {
			cnt++
		}
	}
	return j
}

// initBefore reports whether the token before the periodic region starting
// at j (period p) is an init-time call: on the sequence's first lock, a
// call that does not repeat p tokens later.
func (d *seqDet) initBefore(j, p int64) bool {
	return !d.confirmedOnce && len(d.known) == 0 && !d.syncOnly && j-1 >= d.oldest() && j-1+p < d.n &&
		d.at(j-1) != tokS && d.at(j-1) != d.at(j-1+p)
}

// creationStarts reports whether the communicator's creation is the start
// of the step that the first instance of a cycle of period p at token 0
// ends: when it was seen and lies within one and a half cycles (as long
// as the second instance) before that end, not before an idle wait.
func (d *seqDet) creationStarts(p, n int64) bool {
	if !d.fromCreation || 2*p-1 > n || d.oldest() > 0 {
		return false
	}
	end, cyc := d.tAt(p-1), d.tAt(2*p-1)-d.tAt(p-1)
	return d.createdAt <= d.tAt(0) && 2*(end-d.createdAt) <= 3*cyc
}

func (d *seqDet) remember(cyc []int32) {
	d.clock++
	for _, k := range d.known {
		if equalIDs(k.ids, cyc) {
			k.lastUse, k.grp = d.clock, d.grp
			return
		}
	}
	k := newKnown(cyc)
	k.lastUse, k.grp = d.clock, d.grp
	d.known = remember(d.known, k, func(k *knownCycle) uint64 { return k.lastUse })
}
