package stepdet

import (
	"math"
	"slices"
)

// Several instances of a cycle per iteration, resolved by timing.
//
// The token cycle is the shortest period of the call sequence, and an
// iteration can hold it several times: Megatron's grad-norm all-reduce and
// its interval timer's barrier (both an all-reduce of one element), each
// followed by the timers' device synchronisation, make "B S B S" per
// iteration; the transformers Trainer without a collective makes five
// identical cudaStreamSynchronize per iteration (a period of one call on
// the fallback clock). Tokens cannot tell these instances apart; their
// timing can: the instances of one iteration follow each other closely,
// and one of them holds the forward and backward pass. As in burst.go,
// reach(k) counts the instances right before instance k whose duration
// (from the end of the previous instance to its own end) is less than
// 1/groupRatio of instance k's. While a lock is tentative, an instance k
// with reach r >= 1 whose predecessors k−(r+1), k−2(r+1), … (Repeats
// groups in all; settledReps where the groups' other instances agree with
// the steady instances before them, one-instance iterations that stalls
// of the host stretched at every m-th: stalled) reach as far makes groups
// of m = r+1 instances (another m than the current grouping's, if any):
// the lock's per-instance steps are withdrawn and a step becomes m
// instances, ending with the dominant one (the return of the
// synchronisation that waited for the iteration's GPU work). The first
// group is the earliest one whose dominant instance reaches as far and is
// not init-time (initGroup), and the ones before it,
// each while its last instance dominates the one before it (or would but
// for one instance of its group that a preemption delayed) and lasts at
// least half as long as the next group's (the first iterations: the
// first's instances hold data loading or compilation, and the next one's
// first instance can hold the end of the first: the Trainer's first
// iteration on the H200, 3.1 s, was lost when its second's first instance
// of 200 ms dominated only two of the four others).
//
// Later groups are cut by count (countedEnd): the instance at the count
// ends a step when it dominates its group, or lasts at least half as long
// as the dominant instances did while another instance of its group is far
// shorter. The dominant duration is a low quantile (the domQ+1-th
// shortest) of the latest domN instances that ended steps: a preemption of
// the host only lengthens instances, so that stalls do not raise it, and
// a preempted group (other instances delayed, the end still long) keeps
// the phase. An instance whose closing call returned at once while the
// step ends' calls wait for the GPU (waited) is no end either: a
// preemption of the host between two brief calls. A group whose instance
// at the count is no end loses the phase (an iteration with extra calls, a
// logging step), which is found again (resyncEnd):
//
//   - at the count's position (keptRun): the count of calls per iteration
//     is what the cycle is, and extra calls keep the phase when their
//     number is a multiple of the group (a preempted group that lost it
//     keeps it always), once Repeats consecutive groups end a step there
//     as they would by the count. The evidence is that of many groups, not
//     of one group's durations, which preemptions make noisy;
//   - at the next instance that reaches m−1 and lasts at least half as
//     long as the dominant instances did (a spike among the logging
//     step's calls does not), once the instances pendGroups groups later
//     end a step by the count (the idle time after the logging step's
//     calls is no step's end); the instance a group before it ends a step
//     too when it agrees with it within groupRatio (firstOfRun: the first
//     iteration after the irregular calls, whose first instance follows
//     them);
//   - or at a new pace (newPace): iterations that got shorter (after a
//     warm-up, a smaller batch) never reach half the last dominant
//     instance, so the dominant duration is learned again from a run of
//     instances at the same position in consecutive groups, the first
//     dominating its group, the others ending a step by the count, that
//     holds Repeats groups over groupRatio times the lock's recent steps
//     (a logging step's periodic spikes repeat as regularly, but briefly).
//
// All those instances end steps, reported when the phase is found, so that
// no iteration is lost. A confirmed cycle remembers m; re-locked, it waits
// for such an instance before its first step.
//
// The decisions depend on the timing of one rank's calls; ranks coupled by
// their collectives run the same iteration structure, so they group alike.

const (
	// groupRatio: the dominant instance lasts at least this many times
	// every other instance of its iteration (burstRatio's counterpart).
	groupRatio = 2
	// MaxGroup is the most instances of a cycle per iteration.
	MaxGroup = 16
	// instRing: instance end times kept (Repeats+1 groups of MaxGroup fit).
	instRing = 256
	// domN, domQ: the dominant duration is the domQ+1-th shortest of the
	// latest domN instances that ended steps of groups. It was their median
	// of 3: two stalls of 8 and 10 ms among 1.3 ms iterations on a loaded
	// 2-core host set it, and the next iterations, each with an instance
	// delayed, lost the phase for 12 of them
	// (testdata/trainer-speedup10-loaded-aligned-to-withdrawn).
	domN, domQ = 8, 2
	// settledSteps, settledReps: a grouping that made settledSteps steps
	// is replaced only by one that holds settledReps groups (findGroup).
	settledSteps, settledReps = 16, 8
	// pendGroups: the groups after a step end found again that must end
	// steps by the count before it counts (groupEnd). One was not enough
	// at a new pace of 1.2 ms dominant instances: in a logging step's
	// 0.1 ms calls, two preemptions of the host 5 calls apart (1 ms each)
	// made an iteration's end and its confirmation (402 facts for 400
	// iterations, TestReplayTrainerSpeedup's 10-loaded-preempted-logging).
	pendGroups = 2
	// waitScale: the scale of a wait's share of its instance (waited).
	waitScale = 1024
	// steadyN: steps whose durations must agree within groupRatio before
	// the fallback clock's first lock is confirmed.
	steadyN = 4
	// regularN steps, of which regularOut may be longer, make a regular
	// synchronisation clock (regular).
	regularN, regularOut = 16, 4
)

func (d *seqDet) setInstT(k, t int64)    { d.instT[((k%instRing)+instRing)%instRing] = t }
func (d *seqDet) setInstW(k, w int64)    { d.instW[((k%instRing)+instRing)%instRing] = w }
func (d *seqDet) instWait(k int64) int64 { return d.instW[((k%instRing)+instRing)%instRing] }
func (d *seqDet) instAt(k int64) int64   { return d.instT[((k%instRing)+instRing)%instRing] }

// dur is the duration of instance k; ok when its start is known.
func (d *seqDet) dur(k int64) (int64, bool) {
	if k < d.instFrom || k >= d.inst || k-1 <= d.inst-instRing {
		return 0, false
	}
	return d.instAt(k) - d.instAt(k-1), true
}

// reach counts the instances right before k shorter than 1/groupRatio of
// instance k.
func (d *seqDet) reach(k int64) int64 {
	dk, ok := d.dur(k)
	if !ok {
		return 0
	}
	var r int64
	for i := k - 1; r < MaxGroup; i-- {
		di, ok := d.dur(i)
		if !ok || di*groupRatio >= dk {
			break
		}
		r++
	}
	return r
}

// instance notes the end of one instance of the locked cycle at t and
// reports a step boundary when it ends a step.
func (d *seqDet) instance(t, w int64, counts bool) {
	k := d.inst
	d.inst++
	d.setInstT(k, t)
	d.setInstW(k, w)
	if d.grp <= 1 {
		d.boundary(t, w, counts)
	} else if end, from := d.groupEnd(k); end {
		// the instances from, from+grp, …, k end steps (a step's end found
		// again one group later, a new pace's run), reported now
		if from < 0 {
			from = k
		}
		for e := from; e <= k; e += d.grp {
			d.stepInst = e
			if !d.grpOpen {
				d.grpOpen = true
				d.startStep(d.instAt(e))
			} else {
				d.boundary(d.instAt(e), d.instWait(e), counts)
			}
		}
	}
	if d.locked && d.tentative {
		d.findGroup(k)
	}
}

// groupEnd reports whether instance k ends a step of groups; from >= 0
// is the first of the instances from, from+grp, …, k that end steps.
func (d *seqDet) groupEnd(k int64) (end bool, from int64) {
	switch {
	case d.resync:
		return d.resyncEnd(k)
	case (k-d.anchor)%d.grp != 0:
		return false, -1
	}
	dk, _ := d.dur(k)
	if !d.countedEnd(k, dk, d.domDur) {
		// An iteration with other calls (a logging step): find the phase
		// again, at the count's position first (keptRun).
		d.resync = true
		d.runFrom, d.runLast, d.pend = -1, -1, -1
		d.kept, d.keptFrom, d.keptLast, d.lost = true, -1, -1, k
		return false, -1
	}
	d.noteDom(k, dk, false)
	return true, -1
}

// resyncEnd is groupEnd while the phase is lost.
func (d *seqDet) resyncEnd(k int64) (end bool, from int64) {
	dk, _ := d.dur(k)
	if d.kept && d.grp >= 3 && (k-d.anchor)%d.grp == 0 {
		if from = d.keptRun(k, dk); from >= 0 {
			d.phase(k, dk, 2*dk < d.domDur)
			return true, d.groupsBefore(from, dk)
		}
	}
	if end, from, wait := d.pendEnd(k, dk); end || wait {
		return end, from
	}
	if d.reach(k) < d.grp-1 && (d.runLast < 0 || k != d.runLast+d.grp) {
		return false, -1
	}
	if from = d.newPace(k); from >= 0 {
		d.phase(k, dk, true)
		return true, d.groupsBefore(from, dk)
	}
	if d.reach(k) >= d.grp-1 && 2*dk >= d.domDur && d.waited(k, dk) {
		d.pend, d.pendFrom, d.pendHeld = k, k, 0 // the step's end, once the next groups hold
		if p := k - d.grp; d.firstOfRun(p, dk) {
			d.pendFrom = p
		}
	}
	return false, -1
}

// pendEnd confirms a candidate step end, d.pend: the instance that ends
// the next step dominates its group and lasts as long as the dominant
// instances did (half at least), not a spike among the many calls of a
// logging step, and the instances pendGroups groups later end a step by
// the count (countEnd): the idle time after a logging step's calls
// dominates them as well. The group before it may end a step too
// (firstOfRun). Or it is shorter, one of a new pace's run of groups
// (newPace). wait: k is one of the groups that the candidate still waits
// for.
func (d *seqDet) pendEnd(k, dk int64) (end bool, from int64, wait bool) {
	p := d.pend
	if p < 0 || k != p+(d.pendHeld+1)*d.grp {
		return false, -1, false
	}
	prev := k - d.grp
	dp, _ := d.dur(prev)
	held := d.countEnd(k, dk, dp)
	if prev == p {
		// The next iteration is of the pace the candidate resumes:
		// its dominant instance lasts as long as the dominant ones
		// did (half at least), as the candidate does; a new pace of
		// shorter ones is newPace's. A spike among a logging step's
		// brief calls was confirmed by another a group later that
		// dominated the briefer calls before it (testdata
		// trainer-speedup10-loaded-logging-spikes).
		held = held && !briefAfter(dk, dp) && 2*dk >= d.domDur
	} else {
		held = held || d.delayedInGroup(k, dk, dp) // a burst of far shorter groups may follow (pace.go)
	}
	switch {
	case !held:
		d.pend = -1 // and k may be a candidate itself
		return false, -1, false
	case d.pendHeld+1 < pendGroups:
		d.pendHeld++
		return false, -1, true
	}
	d.pend = -1
	from = d.groupsBefore(d.pendFrom, dk)
	d.phase(k, dk, false)
	return true, from, false
}

// countedEnd reports whether instance k at the count (of duration dk), dom
// the dominant duration, ends a step: it dominates its group (whatever its
// length: the iterations may get shorter), or lasts as long as the
// dominant instances did (half at least) while another instance of its
// group is far shorter (longEnd). A preemption of the host only lengthens
// instances: the end at the count stays long, though one or more of its
// group may outlast it (on a loaded 2-core host, two or three instances of
// one group 1.2 to 4 ms late among 1.3 ms iterations, every few
// iterations, lost the phase, which was found again 6 to 13 iterations
// later: testdata/trainer-speedup10-loaded-aligned-to-withdrawn). A
// logging step's brief calls at the count lose it, and so does a spike
// among them whose call returned at once (waited).
func (d *seqDet) countedEnd(k, dk, dom int64) bool {
	return (d.reach(k) >= d.grp-1 || d.longEnd(k, dk, dom)) && d.waited(k, dk)
}

// longEnd reports whether instance k (of duration dk) lasts as long as dom
// did (half at least) while another instance of its group is shorter than
// 1/groupRatio of it: not one of a run of alike instances (a CUDA graph's
// iterations after a grouping of the model's paired copies, which ungroup
// ends). Its call waited as an iteration's end does, for the iteration's
// GPU work: no two other calls of its group waited more than groupRatio
// times as long (one may: a preemption of the host inside the call right
// after the previous end, which then lasts its whole instance). On a loaded
// host the count after a logging iteration's end fell on its first logging
// call, 1.02 ms after the call before it and itself 224 µs long (the
// logging calls take 3 µs), after the grad-norm and all-gather
// synchronisations, which waited 2.5 and 1.9 ms: two facts in that
// iteration (TestReplayTrainerSpeedup's 10-loaded-logging-after-waits).
func (d *seqDet) longEnd(k, dk, dom int64) bool {
	if 2*dk < dom {
		return false
	}
	short, waitedMore := false, 0
	w := d.instWait(k)
	for i := k - d.grp + 1; i < k; i++ {
		di, ok := d.dur(i)
		if !ok {
			continue
		}
		if di*groupRatio < dk {
			short = true
		}
		if d.instWait(i) > w*groupRatio {
			waitedMore++
		}
	}
	return short && waitedMore < 2
}

// keptRun reports whether instance k (of duration dk), at the position of
// the count that lost the phase, ends a run of Repeats groups at that
// position, and returns the run's first instance; else -1. The count of
// calls per iteration is what the cycle is: an iteration with other calls
// keeps the phase when their number is a multiple of the group (the fake
// trainer's 100 synchronisations of a logging step), and a preempted group
// keeps it always. Each instance of the run ends a step as it would at the
// count (countedEnd), so that a preemption does not end the run; and the
// run restarts at an instance more than groupRatio times as long as its
// first (a spike among a logging step's brief calls that dominated them,
// the first iteration after them: TestReplayTrainerSpeedup's
// 3-loaded-preempted-iteration-1). Durations
// of one group decide nothing: Repeats of them at the count's position do,
// and the groupsBefore walk carries the phase back over the iterations
// since the loss.
func (d *seqDet) keptRun(k, dk int64) int64 {
	if !d.countedEnd(k, dk, d.domDur) || k <= d.stepInst {
		d.keptFrom, d.keptLast = -1, -1
		return -1
	}
	if d0, ok := d.dur(d.keptFrom); d.keptLast < 0 || k != d.keptLast+d.grp || !ok || d0*groupRatio < dk {
		d.keptFrom = k
	}
	d.keptLast = k
	if (d.keptLast-d.keptFrom)/d.grp+1 < int64(d.par.Repeats) {
		return -1
	}
	return d.keptFrom
}

// countEnd reports whether instance k at the count (of duration dk) ends a
// step, dom the dominant duration: it dominates its predecessor and
// either its whole group (whatever its length: the iterations may get
// shorter) or lasts as long as the dominant instances did (half at least:
// the first instance of the group is long, a data-loading stall), not a
// spike among the calls of a logging step that fell on the count.
func (d *seqDet) countEnd(k, dk, dom int64) bool {
	r := d.reach(k)
	return r >= 1 && (r >= d.grp-1 || 2*dk >= dom)
}

// briefAfter reports whether dk, the instance a group after a candidate
// step end of duration dp, is too brief to confirm it: one of a logging
// step's brief calls, which dominates the briefer ones before it. A
// preemption of the host in those calls (a gap of 2.9 ms among 0.1 ms
// ones) had made a candidate that a call of 0.35 ms confirmed: two more
// steps in the logging iteration (402 facts for 400 iterations,
// TestReplayTrainerSpeedup's preempted-logging). A real iteration's
// dominant instance is at most a few times shorter than a preempted one
// (3x in run-preempted).
func briefAfter(dk, dp int64) bool { return dk*groupRatio*groupRatio < dp }

// delayedInGroup reports whether instance k at the count (of duration dk)
// ends a step although it does not dominate its predecessor: one other
// instance of its group was delayed by a preemption of the host (3 ms
// late on a loaded machine, as long as the iteration's GPU wait) while k
// lasts as long as dom, the dominant instances, did (half at least), and
// every other instance of the group is shorter than 1/groupRatio of it
// (the delayed one may be longer: a new pace's dominant instances of
// 1.2 ms, one preemption 1.9 ms). Without it the phase was lost in that
// iteration and, found again only after the next one, a logging step's
// iteration with it (398 facts for 400 iterations: TestReplayTrainerSpeedup's
// preempted-before-logging); a new pace's run ended there, before it
// held groupRatio times the lock's pace, and its iterations were merged
// (387/400: speedup10-preempted-run). Groups of two have no other
// instance to tell a delay from a change of the iteration.
func (d *seqDet) delayedInGroup(k, dk, dom int64) bool {
	if d.grp < 3 || 2*dk < dom {
		return false
	}
	delayed := 0
	for i := k - d.grp + 1; i < k; i++ {
		di, ok := d.dur(i)
		switch {
		case !ok:
			return false
		case di*groupRatio >= dk:
			delayed++
		}
	}
	return delayed == 1
}

// phase notes that instance k, of duration dk, ends a step: the groups'
// phase and the dominant duration.
func (d *seqDet) phase(k, dk int64, newPace bool) {
	d.resync, d.anchor, d.kept = false, k, false
	d.runFrom, d.runLast, d.pend = -1, -1, -1
	d.noteDom(k, dk, newPace)
}

// noteDom notes instance k, of duration dk, that ended a step of groups:
// the dominant duration is a low quantile of the latest domN of them
// (stalls of the host do not make the next iterations too short to keep
// or find again the phase), and their waits (waited) the medians; a new
// pace replaces them.
func (d *seqDet) noteDom(k, dk int64, newPace bool) {
	w := [2]int64{d.instWait(k), d.instWait(k) * waitScale / max(dk, 1)}
	if newPace || d.nDom == 0 {
		for i := range d.doms {
			d.doms[i] = dk
		}
	}
	if newPace || d.nWait == 0 {
		for i := range d.waits {
			d.waits[i] = w
		}
	}
	d.doms[d.nDom%domN], d.waits[d.nWait%domN] = dk, w
	d.nDom++
	d.grpEnds++
	d.nWait++
	ds := d.doms
	slices.Sort(ds[:])
	d.domDur = ds[domQ]
	var ws, sh [domN]int64
	for i, w := range d.waits {
		ws[i], sh[i] = w[0], w[1]
	}
	slices.Sort(ws[:])
	slices.Sort(sh[:])
	d.domWait, d.domShare = ws[domN/2], sh[domN/2]
}

// waited reports whether the call that ended instance k (of duration dk)
// waited as the steps' ending calls do, when they wait for a good part of
// their instances (a quarter at least: the iteration's end waits for its
// GPU work): for more than 1/paceRatio of their median wait, or for more
// than 1/groupRatio² of their median share of the instance (a new pace's
// waits are shorter in proportion; a spike of 0.67 ms whose call waited
// 89 µs, 0.13 of it against the ends' 0.63, passed at 1/paceRatio:
// TestReplayTrainerSpeedup's 10-loaded-spike-brief-wait).
// A preemption of the host between two brief calls makes an instance as
// long as an iteration's end, whose call returns at once: among a logging
// step's synchronisations (5 µs against 0.8 ms), such a spike one group
// before the next iteration's end became a step with it (two facts in one
// iteration: TestReplayTrainerSpeedup's 10-logging-spike-no-wait).
func (d *seqDet) waited(k, dk int64) bool {
	if d.nWait == 0 || d.domShare*groupRatio*groupRatio < waitScale {
		// The steps' ends do not wait (the loop is not the GPU's), or
		// the lock has none yet: a re-locked cycle's first step end is
		// found by duration alone (the Trainer's end of training).
		return true
	}
	w := d.instWait(k)
	return w*paceRatio >= d.domWait || w*waitScale*groupRatio*groupRatio >= d.domShare*max(dk, 1)
}

// agrees reports whether durations a and b agree within groupRatio.
func agrees(a, b int64) bool { return a*groupRatio >= b && b*groupRatio >= a }

// firstOfRun reports whether instance p, a group before an instance of
// duration dk that dominates its group, ends a step too: the first group
// after the calls that lost the phase (its first instance follows them:
// the idle time after a logging step's calls; an iteration with a call
// less; a preemption of the host that made the instance before p as
// long) when p agrees with dk and lies after the latest step's end. (A
// spike of a logging step is far shorter than a dominant instance.)
func (d *seqDet) firstOfRun(p, dk int64) bool {
	dp, ok := d.dur(p)
	return ok && p > d.stepInst && agrees(dp, dk)
}

// groupsBefore returns the earliest instance e of from, from−grp, … that
// ends a step with the groups after it, ref the duration of an instance
// that ended one by the count after the phase was found again: each
// instance before from dominates its group and lasts at least
// 1/groupRatio of ref (a preempted one may be longer), or would dominate
// it but for one delayed instance (delayedInGroup), and lies after the
// latest step's end. These are iterations whose run a preemption of the
// host ended before it held Repeats groups, or groupRatio times the lock's
// pace (a new pace's iterations after --speedup 10 on a loaded host, 8 to
// 11 of them merged into one step: TestReplayTrainerSpeedup's
// 10-loaded-preempted-walk2 and 3; one dominant instance three times as long:
// run-preempted); the phase, found again, carries back over them. A
// logging step's brief calls dominate nothing or are far briefer than
// ref, which ends the walk. A run whose oldest groups slid out of the
// instance ring was merged, counted as bursts: not walked.
func (d *seqDet) groupsBefore(from, ref int64) int64 {
	if d.runSlid > 0 {
		return from
	}
	for e := from - d.grp; e > d.stepInst; e -= d.grp {
		de, ok := d.dur(e)
		if !ok || !d.longEnd(e, de, ref) || !d.waited(e, de) && e != d.lost {
			break
		}
		from = e
	}
	return from
}

// newPace reports whether instance k, which dominates its group, ends a
// run of groups of a new pace (iterations that got shorter: its dominant
// instances last less than half the last dominant one, which the phase
// waits for otherwise), and returns the run's first instance; else -1. A
// run is the instances at the same position in consecutive groups, the
// first dominating its group (and the one a group before it, see
// firstOfRun), the others ending a step by the count (countEnd, the run's
// previous instance the dominant duration: a preemption of the host that
// delays an instance of the group does not end the run), each shorter
// than half the dominant duration. It is a new pace once it holds
// Repeats groups over groupRatio times the lock's pace (the median of its
// latest steps reported): a logging step's periodic spikes and an
// end-of-training burst repeat as regularly, but within an iteration's
// time. The run's instances all end steps, and the dominant duration is
// learned again (the position in the group, not the duration, carries the
// phase over the change). A run keeps its latest instRing/2 instances;
// older groups (a speed-up by more than instRing/(2·groupRatio·m)) are
// merged into the step before the run, counted as bursts.
func (d *seqDet) newPace(k int64) int64 {
	dk, _ := d.dur(k)
	if 2*dk >= d.domDur {
		d.runFrom, d.runLast = -1, -1
		return -1
	}
	dl, _ := d.dur(d.runLast)
	switch {
	case d.runLast >= 0 && k == d.runLast+d.grp && (d.countEnd(k, dk, dl) || d.delayedInGroup(k, dk, dl)):
		d.runLast = k
		if k-d.runFrom >= instRing/2 {
			d.runFrom += d.grp
			d.runSlid++
		}
	case d.reach(k) >= d.grp-1:
		d.runFrom, d.runLast, d.runSlid = k, k, 0
		if p := k - d.grp; d.firstOfRun(p, dk) {
			d.runFrom = p
		}
	default:
		d.runFrom, d.runLast = -1, -1 // the run ends (a logging step's spikes did)
		return -1
	}
	ref, ok := d.pace.pace()
	if !ok {
		ref = d.domDur
	}
	if (d.runLast-d.runFrom)/d.grp+1 < int64(d.par.Repeats) || d.instAt(d.runLast)-d.instAt(d.runFrom) < groupRatio*ref {
		return -1
	}
	if d.runSlid > 0 {
		d.emit(Event{Kind: Burst, Idx: d.runSlid})
	}
	return d.runFrom
}

// findGroup looks for m instances per iteration ending with instance k,
// while the lock is tentative: a grouping found in an init-time burst
// gives way to the training loop's. The current grouping's phase, lost,
// is found again by groupEnd, without withdrawing the lock's steps (a
// regroup at the same m withdrew 150 steps after iterations that got
// shorter within the first ConfirmSpan: TestReplayTrainerSpeedup).
func (d *seqDet) findGroup(k int64) {
	r := d.reach(k)
	m := r + 1
	reps := int64(d.par.Repeats)
	if m == d.grp {
		return // the current grouping; its phase is kept or found again by groupEnd
	}
	if m < d.grp {
		// A shorter group must hold over Repeats−1 of the current ones: a
		// lesser peak inside the iteration repeats at a period of its own
		// for a few instances.
		reps = max(reps, (reps-1)*d.grp/m+1)
	}
	if m == 1 && d.resync {
		d.ungroup(k, reps)
		return
	}
	if d.grp > 1 && d.nStep >= settledSteps {
		// A grouping that made settledSteps steps gives way only to one
		// that holds settledReps groups: after a 10x speed-up on a loaded
		// host, preemptions mimicked groups of 4 instead of 5 for 3 groups,
		// and the regroups there and back withdrew the tentative lock's
		// 110 steps twice (248 facts for 400 iterations,
		// TestReplayTrainerSpeedup's 10-loaded-regroup).
		reps = max(reps, settledReps)
	}
	if m < 2 || m > MaxGroup {
		return
	}
	if d.grp <= 1 && d.stalled(m, k, reps) {
		reps = max(reps, settledReps)
	}
	if k-(reps-1)*m-r < d.instFrom {
		return
	}
	for j := int64(1); j < reps; j++ {
		if d.reach(k-j*m) < r {
			return
		}
	}
	d.regroup(m, k)
}

// stalled reports whether the reps groups of m instances ending with
// instance k, and the groups before them that reach as far, may be
// iterations of one instance each, every m-th stretched by a stall of the
// host: the other instances of the groups agree within groupRatio with
// each of the steadyN instances before the groups, which agree with each
// other. Preemptions of the host on a loaded 2-core host stretched three
// iterations at every other instance of a one-instance cycle (40, 67 and
// 41 ms among 17.4 ms ones) in its tentative lock, which regrouped by two
// (TestReplayReattachStallsKeepOneInstancePerIteration); such a grouping
// must hold settledReps groups.
func (d *seqDet) stalled(m, k, reps int64) bool {
	e0 := k - (reps-1)*m // the earliest group that reaches as far, as regroup walks
	for e0-m >= d.instFrom && d.reach(e0-m) >= m-1 {
		e0 -= m
	}
	first := e0 - m + 1
	if first-steadyN < d.instFrom {
		return false
	}
	lo, hi := int64(math.MaxInt64), int64(0)
	for i := first - steadyN; i < first; i++ {
		di, ok := d.dur(i)
		if !ok {
			return false
		}
		lo, hi = min(lo, di), max(hi, di)
	}
	if lo*groupRatio < hi {
		return false
	}
	for i := first; i <= k; i++ {
		if (k-i)%m == 0 {
			continue // the dominant instances
		}
		if di, ok := d.dur(i); !ok || !agrees(di, lo) || !agrees(di, hi) {
			return false
		}
	}
	return true
}

// ungroup ends a grouping whose phase is lost when the latest n instances
// up to k are alike (within groupRatio of each other, none dominating its
// predecessor) and each lasts as long as the dominant instances did (half
// at least; a logging step's calls are brief): the grouping was an
// init-time burst's (the model's copy to the GPU synchronises in pairs)
// and the training loop's iterations are one instance each (a CUDA graph's
// replay and its synchronisation). Waiting for a dominant instance would
// wait for ever: the lock made no step for the rest of the run. The
// brevity is measured only against a dominant duration that steps of the
// grouping have held (domQ+1 of them since the regroup, so that the
// quantile is theirs): until then it is the regroup's own instance, and
// that can be a stall. Preemptions of the host that stretched every other
// iteration of a one-instance cycle (40, 67 and 41 ms among 17.4 ms ones)
// made a grouping of two whose dominant duration no later iteration
// reached half of: 0 facts for 150 iterations
// (TestReplayReattachStallsKeepOneInstancePerIteration). The lock's steps
// are withdrawn and the run's instances become its steps, with the
// instances before it back to the first one shorter than half the run's
// (the burst's), or to the lock's first instance.
func (d *seqDet) ungroup(k, n int64) {
	if k-n < d.instFrom {
		return
	}
	lo, hi := int64(math.MaxInt64), int64(0)
	for i := k - n + 1; i <= k; i++ {
		di, ok := d.dur(i)
		if !ok || d.reach(i) != 0 {
			return
		}
		lo, hi = min(lo, di), max(hi, di)
	}
	if lo*groupRatio < hi || 2*lo < d.domDur && d.grpEnds > domQ {
		return // not alike, or brief: a logging step's many calls
	}
	e0 := k - n + 1
	for e0 > d.instFrom {
		di, ok := d.dur(e0 - 1)
		if !ok || di*groupRatio < lo {
			break // an init-time burst's instance; a longer one (a warm-up iteration, the graph's capture) is a step
		}
		e0--
	}
	d.emit(Event{Kind: Retract, Gen: d.gen})
	d.nextIdx = d.genBase
	d.gen++
	d.since, d.nStep = 0, 0
	d.grp, d.anchor, d.resync, d.grpOpen, d.stepInst = 1, k, false, true, k
	d.runFrom, d.runLast, d.pend = -1, -1, -1
	d.startStep(d.instAt(e0 - 1))
	for e := e0; e <= k; e++ {
		d.boundary(d.instAt(e), d.instWait(e), false)
	}
}

// regroup withdraws the lock's steps and reports groups of m instances
// ending with instance k instead, from the first group (see above).
func (d *seqDet) regroup(m, k int64) {
	d.emit(Event{Kind: Retract, Gen: d.gen})
	d.nextIdx = d.genBase
	d.gen++
	d.since, d.nStep = 0, 0
	d.grp, d.anchor, d.resync, d.grpOpen, d.stepInst = m, k, false, true, k
	d.runFrom, d.runLast, d.pend = -1, -1, -1
	dk, _ := d.dur(k)
	d.noteDom(k, dk, true)
	d.grpEnds = 0
	e0 := k
	for e0-m >= d.instFrom && d.reach(e0-m) >= m-1 && !d.initGroup(e0-m, k) {
		e0 -= m
	}
	// The first iterations, each as long as half the next one at least.
	for g := e0 - m; g >= d.instFrom && d.firstIteration(g, e0); g -= m {
		e0 = g
	}
	d.startStep(d.instAt(max(e0-m, d.instFrom-1)))
	for e := e0; e <= k; e += m {
		d.boundary(d.instAt(e), d.instWait(e), false)
	}
}

// initGroup reports whether the group ending with instance g, which
// reaches as far as the regroup's groups up to k, is init-time (the
// model's copy to the GPU, a synchronisation per tensor) by InitTime's
// rule, which the confirmation of the fallback clock's first lock applies
// to its steps: shorter than 1/groupRatio of each of the next groups (up
// to steadyN+1 of them) and ending no run of steadyN+1 groups that agree
// within groupRatio (a change of pace). Reported as a step and withdrawn
// at the confirmation, it took an index all the same: on one rank of the
// fake trainer the last copies happened to make a group (four brief ones,
// then one of 1 ms before iterations of 11 ms), on the other not, and step
// k was iteration k−1 on the first (TestReplayTrainerSpeedup's
// 10-loaded-preempted-first-iterations).
func (d *seqDet) initGroup(g, k int64) bool {
	dg, _ := d.dur(g)
	n := 0
	for e := g + d.grp; e <= k && n <= steadyN; e += d.grp {
		if de, _ := d.dur(e); dg*groupRatio >= de {
			return false
		}
		n++
	}
	return n > 0 && !d.endsRun(g)
}

// endsRun reports whether the groups ending with instances g−steadyN·grp,
// …, g each reach grp−1 and agree within groupRatio.
func (d *seqDet) endsRun(g int64) bool {
	lo, hi := int64(math.MaxInt64), int64(0)
	for j := int64(0); j <= steadyN; j++ {
		e := g - j*d.grp
		de, ok := d.dur(e)
		if !ok || d.reach(e) < d.grp-1 {
			return false
		}
		lo, hi = min(lo, de), max(hi, de)
	}
	return lo*groupRatio >= hi
}

// firstIteration reports whether instance g, a group before e, the first
// instance of a regroup that ends a step, ends a step too: it lasts half
// as long as e at least and dominates the instance before it (the first
// instance, whose predecessor is unknown, need not), or would dominate
// it but for one other instance of its group that a preemption of the
// host delayed (delayedInGroup, as at the count). On a loaded 2-core host
// rank 1's iteration 1 had its third call 5.9 ms late, beside an 11.3 ms
// end: the walk stopped there and iterations 0 and 1 made no step
// (TestReplayTrainerSpeedup's 10-loaded-preempted-first-iterations).
func (d *seqDet) firstIteration(g, e int64) bool {
	dg, _ := d.dur(g)
	de, _ := d.dur(e)
	if 2*dg < de {
		return false
	}
	return d.reach(g) >= min(1, g-d.instFrom) || d.delayedInGroup(g, dg, de)
}

// knownGroup is the instances per step of a confirmed cycle (0: unknown).
func (d *seqDet) knownGroup(cyc []int32) int64 {
	for _, k := range d.known {
		if equalIDs(k.ids, cyc) {
			return k.grp
		}
	}
	return 0
}

// regular reports whether the latest regularN steps but the longest
// regularOut agree within groupRatio: steady through logging steps'
// longer steps (their iterations may not have got shorter with the
// others) and preemptions of the host on a loaded machine. With the latest
// 5 steps and one longer allowed, a logging step and a preempted
// iteration (10 ms among 5 ms ones) let the all-gather's communicator, one
// step every 50 iterations, take the clock over (8 facts for 400
// iterations); with 8 and two, two logging steps and a preemption among
// 1.8 ms steps did (3 facts: TestReplayTrainerSpeedup's keep-sync-clock
// replays).
func (d *seqDet) regular() bool {
	var ds [regularN]int64
	if !d.latestSteps(ds[:]) {
		return false
	}
	return ds[0]*groupRatio >= ds[regularN-1-regularOut]
}

// evenSteps: the latest steps are steady or regular.
func (d *seqDet) EvenSteps() bool {
	_, steady := d.steady()
	return steady || d.regular()
}

// steady reports whether the latest steadyN steps agree within groupRatio;
// thr is half their median: the shorter steps before them are init-time.
func (d *seqDet) steady() (thr int64, ok bool) {
	var ds [steadyN]int64
	if !d.latestSteps(ds[:]) || ds[0]*groupRatio < ds[steadyN-1] {
		return 0, false
	}
	return ds[steadyN/2] / 2, true
}

// latestSteps fills ds with the durations of the latest len(ds) steps
// (stepT holds len(ds)+1 boundaries at least), sorted; false until there
// are len(ds)+1 boundaries.
func (d *seqDet) latestSteps(ds []int64) bool {
	n := len(ds)
	if d.nStep < n+1 {
		return false
	}
	for i := range n {
		ds[i] = d.stepT[(d.nStep-1-i)%len(d.stepT)] - d.stepT[(d.nStep-2-i)%len(d.stepT)]
	}
	slices.Sort(ds)
	return true
}

// InitTime returns the latest init-time step (a synchronisation per
// parameter copied to the GPU) of a tentative lock whose steps lasted
// durs, -1 when none: the settling withdraws it and the steps before it
// at a Trim event (T is minNS). A step is init-time when it is not in a
// run itself (a run is steadyN+1 consecutive steps that agree within
// groupRatio) and shorter than 1/groupRatio of each of the next steps of
// a run (up to steadyN+1 of them: the next one alone was iteration 1,
// preempted to twice the others, so that iteration 0 was withdrawn as
// init-time, TestReplayTrainerSpeedup's preempted-iteration-1; their
// median was a run of three preempted iterations of 4 ms and two of 2.2
// and 2.6 ms, so that a 2 ms iteration before them and the 189 before it
// were withdrawn: TestReplayTrimUnderPreemptions), or, with no run after
// it, than minNS (half the
// median of the lock's latest steps: after a 3x slow-down within the
// first ConfirmSpan, a preempted iteration of the old pace between two
// runs was shorter than that, and the 31 iterations before it were
// withdrawn: speedup0.33-loaded-preempted). So a change
// of pace within the first ConfirmSpan keeps the old pace's iterations
// (withdrawing every step before the latest one shorter than minNS
// withdrew 100 iterations before a 3x slow-down) and withdraws the copies'
// steps before a 10x speed-up, as long as the new iterations.
func InitTime(durs []int64, minNS int64) int {
	dur := func(k int) int64 { return durs[k] }
	const w = steadyN + 1
	inRun := make([]bool, len(durs))
	for a := 0; a+w <= len(durs); a++ {
		lo, hi := dur(a), dur(a)
		for k := a + 1; k < a+w; k++ {
			lo, hi = min(lo, dur(k)), max(hi, dur(k))
		}
		if lo*groupRatio >= hi {
			for k := a; k < a+w; k++ {
				inRun[k] = true
			}
		}
	}
	return initCut(len(durs), dur, inRun, minNS)
}

// initCut returns the latest init-time step of n steps (durations dur,
// inRun: in a run) by InitTime's rule, -1 when none. The step after it is
// init-time too when it is in no run and the step after that is far
// longer (paceRatio) than the lock's latest steps (2·minNS is their
// median): that one is the first iteration, after the copies, and the last
// copies' step can be as long as an iteration (FSDP2 and a CUDA graph at
// world size 1 on the H200: 15 ms before iteration 0's 3.9–4.2 s, a fact
// before the first iteration).
func initCut(n int, dur func(int) int64, inRun []bool, minNS int64) int {
	const w = steadyN + 1
	var next []int64 // the durations of the next steps of a run, nearest first
	for k := n - 1; k >= 0; k-- {
		d := dur(k)
		if inRun[k] {
			next = append([]int64{d}, next[:min(len(next), w-1)]...)
			continue
		}
		if len(next) == 0 && d < minNS || len(next) > 0 && d*groupRatio < slices.Min(next) {
			if k+2 < n && !inRun[k+1] && dur(k+2) > paceRatio*2*minNS {
				return k + 1
			}
			return k
		}
	}
	return -1
}
