package detector

// The types in this file are the public JSONL contracts of DESIGN.md section 5.
// Fields may be added; existing names and meanings must not change.

// Fact kinds as they appear in the "kind" field of a JSONL line.
const (
	KindTopology = "topology"
	KindStep     = "step"
	KindVerdict  = "verdict"
	KindSummary  = "summary"
)

// Phase names of DESIGN.md section 3.
const (
	PhaseStep        = "step"
	PhaseCompute     = "compute"
	PhaseHost        = "host"
	PhaseSyncWait    = "sync_wait"
	PhaseComm        = "comm"
	PhaseExposedComm = "exposed_comm"
	PhaseCollWait    = "coll_wait"
	PhaseIdle        = "idle"
	PhaseAttention   = "attention"
	PhaseMoE         = "moe"
)

// PhaseNames returns every phase name above, in DESIGN.md's order: the
// vocabulary of step facts and of the phases a Config may evaluate.
func PhaseNames() []string {
	return []string{PhaseStep, PhaseCompute, PhaseHost, PhaseSyncWait, PhaseComm, PhaseExposedComm,
		PhaseCollWait, PhaseIdle, PhaseAttention, PhaseMoE}
}

// Hints attached to verdicts. They are diagnostic hints, never a root-cause claim.
const (
	HintGPUStreamStall = "gpu_stream_stall"
	HintHostOnlyStall  = "host_only_stall"
)

// States of the per (rank, phase) state machine as written in verdicts.
const (
	StateOK        = "ok"
	StateCandidate = "candidate"
	StateStraggler = "straggler"
	StateRecovered = "recovered"
	StateUncertain = "uncertain"
)

// Topology describes the ranks of a job and the communicator groups they form.
// A newer Version supersedes older ones for step facts tagged with it.
type Topology struct {
	Kind    string     `json:"kind"`
	Job     string     `json:"job"`
	Version int        `json:"version"`
	Ranks   []RankInfo `json:"ranks,omitempty"`
	Groups  []Group    `json:"groups,omitempty"`
}

// RankInfo identifies where a rank runs.
type RankInfo struct {
	Rank      int    `json:"rank"`
	Host      string `json:"host,omitempty"`
	LocalRank int    `json:"local_rank"`
	PID       int    `json:"pid,omitempty"`
	// Placement is an extension (optional): its fields sit flat in the
	// rank's JSON object next to the ones above, and are absent when unknown.
	Placement
}

// Placement names where a rank runs as the cluster names it, so that the
// rank's spans and metrics can be joined with what Kubernetes, Slurm and
// dcgm-exporter report. Every field is optional ("" or zero when not known);
// the struct stays comparable, so that topologies compare with ==.
type Placement struct {
	// K8s is the rank's pod: the UID from the process's cgroup, the names
	// from its downward-API environment.
	K8s K8sPod `json:"k8s,omitzero"`
	// ContainerID is the runtime's container id (64 hex digits) from the
	// process's cgroup.
	ContainerID string `json:"container_id,omitempty"`
	// Slurm is the rank's Slurm job and step (SLURM_JOB_ID, SLURM_STEP_ID).
	Slurm SlurmStep `json:"slurm,omitzero"`
	// GPU is the GPU the rank trains on, as NVML reports it.
	GPU RankGPU `json:"gpu,omitzero"`
}

// K8sPod names a rank's pod and container.
type K8sPod struct {
	PodName       string `json:"pod_name,omitempty"`
	PodUID        string `json:"pod_uid,omitempty"`
	Namespace     string `json:"namespace,omitempty"`
	ContainerName string `json:"container_name,omitempty"`
}

// SlurmStep names a rank's Slurm job step.
type SlurmStep struct {
	JobID  string `json:"job_id,omitempty"`
	StepID string `json:"step_id,omitempty"`
}

// RankGPU is the GPU that NVML shows the rank's process holding its
// context on. UUID "" means not known (no NVML, no context yet, or the
// process is on several GPUs that NVML cannot tell apart); Index is then 0.
type RankGPU struct {
	// Index is the NVML index (PCI bus order, not CUDA_VISIBLE_DEVICES):
	// dcgm-exporter's "gpu" label.
	Index int `json:"index"`
	// UUID is "GPU-..." (dcgm-exporter's "UUID" label).
	UUID string `json:"uuid,omitempty"`
	// PCIBusID is NVML's bus id, e.g. "00000000:3B:00.0" (dcgm-exporter's
	// "pci_bus_id" label).
	PCIBusID string `json:"pci_bus_id,omitempty"`
}

// Group is one communicator group. Type is "dp", "tp", "pp", "ep", "world" or
// any other label; the detector builds cohorts from groups of its configured type.
type Group struct {
	ID    string `json:"id"`
	Type  string `json:"type"`
	Ranks []int  `json:"ranks"`
}

// Step is the fact of one training step of one rank. Phase values are
// milliseconds; a phase that was not measured is absent from Phases, never 0.
type Step struct {
	Kind     string             `json:"kind"`
	Job      string             `json:"job"`
	Topo     int                `json:"topo,omitempty"`
	Rank     int                `json:"rank"`
	Step     int64              `json:"step"`
	Host     string             `json:"host,omitempty"`
	StartNS  int64              `json:"start_ns"`
	EndNS    int64              `json:"end_ns"`
	Phases   map[string]float64 `json:"phases"`
	GPU      bool               `json:"gpu"`
	Workload *Workload          `json:"workload,omitempty"`

	// Extensions (not in the original contract; all optional).

	// Epoch is the agent's attach epoch: it grows when an agent re-attaches
	// to a running process, so that restarts never double-count a step.
	Epoch int `json:"epoch,omitempty"`
	// LastArrival is true when this rank was the last to arrive at the
	// majority of the step's collectives (culprit evidence).
	LastArrival *bool `json:"last_arrival,omitempty"`
	// ArrivalLagMS is how long after the first rank this rank arrived at the
	// step's collectives, median over the step's collectives.
	ArrivalLagMS *float64 `json:"arrival_lag_ms,omitempty"`
	// DeviceLastArrival is true when this rank's GPU was the last of the
	// ranks on its host to start the kernels of the majority of the step's
	// collectives (NCCL's profiler plugin times them): who the others
	// waited for, where LastArrival says who enqueued last.
	DeviceLastArrival *bool `json:"device_last_arrival,omitempty"`
	// DeviceArrivalLagMS is how long after the first rank on its host this
	// rank's kernels started, median over the step's collectives.
	DeviceArrivalLagMS *float64 `json:"device_arrival_lag_ms,omitempty"`
	// DeviceCollMS is the GPU time of the step's collectives, their
	// kernels' durations summed, when every one was timed. A collective
	// ends at about the same time on all its ranks, so the rank that
	// reached it last spends the least time in it: the detector compares
	// it across ranks and hosts without comparing their clocks.
	DeviceCollMS *float64 `json:"device_coll_ms,omitempty"`
}

// Workload is the evidence that two steps did comparable work: equal
// fingerprints are comparable, and token counts within a tolerance are.
type Workload struct {
	FP     string `json:"fp,omitempty"`
	Tokens int64  `json:"tokens,omitempty"`
}

// Verdict is the detector's judgement of one (window, rank, phase).
type Verdict struct {
	Kind          string  `json:"kind"`
	Job           string  `json:"job"`
	Window        int64   `json:"window"`
	WindowStartNS int64   `json:"window_start_ns"`
	WindowEndNS   int64   `json:"window_end_ns"`
	Rank          int     `json:"rank"`
	State         string  `json:"state"`
	Phase         string  `json:"phase"`
	Hint          string  `json:"hint"`
	ValueMS       float64 `json:"value_ms"`
	ReferenceMS   float64 `json:"reference_ms"`
	ReferenceRank int     `json:"reference_rank"`
	Deviation     float64 `json:"deviation"`
	// ComparableRanks lists at most MaxListedComparable ranks, lowest first;
	// ComparableCount is the full number.
	ComparableRanks          []int   `json:"comparable_ranks"`
	Consecutive              int     `json:"consecutive"`
	Coverage                 float64 `json:"coverage"`
	WorkloadEvidenceDegraded bool    `json:"workload_evidence_degraded"`
	Reason                   string  `json:"reason"`

	// Extensions.
	AlertActive     bool   `json:"alert_active,omitempty"`
	ComparableCount int    `json:"comparable_count"`
	Cohort          string `json:"cohort,omitempty"`
	Topo            int    `json:"topo,omitempty"`
	// SinceWindow is the first window of the current slow streak (set for
	// candidate and straggler states).
	SinceWindow *int64 `json:"since_window,omitempty"`
	// LastArrivalShare is the share of the rank's steps in the window in
	// which it arrived last at the collectives, when that evidence exists.
	LastArrivalShare *float64 `json:"last_arrival_share,omitempty"`
	// DeviceLastArrivalShare is the share of the rank's steps in the
	// window in which its GPU was the last of its host's ranks to start
	// the collectives' kernels (Step.DeviceLastArrival), when known.
	DeviceLastArrivalShare *float64 `json:"device_last_arrival_share,omitempty"`
	// DeviceCollMS is the rank's median Step.DeviceCollMS in the window
	// and DeviceCollPeerMS the median of its cohort's other ranks' medians,
	// when it and at least one other rank report it: a rank whose
	// collectives take clearly less GPU time than its peers' is the one
	// they waited for, on any host, with no clock compared.
	DeviceCollMS     *float64 `json:"device_coll_ms,omitempty"`
	DeviceCollPeerMS *float64 `json:"device_coll_peer_ms,omitempty"`
	// GPU is what NVML saw on the rank's GPU during the window: evidence to
	// read next to the verdict, never a root-cause claim. Absent without NVML.
	GPU *GPUEvidence `json:"gpu_evidence,omitempty"`
	// Exposure says whether the excess over the reference lengthened a step,
	// and on what evidence (DESIGN.md section 4). Present on verdicts of a
	// gated phase (host) in windows that the seed's rule alone finds slow.
	Exposure *Exposure `json:"exposure,omitempty"`
}

// Evidence that decides whether a deviation is exposed (Exposure.Evidence).
const (
	// EvidenceIdle: the rank's GPU idle time against its peers' (device records).
	EvidenceIdle = "idle"
	// EvidenceVictimWait: the peers' waits in blocking collectives against the rank's.
	EvidenceVictimWait = "victim_wait"
	// EvidenceSlack: the rank blocked less than the floor per step (its GPU
	// and its peers were done before its host) while its peers waited.
	EvidenceSlack = "slack"
	// EvidenceStepTime: the job's step time against its own recent past,
	// attributed by the rank's host time against its own past.
	EvidenceStepTime = "step_time"
	// EvidenceCarried: direct evidence (idle, slack) of one of the last
	// Config.CarryWindows windows, standing for the same deviation in a
	// window that has none (device records come in on-phases).
	EvidenceCarried = "carried"
	// EvidenceNone: nothing tells; the verdict is uncertain.
	EvidenceNone = "none"
)

// Exposure is the evidence of whether a slow window's excess over the
// reference lengthened a step. Only the exposed part of the excess is held
// against the threshold and the floor; when all of it is exposed the rule is
// the seed's.
type Exposure struct {
	// Evidence is the evidence that decided: EvidenceIdle, EvidenceSlack,
	// EvidenceVictimWait, EvidenceStepTime, EvidenceCarried or EvidenceNone.
	Evidence string `json:"evidence"`
	// Exposed is true when the exposed part passes the threshold and floor.
	Exposed bool `json:"exposed"`
	// ExcessMS is value_ms - reference_ms; ExposedMS the part of it that the
	// evidence shows to lengthen a step (0 with EvidenceNone).
	ExcessMS  float64 `json:"excess_ms"`
	ExposedMS float64 `json:"exposed_ms"`
	// What was looked at (absent when not measured): the rank's and its
	// peers' median GPU idle and blocking-collective wait, and the rank's
	// median step time against the median of its recent clean windows.
	IdleMS         *float64 `json:"idle_ms,omitempty"`
	PeerIdleMS     *float64 `json:"peer_idle_ms,omitempty"`
	CollWaitMS     *float64 `json:"coll_wait_ms,omitempty"`
	PeerCollWaitMS *float64 `json:"peer_coll_wait_ms,omitempty"`
	// WaitMS and PeerWaitMS: the rank's and its peers' median time blocked
	// per step (sync_wait + coll_wait), the slack evidence.
	WaitMS          *float64 `json:"wait_ms,omitempty"`
	PeerWaitMS      *float64 `json:"peer_wait_ms,omitempty"`
	StepMS          *float64 `json:"step_ms,omitempty"`
	BaselineStepMS  *float64 `json:"baseline_step_ms,omitempty"`
	BaselineWindows int      `json:"baseline_windows"`
	// The job's step time against its recent past, which bounds what the
	// peers' collective waits show and is the step_time evidence: the ranks
	// of a synchronous job share one step time, so each cohort rank with a
	// baseline measures the same rise. StepRiseMS is the median over them of
	// step - baseline, StepRiseBaselineMS the median of their baselines,
	// StepRiseRanks their number (all absent before any rank has one).
	StepRiseMS         *float64 `json:"step_rise_ms,omitempty"`
	StepRiseBaselineMS *float64 `json:"step_rise_baseline_ms,omitempty"`
	StepRiseRanks      int      `json:"step_rise_ranks,omitempty"`
	// HostRiseMS is how much more the rank's host time rose above its own
	// baseline than its peers' median rise above theirs: the part of the
	// job's step rise that its host can account for (absent before it has a
	// baseline of host times).
	HostRiseMS *float64 `json:"host_rise_ms,omitempty"`
	// CarriedFrom and CarriedWindow name the direct evidence that a carried
	// judgement stands for, and the window it was measured in.
	CarriedFrom   string `json:"carried_from,omitempty"`
	CarriedWindow *int64 `json:"carried_window,omitempty"`
	// WeakBaseline is true when the step-time baseline was learned in
	// windows whose deviations lacked evidence: it shows a rise, but cannot
	// show a deviation hidden.
	WeakBaseline bool `json:"weak_baseline,omitempty"`
	// Capped is true when the job's step rise held the victim_wait evidence
	// below what the peers' waits alone showed (a rise within the threshold
	// of the baseline counts as none).
	Capped bool `json:"capped,omitempty"`
}

// GPUEvidence summarises NVML samples of one GPU over one window.
type GPUEvidence struct {
	Index           int      `json:"index"`
	UUID            string   `json:"uuid"`
	Samples         int      `json:"samples"`
	SMClockMinMHz   uint32   `json:"sm_clock_min_mhz"`
	SMClockMaxMHz   uint32   `json:"sm_clock_max_mhz"`
	SMClockLimitMHz uint32   `json:"sm_clock_limit_mhz,omitempty"`
	PowerMaxW       float64  `json:"power_max_w"`
	TempMaxC        uint32   `json:"temperature_max_c"`
	ThrottleReasons []string `json:"throttle_reasons,omitempty"`
	// ECCUncorrected and PCIeReplays are the increases of the volatile
	// uncorrected ECC error count and of the PCIe replay counter.
	ECCUncorrected uint64 `json:"ecc_uncorrected_delta"`
	PCIeReplays    uint64 `json:"pcie_replay_delta"`
}

// Summary closes a replay (and an agent's verdict stream on stop).
type Summary struct {
	Kind       string `json:"kind"`
	Job        string `json:"job"`
	Stragglers []int  `json:"stragglers"`
	// WorstRank is the rank most in need of attention: an active straggler
	// always ranks above a candidate, which ranks above an uncertain one.
	WorstRank      *int     `json:"worst_rank"`
	WorstPhase     string   `json:"worst_phase,omitempty"`
	WorstState     string   `json:"worst_state,omitempty"`
	WorstDeviation *float64 `json:"worst_deviation,omitempty"`
	Windows        int64    `json:"windows"`
	Facts          int64    `json:"facts"`
	Verdicts       int64    `json:"verdicts"`
	Alerts         int64    `json:"alerts"`
	Late           int64    `json:"late"`
	Duplicates     int64    `json:"duplicates"`
	Evicted        int64    `json:"evicted"`
	RejectedRanks  int64    `json:"rejected_ranks"`
	// HiddenDeviations counts (window, rank, phase) deviations that the
	// seed's rule alone calls slow but that exposure evidence showed did not
	// lengthen a step (not emitted as verdicts unless EmitOK).
	HiddenDeviations int64 `json:"hidden_deviations,omitempty"`
	InvalidLines     int64 `json:"invalid_lines,omitempty"`
	UnknownKinds     int64 `json:"unknown_kinds,omitempty"`
}

// Sink receives a detector's results as the agent's pipeline and the
// aggregator hand them on, in order, from one goroutine: a step's Step
// call precedes the Settled call of its window. A Sink must not block for
// long (it owns its own bounded queue). The export side's JSONL and OTLP
// sinks implement it; the agent (agent/pipeline) and the aggregator
// (aggregate) both take it.
type Sink interface {
	Topology(Topology)
	Step(s Step, window int64)
	Settled(w SettledWindow, verdicts []Verdict)
}
