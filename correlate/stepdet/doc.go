// Package stepdet finds iteration boundaries in a rank's host-call stream:
// fed the collectives, synchronisations and collective waits of one
// communicator (or, for the fallback clock, of one process), a Detector
// reports where steps start and end, which of them are tentative, and
// when a lock is confirmed, withdrawn or trimmed, as Events.
//
// It is separate from correlate because it is the part that changes with
// every new training loop: its rules accrete one per failing capture (the
// catalogue is in correlate/doc.go), and each must be read, changed and
// tested against the others without the settling around it. The seam is
// small on purpose: correlate chooses a strategy per communicator (NewSeq,
// NewBurst, NewSyncClock, NewNone), feeds it Calls through the Detector
// interface, and reads back its Status: the pending events, the lock and
// the counters. Which communicator is a process's clock, step indices
// across ranks, the withdrawal of tentative steps and the phases of a step
// are correlate's (steps.go); InitTime, the rule of which tentative steps
// are init-time, is here because it is a judgement on step durations alone.
//
// Two strategies:
//
//   - the token detector (period.go, group.go, pace.go) locks onto the
//     cycle of the sequence of signatures (op, count, datatype) and
//     synchronisations, and resolves a cycle that occurs several times per
//     iteration by timing (group.go) and holds boundaries far shorter than
//     the recent steps (pace.go);
//   - the timing detector (burst.go) finds the period of collectives that
//     carry no sizes (torch c10d over gloo) from their gaps.
//
// Tests: those that drive a detector alone are here (period_test.go).
// A rule is pinned by what the settling makes of it, so most tests drive
// the whole Correlator and stay in correlate: stepdet_group_test.go,
// stepdet_pace_test.go and stepdet_burst_test.go beside the replays of
// captures (extloops_test.go, gloo_test.go, init_test.go, ...); the rule
// catalogue in correlate/doc.go names the test of each rule.
//
// Decisions depend only on what a detector was fed: every member of a
// communicator, which sees the same sequence, cuts the same iteration
// alike. Everything is bounded by Params (token history, known cycles,
// signatures).
//
// # Concurrency
//
// A Detector is not safe for concurrent use; correlate's single goroutine
// owns it. The package owns no I/O, clock, goroutine or kernel resource,
// and imports no other slowrank package (a depguard rule in .golangci.yml).
package stepdet
