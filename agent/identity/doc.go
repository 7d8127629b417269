// Package identity owns what a training process says about itself: its
// place in the job (rank, local rank, world size, job id and where each
// came from) read from its environment by the launchers' conventions
// (torchrun, Open MPI, MPICH/PMI, Slurm, LSF, PBS), its placement in the
// cluster (Kubernetes pod and container, Slurm step) from the environment
// and from its cgroup, and the injection library it was started with.
//
// The package is pure: parsers of bytes the caller read
// (/proc/PID/environ, /proc/PID/cgroup) and functions of their results; no
// I/O, no clocks, no goroutines, no logging. It keeps only the variables it
// reads (IsVar): no other part of a process's environment, secrets
// included, is kept. Package agent/discover reads the files (discover.go,
// policy.go) and carries an Identity per process (discover.Identity is an
// alias).
//
// Concurrency: no state; everything is safe for concurrent use.
//
// Requirements: none. (Reading another user's /proc/PID/environ, the
// caller's part, needs CAP_DAC_READ_SEARCH or CAP_SYS_PTRACE: see
// agent/privilege.)
//
// It imports only detector (for detector.Placement) and internal/hexname;
// depguard in .golangci.yml keeps it so.
package identity
