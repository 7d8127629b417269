package bpf

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// ErrNotSupported is returned (wrapped, with the missing feature and its
// minimum kernel in the message) when the kernel lacks something slowrank
// needs. It is cilium/ebpf's sentinel, so errors from that library match too.
var ErrNotSupported = ebpf.ErrNotSupported

// ErrPermission is returned (wrapped) when the caller lacks the privileges to
// load BPF programs or create uprobes (root, or CAP_BPF + CAP_PERFMON, plus
// CAP_SYS_RESOURCE on kernels before 5.11 for the memlock limit).
var ErrPermission = errors.New("missing privileges for BPF (need root or CAP_BPF and CAP_PERFMON)")

// Defaults of Options.
const (
	DefaultRingBufferSize  = 4 << 20
	DefaultInflightEntries = 16384
	DefaultMaxTracked      = 4096
	DefaultWakeupBytes     = 64 << 10
	DefaultPollInterval    = 20 * time.Millisecond
)

// Options configure Load. The zero value is usable.
type Options struct {
	// RingBufferSize is the size in bytes of the one BPF ring buffer: a power
	// of two and a multiple of the page size. 0 means DefaultRingBufferSize.
	RingBufferSize int
	// InflightEntries bounds the LRU map joining entries to returns
	// (threads x probes in flight). 0 means DefaultInflightEntries.
	InflightEntries int
	// MaxTracked bounds tracked_tgids. 0 means DefaultMaxTracked.
	MaxTracked int
	// WakeupBytes: BPF wakes the reader only once this many bytes are
	// pending (capped at half the ring); otherwise the reader polls every
	// PollInterval. A wakeup per record would cost every traced call an
	// irq_work (often an IPI). 0 means DefaultWakeupBytes.
	WakeupBytes int
	// PollInterval bounds how long a record can wait in the ring buffer
	// before Reader.Read returns it while records flow; after an idle
	// spell the reader polls less often, up to 10 intervals apart. 0 means
	// DefaultPollInterval.
	PollInterval time.Duration
	// Logger receives debug logs about attachments; nil discards.
	Logger *slog.Logger
	// SingleUprobes attaches one perf-event uprobe per function even where
	// the kernel has uprobe_multi links (Linux 6.6+). Only for tests and
	// for kernels whose uprobe_multi misbehaves: single uprobes detach one
	// grace period at a time (seconds per process's libraries).
	SingleUprobes bool
}

// Probes is the loaded BPF collection: programs, the ring buffer, the
// tracked-tgid filter and the counters. Create it with Load, release it with
// Close. All methods are safe for concurrent use.
type Probes struct {
	coll     *ebpf.Collection
	events   *ebpf.Map
	tracked  *ebpf.Map
	counters *ebpf.Map
	log      *slog.Logger
	ncpu     int
	poll     time.Duration
	// multi: the shared programs are loaded, for uprobe_multi links (see selectPrograms).
	multi bool

	mu          sync.Mutex
	closed      bool
	attachments map[*Attachment]struct{}
	readers     map[*Reader]struct{}

	libsAttached    atomic.Uint64
	libsStripped    atomic.Uint64
	libsNoSymbols   atomic.Uint64
	symbolsAttached atomic.Uint64
	symbolsMissing  atomic.Uint64
	attachErrors    atomic.Uint64
	filesRefused    atomic.Uint64
	openedMapFiles  atomic.Uint64
	openedPath      atomic.Uint64
	// openMapFiles opens /proc/PID/map_files entries (nil: openNonblock);
	// tests refuse it.
	openMapFiles opener
}

// CheckSupport probes the kernel for everything Load and AttachLibrary need
// and returns the first thing missing, wrapping ErrNotSupported or
// ErrPermission. It does not check ref_ctr_offset (only the CUPTI probe needs
// it; see CheckRefCtrSupport).
func CheckSupport() error {
	checks := []struct {
		what string
		fn   func() error
	}{
		{"kprobe/uprobe BPF programs", func() error { return features.HaveProgramType(ebpf.Kprobe) }},
		{"BPF ring buffer maps (Linux 5.8+)", func() error { return features.HaveMapType(ebpf.RingBuf) }},
		{"BPF LRU hash maps", func() error { return features.HaveMapType(ebpf.LRUHash) }},
		{"BPF per-CPU array maps", func() error { return features.HaveMapType(ebpf.PerCPUArray) }},
		{"bpf_ringbuf_reserve helper", func() error { return features.HaveProgramHelper(ebpf.Kprobe, asm.FnRingbufReserve) }},
		{"bpf_probe_read_user helper (Linux 5.5+)", func() error { return features.HaveProgramHelper(ebpf.Kprobe, asm.FnProbeReadUser) }},
		{"uprobes (CONFIG_UPROBE_EVENTS)", haveUprobes},
	}
	for _, c := range checks {
		if err := c.fn(); err != nil {
			return classify(c.what, err)
		}
	}
	return nil
}

// CheckRefCtrSupport reports whether uprobes can carry a reference counter
// (ref_ctr_offset, Linux 4.20+), which gates the CUPTI injection library.
func CheckRefCtrSupport() error {
	_, err := os.Stat("/sys/bus/event_source/devices/uprobe/format/ref_ctr_offset")
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("uprobe ref_ctr_offset (Linux 4.20+): %w", ErrNotSupported)
	}
	if err != nil {
		return fmt.Errorf("uprobe ref_ctr_offset: %w", err)
	}
	return nil
}

// CheckUprobeMultiSupport reports whether the kernel has uprobe_multi links
// (Linux 6.6+), which Load uses unless Options.SingleUprobes is set.
func CheckUprobeMultiSupport() error {
	if err := features.HaveBPFLinkUprobeMulti(); err != nil {
		return classify("uprobe_multi links (Linux 6.6+)", err)
	}
	return nil
}

func haveUprobes() error {
	for _, p := range []string{
		"/sys/bus/event_source/devices/uprobe/type",
		"/sys/kernel/tracing/uprobe_events",
		"/sys/kernel/debug/tracing/uprobe_events",
	} {
		if _, err := os.Stat(p); err == nil {
			return nil
		}
	}
	return ErrNotSupported
}

// classify wraps err once, mapping permission problems to ErrPermission.
func classify(what string, err error) error {
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) || errors.Is(err, os.ErrPermission) {
		return fmt.Errorf("%s: %w: %w", what, ErrPermission, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Load loads and verifies the BPF objects. It removes the memlock rlimit of
// the calling process when the kernel still charges BPF memory to it (< 5.11).
// The caller must Close the result.
func Load(opts Options) (*Probes, error) {
	spec, err := loadSlowrank()
	if err != nil {
		return nil, fmt.Errorf("parse bpf object: %w", err)
	}
	if err := prepareSpec(spec, opts); err != nil {
		return nil, err
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, classify("remove memlock rlimit", err)
	}
	multi := !opts.SingleUprobes && CheckUprobeMultiSupport() == nil
	selectPrograms(spec, multi)
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		if serr := CheckSupport(); serr != nil {
			return nil, serr
		}
		return nil, classify("load bpf objects", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		coll.Close()
		return nil, fmt.Errorf("count possible cpus: %w", err)
	}
	return &Probes{
		coll:        coll,
		events:      coll.Maps["events"],
		tracked:     coll.Maps["tracked_tgids"],
		counters:    coll.Maps["counters"],
		log:         log.With("component", "bpf"),
		ncpu:        ncpu,
		poll:        cmp.Or(opts.PollInterval, DefaultPollInterval),
		multi:       multi,
		attachments: map[*Attachment]struct{}{},
		readers:     map[*Reader]struct{}{},
	}, nil
}

// selectPrograms keeps the programs of one kind of uprobe link. With
// uprobe_multi (multi), the shared multi_* programs, one per record type and
// direction: one link per library, probe class and direction carries all the
// class's functions, each with its probe id and argument layout in its
// attach cookie. Otherwise the per-function programs of perf-event uprobes,
// which kernels without uprobe_multi can load.
//
// Why uprobe_multi, and why one link per class: a perf-event uprobe waits
// for its own grace periods, and the kernel runs those teardowns one after
// another even when they are closed concurrently (6.5 s for the 37 functions
// of the fake libraries on 6.18; up to 24 s seen for a real training
// process), while a uprobe_multi link unregisters all its addresses and then
// waits once. And a process that dies (a SIGKILLed agent) has the kernel
// release its links one after another, about 50 ms each: about 2.3 s for
// the 43 per-function links of the fake job, about 0.5 s for its 10
// per-class ones (docs/internals.md, "A killed agent").
func selectPrograms(spec *ebpf.CollectionSpec, multi bool) {
	for name, ps := range spec.Programs {
		if ps.Type != ebpf.Kprobe {
			continue
		}
		if isMultiSection(ps.SectionName) != multi {
			delete(spec.Programs, name)
		}
	}
}

// isMultiSection reports whether a program's section makes it a uprobe_multi
// program (libbpf's "uprobe.multi" and "uretprobe.multi").
func isMultiSection(sec string) bool {
	return strings.HasPrefix(sec, "uprobe.multi") || strings.HasPrefix(sec, "uretprobe.multi")
}

// UprobeMulti reports whether the probes attach through uprobe_multi links.
func (p *Probes) UprobeMulti() bool { return p.multi }

// prepareSpec checks the object version and applies the sizes of opts.
func prepareSpec(spec *ebpf.CollectionSpec, opts Options) error {
	v, ok := spec.Variables["slowrank_events_version"]
	if !ok {
		return fmt.Errorf("bpf object lacks slowrank_events_version")
	}
	var version uint32
	if err := v.Get(&version); err != nil {
		return fmt.Errorf("read slowrank_events_version: %w", err)
	}
	if version != EventsVersion {
		return fmt.Errorf("bpf object has events version %d, decoder wants %d", version, EventsVersion)
	}
	for _, name := range []string{"events", "inflight", "tracked_tgids", "counters"} {
		if spec.Maps[name] == nil {
			return fmt.Errorf("bpf object lacks map %q", name)
		}
	}
	ring := opts.RingBufferSize
	if ring == 0 {
		ring = DefaultRingBufferSize
	}
	page := os.Getpagesize()
	if ring < page || ring&(ring-1) != 0 || ring%page != 0 || ring > 1<<30 {
		return fmt.Errorf("ring buffer size %d: want a power of two, a multiple of %d, at most 1 GiB", ring, page)
	}
	spec.Maps["events"].MaxEntries = uint32(ring)
	wake := cmp.Or(opts.WakeupBytes, DefaultWakeupBytes)
	if wake < 0 {
		return fmt.Errorf("wakeup bytes %d out of range", wake)
	}
	wake = min(wake, ring/2)
	wv, ok := spec.Variables["wakeup_bytes"]
	if !ok {
		return fmt.Errorf("bpf object lacks wakeup_bytes")
	}
	if err := wv.Set(uint64(wake)); err != nil {
		return fmt.Errorf("set wakeup_bytes: %w", err)
	}
	if opts.PollInterval < 0 {
		return fmt.Errorf("poll interval %v out of range", opts.PollInterval)
	}
	if n := opts.InflightEntries; n != 0 {
		if n < 0 || n > 1<<24 {
			return fmt.Errorf("inflight entries %d out of range", n)
		}
		spec.Maps["inflight"].MaxEntries = uint32(n)
	}
	if n := opts.MaxTracked; n != 0 {
		if n < 0 || n > 1<<22 {
			return fmt.Errorf("max tracked %d out of range", n)
		}
		spec.Maps["tracked_tgids"].MaxEntries = uint32(n)
	}
	return nil
}

// Track makes the probes record calls of process tgid. rank is stored as the
// map value (informational). Tracking an already tracked tgid updates it.
func (p *Probes) Track(tgid, rank uint32) error {
	if err := p.tracked.Put(tgid, rank); err != nil {
		return fmt.Errorf("track pid %d: %w", tgid, err)
	}
	return nil
}

// Untrack stops recording process tgid. Untracking an unknown tgid is not an
// error.
func (p *Probes) Untrack(tgid uint32) error {
	if err := p.tracked.Delete(tgid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("untrack pid %d: %w", tgid, err)
	}
	return nil
}

// Stats are the BPF per-CPU counters summed over CPUs, plus attach counts
// kept in Go. All are totals since Load.
type Stats struct {
	Events           uint64 // records submitted to the ring buffer
	RingBufFull      uint64 // records lost: ring buffer reserve failed
	BatchOversize    uint64 // CUPTI batches lost: len > BatchMax
	MissingEntry     uint64 // returns of tracked processes without an entry
	Filtered         uint64 // calls of untracked processes (not an error)
	ReadFault        uint64 // failed reads of user memory
	EntryOverwritten uint64 // entries that replaced a pending one (recursion, lost return)
	InflightFailed   uint64 // entries that could not be stored: that call is lost

	LibrariesAttached  uint64 // AttachLibrary calls that attached at least one symbol
	LibrariesStripped  uint64 // libraries without .symtab (dynamic symbols only)
	LibrariesNoSymbols uint64 // libraries with no symbols at all: nothing attached
	SymbolsAttached    uint64
	SymbolsMissing     uint64 // required and optional symbols not found
	AttachErrors       uint64 // symbols found but not attachable
	// FilesRefused counts attaches and re-attaches refused because the
	// path opened another file than the one mapped (ErrFileChanged).
	FilesRefused uint64
	// OpenedMapFiles and OpenedPath count the library files attaches and
	// re-attaches opened through the mapping (/proc/PID/map_files) and,
	// where that failed, through the path checked against the mapping.
	OpenedMapFiles, OpenedPath uint64
}

// Lost is the number of records lost in BPF.
func (s Stats) Lost() uint64 { return s.RingBufFull + s.BatchOversize + s.InflightFailed }

// Stats reads the counters.
func (p *Probes) Stats() (Stats, error) {
	var c [8]uint64
	values := make([]uint64, p.ncpu)
	for i := range c {
		if err := p.counters.Lookup(uint32(i), &values); err != nil {
			return Stats{}, fmt.Errorf("read counter %d: %w", i, err)
		}
		for _, v := range values {
			c[i] += v
		}
	}
	return Stats{
		Events:             c[0],
		RingBufFull:        c[1],
		BatchOversize:      c[2],
		MissingEntry:       c[3],
		Filtered:           c[4],
		ReadFault:          c[5],
		EntryOverwritten:   c[6],
		InflightFailed:     c[7],
		LibrariesAttached:  p.libsAttached.Load(),
		LibrariesStripped:  p.libsStripped.Load(),
		LibrariesNoSymbols: p.libsNoSymbols.Load(),
		SymbolsAttached:    p.symbolsAttached.Load(),
		SymbolsMissing:     p.symbolsMissing.Load(),
		AttachErrors:       p.attachErrors.Load(),
		FilesRefused:       p.filesRefused.Load(),
		OpenedMapFiles:     p.openedMapFiles.Load(),
		OpenedPath:         p.openedPath.Load(),
	}, nil
}

// Close releases everything in this order: readers (unblocking Read), then
// attachments (uprobe links; semaphores drop to 0), then maps and programs.
// Detaching waits for kernel grace periods: well under a second with
// uprobe_multi links, about 0.1 s per function with perf-event uprobes.
// Closing twice is a no-op. Callers may close readers and attachments
// themselves earlier, in the same order.
func (p *Probes) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	readers := p.readers
	atts := p.attachments
	p.readers, p.attachments = nil, nil
	p.mu.Unlock()

	var errs []error
	for r := range readers {
		errs = append(errs, r.close())
	}
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	for a := range atts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := a.close()
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}()
	}
	wg.Wait()
	p.coll.Close()
	return errors.Join(errs...)
}

func (p *Probes) forget(a *Attachment) {
	p.mu.Lock()
	delete(p.attachments, a)
	p.mu.Unlock()
}

func (p *Probes) forgetReader(r *Reader) {
	p.mu.Lock()
	delete(p.readers, r)
	p.mu.Unlock()
}
