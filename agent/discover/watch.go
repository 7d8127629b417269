package discover

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io/fs"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"
)

// Event is one change that a Watcher reports: *ProcessAdded, *ProcessExited, *LibraryMapped
// or *LibraryUnmapped.
type Event interface {
	// Key is the process the event is about.
	Key() ProcessKey
}

// ProcessAdded reports a newly selected process. It comes before any LibraryMapped of the
// process.
type ProcessAdded struct{ Process Process }

// ProcessExited reports that a reported process ended (or became a zombie), that its PID now
// belongs to another process, or that it exec'ed (a ProcessAdded with the same key and the new
// image's identity follows when the new image is still selected). Its libraries are gone with
// it: no LibraryUnmapped is sent for them.
type ProcessExited struct{ ProcessKey }

// LibraryMapped reports a probed library mapped by a reported process: at discovery, after a
// dlopen, and again when its load base changed (dlclose and dlopen). The attach layer attaches
// once per Library.File and uses Library.Base for per-process addresses.
type LibraryMapped struct {
	ProcessKey
	Library Library
}

// LibraryUnmapped reports that a reported, still running process no longer maps a library
// (dlclose).
type LibraryUnmapped struct {
	ProcessKey
	Library Library
}

// Key implements Event.
func (e *ProcessAdded) Key() ProcessKey { return e.Process.ProcessKey }

// Key implements Event.
func (e *ProcessExited) Key() ProcessKey { return e.ProcessKey }

// Key implements Event.
func (e *LibraryMapped) Key() ProcessKey { return e.ProcessKey }

// Key implements Event.
func (e *LibraryUnmapped) Key() ProcessKey { return e.ProcessKey }

// Defaults of WatcherConfig.
const (
	DefaultInterval  = 500 * time.Millisecond
	DefaultQueueSize = 1024
	DefaultRecheck   = 10 * time.Second
)

// WatcherConfig configures a Watcher. The zero value watches /proc for processes whose
// environment has RANK.
type WatcherConfig struct {
	// ProcRoot is the proc filesystem to watch: "" for /proc, a fixture tree in tests.
	ProcRoot string
	Selector Selector
	// Interval is the poll period (DefaultInterval): a library that a tracked process dlopens
	// is reported within about one Interval.
	Interval time.Duration
	// QueueSize bounds the event channel (DefaultQueueSize).
	QueueSize int
	// Recheck is how often processes that were not selected are looked at again, to see an
	// exec or a reused PID that the poll missed (DefaultRecheck). Processes younger than two
	// Intervals are looked at on every poll, which catches a launcher's fork-then-exec.
	Recheck time.Duration
	Logger  *slog.Logger
}

// WatcherStats is a snapshot of a Watcher's counters. All but Tracked and LastPoll only grow.
type WatcherStats struct {
	Polls             uint64
	LastPoll          time.Duration // how long the last poll took
	Tracked           int           // processes selected now
	ProcessesAdded    uint64        // ProcessAdded events delivered
	ProcessesExited   uint64        // ProcessExited events delivered
	LibrariesMapped   uint64        // LibraryMapped events delivered
	LibrariesUnmapped uint64        // LibraryUnmapped events delivered
	// EventsDeferred counts sends that found the queue full. The watcher keeps what it has
	// not delivered and sends it on the next poll: a deferred event is late, not lost.
	EventsDeferred uint64
	// ExitsLost counts ProcessExited events dropped because too many were waiting for room.
	ExitsLost uint64
	Vanished  uint64 // processes that ended while being read; skipped
	Denied    uint64 // processes whose environ or maps the agent may not read
	Failed    uint64 // unexpected read or parse errors
	// Oversized counts processes whose environ or cmdline exceeds its
	// bound (not selected), and maps reads of tracked processes beyond
	// theirs (libraries not updated).
	Oversized uint64
	// RefusedPolicy counts processes not selected because the policy does
	// not allow their owner; RefusedQuota selections refused because their
	// owner had its quota of tracked processes (looked at again every
	// Recheck).
	RefusedPolicy uint64
	RefusedQuota  uint64
	MapsReads     uint64 // /proc/PID/maps reads of tracked processes
	MapsUnchanged uint64 // of which had the same content as the last read (not parsed)
	MapsSkipped   uint64 // maps reads saved because the address-space size had not changed
}

type watcherCounters struct {
	polls, lastPoll, tracked              atomic.Int64
	added, exited, mapped, unmapped       atomic.Uint64
	deferred, exitsLost                   atomic.Uint64
	vanished, denied, failed, oversized   atomic.Uint64
	refusedPolicy, refusedQuota           atomic.Uint64
	mapsReads, mapsUnchanged, mapsSkipped atomic.Uint64
}

// Watcher follows training processes and the probed libraries they map, by polling the proc
// filesystem, and reports changes as Events. Run is the only goroutine that touches its
// state; Events and Stats may be used from any goroutine.
//
// Per poll it reads stat of each tracked process and, when its address-space size changed (and
// every Recheck), its maps, which it parses only when their hash changed; it lists the PIDs
// and reads stat, environ, cmdline and exe only of PIDs it has not seen (stat of rejected
// ones again while they are young and every Recheck). Measured on a 5,000-mapping process:
// reading maps costs about 0.7 ms, parsing it 0.55 ms.
type Watcher struct {
	r        *procReader
	sel      Selector
	explicit map[int]uint64
	interval time.Duration
	recheck  uint64 // in polls
	log      *slog.Logger
	events   chan Event
	running  atomic.Bool
	stats    watcherCounters

	// State owned by Run.
	poll         uint64
	tracked      map[int]*trackedProc
	seen         map[int]*seenProc
	pendingExits []ProcessKey
	buf          []byte
	seed         maphash.Seed
	deniedLogged bool
	bigLogged    bool
	perOwner     map[string]int // tracked processes per Owner.QuotaKey
	refusalLog   time.Time      // last refusal logged at warning level
}

type trackedProc struct {
	proc      Process
	quotaKey  string // "" for an explicitly selected PID (not counted)
	execSig   [2]uint64
	vsize     uint64
	announced bool
	mapsHash  uint64
	libs      []Library          // current, by Base
	sent      map[FileID]Library // announced
	mapsErr   bool               // a maps read error was counted
}

// seenProc is a process looked at and not selected.
type seenProc struct {
	start     uint64
	execSig   [2]uint64
	firstPoll uint64
	listed    uint64 // last poll that listed it
	failed    bool   // evaluation failed unexpectedly: evaluate again every Recheck
}

// NewWatcher checks cfg and returns a Watcher; Run starts it. An explicitly selected PID that
// does not exist is an error that matches ErrNoSuchProcess (one *NoSuchProcessError per PID).
func NewWatcher(cfg WatcherConfig) (*Watcher, error) {
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.QueueSize == 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.Recheck == 0 {
		cfg.Recheck = DefaultRecheck
	}
	if cfg.Interval < 0 || cfg.QueueSize < 0 || cfg.Recheck < 0 {
		return nil, fmt.Errorf("watcher config: negative interval, queue size or recheck")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := CheckPolicy(cfg.Selector.Policy); err != nil {
		return nil, fmt.Errorf("watcher config: %w", err)
	}
	r, err := newProcReader(cfg.ProcRoot)
	if err != nil {
		return nil, err
	}
	explicit, err := r.explicitStarts(cfg.Selector.PIDs)
	if err != nil {
		return nil, err
	}
	return &Watcher{
		r:        r,
		sel:      cfg.Selector,
		explicit: explicit,
		interval: cfg.Interval,
		recheck:  uint64(max(1, cfg.Recheck/cfg.Interval)),
		log:      cfg.Logger.With("component", "discover"),
		events:   make(chan Event, cfg.QueueSize),
		tracked:  make(map[int]*trackedProc),
		seen:     make(map[int]*seenProc),
		perOwner: make(map[string]int),
		seed:     maphash.MakeSeed(),
	}, nil
}

// Events returns the event channel. It is closed when Run returns.
func (w *Watcher) Events() <-chan Event { return w.events }

// Stats returns a snapshot of the counters.
func (w *Watcher) Stats() WatcherStats {
	c := &w.stats
	return WatcherStats{
		Polls:             uint64(c.polls.Load()),
		LastPoll:          time.Duration(c.lastPoll.Load()),
		Tracked:           int(c.tracked.Load()),
		ProcessesAdded:    c.added.Load(),
		ProcessesExited:   c.exited.Load(),
		LibrariesMapped:   c.mapped.Load(),
		LibrariesUnmapped: c.unmapped.Load(),
		EventsDeferred:    c.deferred.Load(),
		ExitsLost:         c.exitsLost.Load(),
		Vanished:          c.vanished.Load(),
		Denied:            c.denied.Load(),
		Failed:            c.failed.Load(),
		Oversized:         c.oversized.Load(),
		RefusedPolicy:     c.refusedPolicy.Load(),
		RefusedQuota:      c.refusedQuota.Load(),
		MapsReads:         c.mapsReads.Load(),
		MapsUnchanged:     c.mapsUnchanged.Load(),
		MapsSkipped:       c.mapsSkipped.Load(),
	}
}

// Run polls at once and then every Interval until ctx is done, and closes the event channel
// when it returns. It returns nil when ctx is done, and an error only when the first poll
// cannot list processes. It may be called once.
func (w *Watcher) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("watcher: Run called twice")
	}
	defer close(w.events)
	ticker := time.NewTicker(w.interval)
	defer ticker.Stop()
	for {
		if err := w.pollOnce(); err != nil {
			if w.poll == 1 {
				return err
			}
			w.stats.failed.Add(1)
			w.log.Warn("poll processes", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// pollOnce looks at the proc tree once and sends what changed.
func (w *Watcher) pollOnce() error {
	start := time.Now()
	w.poll++
	defer func() {
		w.stats.polls.Add(1)
		w.stats.lastPoll.Store(int64(time.Since(start)))
		w.stats.tracked.Store(int64(len(w.tracked)))
	}()

	w.flushExits()
	for _, pid := range sortedPIDs(w.tracked) {
		w.refresh(w.tracked[pid])
	}
	w.flushExits()

	pids, err := w.r.pids()
	if err != nil {
		return err
	}
	for _, pid := range pids {
		if _, ok := w.tracked[pid]; ok {
			continue
		}
		if s, ok := w.seen[pid]; ok {
			s.listed = w.poll
			young := w.poll-s.firstPoll <= 2
			if !young && w.poll%w.recheck != 0 {
				continue
			}
			st, err := w.r.stat(pid)
			if err != nil {
				delete(w.seen, pid) // gone, or unreadable: look again next poll
				continue
			}
			if st.StartTime == s.start && st.ExecSig == s.execSig && !(s.failed && !young) {
				continue
			}
			delete(w.seen, pid) // PID reused, exec'ed, or failed before: a new candidate
			w.consider(st)
			continue
		}
		st, err := w.r.stat(pid)
		if err != nil {
			w.countErr(err, pid, "read stat")
			continue
		}
		w.consider(st)
	}
	for pid, s := range w.seen {
		if s.listed != w.poll {
			delete(w.seen, pid)
		}
	}
	return nil
}

// consider evaluates a process not tracked now and tracks or remembers it.
func (w *Watcher) consider(st procStat) {
	p, res, err := w.r.evaluate(st, w.sel, w.explicit)
	switch res {
	case evalSelected:
		t := &trackedProc{proc: p, execSig: st.ExecSig, vsize: st.VSize, sent: make(map[FileID]Library)}
		if p.SelectedBy != "pid" {
			t.quotaKey = p.Owner.QuotaKey()
			if w.perOwner[t.quotaKey] >= w.sel.Policy.quota() {
				w.stats.refusedQuota.Add(1)
				w.logRefusal(p, "its owner has its quota of tracked processes")
				res = evalFailed // looked at again every Recheck: a slot may free
				break
			}
			w.perOwner[t.quotaKey]++
		}
		w.tracked[p.PID] = t
		w.log.Debug("process selected", "pid", p.PID, "rank", p.Identity.Rank, "job", p.Identity.JobID, "by", p.SelectedBy)
		if !w.refreshMaps(t) {
			w.untrack(t)
			w.stats.vanished.Add(1)
			return
		}
		w.announce(t)
		return
	case evalRefused:
		w.stats.refusedPolicy.Add(1)
		w.logRefusal(p, "the selection policy does not allow its owner")
	case evalGone:
		w.stats.vanished.Add(1)
		return
	case evalDenied:
		w.stats.denied.Add(1)
		lvl := slog.LevelDebug
		if !w.deniedLogged {
			lvl, w.deniedLogged = slog.LevelWarn, true
		}
		w.log.Log(context.Background(), lvl, "cannot read a process's environment; it is not watched (further ones logged at debug)",
			"pid", st.PID, "error", &AccessError{PIDs: []int{st.PID}, Err: err})
	case evalFailed:
		w.stats.failed.Add(1)
		w.log.Debug("evaluate process", "pid", st.PID, "error", err)
	case evalOversized:
		w.stats.oversized.Add(1)
		w.logOversized(st.PID, err)
	}
	w.seen[st.PID] = &seenProc{start: st.StartTime, execSig: st.ExecSig, firstPoll: w.poll, listed: w.poll,
		failed: res == evalFailed}
}

// refresh re-reads a tracked process: ended, reused or exec'ed processes leave, the others
// have their maps re-read and their changes announced.
func (w *Watcher) refresh(t *trackedProc) {
	pid := t.proc.PID
	st, err := w.r.stat(pid)
	switch {
	case err != nil && !procGone(err):
		w.countErr(err, pid, "read stat")
		return
	case err != nil || st.StartTime != t.proc.StartTime || st.exited():
		w.remove(t)
		return
	case st.ExecSig != t.execSig:
		// exec: report the old image gone; the listing step evaluates the new one.
		w.remove(t)
		return
	}
	// A dlopen or dlclose changes the address-space size; when it did not change, maps is
	// read only every Recheck (in case an unmap and a map of equal size cancelled out).
	if st.VSize == t.vsize && w.poll%w.recheck != 0 {
		w.stats.mapsSkipped.Add(1)
		w.announce(t) // what a full queue held back
		return
	}
	t.vsize = st.VSize
	if !w.refreshMaps(t) {
		w.remove(t)
		return
	}
	w.announce(t)
}

// refreshMaps re-reads the maps of t and updates t.libs. It returns false when the process
// is gone.
func (w *Watcher) refreshMaps(t *trackedProc) bool {
	pid := t.proc.PID
	var err error
	w.buf, err = ReadInto(w.r.path(pid, "maps"), w.buf, maxMapsBytes)
	w.stats.mapsReads.Add(1)
	switch {
	case err != nil && procGone(err):
		return false
	case errors.Is(err, errProcFileTooLarge):
		w.stats.oversized.Add(1)
		w.logOversized(pid, err)
		return true
	case err != nil:
		if !t.mapsErr {
			t.mapsErr = true
			w.countErr(err, pid, "read maps")
		}
		return true
	case len(w.buf) == 0:
		return false // a zombie or a process past exit_mm
	}
	h := maphash.Bytes(w.seed, w.buf)
	if h == t.mapsHash {
		w.stats.mapsUnchanged.Add(1)
		return true
	}
	libs, err := librariesFromMaps(w.buf, w.r.root, pid)
	if errors.Is(err, errProcFileTooLarge) {
		w.stats.oversized.Add(1)
		w.logOversized(pid, err)
		return true
	}
	if err != nil {
		w.stats.failed.Add(1)
		w.log.Warn("parse maps", "pid", pid, "error", err)
		return true
	}
	t.mapsHash, t.libs = h, libs
	return true
}

// announce sends what the consumer has not been told about t.
func (w *Watcher) announce(t *trackedProc) {
	if !t.announced {
		if slices.ContainsFunc(w.pendingExits, func(k ProcessKey) bool { return k.PID == t.proc.PID }) {
			return // the old process of this PID must be reported gone first
		}
		if !w.send(&ProcessAdded{Process: t.proc}) {
			return
		}
		t.announced = true
		w.stats.added.Add(1)
	}
	key := t.proc.ProcessKey
	for id, lib := range t.sent {
		if slices.ContainsFunc(t.libs, func(l Library) bool { return l.File == id }) {
			continue
		}
		if w.send(&LibraryUnmapped{ProcessKey: key, Library: lib}) {
			delete(t.sent, id)
			w.stats.unmapped.Add(1)
		}
	}
	for _, lib := range t.libs {
		if old, ok := t.sent[lib.File]; ok && old.Base == lib.Base {
			continue
		}
		if w.send(&LibraryMapped{ProcessKey: key, Library: lib}) {
			t.sent[lib.File] = lib
			w.stats.mapped.Add(1)
		}
	}
}

// remove stops tracking t and queues its ProcessExited if it was announced.
func (w *Watcher) remove(t *trackedProc) {
	w.untrack(t)
	if !t.announced {
		return
	}
	if len(w.pendingExits) >= cap(w.events)+64 {
		w.stats.exitsLost.Add(1)
		w.log.Warn("event queue full, process exit lost", "pid", t.proc.PID)
		return
	}
	w.pendingExits = append(w.pendingExits, t.proc.ProcessKey)
	w.log.Debug("process gone", "pid", t.proc.PID)
}

func (w *Watcher) flushExits() {
	n := 0
	for _, k := range w.pendingExits {
		if w.send(&ProcessExited{ProcessKey: k}) {
			w.stats.exited.Add(1)
			continue
		}
		w.pendingExits[n] = k
		n++
	}
	w.pendingExits = w.pendingExits[:n]
}

// send delivers ev without blocking; false means the queue was full (counted).
func (w *Watcher) send(ev Event) bool {
	select {
	case w.events <- ev:
		return true
	default:
		w.stats.deferred.Add(1)
		return false
	}
}

// untrack forgets t and frees its owner's slot.
func (w *Watcher) untrack(t *trackedProc) {
	delete(w.tracked, t.proc.PID)
	if t.quotaKey == "" {
		return
	}
	if w.perOwner[t.quotaKey]--; w.perOwner[t.quotaKey] <= 0 {
		delete(w.perOwner, t.quotaKey)
	}
}

// refusalLogEvery rate-limits the warnings about refused processes.
const refusalLogEvery = time.Minute

// logRefusal logs a refused process: a warning at most every
// refusalLogEvery, with the counts so far, the others at debug.
func (w *Watcher) logRefusal(p Process, why string) {
	lvl := slog.LevelDebug
	if now := time.Now(); now.Sub(w.refusalLog) >= refusalLogEvery {
		lvl, w.refusalLog = slog.LevelWarn, now
	}
	w.log.Log(context.Background(), lvl, "process not watched: "+why+" (further ones logged at debug for a minute)",
		"pid", p.PID, "uid", p.Owner.UID, "cgroup", p.Owner.Cgroup,
		"refused_policy", w.stats.refusedPolicy.Load(), "refused_quota", w.stats.refusedQuota.Load())
}

// logOversized warns of the first oversized proc file, the others at debug.
func (w *Watcher) logOversized(pid int, err error) {
	lvl := slog.LevelDebug
	if !w.bigLogged {
		lvl, w.bigLogged = slog.LevelWarn, true
	}
	w.log.Log(context.Background(), lvl, "proc file beyond its bound; the process is not watched (further ones logged at debug)",
		"pid", pid, "error", err)
}

func (w *Watcher) countErr(err error, pid int, what string) {
	switch {
	case procGone(err):
		w.stats.vanished.Add(1)
	case errors.Is(err, fs.ErrPermission):
		w.stats.denied.Add(1)
		w.log.Debug(what, "pid", pid, "error", err)
	default:
		w.stats.failed.Add(1)
		w.log.Debug(what, "pid", pid, "error", err)
	}
}

func sortedPIDs[V any](m map[int]V) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
