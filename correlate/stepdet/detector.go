package stepdet

// The seam between a communicator's step detection and correlate's step
// timeline. A communicator holds one Detector, chosen at its first
// collective (None before it): a token detector (NewSeq, period.go) finds
// the cycle of the token sequence of its collectives and synchronisations,
// a timing detector (NewBurst, burst.go) the period of the timing of
// collectives that carry no sizes, until the first call with a size hands
// the communicator over to a token detector. A process's fallback clock on
// synchronisations is a token detector too (NewSyncClock). A detector
// reports what it finds as Events, which correlate hands to the process's
// steps; its decisions depend only on what it was fed.

// Detector is one strategy of step detection on one communicator.
// Every call that feeds it may leave events in its Status.
type Detector interface {
	// Collective adds a collective call of the communicator. urgent: the
	// process's buffers are half full, so that a first lock must not be
	// held back any longer (Params.ConfirmSpan).
	Collective(h Call, urgent bool)
	// Sync adds a synchronisation of the process (h ended at h.EndNS).
	Sync(h Call, urgent bool)
	// Wait adds a wait of a host thread of the process for a collective
	// (a wait without op): time the host spent blocked on its peers, not
	// its own work.
	Wait(h Call)
	// Yield reports whether the strategy gives the communicator up at
	// collective h, which another strategy must take: it has left its lock
	// (its events say so) and is fed no more.
	Yield(h Call) bool
	// Finish ends the detection: the agent stops, or the process exited
	// or destroyed the communicator (exited).
	Finish(exited bool)
	// LatestStep is the duration of the latest step the detector reported,
	// when it keeps it.
	LatestStep() (ns int64, ok bool)
	// HasKnown reports whether a cycle has been confirmed.
	HasKnown() bool
	// EvenSteps reports whether the detector's latest steps agree within
	// a factor of two: all of the latest steadyN, or all of the latest
	// regularN but the longest regularOut (logging steps, preemptions).
	// False while it keeps too few step times, or none.
	EvenSteps() bool
	// Status is what the step timeline reads: the pending events, the
	// lock and the counters.
	Status() *State
}

var (
	_ Detector = (*seqDet)(nil)
	_ Detector = (*burstDet)(nil)
	_ Detector = (*noDetector)(nil)
)

// Call is what step detection sees of one host call: tokens compare the
// op, count and datatype for equality only, and timing reads the times.
type Call struct {
	TID uint32
	// Op is the collective or, for a synchronisation, its function.
	Op string
	// Count is the number of elements; 0 when the probe sees no size:
	// such a communicator's steps come from call timing (NewBurst).
	Count    uint64
	Datatype uint32
	// StartNS and EndNS are CLOCK_MONOTONIC.
	StartNS, EndNS int64
}

// Params are the detectors' settings, from correlate's Config.
type Params struct {
	// Repeats is how many cycles the latest run of repetition must cover
	// to lock; MaxPeriod the longest cycle, in tokens.
	Repeats, MaxPeriod int
	// Confirm is how many more cycles confirm a fresh lock, Promote how
	// many a later cycle needs.
	Confirm, Promote int
	// NoSyncMin is how many calls without a synchronisation accept a cycle
	// without one.
	NoSyncMin int
	// ConfirmSpan is how much event time (ns) a first lock must also hold.
	ConfirmSpan int64
}

// NewSeq returns a token detector of a communicator. fromCreation: its
// creation was seen at createdAt and its first call is the one to come
// (token 0); else the sequence began unseen (the cut point does not
// depend on it).
func NewSeq(par Params, fromCreation bool, createdAt int64) Detector {
	d := newSeqDet(par, false)
	d.fromCreation, d.createdAt = fromCreation, createdAt
	return d
}

// NewSyncClock returns the token detector of a process's fallback clock:
// every synchronisation is a token of its function. *procColl reports
// whether the process made a collective yet; a first lock taken after one
// is held until the process ends (the communicator's cycle is to come).
func NewSyncClock(par Params, procColl *bool) Detector {
	d := newSeqDet(par, true)
	d.procColl = procColl
	return d
}

// NewBurst returns the timing detector of a communicator whose
// collectives carry no sizes.
func NewBurst(par Params) Detector { return newBurstDet(par) }

// NewNone returns a communicator's detector before its first collective,
// which chooses the strategy: it yields at once and finds nothing.
func NewNone() Detector { return &noDetector{} }

type noDetector struct{ State }

func (*noDetector) Collective(Call, bool)     {}
func (*noDetector) Sync(Call, bool)           {}
func (*noDetector) Wait(Call)                 {}
func (*noDetector) Yield(Call) bool           { return true }
func (*noDetector) Finish(bool)               {}
func (*noDetector) LatestStep() (int64, bool) { return 0, false }
func (*noDetector) HasKnown() bool            { return false }
func (*noDetector) EvenSteps() bool           { return false }

// State is what a step detector shows the step timeline: its pending
// events, its lock and its counters.
type State struct {
	events            []Event
	locked, tentative bool
	Counts
}

// Status returns d itself, for the Detector interface.
func (d *State) Status() *State { return d }

// Locked reports whether the detector holds a cycle.
func (d *State) Locked() bool { return d.locked }

// Tentative reports whether that lock is not confirmed yet.
func (d *State) Tentative() bool { return d.tentative }

// Take returns the pending events and clears them. The slice is reused:
// it is valid until the detector is fed again.
func (d *State) Take() []Event {
	evs := d.events
	d.events = d.events[:0]
	return evs
}

func (d *State) emit(e Event) { d.events = append(d.events, e) }

// Counts are the counters of a detector that go into correlate's
// RankStats; a process keeps those of the detectors it no longer holds.
type Counts struct {
	Irregular uint64 // calls outside a locked cycle
	Relocks   uint64
	InitCalls uint64 // collectives before the first confirmed cycle
}

// Add adds b's counters to a.
func (a *Counts) Add(b Counts) {
	a.Irregular += b.Irregular
	a.Relocks += b.Relocks
	a.InitCalls += b.InitCalls
}

// EventKind says what an Event reports.
type EventKind uint8

// Event kinds.
const (
	Start    EventKind = iota + 1 // a step opens at T
	Boundary                      // the open step closes at T with index Idx; the next opens
	Break                         // the sequence left the cycle: the open step is irregular
	Confirm                       // the tentative lock Gen is confirmed
	Retract                       // the tentative lock Gen is withdrawn with its steps
	Trim                          // the tentative steps of Gen up to its latest init-time one are withdrawn (T: half the median of its latest steps; InitTime)
	Burst                         // Idx boundaries held in the open step were merged into it or dropped with it (pace.go)
)

// Event is one finding of a detector. Gen numbers its locks; a Tentative
// boundary belongs to a lock that may still be withdrawn (Retract, Trim).
type Event struct {
	Kind      EventKind
	Tentative bool
	Gen       uint32
	T         int64
	Idx       int64
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
