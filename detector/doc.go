// Package detector owns slowrank's verdicts: it turns per-rank step facts into
// straggler verdicts with the semantics of DESIGN.md section 4.
//
// For every job it assigns step facts to windows of event time by their end
// (window = floor((end_ns - t0) / window)), builds cohorts from topology
// (communicator groups of the configured type, default "dp"; the whole job
// when there is no topology), and, per window and phase, compares each rank's
// median with the median of the fastest comparable member of its cohort.
// Comparable means the same workload fingerprint or token counts within a
// tolerance; without workload evidence the comparison falls back to the
// cohort and is marked degraded. A window is slow when the deviation reaches
// the relative threshold and the absolute difference reaches the floor; for
// host, with Config.Exposure, only the part of the difference that evidence
// shows to lengthen a step counts: the rank's GPU idle time against its
// peers'; its own slack (it blocked under the floor while its peers waited);
// its peers' collective waits against its own, at most as much as the job's
// step rose above its recent windows and the rank's host rose beyond its
// peers'; or that attributed rise alone; or the direct evidence of one of the
// last Config.CarryWindows windows where this one cannot decide; without any,
// the window is uncertain. A baseline learned in windows without evidence
// shows a rise but never hides a deviation. A candidate becomes a straggler
// after the configured number of consecutive slow windows; uncertain windows
// and gaps longer than Config.CarryWindows break a candidate's streak but
// never recover an active alert.
//
// The package is pure and deterministic: no clocks, no I/O, no goroutines, no
// logging. Time only advances through the facts themselves or through
// Advance, to which the caller passes a watermark of event time. The same
// facts in the same order always produce the same verdicts. A Detector is not
// safe for concurrent use; callers serialise access.
//
// State is bounded: per job at most Config.MaxRanks ranks (more are rejected
// and counted), ranks silent for Config.EvictAfter windows are evicted
// (counted), and at most Config.MaxJobs jobs are tracked.
package detector
