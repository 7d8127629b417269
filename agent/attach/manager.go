package attach

import (
	"log/slog"
	"sync"
	"time"

	"github.com/slowrank/slowrank/internal/monoclock"
)

// Library is one library file as one process maps it.
type Library[F comparable] struct {
	// File is the file on the host (its device and inode): the manager
	// attaches once per File.
	File F
	// Name is the path as the process maps it (status and logs).
	Name string
	// MapFiles is the process's map_files entry of one mapping of the
	// file (/proc/PID/map_files/<start>-<end>, from the maps read that
	// found it): the probe set opens the mapped file through it, so a
	// rename onto the path cannot change what is attached. Valid while the
	// mapping lives.
	MapFiles string
	// Open is the path the probe set opens where MapFiles cannot be
	// opened (no CAP_SYS_ADMIN, the mapping went away): the host path,
	// checked against File; valid while PID lives.
	Open string
	// PID is the process whose mapping this is: the attach goes through it.
	PID int
	// Owner is who runs the process, a key that owner cannot multiply
	// (the agent's quota key: a uid, or a container's cgroup for root):
	// the attach worker serves owners in turn (worker.go).
	Owner string
	// Kind is the caller's kind of library (the agent's LibraryKind),
	// passed through to the probe set and the sink.
	Kind uint8
}

// ProbeSet makes attachments. Attach runs on the worker goroutine, one call
// at a time, and may take seconds (it reads the library's symbol tables).
// It returns a Link or an error, never both.
type ProbeSet[F comparable] interface {
	Attach(lib Library[F]) (Link, error)
}

// Link is one library's attachment: its uprobes, for every process that
// maps the file. Close detaches them; it may wait for kernel grace periods.
type Link interface {
	Close() error
}

// Sink receives what the manager reports, on the owner goroutine.
type Sink[F comparable] interface {
	// Count adds n to the counter name.
	Count(name string, n int64)
	// Attached reports an attachment made through lib, after took.
	Attached(lib Library[F], link Link, took time.Duration)
}

// DefaultLinger is how long an attachment that no process uses any more
// stays attached. An elastic restart maps the same library files again
// within seconds: reusing the attachment spares the new processes the
// attach, and the kernel the teardown (grace periods, during which new
// uprobes wait), so the first steps after a restart are not missed.
const DefaultLinger = 15 * time.Second

// Config configures a Manager.
type Config[F comparable] struct {
	Probes ProbeSet[F]
	Sink   Sink[F]
	// Deliver is the owner goroutine's control channel: the worker sends
	// each outcome on it as a function that the owner runs.
	Deliver chan<- func()
	// Log gets a warning for each failed attach (nil: none).
	Log *slog.Logger
	// Linger is how long an unused attachment stays (0: DefaultLinger).
	Linger time.Duration
	// Now reads the monotonic clock in ns (nil: CLOCK_MONOTONIC), the
	// clock of DetachIdle's argument.
	Now func() int64
}

// Manager holds the attachments of library files and the processes that
// use each. Its owner goroutine calls every method (doc.go).
type Manager[F, P comparable] struct {
	cfg  Config[F]
	libs map[F]*entry[F, P]
	// worker attaches libraries off the owner goroutine (started with the
	// first library to attach).
	worker  *worker[F]
	closing sync.WaitGroup
	// stop is closed by Close: collective changes in flight no longer
	// deliver their outcome (collectives.go).
	stop chan struct{}
}

// entry is one library file's state.
type entry[F, P comparable] struct {
	file F
	name string
	link Link // nil while attaching or when attaching failed
	// attaching: queued for or in the attach worker.
	attaching bool
	// failed: the last attach failed; the next process mapping the
	// library retries it, and so does RetryFailed once retryAt passed.
	failed bool
	// failures is how many attaches in a row failed; retryAt when
	// RetryFailed tries again through a user (monotonic ns; 0: never).
	failures int
	retryAt  int64
	// idleSince is when the last user went (monotonic ns; 0: in use).
	idleSince int64
	// users are the processes that map the file, each with its mapping
	// (a retry goes through one of them).
	users map[P]Library[F]
	// plugin are the users that report their collectives another way;
	// collOff: the link's collective probes are closed; changing: a
	// detach or re-attach of them is in flight; collRetry: the last
	// re-attach failed, RetryFailed tries again; noDetach: a detach
	// failed, the file keeps its collective probes (collectives.go).
	plugin                       map[P]bool
	collOff, changing, collRetry bool
	noDetach                     bool
	// viaFailed are the users through whose mapping an attach, or a
	// re-attach of the collective probes, failed since the last one that
	// worked (pick).
	viaFailed map[P]bool
	// blindSince is when a user that needs the closed collective probes
	// was first seen (monotonic ns; 0: none waits): its collectives trap
	// nowhere until they are made again (nccl_collective_blind_ms).
	blindSince int64
}

// Timed retries of a failed attach through the processes that already map
// the library: the first after RetryBackoff, each next one twice as late,
// MaxRetries in all. Without them, an attach that failed while every
// process of the job was already mapping the library was never made again:
// the agent recorded nothing of that job. Seen when another agent attaches
// or detaches on the host at the same time (creating a uprobe fails with
// ENOENT), which a restarted agent does while its predecessor's uprobes
// are still being closed.
const (
	RetryBackoff = time.Second
	MaxRetries   = 6 // 1+2+4+8+16+32 s: about a minute
)

// New returns a Manager with no attachments; cfg.Probes, Sink and Deliver
// are required.
func New[F, P comparable](cfg Config[F]) *Manager[F, P] {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Linger == 0 {
		cfg.Linger = DefaultLinger
	}
	if cfg.Now == nil {
		cfg.Now = monoclock.Now
	}
	return &Manager[F, P]{cfg: cfg, libs: map[F]*entry[F, P]{}, stop: make(chan struct{})}
}

// Use records that process p maps lib. With probe, the file is attached
// unless it is attached or being attached already: the first process to
// map it attaches it, and after a failed attach the next one tries again.
// Without probe (a library the agent only follows), p is just counted as
// a user.
func (m *Manager[F, P]) Use(p P, lib Library[F], probe bool) {
	e := m.libs[lib.File]
	if e != nil {
		e.users[p] = lib
		if e.attaching && m.worker != nil {
			m.worker.join(lib) // queued: its turn may come through p's owner first
		}
		if e.idleSince != 0 {
			e.idleSince = 0
			m.cfg.Sink.Count("attachments_reused", 1)
		}
		if !e.failed || e.attaching {
			m.judge(e) // a new user may need the collective probes
			return
		}
		// The attach through another process failed (it may have exited
		// meanwhile): try again through this one. Bounded by the number
		// of processes that map the library.
		m.cfg.Sink.Count("attach_retries", 1)
	} else {
		e = &entry[F, P]{file: lib.File, name: lib.Name, users: map[P]Library[F]{p: lib}}
		m.libs[lib.File] = e
	}
	if !probe {
		return
	}
	m.attach(e, lib)
}

// attach queues lib's attach for the worker.
func (m *Manager[F, P]) attach(e *entry[F, P], lib Library[F]) {
	if m.worker == nil {
		m.worker = newWorker(m.cfg.Probes.Attach, m.cfg.Deliver, m.done)
	}
	e.attaching = true
	m.worker.enqueue(lib)
}

// done takes the worker's outcome for one library.
func (m *Manager[F, P]) done(o outcome[F]) {
	e := m.libs[o.lib.File]
	if e == nil { // cannot happen: an attaching entry is kept until now
		if o.link != nil {
			o.link.Close()
		}
		return
	}
	e.attaching = false
	if len(e.users) == 0 {
		e.idleSince = m.cfg.Now() // every user went while it attached: linger, then detach
	}
	if o.err != nil {
		e.failVia(o.lib)
		e.failed = true
		e.failures++
		m.cfg.Sink.Count("attach_errors", 1)
		e.retryAt = 0
		if e.failures <= MaxRetries {
			e.retryAt = m.cfg.Now() + int64(RetryBackoff)<<(e.failures-1)
		}
		m.cfg.Log.Warn("attach library", "path", o.lib.Name, "pid", o.lib.PID, "err", o.err, "failures", e.failures, "retry", e.retryAt != 0)
		if len(e.users) == 0 {
			delete(m.libs, o.lib.File)
		}
		return
	}
	e.link, e.failed, e.failures, e.retryAt, e.viaFailed = o.link, false, 0, 0, nil
	m.cfg.Sink.Count("libraries_attached", 1)
	m.cfg.Sink.Attached(o.lib, o.link, o.took)
	m.judge(e)
}

// Release drops p's use of file f (an unmap, or p exited); when nobody
// uses it any more, it is detached after Config.Linger (DetachIdle) unless
// a process maps it again.
func (m *Manager[F, P]) Release(p P, f F) {
	e := m.libs[f]
	if e == nil {
		return
	}
	delete(e.users, p)
	delete(e.plugin, p)
	delete(e.viaFailed, p)
	if len(e.users) > 0 {
		m.judge(e) // the last user that needed the collective probes may be gone
		return
	}
	if e.attaching {
		return // done decides
	}
	if e.link == nil {
		delete(m.libs, f)
		return
	}
	e.idleSince = m.cfg.Now()
}

// RetryFailed tries a failed attach again, through a user (pick), once
// its backoff passed as of now (monotonic ns, Config.Now's
// clock): RetryBackoff after the first failure, twice as long after each
// next one, MaxRetries times. A process mapping the library meanwhile
// retries it at once (Use).
func (m *Manager[F, P]) RetryFailed(now int64) {
	for _, e := range m.libs {
		if e.collRetry {
			e.collRetry = false
			m.judge(e)
		}
		if !e.failed || e.attaching || e.retryAt == 0 || now < e.retryAt || len(e.users) == 0 {
			continue
		}
		_, via := e.pick(func(P) bool { return true })
		m.cfg.Sink.Count("attach_retries", 1)
		m.attach(e, via)
	}
}

// pick returns the user, among those that want says, through whose mapping
// the next attach or re-attach goes: the lowest PID among those whose
// mapping has not failed one (its path may name another file than the one
// it maps: bpf.ErrFileChanged), or among all of them once every one has
// failed. One user cannot keep a file unattached for the others by failing.
func (e *entry[F, P]) pick(want func(P) bool) (P, Library[F]) {
	var (
		user P
		via  Library[F]
	)
	for pass := 0; pass < 2 && via.PID == 0; pass++ {
		for p, l := range e.users {
			if !want(p) || pass == 0 && e.viaFailed[p] {
				continue
			}
			if via.PID == 0 || l.PID < via.PID {
				user, via = p, l
			}
		}
		if via.PID == 0 {
			e.viaFailed = nil // every one failed: start over
		}
	}
	return user, via
}

// failVia notes that an attach through lib failed.
func (e *entry[F, P]) failVia(lib Library[F]) {
	for p, l := range e.users {
		if l == lib {
			if e.viaFailed == nil {
				e.viaFailed = map[P]bool{}
			}
			e.viaFailed[p] = true
		}
	}
}

// DetachIdle detaches the attachments unused for Config.Linger as of now
// (monotonic ns, Config.Now's clock).
func (m *Manager[F, P]) DetachIdle(now int64) {
	for f, e := range m.libs {
		if e.idleSince != 0 && len(e.users) == 0 && now-e.idleSince >= int64(m.cfg.Linger) {
			m.detach(f, e)
		}
	}
}

// detach forgets f and closes its attachment. Detaching waits for kernel
// grace periods (seconds with perf-event uprobes): it runs in the
// background so the owner goroutine never waits for it.
func (m *Manager[F, P]) detach(f F, e *entry[F, P]) {
	delete(m.libs, f)
	if e.link == nil {
		return
	}
	m.closing.Add(1)
	go func() {
		defer m.closing.Done()
		e.link.Close()
	}()
	m.cfg.Sink.Count("libraries_detached", 1)
}

// Close stops the worker (the attachment in flight is closed, queued ones
// are not made), closes every attachment and waits for the closes. Call it
// once the owner no longer reads Config.Deliver, and use the Manager no
// more.
func (m *Manager[F, P]) Close() {
	if m.worker != nil {
		m.worker.close()
	}
	close(m.stop)
	for f, e := range m.libs {
		e.users = nil
		m.detach(f, e)
	}
	m.closing.Wait()
}

// Attached tells whether file f has an attachment.
func (m *Manager[F, P]) Attached(f F) bool {
	e := m.libs[f]
	return e != nil && e.link != nil
}

// Attaching tells whether file f is queued for or in the attach worker.
func (m *Manager[F, P]) Attaching(f F) bool {
	e := m.libs[f]
	return e != nil && e.attaching
}

// Name is the path of file f as the process that first mapped it maps it;
// false when the manager does not know f (no process uses it, and it is
// neither attached nor being attached).
func (m *Manager[F, P]) Name(f F) (string, bool) {
	e := m.libs[f]
	if e == nil {
		return "", false
	}
	return e.name, true
}

// Pending is the number of libraries queued for or in the attach worker.
func (m *Manager[F, P]) Pending() int {
	if m.worker == nil {
		return 0
	}
	return m.worker.pending()
}
