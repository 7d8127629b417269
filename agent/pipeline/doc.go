// Package pipeline owns the agent's data path after the ring buffer: the
// records' queue, their order, the correlator and the detector, and the
// hand-over of results to the sinks.
//
//   - The input queue (Queue, Input): batches of records from the agent's
//     reader goroutine, bounded in records and never blocking the reader
//     (a refused batch is the reader's to count lost); host calls and
//     device intervals travel inline, not boxed, and full batches are
//     recycled, so that 100,000 records a second allocate nothing.
//   - The reorder hold (reorder.go): a process on the NCCL plugin path
//     (PluginPath) has its host calls and communicator records held until
//     event time is past their end by 400 ms and fed in end order, since
//     the plugin's collectives come a batch after the real-time
//     synchronisations.
//   - Correlate → detect → sinks (Feed, Tick, Flush): records go to the
//     correlator; each tick, the steps and topologies it releases go to
//     the detector and, with their window, to every Sink, then each
//     settled window with its verdicts (with GPU evidence through
//     Config.Evidence); alert transitions are logged, the duty-cycle
//     controller is told of covered steps and suspicious windows
//     (Config.Duty).
//   - The detector hot-swap (swap.go, SwapDetector): new settings make a
//     new detector that takes over each job at its next window boundary
//     while the old one settles its last window, so sinks see one
//     increasing sequence of windows per job.
//
// The agent talks to it through that API and a few reads: SetRank and
// Forget for the processes it found and lost, Snapshot for the live view,
// Counters (the correlate_* and detector_* metrics, under the names the
// agent exports), DetectorConfig, SwapStatus, LiveStats and Summaries for
// runtime control and the end of the run. It never sees the agent: its
// counters go through Config.Count, the records of the event dump through
// Config.Dump. agent.Sink and agent.RankView are aliases of Sink and
// RankView.
//
// Concurrency: a Pipeline belongs to one goroutine, its owner (the agent's
// main goroutine), which calls every method but Snapshot; the sinks, the
// duty controller, Evidence, Dump and Count are called only from it.
// Snapshot is safe from any goroutine (the status is kept under a mutex).
// A Queue has two sides: Get and Offer for the one reader goroutine, C and
// Done for the owner; Len is safe from any.
//
// Requirements: none. It does no I/O and needs no privileges: everything
// arrives as records and event time (CLOCK_MONOTONIC ns passed in), so its
// tests run unprivileged.
//
// It imports only correlate and detector (depguard in .golangci.yml): the
// agent imports it, never the other way round.
package pipeline
