// Package privilege owns what the agent may do on this host and how it
// finds out: the Linux capabilities it uses and what each is for
// (CapRequirements), the check of the process's effective set against them
// (CheckCapabilities, MissingCapabilities), the probe of whether this kernel
// requires CAP_SYS_ADMIN for uprobes (UprobesNeedSysAdmin), the drop of
// every other capability by re-executing the binary (DropCapabilities), and
// the kernel version facts those decisions depend on (ParseKernelVersion,
// KernelRelease). The list of capabilities and why each is needed is at the
// top of caps.go.
//
// `slowrank agent` runs CheckCapabilities and DropCapabilities before it
// touches any process; `slowrank doctor` reports with the same requirements
// and parsers, so that what doctor says and what the agent refuses to start
// without cannot drift apart.
//
// Concurrency: everything is safe for concurrent use, but
// UprobesNeedSysAdmin lowers the effective set of one locked thread for the
// duration of its probe, and DropCapabilities replaces the process
// (execve) and must run before the program starts other work.
//
// Requirements: Linux. Reading capabilities needs nothing;
// UprobesNeedSysAdmin needs CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN) to
// load its one-instruction program, and otherwise answers with an error;
// DropCapabilities acts only for root (uid 0) and returns ErrCannotDrop for
// others.
//
// The package imports no other slowrank package (depguard in
// .golangci.yml); package agent and cmd/slowrank import it.
package privilege
