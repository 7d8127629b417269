package cupti

import "strconv"

// Class is the kind of work a kernel does, decided by the injection library
// from the kernel's name once per distinct name.
type Class uint8

// Kernel classes (SLOWRANK_CLASS_* in slowrank_abi.h).
const (
	ClassOther         Class = 0
	ClassCommunication Class = 1 // nccl*Kernel*, ncclDevKernel*, nvshmem, custom all-reduce
	ClassAttention     Class = 2 // flash, fmha, sdpa, attention
	ClassGEMM          Class = 3 // gemm, cutlass, cublas, xmma, nvjet
	ClassMoE           Class = 4 // grouped gemm, moe, all-to-all, token permute
	ClassCopy          Class = 5 // copy kernels
)

var classNames = [...]string{"other", "communication", "attention", "gemm", "moe", "copy"}

func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return "class(" + strconv.Itoa(int(c)) + ")"
}

// ClockSource says how the library put record timestamps on CLOCK_MONOTONIC.
type ClockSource uint16

// Clock sources (SLOWRANK_CLOCK_*).
const (
	// ClockMonotonicCallback: CUPTI called the library's CLOCK_MONOTONIC
	// timestamp callback; no conversion was needed.
	ClockMonotonicCallback ClockSource = 0
	// ClockCalibrated: CUPTI's own clock plus Header.ClockOffsetNs, measured
	// with a bracket of Header.ClockBracketNs and already applied.
	ClockCalibrated ClockSource = 1
	// ClockUnknown: not calibrated; timestamps are CUPTI's raw clock.
	ClockUnknown ClockSource = 2
)

func (c ClockSource) String() string {
	switch c {
	case ClockMonotonicCallback:
		return "monotonic_callback"
	case ClockCalibrated:
		return "calibrated"
	case ClockUnknown:
		return "unknown"
	}
	return "clock(" + strconv.Itoa(int(c)) + ")"
}

// Reason is why collection was switched on or off.
type Reason uint8

// Transition reasons (SLOWRANK_REASON_*).
const (
	ReasonDuty       Reason = 0
	ReasonEscalation Reason = 1
	ReasonAttach     Reason = 2
	ReasonExit       Reason = 3
	ReasonError      Reason = 4
	ReasonYield      Reason = 5 // another CUPTI client started: hands off
	ReasonLease      Reason = 6 // the agent's configuration expired (agent hung)
)

func (r Reason) String() string {
	switch r {
	case ReasonDuty:
		return "duty"
	case ReasonEscalation:
		return "escalation"
	case ReasonAttach:
		return "attach"
	case ReasonExit:
		return "exit"
	case ReasonError:
		return "error"
	case ReasonYield:
		return "yield"
	case ReasonLease:
		return "lease"
	}
	return "reason(" + strconv.Itoa(int(r)) + ")"
}

// DutyMode selects when the library collects while an agent is attached.
type DutyMode uint32

// Duty modes (SLOWRANK_DUTY_*).
const (
	DutyOff    DutyMode = 0 // never
	DutyAlways DutyMode = 1 // all the time
	DutyTime   DutyMode = 2 // On of every Period, phase from CLOCK_MONOTONIC + PhaseOffset
	DutySteps  DutyMode = 3 // while step % NSteps < KSteps; the agent writes the step
)

func (m DutyMode) String() string {
	switch m {
	case DutyOff:
		return "off"
	case DutyAlways:
		return "always"
	case DutyTime:
		return "time"
	case DutySteps:
		return "steps"
	}
	return "mode(" + strconv.Itoa(int(m)) + ")"
}

// State is the library's state, as published in its control block.
type State uint32

// Library states (SLOWRANK_STATE_*).
const (
	StateInit        State = 0 // InitializeInjection has not run
	StateIdle        State = 1 // no agent attached: nothing enabled
	StateOn          State = 2 // attached, collecting
	StateOffPhase    State = 3 // attached, duty-cycle off-phase
	StateUnavailable State = 4 // libcupti could not be loaded
	StateRefused     State = 5 // CUPTI refused (another subscriber...); retried on the next attach
	StateDisabled    State = 6 // SLOWRANK_CUPTI_DISABLE=1
	StateYielded     State = 7 // another CUPTI client (Kineto, nsys) is active: no CUPTI calls
)

var stateNames = [...]string{"init", "idle", "on", "off_phase", "unavailable", "refused", "disabled", "yielded"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}

// StatusFlags are the library's SLOWRANK_STATUS_* bits.
type StatusFlags uint32

// Status flags.
const (
	StatusCUPTILoaded  StatusFlags = 1 << 0
	StatusCUPTIReady   StatusFlags = 1 << 1
	StatusTSCallback   StatusFlags = 1 << 2
	StatusCalibrated   StatusFlags = 1 << 3
	StatusThreadAlive  StatusFlags = 1 << 4
	StatusForcedAttach StatusFlags = 1 << 5
	StatusLeaseExpired StatusFlags = 1 << 6 // the agent's configuration expired: collection off
	// StatusForeignSubscriber: at attach, another client held CUPTI's
	// subscriber slot (Kineto does from its first session on).
	StatusForeignSubscriber StatusFlags = 1 << 7
	StatusWaiting           StatusFlags = 1 << 8 // attached, waiting for the agent's yield decision
)

// Stat indexes Stats.Counters (SLOWRANK_STAT_*). All counters are cumulative
// since the training process started.
type Stat int

// Counters of a stats record.
const (
	StatRecordsSeen       Stat = 0  // CUPTI records walked
	StatKernels           Stat = 1  // kernel records emitted
	StatMemcpys           Stat = 2  // memcpy records emitted
	StatMemsets           Stat = 3  // memset records emitted
	StatUnknownKinds      Stat = 4  // CUPTI records of kinds not converted
	StatBadRecords        Stat = 5  // truncated or without valid timestamps (also in LibDropped)
	StatNames             Stat = 6  // distinct names interned
	StatNamesOverflow     Stat = 7  // kernels whose name did not fit the library's table
	StatBuffersRequested  Stat = 8  // buffers CUPTI asked for
	StatBuffersRefused    Stat = 9  // requests refused: pool exhausted, CUPTI drops
	StatBuffersCompleted  Stat = 10 // buffers CUPTI handed back
	StatBatches           Stat = 11 // batches emitted
	StatBatchBytes        Stat = 12 // bytes emitted
	StatFlushes           Stat = 13 // cuptiActivityFlushAll calls
	StatEnables           Stat = 14 // off -> on transitions
	StatAttaches          Stat = 15 // semaphore 0 -> non-zero
	StatCUPTIErrors       Stat = 16 // CUPTI calls that failed
	StatOnNs              Stat = 17 // total ns with collection enabled
	StatDiscardedDetached Stat = 18 // records completed while no agent was attached
	StatYields            Stat = 19 // times the library yielded to another CUPTI client
	StatYieldedNs         Stat = 20 // total ns yielded
	StatBuffersOrphaned   Stat = 21 // buffers CUPTI never handed back (another client took them)
	StatForeignClock      Stat = 22 // records dropped: on another client's clock
	StatLeaseExpired      Stat = 23 // the agent's configuration outlived its lease
	StatControlRejected   Stat = 24 // configurations refused as out of bounds
	StatReenabled         Stat = 25 // kinds enabled again after a toggle raced another client
	StatSetups            Stat = 26 // callback (re)registrations
	StatClockConverted    Stat = 27 // records on another clock (CLOCK_REALTIME, TSC) mapped to CLOCK_MONOTONIC
	StatHandbacks         Stat = 28 // another client's buffer callbacks registered again after the library's
	StatForwarded         Stat = 29 // another client's buffers completed to the library, passed to its callback
	StatCallbacksTaken    Stat = 30 // yields where the library may have replaced another client's callbacks, none given back
	StatHandbackRejected  Stat = 31 // callback pairs from the agent refused (not code, or the library's own)
	// The NCCL profiler plugin's (0 where NCCL never loaded it).
	StatNCCLEvents        Stat = 32 // startEvent calls
	StatNCCLColls         Stat = 33 // NCCL_COLL records queued
	StatNCCLKernels       Stat = 34 // NCCL_KERNEL records queued
	StatNCCLRingFull      Stat = 35 // records dropped: the in-process ring was full
	StatNCCLDiscarded     Stat = 36 // records drained while no agent was attached
	StatNCCLBadHandles    Stat = 37 // calls with a handle or context not (or no longer) the plugin's
	StatNCCLIncomplete    Stat = 38 // operations whose kernel channels did not all report
	StatNCCLComms         Stat = 39 // communicators initialised
	StatNCCLCommOverflow  Stat = 40 // communicators not tracked (table full)
	StatNCCLClockSuspect  Stat = 41 // kernel records whose GPU end lies after the host saw it
	StatNCCLUnknownEvents Stat = 42 // events of types the plugin does not record
	StatNCCLAPILost       Stat = 43 // v5 operations without API times: the CollApi/P2pApi slot was reused first
	StatNCCLClockClamped  Stat = 44 // kernel records whose GPU end, within the slack after the host saw it, was clamped
	NumStats                   = numStats
)

var statNames = [...]string{
	"records_seen", "kernels", "memcpys", "memsets", "unknown_kinds", "bad_records", "names",
	"names_overflow", "buffers_requested", "buffers_refused", "buffers_completed", "batches",
	"batch_bytes", "flushes", "enables", "attaches", "cupti_errors", "on_ns", "discarded_detached",
	"yields", "yielded_ns", "buffers_orphaned", "foreign_clock", "lease_expired", "control_rejected",
	"reenabled", "setups", "clock_converted", "handbacks", "forwarded", "callbacks_taken", "handback_rejected",
	"nccl_events", "nccl_colls", "nccl_kernels", "nccl_ring_full", "nccl_discarded", "nccl_bad_handles",
	"nccl_incomplete", "nccl_comms", "nccl_comm_overflow", "nccl_clock_suspect", "nccl_unknown_events",
	"nccl_api_lost", "nccl_clock_clamped",
}

func (s Stat) String() string {
	if s >= 0 && int(s) < len(statNames) {
		return statNames[s]
	}
	return "stat(" + strconv.Itoa(int(s)) + ")"
}
