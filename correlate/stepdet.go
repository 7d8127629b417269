package correlate

// The seam between a communicator's step detection and the step timeline
// (steps.go). A procComm holds one stepDetector, chosen at its first
// collective (a noDetector before it): a seqDet (period.go) finds the
// cycle of the token sequence of its collectives and synchronisations, a
// burstDet (burst.go) the period of the timing of collectives that carry
// no sizes, until the first call with a size hands the communicator over
// to a seqDet. A process's fallback clock on synchronisations
// (proc.syncPC) is a seqDet too. A detector reports what it finds as
// detEvents, which Correlator.onEvents hands to the process's steps; its
// decisions depend only on what it was fed.

// stepDetector is one strategy of step detection on one communicator.
// Every call that feeds it may leave events in its state for onEvents.
type stepDetector interface {
	// collective adds a collective call of the communicator. urgent: the
	// process's buffers are half full, so that a first lock must not be
	// held back any longer (Config.ConfirmSpan).
	collective(h *HostCall, urgent bool)
	// sync adds a synchronisation of the process (h ended at h.EndNS).
	sync(h *HostCall, urgent bool)
	// wait adds a wait of a host thread of the process for a collective
	// (a HostCollWait without op): time the host spent blocked on its
	// peers, not its own work.
	wait(h *HostCall)
	// yield reports whether the strategy gives the communicator up at
	// collective h, which another strategy must take: it has left its lock
	// (its events say so) and is fed no more.
	yield(h *HostCall) bool
	// finish ends the detection: the agent stops (Flush), or the process
	// exited (Forget).
	finish(exited bool)
	// latestStep is the duration of the latest step the detector reported,
	// when it keeps it.
	latestStep() (ns int64, ok bool)
	// evenSteps reports whether the detector's latest steps agree within
	// a factor of two: all of the latest steadyN, or all of the latest
	// regularN but the longest regularOut (logging steps, preemptions).
	// False while it keeps too few step times, or none.
	evenSteps() bool
	// hasKnown reports whether a cycle has been confirmed.
	hasKnown() bool
	// state is what the step timeline reads: the pending events, the lock
	// and the counters.
	state() *detState
}

var (
	_ stepDetector = (*seqDet)(nil)
	_ stepDetector = (*burstDet)(nil)
	_ stepDetector = (*noDetector)(nil)
)

// noDetector is a communicator's detector before its first collective,
// which chooses the strategy (Correlator.newDetector): it yields at once
// and finds nothing until then.
type noDetector struct{ detState }

func (*noDetector) collective(*HostCall, bool) {}
func (*noDetector) sync(*HostCall, bool)       {}
func (*noDetector) wait(*HostCall)             {}
func (*noDetector) yield(*HostCall) bool       { return true }
func (*noDetector) finish(bool)                {}
func (*noDetector) latestStep() (int64, bool)  { return 0, false }
func (*noDetector) hasKnown() bool             { return false }
func (*noDetector) evenSteps() bool            { return false }

type detParams struct {
	repeats, maxPeriod, confirm, promote, noSyncMin int
	confirmSpan                                     int64 // ns
}

// detState is what a step detector shows the step timeline: its pending
// events, its lock and its counters.
type detState struct {
	events            []detEvent
	locked, tentative bool
	detCounts
}

func (d *detState) state() *detState { return d }

func (d *detState) emit(e detEvent) { d.events = append(d.events, e) }

// detCounts are the counters of a detector that go into RankStats; a
// process keeps those of the detectors it no longer holds (proc.retired).
type detCounts struct {
	irregular uint64 // calls outside a locked cycle
	relocks   uint64
	initCalls uint64 // collectives before the first confirmed cycle
}

func (a *detCounts) add(b detCounts) {
	a.irregular += b.irregular
	a.relocks += b.relocks
	a.initCalls += b.initCalls
}

type detEventKind uint8

const (
	evStart    detEventKind = iota + 1 // a step opens at t
	evBoundary                         // the open step closes at t with index idx; the next opens
	evBreak                            // the sequence left the cycle: the open step is irregular
	evConfirm                          // the tentative lock gen is confirmed
	evRetract                          // the tentative lock gen is withdrawn with its steps
	evTrim                             // the tentative steps of gen up to its latest init-time one are withdrawn (t: half the median of its latest steps; trimGen)
	evBurst                            // idx boundaries held in the open step were merged into it or dropped with it (pace.go)
)

type detEvent struct {
	kind      detEventKind
	tentative bool
	gen       uint32
	t         int64
	idx       int64
}

// maxKnown is how many confirmed cycles a detector remembers.
const maxKnown = 8

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
