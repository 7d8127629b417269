// Package attach owns the agent's attachments of probed libraries: which
// library files are attached, which processes use each, and when an
// attachment is made, made again or taken down.
//
//   - One attachment per library file (F, the file's device and inode):
//     uprobes live on the inode and fire in every process that maps it, so
//     the first process to map a file attaches it and the others only
//     count as its users (a reference count per file).
//   - Retries: an attach that failed (the process through whose
//     /proc/PID/root or map_files the file was opened exited meanwhile;
//     another agent's uprobes on the file being created or closed) is
//     tried again through the next process that maps the file, and, on
//     the agent's tick (RetryFailed), through a process that already maps
//     it, RetryBackoff after the failure and twice as late each time,
//     MaxRetries times.
//   - Idle detach: when the last user unmaps the file or exits, its
//     attachment stays for Config.Linger (DefaultLinger) and is reused if
//     a process maps the file again meanwhile (an elastic restart does,
//     within seconds); after that it is closed, in the background, because
//     closing uprobes waits for kernel grace periods.
//   - The attach worker: opening a library and reading its symbol tables
//     (seconds for libtorch's) runs on one goroutine of its own, one
//     library at a time, so that the owner goroutine keeps feeding the
//     pipeline and answering status, and the ELF reader's memory budget is
//     the agent's, not one per library. Its queue is fair between owners
//     (Library.Owner, a uid or a container's cgroup): one lane per owner,
//     served in turn, so one owner's many slow files delay another's first
//     attach by one attach per other owner waiting, not by their number.
//
// It knows the probes only through ProbeSet (attach the uprobes of one
// library, giving a Link to close) and reports through Sink (counters, and
// each attachment made). Package agent implements both over bpf.Probes
// (agent/probeset.go) and keeps the processes themselves: ranks, the BPF
// filter entries, duty-cycle writes (agent/attacher.go). The counters it
// reports (attach_errors, attach_retries, attachments_reused,
// libraries_attached, libraries_detached) keep their names in the agent's
// metrics.
//
// Concurrency: a Manager belongs to one goroutine, its owner (the agent's
// main goroutine): every method must be called from it, and the Sink is
// called only from it. The worker goroutine calls only ProbeSet.Attach (one
// call at a time) and hands each outcome back by sending a function on
// Config.Deliver, which the owner must run; Close stops the worker, after
// the owner stopped reading Deliver, and closes every attachment.
//
// Requirements: none of its own. Privileges are the probe set's: the real
// one needs what bpf.Probes needs (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN for
// uprobes, see agent/privilege); with a fake probe set, as in its tests,
// everything runs unprivileged.
//
// It imports only internal/monoclock (depguard in .golangci.yml): the
// agent imports it, never the other way round.
package attach
