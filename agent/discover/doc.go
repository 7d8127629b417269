// Package discover owns finding the training processes of a host and what
// they map: which processes are ranks, whose they are, and which probed
// libraries each one maps.
//
//   - Discovery (discover.go): one scan of the proc tree (Discover) or the
//     evaluation of one process, selected by an environment variable
//     (Selector, DefaultEnvKey "RANK"), explicit PIDs or a match on the
//     executable; its identity (rank, job, placement) comes from
//     agent/identity. Every proc file a process shapes is read within a
//     bound (ReadInto): a larger one is refused and counted, never read
//     whole.
//   - Who may be a rank (policy.go): the owner (a uid, for root a cgroup),
//     the operator's allow lists (Policy) and the per-owner quota of
//     tracking slots, so that one owner's flood cannot blind the agent to
//     the others.
//   - The maps (maps.go): /proc/PID/maps parsed into the probed libraries
//     (Library, LibraryKind), each with the map_files path the attach opens
//     it through.
//   - The watch (watch.go): a Watcher polls the proc tree and reports
//     processes added and exited and libraries mapped and unmapped as
//     Events on a bounded channel; a full channel defers an event to the
//     next poll (counted), never blocks the poll.
//   - CheckImage: whether a process still shows the image discovery judged
//     (an exec or a reused PID shows another), for whoever opens its
//     memory later.
//
// It never touches a process beyond reading its proc files. The agent
// consumes its events and attaches; doctor and status use Discover,
// ReadLibraries and ReadMaps to look at a process as the agent does.
//
// Concurrency: a Watcher's state belongs to its Run goroutine; Events and
// Stats are safe from any goroutine. Discover and the Read functions hold
// no state.
//
// Requirements: a proc filesystem (a fixture tree in tests, ProcRoot);
// reading another user's environ and maps needs root or CAP_SYS_PTRACE
// (AccessError and the Denied counts say when it was refused).
//
// It imports only agent/identity and detector (whose placement an
// identity gives; depguard in .golangci.yml): the agent imports it, never
// the other way round.
package discover
