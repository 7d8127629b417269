// Package localapi owns the agent's local HTTP endpoint: where it listens
// and how that is kept private, and what it serves.
//
//   - The listeners (Server): a Unix socket, created mode 0600 from the
//     start (bound in a private directory, then renamed into place) in a
//     directory that no other user can write; a stale socket (the kernel
//     refuses connections to it) is replaced, anything that is not a socket
//     refused; and optionally a TCP address, loopback only unless allowed
//     explicitly (CheckStatusAddr). A socket that another listener holds (an
//     agent running, or one still exiting: a killed agent's socket accepts
//     connections until its process is gone) is never taken: the server
//     serves its TCP address, tries the socket every RetryInterval and takes
//     it once it is stale or gone; while it holds it, it makes it again if
//     the path is removed or replaced. Counters counts the attempts.
//   - The handlers (NewHandler): GET /status (the Backend's report as
//     JSON), GET /metrics (the Prometheus handler it is given), and, on the
//     Unix socket only, POST /control (a strictly decoded, size-bounded JSON
//     request) and the agent's own Go profiles under /debug/pprof/.
//
// It knows the agent only through Backend: a report to encode and a
// control request to apply, in the agent's own JSON types (type parameters
// it never looks inside). agent.LocalAPI adapts an *agent.Agent; the
// report's fields and the control request's are the agent's
// (agent.StatusReport, agent.ControlRequest), not this package's. It
// imports no slowrank package (depguard in .golangci.yml).
//
// Concurrency: a Server serves each listener from its own goroutine and
// each request from net/http's, and keeps its socket from one more
// goroutine; the Backend is called concurrently and must be safe for that.
// Addrs, Waiting and Counters are safe from any goroutine. Close stops the
// socket's goroutine, stops serving (in-flight requests get 2 s), waits for
// the serving goroutines and removes the socket if it is still the one it
// created.
//
// Requirements: none beyond the file system: creating the socket's
// directory (default /run/slowrank) needs the rights to do so there, which
// the agent has as root. The socket's mode is its access control: only its
// owner (root) can reach POST /control.
package localapi
