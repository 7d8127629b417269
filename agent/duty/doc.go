// Package duty owns the agent's one overhead budget: what device-record
// collection, uprobe traps, the NCCL profiler plugin's operations and the
// injection library's threads cost training, and the duty cycle of device
// collection that keeps the sum within Config.Budget.
//
//   - The ledger (duty.go, Ledger): the cost of full device collection
//     estimated inside the run from paired on/off blocks (a trimmed mean
//     with a t-interval, priced at its upper end), the spend per bucket
//     over a sliding Horizon, and the Plan: the base on-share the budget
//     leaves, the period, and escalations to full collection for a
//     suspicious window when the ledger can pay for them.
//   - Slack (slack.go): the host's lead over the device, step by step, in
//     which uprobe traps delay nothing; only the traps it does not hide
//     are charged (Traps).
//   - Kernel channels (kch.go): the NCCL plugin's kernel-channel events
//     measured apart in alternating on-blocks and kept only while they
//     cost less than Config.KernelChannelLimit (--nccl-kernel-channels).
//
// The pipeline tells the ledger of steps and suspicious windows through
// pipeline.Duty; the agent feeds it the traps and plugin operations it
// counted, asks for a Plan once a second and writes it into the injection
// library's control block. Overhead is what status shows of it.
//
// Concurrency: a Ledger belongs to one goroutine (the agent's main
// goroutine); it is not safe for concurrent use.
//
// Requirements: none. It is pure: event time (CLOCK_MONOTONIC ns) comes in
// with each call, so its tests simulate hours of training in milliseconds.
//
// It imports only detector and internal/stats (depguard in
// .golangci.yml): the agent imports it, never the other way round.
package duty
