// Package correlate turns the raw intervals of unmodified training
// processes into step facts and topology facts (detector.Step,
// detector.Topology): step boundaries, phases, collective arrival order,
// workload fingerprints and communicator groups.
//
// It owns no I/O, clock, goroutine or kernel resource: the agent converts
// decoded BPF events (host calls, communicator creation) and CUPTI records
// (device intervals) into this package's types, feeds them to a
// Correlator and drains facts. Time is event time: CLOCK_MONOTONIC
// nanoseconds carried by the records, moved on by Advance.
//
// # Concurrency
//
// A Correlator is not safe for concurrent use. One goroutine calls the Add
// methods, Advance, Drain, Flush, Forget and Stats.
//
// # Input contract
//
//   - SetRank before a process's events, where possible.
//   - Host calls of one process in the order of their end, as the BPF ring
//     buffer delivers them. The collective sequence number of a
//     communicator is the order of arrival of its calls, which NCCL makes
//     identical on all members; a communicator created before the agent
//     attached gets sequence numbers relative to the attach.
//   - Device records in any order within Config.DeviceReorder of event
//     time after their step ended; duplicates are detected by (correlation
//     id, start).
//   - Coverage marks for every period in which device collection was on;
//     without them every step is gpu:false.
//   - Kernel names: DeviceInterval.Name or Config.KernelName; a NameID
//     must denote one name within its process. Without names, steps carry
//     no fingerprint (fingerprints of per-process ids would not be
//     comparable across ranks).
//
// # Steps
//
// Steps are found without configuration. Each communicator's call
// sequence becomes tokens: a collective signature (op, count, datatype),
// or S for the first synchronisation after a collective. The step detector
// (see period.go) locks onto the cycle of that sequence: the period whose
// latest run of repetition is longest and covers Config.Repeats cycles.
// The cut point is a function of the cycle alone (seqDet.canonStart), so
// that every member of a communicator cuts at the same call whatever its
// recording saw (the creation or not, an init prefix, a late dlopen of
// NCCL, an agent restarted mid-run): a step ends with the return of a
// synchronisation, the one followed by the most collectives (ties: the
// rotation with the largest signatures). Decisions depend only on the
// token sequence, so all members of a communicator cut the same
// iteration alike. A fresh lock is tentative until it holds ConfirmCycles
// more cycles and, for a communicator's first cycle, Config.ConfirmSpan of
// event time: init-time bursts (parameter broadcasts whose sizes repeat
// layer by layer, barrier storms, checkpoint loads) repeat, but briefly,
// and make no steps; their calls are counted (InitCalls). A cycle that
// holds until the process ends, or while the buffers are half full, is
// released earlier; the first cycle of the synchronisation clock (below)
// taken after a collective of the process is released only then (after
// DDP's broadcast, the communicator's cycle is to come; torch.compile's
// autotuning benchmarks in the first iteration repeat for seconds). Later
// cycles need PromoteCycles (evaluation loops and checkpoints shorter than
// that are dropped and counted; boundaries held as a burst, below, do not
// count: a burst of another cycle's calls in an iteration is no new
// cycle); a departure from the cycle drops the partial iteration, and a
// known cycle is re-locked after one instance. The first step starts at the synchronisation before
// it, or at the communicator's creation when the cycle starts at its first
// call (within one and a half cycles of it); else the first instance only
// opens the first step. Each process's step clock is the communicator
// that locked first; one with more ranks takes over (at once while the
// clock is still tentative, else once confirmed), so that as many ranks as
// possible share the numbering; indices stay increasing across a change of
// clock. The first step under each clock takes the index of a peer's step
// of the same job that ends within a quarter of a step of it (the first
// process to close a step numbers it), so that step k is the same
// iteration on every rank of a host whatever each one's call count; a
// peer's tentative step that its lock withdraws numbers nothing (the
// steps aligned to it take their own count while unconfirmed). A
// cycle without synchronisations is accepted after NoSyncMinCalls calls or
// ConfirmSpan of event time without one, and keeps its lock through an
// occasional one (logging every N iterations), and its first instance is
// the earliest that the instances before the search's region reach back
// to with such occasional ones left out (Lightning synchronises in its
// first iterations and every 100th); the first lock of a
// communicator also
// starts at the return of an init-time call right before it (the first
// iteration after DDP's broadcast). Until a communicator is the clock
// (after 64 synchronisations) the synchronisation calls themselves are the
// sequence, keyed by function, not stream; occasional collectives do not
// stop them, and a communicator whose steps are more than twice as long
// does not take a confirmed, steady or regular synchronisation clock over
// (steady: its latest steadyN steps agree within a factor of two; regular:
// its latest regularN but the longest regularOut do, logging steps and
// preemptions), nor any one when each of its steps holds more steps of
// the clock than an iteration holds instances of a cycle (maxGroup: a
// logging step's collective every N iterations; a clock of several
// synchronisations per iteration holds a few and gives way). Its first
// lock is confirmed once steadyN steps agree within a factor of two, and the
// init-time steps before them (one per parameter copied to the GPU) are
// withdrawn: those in no run of steadyN+1 steps agreeing within a factor
// of two that are shorter than half the latest steps or than half each of
// the next run's (the iterations of an old pace stay). A cycle that occurs
// several times per iteration (Megatron's "B S B S", the Trainer's five
// synchronisations) is resolved by timing (see group.go): one instance per
// iteration holds the forward and backward pass and dominates the others;
// a step is the m instances that end with it, from the first iterations
// (each dominating, and half as long as the next one at least). Later
// steps are cut by the count of instances; the instance at the count ends
// a step when it dominates its group or lasts half as long as the
// dominant ones at least (a low quantile of the latest 8: preemptions only
// lengthen) beside a far shorter one of its group, and its closing call
// waited as the step ends' do when those wait for the GPU (a preemption
// of the host between brief calls returns at once). An iteration with
// other calls (a logging step) loses the groups' phase; it is found again
// at the count's position once Repeats consecutive groups end steps there
// (the count of calls per iteration is the cycle: extra calls that are a
// multiple of the group keep it), at an instance half as long as the
// dominant ones at least once the next groups hold, or at a new pace: a run of
// instances at the same position in consecutive groups, the first
// dominating its group, the others ending a step by the count, that lasts
// twice the lock's recent steps (iterations that got shorter, which never
// reach the old dominant duration); all of them end steps. On a confirmed
// lock, or a tentative one after a confirmed cycle, a boundary whose
// own step is shorter than 1/8 of the median of the latest steps reported
// is held (see pace.go): a burst of calls inside or after an iteration
// (the Trainer's end of training) is merged into the next step, or
// dropped with the open step when the lock or the sequence ends, and
// counted (BurstSteps); held boundaries consume no index, so step k stays
// the same iteration on every rank. Held boundaries that keep coming for
// 16 boundaries and ConfirmSpan, through up to 3 steps of normal length
// between them (logging steps), are a new pace (iterations that got
// shorter): they are reported as steps after all. On the
// synchronisation clock, where the steps' ends wait for their GPU work,
// the wait decides before the length: a boundary
// in a burst whose call returned at once is short however long (a
// preemption between the burst's calls), and a step whose call waited for as large a share of it as the ends' do is
// an iteration however short. A process that reports
// HostMarker calls is cut at markers only (HostCall.Count > 0 is the step
// index).
//
// Collectives without sizes (HostCall.Count == 0: the torch c10d probes of
// a gloo job) make a degenerate token sequence, every bucket all-reduce
// alike. Such a communicator's steps come from call timing instead (see
// burst.go): the period, counted in calls, is the one at which a single
// long gap (forward pass, optimizer, data loading) dominates the gaps of
// the burst of bucket calls before it; a step is one burst and ends at the
// return of the first synchronisation after its last call (else at that
// call's return). Steps are numbered by call count, so that ranks agree. A
// confirmed lock keeps its count through a host stall at a fixed point of
// the iteration, which makes a second long gap per burst so that none is
// dominated any more. The first call with a size hands the communicator
// to the token detector.
// A communicator holds one of the two detectors at a time, behind one
// interface (stepDetector, see stepdet.go).
//
// # Phases
//
// Phases follow DESIGN.md section 3, in milliseconds. An interval belongs
// to the step in which it ended and is clipped to that step for the union
// arithmetic. host, sync_wait and coll_wait need the host probes
// (RankInfo.Probes, or inferred from the first such interval); compute,
// comm, exposed_comm, idle, and attention/moe when such kernels ran, need
// the step to lie inside a coverage period with no device records lost.
// A phase that was not measured is absent, never 0.
//
// # Arrival order
//
// For every communicator with at least two members on this host, the host
// start times of the calls with the same sequence number give who arrived
// last (LastArrival: last at most of the step's collectives) and how late
// (ArrivalLagMS: median lag behind the first). Arrivals within
// Config.ArrivalTie are broken by the step's device communication time
// (the last to arrive waits least) when both ranks have it, else they do
// not vote. A step waits for the other local members to issue its
// collectives at most Config.ArrivalWait or ArrivalWaitSteps later steps;
// ranks on other hosts are never waited for (see arrival.go).
//
// # Settling
//
// A closed step is settled in order: host records after
// Config.HostReorder, arrival evidence, then device records (for a step
// inside a coverage period) once the process's device records have passed
// its end by Config.DeviceSlack, or after Config.DeviceReorder. Records for
// a settled step count as late. Drain emits settled steps; Flush settles
// everything.
//
// # Workload fingerprint
//
// FNV-1a based 64-bit hash of the multiset of the step's compute kernels
// (name, grid, block), computed as an order-independent sum of mixed
// per-kernel hashes: equal multisets give equal strings on every rank
// (see fingerprint.go).
//
// # Topology
//
// Communicators come from CommInit: the ncclUniqueId hash identifies a
// communicator on every host; a split's identity is derived from its
// parent's, the split's ordinal on the parent and the color. Group types:
// "world" when nranks equals RankInfo.WorldSize; "pp" for point-to-point
// only; "ep" with all-to-all; "dp" for each rank's largest communicator
// with per-step all-reduce or reduce-scatter traffic unless that is the
// world (pure data parallelism stays "world"); "tp" for other traffic;
// "other" without traffic. Groups list the global ranks of their local
// members (all ranks for "world"); ids ("dp-1a2b3c4d") derive from the
// unique id, so hosts agree on them. The version increases whenever the
// content changes: communicators created, destroyed (AddCommDestroy) or
// rebuilt with a new unique id, processes replaced, types refined. A step
// carries the version in effect when it closed (when that version was
// emitted before the next change, else the current one).
//
// # Bounds
//
// Per process and communicator everything is bounded: token history
// ((Repeats+1)·MaxPeriod; calls without sizes (Repeats+2)·MaxPeriod),
// known cycles (8), signatures (4096, then the detector restarts), record
// buffers (MaxHostRecords, MaxDeviceRecords; overflow marks the affected
// steps), pending steps (MaxPending), arrival slots (1024 sequence numbers
// per communicator).
package correlate
