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
// or S for the first synchronisation after a collective. The step
// detector (see stepdet/period.go) locks onto the cycle of that sequence:
// the period whose latest run of repetition is longest and covers
// Config.Repeats cycles.
// The cut point is a function of the cycle alone (stepdet's canonStart), so
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
// synchronisations) is resolved by timing (see stepdet/group.go): one instance per
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
// is held (see stepdet/pace.go): a burst of calls inside or after an iteration
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
// alike. Such a communicator's steps come from call timing instead
// (see stepdet/burst.go): the period, counted in calls, is the one at
// which a single long gap (forward pass, optimizer, data loading) dominates the gaps of
// the burst of bucket calls before it; a step is one burst and ends at the
// return of the first synchronisation after its last call (else at that
// call's return). Steps are numbered by call count, so that ranks agree. A
// confirmed lock keeps its count through a host stall at a fixed point of
// the iteration, which makes a second long gap per burst so that none is
// dominated any more. The first call with a size hands the communicator
// to the token detector.
// A communicator holds one of the two detectors at a time, behind one
// interface (stepdet.Detector, package correlate/stepdet); the rules
// are listed, each with its origin and its test, under "Step-detection
// rules" below.
//
// # Step-detection rules
//
// Each rule of step detection, where it lives, the capture or commit that
// made it (testdata/ names a capture of a real or fake run, replayed; a
// hash is the commit that added the rule, whose message gives its
// reasons) and the test that pins it (go test -run NAME ./correlate/...).
// Each named test was seen to fail with its rule's code switched off
// (December 2026, on the move to correlate/stepdet; rules 9, 13, 24, 27,
// 39, 51, 52 and 56 failed none then and got their tests after); a rule
// whose switching off fails no test is marked "unpinned". A new rule comes
// with a capture that fails without it, a test, and a line here.
//
// Token detector (stepdet/period.go):
//
//  1. A collective is the token of its signature (op, count, datatype),
//     the first synchronisation after one is S; the lock is the period
//     whose latest run is longest and covers Repeats cycles (search).
//     150fdc5; TestStepDetection/steady_cycle.
//  2. A departure from the cycle drops the partial iteration (counted
//     IrregularCalls) and a known cycle re-locks after one instance
//     (stepKnown). 150fdc5; TestStepDetection/evaluation_loop_in_between,
//     TestStepDetection/checkpoint_iteration.
//  3. The cut point is a function of the cycle alone (canonStart: the S
//     followed by the most collectives), so every member cuts at the same
//     call whatever its recording saw. 7366630;
//     TestCutPointIndependentOfAttach.
//  4. A fresh lock is tentative for ConfirmCycles more cycles and, for the
//     first, ConfirmSpan: init-time bursts make no steps (InitCalls).
//     7366630; TestInitBurstsMakeNoSteps.
//  5. A first cycle is released early while the buffers are half full.
//     7366630; TestFirstCycleReleased/buffers_half_full.
//  6. A communicator's destruction ends its cycle as an exit does: a
//     tentative lock that held is confirmed (correlator.go). c8aad91;
//     TestCommDestroyedUnderATentativeLockKeepsItsSteps/destroyed.
//  7. Later cycles need PromoteCycles: an evaluation loop shorter than
//     that makes no steps. 150fdc5;
//     TestStepDetection/evaluation_loop_in_between.
//  8. A cycle without synchronisations is accepted after NoSyncMinCalls
//     calls without one (noSyncAllowed). 150fdc5; TestNoSync.
//  9. Or after ConfirmSpan without one (a DDP loop with few buckets).
//     a8d1fcd; TestNoSyncCycleAcceptedAfterConfirmSpan.
//  10. Such a cycle's first instance reaches back over the occasional
//     synchronisations before its region (backOverS: Lightning's first
//     iterations). b955795, testdata/h200-lightning-1rank;
//     TestReplayH200LightningFirstIterationIsAStep.
//  11. A communicator's first step starts at its creation when the cycle
//     starts at its first call, within 1.5 cycles (creationStarts).
//     150fdc5; TestClockTakeover.
//  12. A first lock that starts at a partial instance's end takes the
//     iteration before it (endsPartialInstance: DDP's iteration 0 before
//     its buckets are rebuilt). 293798e;
//     TestExternalLoopShapes/lightning,_buckets_rebuilt_after_iteration_0.
//  13. A communicator's first lock starts at the return of an init-time
//     call right before it (initBefore: the first iteration after DDP's
//     broadcast), which is no stable start for the cut point; it matters
//     for a cycle without synchronisations only (with one, the cut point
//     follows a synchronisation). 99a5a30, 6eb308a;
//     TestFirstLockStartsAfterInitCall.
//  14. Without a communicator clock, a process's synchronisations (keyed by
//     function, not stream) are its clock after syncFallbackMin of them
//     (correlator.go). 150fdc5; TestStepDetection/warm-up_then_lock,
//     TestStepDetection/two_syncs_per_iteration.
//  15. The synchronisation clock's first lock taken after a collective of
//     the process is released only at the end or with half-full buffers
//     (afterColl: torch.compile's autotuning). 67e2581,
//     testdata/h200-compile-1rank;
//     TestReplayH200CompilingIterationMakesNoSteps.
//  16. That first lock, in a process without collectives, passes over one
//     lone call (passLone: a CUDA graph's warm-up). fddd06f,
//     testdata/h200-cudagraph-1rank and -run7-1rank;
//     TestReplayH200CUDAGraphFirstIterationIsAStep.
//  17. Its confirmation (steadyN steps within a factor of two) trims the
//     init-time steps before them: those in no run and shorter than half
//     each of the next run's steps (InitTime, applied by the settling's
//     trimGen). 5f25faa; TestReplayH200CUDAGraphFirstIterationIsAStep,
//     TestBurstsAreNoSteps/speeds_up_3x_after_warm-up.
//  18. ... each of the next run's, not their median. 138fcdf,
//     testdata/trainer-speedup10-loaded-trim-preempted-2ranks;
//     TestReplayTrimUnderPreemptions.
//  19. ... or than half the latest steps only when no run follows.
//     b9dc8e4, testdata/trainer-speedup0.33-loaded-preempted-2ranks;
//     TestReplayTrainerSpeedup/speedup_0.33-loaded-preempted.
//  20. The step after the latest init-time one is init-time too when it is
//     in no run and the next is paceRatio times the lock's pace (the last
//     parameter copy). fddd06f, testdata/h200-fsdp2-1rank;
//     TestReplayH200FSDP2CopiesMakeNoSteps.
//
// Grouping, several instances of a cycle per iteration (stepdet/group.go):
//
//  21. One instance per iteration dominates the others by timing; a step
//     is the m instances that end with it (findGroup). 99a5a30;
//     TestExternalLoopShapes/trainer, TestExternalLoopShapes/megatron.
//  22. The instance at the count ends a step when it dominates its group
//     or lasts half the dominant duration beside a far shorter one
//     (longEnd). 0318242, c25fbbb, testdata/trainer-epilogue-2ranks;
//     TestGroupPhaseKept.
//  23. A phase lost by the count is found again at the count's position
//     once Repeats groups end steps there (keptRun). a8d1fcd, afe88e8,
//     c25fbbb;
//     TestGroupPhaseKeptUnderPreemptions/groups_with_two_delayed_instances_after_stalls,
//     TestReplayTrainerSpeedup/speedup_10-loaded-new-pace-by-count.
//  24. A new pace: a run of groups at one position, the first dominating,
//     lasting twice the lock's recent steps, ends steps and re-learns the
//     dominant duration (newPace). 193796a, 46eb02b,
//     testdata/trainer-speedup10-loaded-2ranks;
//     TestGroupNewPaceAfterLostPhase.
//  25. A group whose one instance a preemption delayed keeps its phase
//     (delayedInGroup). 566e166, 937f398, c2bc28c;
//     TestReplayTrainerSpeedup/speedup_10-loaded-preempted-first-iterations.
//  26. The phase found again carries back over the groups before it that
//     end steps by the count (groupsBefore). 4d38133,
//     testdata/trainer-speedup10-loaded-preempted-walk2/walk3-2ranks;
//     TestGroupPaceChange,
//     TestReplayTrainerSpeedup/speedup_10-loaded-preempted-walk3.
//  27. A candidate step end is confirmed only by a group whose dominant
//     instance lasts half the dominant ones at least (briefAfter: spikes
//     in a logging step). 566e166, 0e82c0e;
//     TestGroupPhaseKeptUnderPreemptions/a_long_spike_followed_by_brief_ones_in_a_logging_step.
//  28. Where the step ends' calls wait for the GPU, an instance whose call
//     waited less than 1/4 of their share is no iteration's end (waited).
//     1caac3e, f6831ae; TestGroupPhaseKeptUnderPreemptions,
//     TestReplayTrainerSpeedup/speedup_10-loaded-spike-brief-wait.
//  29. An end taken as long beside a far shorter instance is none where
//     two other calls of its group waited groupRatio times as long.
//     d52d6af;
//     TestReplayTrainerSpeedup/speedup_10-loaded-logging-after-waits.
//  30. A tentative grouping whose phase is lost ends when its instances
//     are alike and as long as its iterations were (ungroup). 00420c0,
//     testdata/cudagraph-loaded-2ranks.dump;
//     TestReplayCUDAGraphAfterPairedCopies.
//  31. ... measured against a dominant duration that steps of the grouping
//     have held, not the regroup's own instance. 00bfd0d,
//     testdata/reattach-loaded-stalls-keep-one-instance-4ranks;
//     TestGroupStallsKeepOneInstancePerIteration/three_stalls_from_the_second_iteration.
//  32. A grouping that made settledSteps steps gives way only to one that
//     holds settledReps groups. c87623a;
//     TestReplayTrainerSpeedup/speedup_10-loaded-regroup.
//  33. A one-instance lock regroups on stretched instances only after
//     settledReps groups (stalled). aff2f7c;
//     TestGroupStallsKeepOneInstancePerIteration/seven_stalls_at_every_other_iteration.
//  34. A regroup's first step is the first iteration: its walk back goes
//     over every first iteration (firstIteration). f9c4df7,
//     testdata/h200-trainer-1rank;
//     TestReplayH200TrainerLoggingStepKeepsOneStepPerIteration.
//  35. ... and skips a group the confirmation's trim would withdraw
//     (initGroup). 1b232d2;
//     TestReplayTrainerSpeedup/speedup_10-loaded-preempted-first-iterations.
//
// Bursts, boundaries far shorter than the pace (stepdet/pace.go):
//
//  36. On a confirmed lock (or a tentative one after a confirmed cycle) a
//     boundary under 1/8 of the latest steps' median is held: merged into
//     the next step or dropped, counted (BurstSteps), no index used
//     (hold). ae02995, f9c4df7; TestBurstsAreNoSteps,
//     TestBurstIndicesAlikeOnRanks, TestReplayTrainerEpilogue.
//  37. Held boundaries that keep coming for paceRegime boundaries and
//     ConfirmSpan, through up to paceNormal normal steps, are a new pace:
//     reported after all. ae02995, 59d0af7;
//     TestBurstsAreNoSteps/speeds_up_10x_after_warm-up,_logging_steps_of_the_old_length.
//  38. The end of the sequence drops the boundaries of normal length held
//     in a chain with a burst. 3c22b42;
//     TestReplayTrainerEpilogueFirstGroupLate.
//  39. A boundary after held ones is held while the step it would close is
//     shorter than the pace (brief). 783c20a, c54a228,
//     testdata/trainer-epilogue-preempted-{early,long,longer}-2ranks
//     (the next rule holds those captures too);
//     TestBurstGroupDelayedBelowThePaceIsHeld (on a communicator).
//  40. On the synchronisation clock a burst's boundary whose call returned
//     at once is short (noWait). e5da5b2, 62473fb,
//     testdata/trainer-epilogue-loaded-burst-no-wait-2ranks;
//     TestReplayTrainerEpiloguePreempted.
//  41. There a step whose call waited as the ends' do is an iteration
//     however short (waitedAsEnds). e5da5b2;
//     TestReplayTrainerSpeedup/speedup_10-loaded-confirmed-before,
//     TestReplayTrainerSpeedup/speedup_10-loaded-straddles-pace.
//  42. There a boundary of normal length whose call returned at once,
//     before any short one is held, waits for the next (doubt, up to
//     paceNormal). a4b1bea,
//     testdata/trainer-epilogue-loaded-first-group-late-2ranks;
//     TestReplayTrainerEpilogueFirstGroupLate.
//
// Timing detector, collectives without sizes (stepdet/burst.go):
//
//  43. The period is the one at which a single long gap dominates the
//     burst's gaps; a step is one burst, ending at the first
//     synchronisation after its last call. 9cc67f6; TestBurstSteps.
//  44. Steps are numbered by call count, so that ranks agree (numbering).
//     9cc67f6; TestBurstCrossRank.
//  45. The first call with a size hands the communicator to the token
//     detector (Yield). 9cc67f6; TestBurstHandsOverToTokens.
//  46. At the process's exit a burst complete by count is a step (Finish).
//     9cc67f6; TestBurstLastStepOnForget.
//  47. Gaps are the host's own time: the collectives' thread's waits
//     (Work::wait) between two calls are left out (Wait). 699bddd,
//     testdata/gloo-host-stall-end-4ranks; TestReplayGlooWaitsNotInGaps.
//  48. A confirmed lock keeps a burst by its count through a host stall at
//     a fixed point of the iteration (keptByCount). 5c76f7f,
//     testdata/h200-gloo-host-stall-{end,start,start60}-4ranks;
//     TestReplayGlooHostStallKeepsSteps,
//     TestBurstSteps/host_stall_inside_every_burst_from_iteration_10.
//  49. ... unless the long gaps split the burst evenly (splitEvenly).
//     5c76f7f; TestBurstSteps/bucket_count_halves.
//  50. A gap lock's first step reaches back over whole iterations only
//     (reachBack). f620d50; TestBurstLockReachesBackOverWholeIterations,
//     TestBurstLockReachesBackOnlyOverWholeIterations.
//
// The process's clock and step numbering (steps.go):
//
//  51. The clock is the first communicator that locks; one with more ranks
//     takes over (at once while the clock is tentative, else confirmed).
//     150fdc5; TestClockTakenByMoreRanks.
//  52. A communicator whose steps are more than twice as long does not
//     take a confirmed, steady or regular synchronisation clock over
//     (coarser, EvenSteps). 27d96a2, 566e166, 0e8700d (the next rule
//     holds its captures too); TestSyncClockKeptAgainstCoarserCommunicator.
//  53. Nor any when each of its steps holds more than MaxGroup of the
//     clock's (spansIterations). 6ef231a;
//     TestReplayTrainerSpeedup/speedup_10-loaded-irregular-keeps-sync-clock,
//     TestReplayTrainerSpeedup/speedup_10-loaded-irregular-keeps-sync-clock2.
//  54. A locked communicator takes a clock that made no step for
//     PromoteCycles of both their steps (quietClock). eff6766,
//     testdata/split-at-200-4ranks.dump;
//     TestReplayCycleMovesToASplitCommunicator.
//  55. The first step under each clock takes the index of a peer's step
//     that ends within a quarter of a step of it (alignToPeers). 5c2d5f1;
//     TestMidRunAttachAligned, TestCutPointIndependentOfAttach.
//  56. A retract or trim of the aligned step re-arms the alignment; a step
//     that then finds no peer continues after the steps standing. 2323594,
//     a88f6d7, testdata/trainer-2ranks; TestAlignmentRearmedAfterWithdrawal.
//  57. An alignment to a peer's tentative step that its lock withdraws
//     numbers nothing (unanchor, renumber). e5216b4,
//     testdata/trainer-speedup10-loaded-aligned-to-withdrawn-2ranks;
//     TestAlignedToWithdrawnStepTakesOwnCount,
//     TestReplayTrainerSpeedup/speedup_10-loaded-aligned-to-withdrawn.
//  58. A process that reports markers is cut at markers only (Count > 0 is
//     the index; correlator.go). 150fdc5; TestMarker.
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
