package cupti

// Class is the kind of work a kernel does, decided by the injection library
// from the kernel's name once per distinct name.
//
//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type Class -linecomment
type Class uint8

// Kernel classes (SLOWRANK_CLASS_* in slowrank_abi.h). The line comments
// are the String() names (stringer -linecomment, class_string.go);
// TestEnumNamesMatchHeader ties every enum's names to the header's.
//
//	ClassCommunication  nccl*Kernel*, ncclDevKernel*, nvshmem, custom all-reduce
//	ClassAttention      flash, fmha, sdpa, attention
//	ClassGEMM           gemm, cutlass, cublas, xmma, nvjet
//	ClassMoE            grouped gemm, moe, all-to-all, token permute
//	ClassCopy           copy kernels
const (
	ClassOther         Class = 0 // other
	ClassCommunication Class = 1 // communication
	ClassAttention     Class = 2 // attention
	ClassGEMM          Class = 3 // gemm
	ClassMoE           Class = 4 // moe
	ClassCopy          Class = 5 // copy
)

// ClockSource says how the library put record timestamps on CLOCK_MONOTONIC.
//
//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type ClockSource -linecomment
type ClockSource uint16

// Clock sources (SLOWRANK_CLOCK_*). The line comments are the String()
// names (stringer -linecomment, clocksource_string.go).
const (
	// ClockMonotonicCallback: CUPTI called the library's CLOCK_MONOTONIC
	// timestamp callback; no conversion was needed.
	ClockMonotonicCallback ClockSource = 0 // monotonic_callback
	// ClockCalibrated: CUPTI's own clock plus Header.ClockOffsetNs, measured
	// with a bracket of Header.ClockBracketNs and already applied.
	ClockCalibrated ClockSource = 1 // calibrated
	// ClockUnknown: not calibrated; timestamps are CUPTI's raw clock.
	ClockUnknown ClockSource = 2 // unknown
)

// Reason is why collection was switched on or off.
//
//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type Reason -linecomment
type Reason uint8

// Transition reasons (SLOWRANK_REASON_*). The line comments are the
// String() names (stringer -linecomment, reason_string.go).
//
//	ReasonYield  another CUPTI client started: hands off
//	ReasonLease  the agent's configuration expired (agent hung)
const (
	ReasonDuty       Reason = 0 // duty
	ReasonEscalation Reason = 1 // escalation
	ReasonAttach     Reason = 2 // attach
	ReasonExit       Reason = 3 // exit
	ReasonError      Reason = 4 // error
	ReasonYield      Reason = 5 // yield
	ReasonLease      Reason = 6 // lease
)

// DutyMode selects when the library collects while an agent is attached.
//
//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type DutyMode -linecomment
type DutyMode uint32

// Duty modes (SLOWRANK_DUTY_*). The line comments are the String() names
// (stringer -linecomment, dutymode_string.go).
//
//	DutyOff     never
//	DutyAlways  all the time
//	DutyTime    On of every Period, phase from CLOCK_MONOTONIC + PhaseOffset
//	DutySteps   while step % NSteps < KSteps; the agent writes the step
const (
	DutyOff    DutyMode = 0 // off
	DutyAlways DutyMode = 1 // always
	DutyTime   DutyMode = 2 // time
	DutySteps  DutyMode = 3 // steps
)

// State is the library's state, as published in its control block.
//
//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type State -linecomment
type State uint32

// Library states (SLOWRANK_STATE_*). The line comments are the String()
// names (stringer -linecomment, state_string.go), shown by the agent's
// status and slowrank doctor.
//
//	StateInit         InitializeInjection has not run
//	StateIdle         no agent attached: nothing enabled
//	StateOn           attached, collecting
//	StateOffPhase     attached, duty-cycle off-phase
//	StateUnavailable  libcupti could not be loaded
//	StateRefused      CUPTI refused (another subscriber...); retried on the next attach
//	StateDisabled     SLOWRANK_CUPTI_DISABLE=1
//	StateYielded      another CUPTI client (Kineto, nsys) is active: no CUPTI calls
const (
	StateInit        State = 0 // init
	StateIdle        State = 1 // idle
	StateOn          State = 2 // on
	StateOffPhase    State = 3 // off_phase
	StateUnavailable State = 4 // unavailable
	StateRefused     State = 5 // refused
	StateDisabled    State = 6 // disabled
	StateYielded     State = 7 // yielded
)

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
//
//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type Stat -linecomment
type Stat int

// Counters of a stats record. The line comments are the String() names
// (stringer -linecomment, stat_string.go), which the agent counts as
// cupti_lib_NAME; TestEnumNamesMatchHeader ties them to SLOWRANK_STAT_* and
// SLOWRANK_STAT_COUNT.
//
//	StatRecordsSeen        CUPTI records walked
//	StatKernels            kernel records emitted
//	StatMemcpys            memcpy records emitted
//	StatMemsets            memset records emitted
//	StatUnknownKinds       CUPTI records of kinds not converted
//	StatBadRecords         truncated, or ending before they start (also in LibDropped)
//	StatNames              distinct names interned
//	StatNamesOverflow      kernels whose name did not fit the library's table
//	StatBuffersRequested   buffers CUPTI asked for
//	StatBuffersRefused     requests refused: pool exhausted, CUPTI drops
//	StatBuffersCompleted   buffers CUPTI handed back
//	StatBatches            batches emitted
//	StatBatchBytes         bytes emitted
//	StatFlushes            cuptiActivityFlushAll calls
//	StatEnables            off -> on transitions
//	StatAttaches           semaphore 0 -> non-zero
//	StatCUPTIErrors        CUPTI calls that failed
//	StatOnNs               total ns with collection enabled
//	StatDiscardedDetached  records completed while no agent was attached
//	StatYields             times the library yielded to another CUPTI client
//	StatYieldedNs          total ns yielded
//	StatBuffersOrphaned    buffers CUPTI never handed back (another client took them)
//	StatForeignClock       records dropped: on another client's clock
//	StatLeaseExpired       the agent's configuration outlived its lease
//	StatControlRejected    configurations refused as out of bounds
//	StatReenabled          kinds enabled again after a toggle raced another client
//	StatSetups             callback (re)registrations
//	StatClockConverted     records on another clock (CLOCK_REALTIME, TSC) mapped to CLOCK_MONOTONIC
//	StatHandbacks          another client's buffer callbacks registered again after the library's
//	StatForwarded          another client's buffers completed to the library, passed to its callback
//	StatCallbacksTaken     yields where the library may have replaced another client's callbacks, none given back
//	StatHandbackRejected   callback pairs from the agent refused (not code, or the library's own)
//
// The NCCL profiler plugin's (0 where NCCL never loaded it):
//
//	StatNCCLEvents         startEvent calls
//	StatNCCLColls          NCCL_COLL records queued
//	StatNCCLKernels        NCCL_KERNEL records queued
//	StatNCCLRingFull       records dropped: the in-process ring was full
//	StatNCCLDiscarded      records drained while no agent was attached
//	StatNCCLBadHandles     calls with a handle or context not (or no longer) the plugin's
//	StatNCCLIncomplete     operations whose kernel channels did not all report
//	StatNCCLComms          communicators initialised
//	StatNCCLCommOverflow   communicators not tracked (table full)
//	StatNCCLClockSuspect   kernel records whose GPU end lies after the host saw it
//	StatNCCLUnknownEvents  events of types the plugin does not record
//	StatNCCLAPILost        v5 operations without API times: the CollApi/P2pApi slot was reused first
//	StatNCCLClockClamped   kernel records whose GPU end, within the slack after the host saw it, was clamped
//	StatIncompleteRecords  records without timestamps: a forced flush returned them before their work ran (also in LibDropped)
const (
	StatRecordsSeen       Stat = 0  // records_seen
	StatKernels           Stat = 1  // kernels
	StatMemcpys           Stat = 2  // memcpys
	StatMemsets           Stat = 3  // memsets
	StatUnknownKinds      Stat = 4  // unknown_kinds
	StatBadRecords        Stat = 5  // bad_records
	StatNames             Stat = 6  // names
	StatNamesOverflow     Stat = 7  // names_overflow
	StatBuffersRequested  Stat = 8  // buffers_requested
	StatBuffersRefused    Stat = 9  // buffers_refused
	StatBuffersCompleted  Stat = 10 // buffers_completed
	StatBatches           Stat = 11 // batches
	StatBatchBytes        Stat = 12 // batch_bytes
	StatFlushes           Stat = 13 // flushes
	StatEnables           Stat = 14 // enables
	StatAttaches          Stat = 15 // attaches
	StatCUPTIErrors       Stat = 16 // cupti_errors
	StatOnNs              Stat = 17 // on_ns
	StatDiscardedDetached Stat = 18 // discarded_detached
	StatYields            Stat = 19 // yields
	StatYieldedNs         Stat = 20 // yielded_ns
	StatBuffersOrphaned   Stat = 21 // buffers_orphaned
	StatForeignClock      Stat = 22 // foreign_clock
	StatLeaseExpired      Stat = 23 // lease_expired
	StatControlRejected   Stat = 24 // control_rejected
	StatReenabled         Stat = 25 // reenabled
	StatSetups            Stat = 26 // setups
	StatClockConverted    Stat = 27 // clock_converted
	StatHandbacks         Stat = 28 // handbacks
	StatForwarded         Stat = 29 // forwarded
	StatCallbacksTaken    Stat = 30 // callbacks_taken
	StatHandbackRejected  Stat = 31 // handback_rejected

	StatNCCLEvents        Stat = 32 // nccl_events
	StatNCCLColls         Stat = 33 // nccl_colls
	StatNCCLKernels       Stat = 34 // nccl_kernels
	StatNCCLRingFull      Stat = 35 // nccl_ring_full
	StatNCCLDiscarded     Stat = 36 // nccl_discarded
	StatNCCLBadHandles    Stat = 37 // nccl_bad_handles
	StatNCCLIncomplete    Stat = 38 // nccl_incomplete
	StatNCCLComms         Stat = 39 // nccl_comms
	StatNCCLCommOverflow  Stat = 40 // nccl_comm_overflow
	StatNCCLClockSuspect  Stat = 41 // nccl_clock_suspect
	StatNCCLUnknownEvents Stat = 42 // nccl_unknown_events
	StatNCCLAPILost       Stat = 43 // nccl_api_lost
	StatNCCLClockClamped  Stat = 44 // nccl_clock_clamped

	StatIncompleteRecords Stat = 45 // incomplete_records

	NumStats = numStats // SLOWRANK_STAT_COUNT, the length of Stats.Counters
)
