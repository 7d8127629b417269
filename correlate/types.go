package correlate

import (
	"time"

	"github.com/slowrank/slowrank/correlate/stepdet"
	"github.com/slowrank/slowrank/detector"
)

// HostKind says what a host interval is.
type HostKind uint8

// Host interval kinds.
const (
	// HostCollective is a (non-blocking) NCCL collective or point-to-point
	// call: ncclAllReduce, ncclAllGather, ncclSend, ... It feeds the step
	// detector and the arrival order; its duration is not a phase.
	HostCollective HostKind = iota + 1
	// HostSyncWait is a host thread blocked in a device synchronisation
	// (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize).
	HostSyncWait
	// HostCollWait is a host thread blocked waiting for a collective
	// (torch c10d with gloo: Work::wait, or the c10::ivalue::Future::wait
	// of DDP's reducer). With Op set it is also a collective of the step
	// detector and the arrival order.
	HostCollWait
	// HostGroupStart and HostGroupEnd are ncclGroupStart/ncclGroupEnd.
	// They are counted and otherwise ignored.
	HostGroupStart
	HostGroupEnd
	// HostMarker is a call of a configured per-step marker symbol. Once a
	// process reports a marker its steps are cut at markers only.
	HostMarker
)

// HostCall is one host interval of one thread: a uprobe entry/return pair.
type HostCall struct {
	PID, TID uint32
	Kind     HostKind
	// Op is the collective (OpAllReduce, ...) or, for a synchronisation,
	// the function (Op("cudaStreamSynchronize")).
	Op Op
	// Count is the number of elements; 0 when the probe sees no size
	// (torch c10d): such a communicator's steps come from call timing.
	Count    uint64
	Datatype uint32 // ncclDataType_t
	// Comm is the communicator handle in the process (ncclComm_t). Zero
	// for c10d calls whose group is unknown: they form one default group
	// per job.
	Comm   uint64
	Stream uint64 // cudaStream_t
	// StartNS and EndNS are CLOCK_MONOTONIC. For HostMarker, Count > 0 is
	// taken as the explicit index of the step that the marker ends.
	StartNS, EndNS int64
	// NCCLSeq is NCCL's sequence number of the call on its communicator
	// and function, set (HasNCCLSeq) on the NCCL profiler plugin's path:
	// the key by which the call's CollKernel names it.
	NCCLSeq    uint64 `json:",omitempty"`
	HasNCCLSeq bool   `json:",omitempty"`
}

// stepCall is what step detection sees of h.
func (h *HostCall) stepCall() stepdet.Call {
	return stepdet.Call{TID: h.TID, Op: string(h.Op), Count: h.Count, Datatype: h.Datatype, StartNS: h.StartNS, EndNS: h.EndNS}
}

// CollKernel is the GPU interval of one NCCL collective's kernel as NCCL's
// profiler plugin reports it (its kernel-channel events, on the host's
// CLOCK_MONOTONIC): when the process's GPU reached the collective. It names
// its call by (Comm, Op, NCCLSeq), those of the call's HostCall, which may
// come before or after it.
type CollKernel struct {
	PID     uint32
	Comm    uint64
	Op      Op
	NCCLSeq uint64
	StartNS int64
	EndNS   int64 // 0 when no channel reported its end
}

// CommInit is an NCCL communicator creation (ncclCommInitRank*,
// ncclCommSplit) seen in one process.
type CommInit struct {
	PID    uint32
	Comm   uint64 // the new handle; 0 when a split returned no communicator
	NRanks int    // 0 when unknown (or above MaxRanks)
	Rank   int    // rank in the communicator
	// UniqueIDHash is a hash of the ncclUniqueId shared by all members.
	// Zero for ncclCommSplit: the identity is then derived from the
	// parent's identity, the split's ordinal on the parent and Color.
	UniqueIDHash uint64
	Parent       uint64 // parent handle for ncclCommSplit
	Color, Key   int
	AtNS         int64
}

// CommDestroy is ncclCommDestroy/ncclCommAbort in one process.
type CommDestroy struct {
	PID  uint32
	Comm uint64
	AtNS int64
}

// DeviceKind is the CUPTI activity kind of a device interval.
type DeviceKind uint8

// Device interval kinds.
const (
	DeviceKernel DeviceKind = iota
	DeviceMemcpy
	DeviceMemset
)

// KernelClass is the classification of a kernel by the injection library.
type KernelClass uint8

// Kernel classes.
const (
	ClassOther KernelClass = iota
	ClassComm              // NCCL and other communication kernels
	ClassAttention
	ClassGEMM
	ClassMoE // grouped GEMM, routing, permutation
	ClassCopy
)

// DeviceInterval is one CUPTI activity record, on the host's
// CLOCK_MONOTONIC timeline.
type DeviceInterval struct {
	PID            uint32
	Kind           DeviceKind
	Class          KernelClass
	StartNS, EndNS int64
	Device, Stream uint32
	// NameID is the per-process kernel name id; Name, when set, is the
	// kernel name itself. The workload fingerprint hashes names, so that it
	// is comparable across processes: Name is used when set, otherwise
	// Config.KernelName(PID, NameID).
	NameID      uint32
	Name        string
	Grid, Block [3]uint32
	Corr        uint32 // CUPTI correlation id
}

// Coverage says that device collection of a process was on from StartNS to
// EndNS. EndNS == 0 leaves the period open; a later Coverage with the same
// StartNS closes it.
type Coverage struct {
	PID            uint32
	StartNS, EndNS int64
}

// Drop reports records lost by capture (ring buffer or CUPTI buffer full)
// between FromNS and ToNS. PID 0 applies to every process.
type Drop struct {
	PID          uint32
	Host, Device uint64
	FromNS, ToNS int64
}

// Probes says which host measurements are attached for a process.
type Probes uint8

// Probe flags. A zero Probes means "infer": a measurement counts as
// attached once the process has reported one such interval.
const (
	ProbeSync Probes = 1 << iota
	ProbeCollWait
)

// MaxRanks is the largest world or communicator size believed (the
// detector's default bound on a job's ranks). Sizes come from a process's
// environment and its NCCL calls, which any local user controls: a bigger
// one is treated as unknown (counted as ImplausibleSizes), so that a
// "world" group never lists billions of ranks.
const MaxRanks = 1 << 17

// RankInfo is the identity of the training process PID.
type RankInfo struct {
	PID       uint32
	Rank      int
	LocalRank int
	WorldSize int // 0 when unknown (or above MaxRanks)
	Host      string
	Job       string
	Epoch     int
	Probes    Probes
	// MidRun: the process ran before the agent attached, so its
	// communicators may have been created and its collective sequence
	// begun unseen. Informational: steps are cut at a point of the cycle
	// that does not depend on what was seen (stepdet's seqDet.canonStart) and
	// numbered like a peer's step that ends at the same time
	// (alignToPeers) in any case.
	MidRun bool
	// Placement is where the process runs as the cluster names it (pod,
	// container, Slurm step, GPU); it goes into the topology unchanged. A
	// RankInfo sent again with a new Placement makes a new topology version.
	Placement detector.Placement
}

// Config tunes a Correlator. The zero value is usable; zero fields take the
// defaults given in brackets.
type Config struct {
	// Host names the host in facts of ranks whose RankInfo has none.
	Host string
	// Repeats is how many consecutive repetitions of a collective cycle
	// lock the step detector onto it [3].
	Repeats int
	// MaxPeriod is the longest cycle, in calls per communicator, that is
	// searched [2048].
	MaxPeriod int
	// ConfirmCycles is how many further cycles a communicator's first lock
	// must hold before its steps are released [2].
	ConfirmCycles int
	// PromoteCycles is how many further cycles a new cycle must hold on a
	// communicator that already has one before its steps are released;
	// shorter excursions (evaluation loops, checkpoints) are dropped [16].
	PromoteCycles int
	// ConfirmSpan is how long, in event time, a communicator's first
	// cycle must also have held before its steps are released, so that
	// init-time bursts (parameter broadcasts, barrier storms, checkpoint
	// loads: periodic but brief, followed by the training cycle) make no
	// steps. A cycle that holds until the process ends, or while the
	// buffers are half full, is released earlier [2s].
	ConfirmSpan time.Duration
	// NoSyncMinCalls: a cycle without any synchronisation is accepted only
	// after this many collective calls without one [1024].
	NoSyncMinCalls int
	// HostReorder is how long after a step's end host records may still
	// arrive [100ms].
	HostReorder time.Duration
	// DeviceReorder is how long after a step's end device records may
	// still arrive; later ones count as late [3s]. A covered step is
	// settled earlier once the process's device records have reached
	// DeviceSlack past its end (CUPTI delivers records in completion
	// order per buffer) [50ms].
	DeviceReorder time.Duration
	DeviceSlack   time.Duration
	// ArrivalWait bounds how long a step waits for the other local members
	// of its communicators [1s]; ArrivalWaitSteps bounds it in later
	// steps of the same rank [2].
	ArrivalWait      time.Duration
	ArrivalWaitSteps int
	// ArrivalTie: host arrivals closer than this are a tie, broken by
	// device communication time when known [20µs].
	ArrivalTie time.Duration
	// DeviceArrivalTie: kernel starts of one collective closer than this
	// are a tie, broken by the kernels' durations [50µs: the plugin's GPU
	// clock agrees with CUPTI's to within 10 µs at p99 on the H200, and
	// each process converts its GPU's clock on its own].
	DeviceArrivalTie time.Duration
	// MaxHostRecords and MaxDeviceRecords bound the per-process buffers of
	// records not yet assigned to an emitted step [16384, 131072].
	MaxHostRecords   int
	MaxDeviceRecords int
	// MaxPending bounds the per-process steps awaiting emission [4096].
	MaxPending int
	// KernelName resolves a per-process kernel name id; nil when names
	// come in DeviceInterval.Name or not at all (then no fingerprint).
	KernelName func(pid, nameID uint32) string
}

func (c Config) withDefaults() Config {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Repeats, 3)
	if c.Repeats < 2 {
		c.Repeats = 2
	}
	def(&c.MaxPeriod, 2048)
	def(&c.ConfirmCycles, 2)
	def(&c.PromoteCycles, 16)
	def(&c.NoSyncMinCalls, 1024)
	defD(&c.ConfirmSpan, 2*time.Second)
	defD(&c.HostReorder, 100*time.Millisecond)
	defD(&c.DeviceReorder, 3*time.Second)
	defD(&c.DeviceSlack, 50*time.Millisecond)
	defD(&c.ArrivalWait, time.Second)
	def(&c.ArrivalWaitSteps, 2)
	defD(&c.ArrivalTie, 20*time.Microsecond)
	defD(&c.DeviceArrivalTie, 50*time.Microsecond)
	def(&c.MaxHostRecords, 1<<14)
	def(&c.MaxDeviceRecords, 1<<17)
	def(&c.MaxPending, 4096)
	if c.MaxPending < c.PromoteCycles+c.Repeats+4 {
		c.MaxPending = c.PromoteCycles + c.Repeats + 4
	}
	return c
}

// RankStats are the counters of one rank (all its processes so far).
type RankStats struct {
	Job  string
	Rank int // -1 for processes without RankInfo
	PID  uint32

	HostCalls     uint64 // host intervals received
	DeviceRecords uint64 // device intervals received
	Steps         uint64 // step facts emitted

	Late      uint64 // records after their step was settled (or beyond the buffers)
	Duplicate uint64 // device records seen before (same corr id and start)
	Reordered uint64 // records that arrived out of order and were placed correctly

	DroppedHost   uint64 // host records lost by capture (Drop)
	DroppedDevice uint64 // device records lost by capture (Drop)

	IrregularCalls uint64 // collective calls outside a locked cycle
	Retracted      uint64 // tentative steps withdrawn (short excursions, false locks)
	BurstSteps     uint64 // boundaries of bursts far shorter than the steps (pace.go), merged into the next step or dropped with the open one
	Relocks        uint64 // locks regained on a known cycle
	InitCalls      uint64 // collectives before a communicator's first confirmed cycle (init, warm-up): no steps
	Unassigned     uint64 // records that fell outside every step
	Evicted        uint64 // records or steps pushed out of full buffers

	InvalidSteps   uint64 // steps not emitted because host records were lost
	DegradedSteps  uint64 // covered steps emitted gpu:false because device records were lost
	NoRankSteps    uint64 // steps dropped because the process had no RankInfo
	ArrivalTimeout uint64 // steps emitted before every local peer reported

	KernelRecords        uint64 // CollKernels received
	KernelsUnmatched     uint64 // CollKernels whose call never came (or left the key ring first)
	DeviceArrivalTimeout uint64 // steps emitted before every local peer's kernel records came
	ArrivalRealigned     uint64 // calls that took a peer's ordinal for the same NCCL call (one capture had counted a call the other did not)
	ArrivalMisaligned    uint64 // calls NCCL names differently from a peer's call of the same ordinal: that row is not compared

	ImplausibleSizes uint64 // world or communicator sizes above MaxRanks, treated as unknown
}
