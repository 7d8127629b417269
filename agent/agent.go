package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slowrank/slowrank/agent/capture"
	"github.com/slowrank/slowrank/agent/discover"
	"github.com/slowrank/slowrank/agent/duty"
	"github.com/slowrank/slowrank/agent/gpu"
	"github.com/slowrank/slowrank/agent/pipeline"
	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/correlate"
	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/internal/monoclock"
)

// Config configures an Agent.
type Config struct {
	// ProcRoot is the proc filesystem ("" for /proc).
	ProcRoot string
	Selector Selector
	// HostName names this host in facts.
	HostName string
	// Job overrides the job id found in the processes' environment.
	Job string
	// Epoch is the attach epoch carried by facts: it grows across agent
	// restarts so that a restarted agent never double-counts a step.
	Epoch int

	Detector  detector.Config
	Correlate correlate.Config
	Duty      duty.Config
	// DeviceCollection lets the agent steer the injection library's duty
	// cycle; without it the library keeps its built-in default.
	DeviceCollection bool
	// StepMarker names a probed synchronisation (e.g. "cudaDeviceSynchronize")
	// whose every return ends a step, overriding step detection from the
	// collective period. Gloo jobs need it: torch c10d probes do not see
	// tensor sizes, so bucketed all-reduces look alike.
	StepMarker string
	// ProbeTorch attaches the torch c10d probes (gloo jobs need them; with
	// NCCL they double the probes per collective).
	ProbeTorch bool
	// NCCLPlugin takes a process's NCCL collectives from the injection
	// library's profiler-plugin records once it has them (experimental:
	// the correlator does not yet find the steps after a process's switch
	// from the uprobes to the plugin). Off, the records are counted and
	// ignored and the libnccl uprobes, which stay attached, report.
	NCCLPlugin bool

	RingBufferSize int
	// SingleUprobes uses perf-event uprobes even where the kernel has
	// uprobe_multi links (bpf.Options.SingleUprobes).
	SingleUprobes bool
	// Tick is how often event time advances (steps released, windows
	// settled by the wall clock).
	Tick time.Duration
	// InputQueue bounds the records between the ring-buffer reader and the
	// pipeline; overflow is counted as lost records.
	InputQueue int
	// ForgetDelay is how long records of an exited process may still arrive.
	ForgetDelay time.Duration
	// MaxMemory bounds the agent's resident memory in bytes (0: no bound).
	// New sets the Go runtime's soft memory limit for the whole process to
	// GoMemoryLimit(MaxMemory, RingBufferSize) and, unless GOGC is set, lets
	// the heap grow 4x between collections (the limit caps it); RSS samples
	// above MaxMemory are counted in memory_over_bound.
	MaxMemory int64

	Sinks []Sink
	// Dump, when set, receives every capture record (correlate.HostCall,
	// DeviceInterval, CommInit, ...) on the pipeline goroutine: debugging
	// and validation (clock agreement of host and device records). It must
	// not block.
	Dump   func(any)
	Logger *slog.Logger
}

// Selector says which processes are ranks (discover.Selector says how).
type Selector = discover.Selector

// Sink receives the agent's results: facts, topologies and settled windows
// with their verdicts, from the pipeline (pipeline.Sink says how).
type Sink = pipeline.Sink

// DefaultConfig returns working defaults.
func DefaultConfig() Config {
	return Config{
		Detector: detector.DefaultConfig(), Duty: duty.DefaultConfig(), DeviceCollection: true,
		RingBufferSize: 8 << 20, Tick: 200 * time.Millisecond, InputQueue: 1 << 16, ForgetDelay: time.Second,
		Epoch: int(time.Now().Unix()),
	}
}

// gpuSource is NVML's GPU evidence (agent/gpu) as the agent uses it: Run
// on its own goroutine, the rest from the main goroutine.
type gpuSource interface {
	Run(ctx context.Context, every time.Duration, count func(name string, n int64))
	ForPID(pid int, start, end int64) *detector.GPUEvidence
	Placement(pid int) (detector.RankGPU, bool)
	Close() error
}

// Agent watches training processes and judges their ranks. Start it with Run;
// Run returns after the context is cancelled, once the last window has been
// settled and handed to the sinks.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	probes  *bpf.Probes
	reader  *bpf.Reader
	watcher *discover.Watcher
	pipe    *pipeline.Pipeline
	duty    *duty.Ledger
	conv    *capture.Converter
	// tids translates injection-library thread ids into host ones, for
	// the converter and the attacher alike.
	tids     *capture.TIDMap
	counters *counters
	// queue takes the reader goroutine's records to the main goroutine,
	// bounded by Config.InputQueue.
	queue *pipeline.Queue
	// ctl runs functions on the main goroutine (runtime control).
	ctl     chan func()
	att     *attacher
	started time.Time

	// gpu samples NVML for verdict evidence (a *gpu.Evidence); nil
	// without NVML.
	gpu gpuSource
	// probeCounts counts events per probe id (the hot path avoids the map).
	probeCounts [256]atomic.Uint64
	trapsSeen   [256]uint64 // probeCounts fed to the duty ledger (main goroutine)
	// pluginOpsSeen is capture.PluginOps fed to the duty ledger (main
	// goroutine).
	pluginOpsSeen int64
	// kchLogged is the kernel-channel trial's state last logged (main
	// goroutine).
	kchLogged string

	planMu sync.Mutex
	plan   *duty.Plan // last duty plan applied, for Status

	control controlState // runtime control (control.go), main goroutine only
	// lastControl is the control state as of the last refreshCounters,
	// for Observe (which must not wait for the main goroutine).
	lastControl atomic.Pointer[ControlState]

	lastMemStats time.Time // main goroutine only (refreshRuntime)
	overBound    bool
}

func (a *Agent) dutyPlan() *duty.Plan {
	a.planMu.Lock()
	defer a.planMu.Unlock()
	return a.plan
}

// New checks that this host supports the agent, loads the BPF programs and
// prepares discovery. Nothing is attached until Run. On error, everything
// acquired so far is released.
func New(cfg Config) (*Agent, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	log := cfg.Logger.With("component", "agent")
	if cfg.Tick <= 0 || cfg.InputQueue <= 0 {
		return nil, errors.New("agent config: tick and input queue must be positive")
	}
	if err := applyMemoryBound(cfg); err != nil { // limits.go
		return nil, fmt.Errorf("agent config: %w", err)
	}
	det, err := detector.New(cfg.Detector)
	if err != nil {
		return nil, err
	}
	w, err := discover.NewWatcher(discover.WatcherConfig{ProcRoot: cfg.ProcRoot, Selector: cfg.Selector, Logger: cfg.Logger.With("component", "discovery")})
	if err != nil {
		return nil, err
	}
	if err := bpf.CheckSupport(); err != nil {
		return nil, fmt.Errorf("this host cannot run the agent: %w", err)
	}
	// BPF wakes the reader once 1/16 of the ring is pending (else every
	// poll interval, which bounds the latency): fewer blocking reads, and
	// fewer Go sysmon wake-ups behind them (a tenth less CPU per event).
	probes, err := bpf.Load(bpf.Options{RingBufferSize: cfg.RingBufferSize, WakeupBytes: max(cfg.RingBufferSize/16, 4096), SingleUprobes: cfg.SingleUprobes, Logger: cfg.Logger.With("component", "bpf")})
	if err != nil {
		return nil, fmt.Errorf("load BPF programs: %w", err)
	}
	reader, err := probes.NewReader()
	if err != nil {
		_ = probes.Close() // nothing attached yet: the reader's error is the one to return
		return nil, fmt.Errorf("open ring buffer: %w", err)
	}
	c := newCounters()
	if cfg.Correlate.Host == "" {
		cfg.Correlate.Host = cfg.HostName
	}
	var ledger *duty.Ledger
	if cfg.Duty.Period > cfg.Detector.Window {
		// Every window needs some covered steps, or the device phases of
		// the windows without any are not judged and streaks break. (When
		// the budget leaves blocks too short to hold a few steps, the
		// plan doubles the period anyway: duty.Ledger.period.)
		cfg.Duty.Period = cfg.Detector.Window
	}
	if cfg.DeviceCollection {
		ledger = duty.New(cfg.Duty)
	}
	var marker bpf.ProbeID
	if cfg.StepMarker != "" {
		id, ok := markerProbe(cfg.StepMarker)
		if !ok {
			_ = probes.Close() // nothing attached yet: the configuration's error is the one to return
			return nil, fmt.Errorf("step marker %q is not a probed synchronisation call (try cudaDeviceSynchronize, cudaStreamSynchronize, cuCtxSynchronize)", cfg.StepMarker)
		}
		marker = id
	}
	tids := capture.NewTIDMap(cfg.ProcRoot)
	a := &Agent{
		cfg: cfg, log: log, probes: probes, reader: reader, watcher: w, duty: ledger,
		conv:     capture.New(capture.Config{Count: c.add, NCCLPlugin: cfg.NCCLPlugin, Marker: marker, TIDs: tids}),
		tids:     tids,
		counters: c,
		queue:    pipeline.NewQueue(cfg.InputQueue),
		ctl:      make(chan func()),
		started:  time.Now(),
	}
	pc := pipeline.Config{Log: log, Correlator: correlate.New(cfg.Correlate), Detector: det, Sinks: cfg.Sinks, Dump: cfg.Dump, Count: c.add}
	if ledger != nil { // a nil *duty.Ledger in the interface would not read as nil
		pc.Duty = ledger
	}
	if nv, err := gpu.OpenNVML(); err == nil {
		a.gpu = gpu.NewEvidence(nv)
		pc.Evidence = a.gpuEvidenceFor
	} else {
		log.Info("no GPU evidence for verdicts", "reason", err)
	}
	a.pipe = pipeline.New(pc)
	a.att = newAttacher(a)
	return a, nil
}

// Run attaches to training processes as they appear and runs until ctx is
// cancelled; then it detaches, settles the last window and returns. It
// returns an error, after the same orderly stop, when the process watcher
// cannot list processes at all: nothing would ever be attached.
func (a *Agent) Run(ctx context.Context) error {
	wctx, stopWatch := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	watchErr := make(chan error, 1)
	go func() { defer wg.Done(); watchErr <- a.watcher.Run(wctx) }()
	if a.gpu != nil {
		wg.Add(1)
		go func() { defer wg.Done(); a.gpu.Run(wctx, time.Second, a.counters.add) }()
	}
	readDone := make(chan struct{})
	go func() { defer wg.Done(); defer close(readDone); a.readLoop() }()

	tick := time.NewTicker(a.cfg.Tick)
	defer tick.Stop()
	var lastDuty, lastPlaced time.Time
	var runErr error
	events := a.watcher.Events()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case ev, ok := <-events:
			if ok {
				a.att.handle(ev)
				continue
			}
			// The watcher stopped before us: only its first poll ends it
			// (the proc tree cannot be listed). A closed channel is always
			// ready: stop reading it either way.
			events = nil
			if err := <-watchErr; err != nil {
				runErr = fmt.Errorf("watch processes: %w", err)
				break loop
			}
		case batch := <-a.queue.C():
			a.handleBatch(batch)
		case f := <-a.ctl:
			f()
		case now := <-tick.C:
			mono := monotonicNow()
			a.att.forgetDue(mono)
			a.att.tendCUPTI(mono)
			a.att.tendPlugin(mono)
			a.drainInput()
			a.pipe.Tick(mono)
			if a.duty != nil && now.Sub(lastDuty) >= time.Second {
				lastDuty = now
				a.planDuty(mono) // dutyplan.go
			}
			if a.gpu != nil && now.Sub(lastPlaced) >= time.Second { // NVML's sampling period
				lastPlaced = now
				a.refreshPlacements() // attacher.go, placeGPU
			}
			a.refreshCounters()
		}
	}
	a.log.Info("stopping: detaching and settling the last window")
	stopWatch()
	detachStart := time.Now()
	a.att.detachAll()
	a.log.Debug("detached", "took", time.Since(detachStart).Round(time.Millisecond))
	if err := a.reader.Flush(); err != nil && !errors.Is(err, bpf.ErrClosed) {
		a.log.Warn("flush ring buffer", "err", err)
	}
	select {
	case <-readDone:
	case <-time.After(2 * time.Second):
		a.counters.add("shutdown_read_timeout", 1)
		_ = a.reader.Close() // only to unblock the stuck read (counted above): the agent is stopping
	}
	a.drainInput()
	a.pipe.Flush(monotonicNow())
	wg.Wait()
	if a.duty != nil {
		p := a.duty.Plan(monotonicNow())
		o := p.Overhead
		args := []any{"budget", fmt.Sprintf("%.4f", o.Budget), "spent", fmt.Sprintf("%.4f", o.Total),
			"device", fmt.Sprintf("%.4f", o.Device), "uprobes", fmt.Sprintf("%.4f", o.Uprobes),
			"uprobes_hidden", fmt.Sprintf("%.4f", o.UprobesHidden)}
		if o.NCCLPlugin > 0 {
			args = append(args, "nccl_plugin", fmt.Sprintf("%.4f", o.NCCLPlugin))
		}
		a.log.Info("overhead", append(args,
			"cost", fmt.Sprintf("%.4f", o.Cost.Cost), "cost_ci", fmt.Sprintf("[%.4f, %.4f]", o.Cost.Low, o.Cost.High),
			"pairs", o.Cost.Pairs, "measured", o.Cost.Measured, "share", fmt.Sprintf("%.4f", p.OnShare),
			"escalations_granted", o.EscalationsGranted, "escalations_refused", o.EscalationsRefused)...)
	}
	a.refreshCounters()
	return runErr
}

// do runs f on the agent's main goroutine, where the attacher, pipeline and
// detector live, and waits for it. It fails when ctx ends first (the agent
// is not running or stopping).
func (a *Agent) do(ctx context.Context, f func()) error {
	done := make(chan struct{})
	select {
	case a.ctl <- func() { f(); close(done) }:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// readLoop moves ring-buffer events into the pipeline's queue without ever
// blocking on it: a full queue counts the lost records. Records go in
// batches, handed over when a batch is full or the ring buffer has nothing
// more to read, so batching adds no latency.
func (a *Agent) readLoop() {
	batch := a.queue.Get()
	events := int64(0) // counted once per hand-over, not per record
	handOver := func() {
		if events > 0 {
			a.counters.add("events", events)
			events = 0
		}
		n := int64(len(batch))
		var ok bool
		if batch, ok = a.queue.Offer(batch); !ok {
			a.counters.add("events_lost_queue", n)
		}
	}
	defer handOver()
	for {
		if n := len(batch); n >= pipeline.Batch || (n+int(events) > 0 && a.reader.Pending() == 0) {
			handOver()
		}
		ev, err := a.reader.Next() // valid until the next call: convert copies it
		switch {
		case errors.Is(err, bpf.ErrFlushed), errors.Is(err, bpf.ErrClosed):
			return
		case errors.Is(err, bpf.ErrMalformed):
			a.counters.add("events_malformed", 1)
			continue
		case err != nil:
			a.counters.add("read_errors", 1)
			a.log.Warn("read ring buffer", "err", err)
			return
		}
		events++
		if id := ev.Base().Probe; int(id) < len(a.probeCounts) {
			a.probeCounts[id].Add(1)
		}
		batch = a.conv.Convert(ev, batch)
	}
}

// handleBatch feeds a batch from readLoop to the pipeline.
func (a *Agent) handleBatch(batch []pipeline.Input) {
	for i := range batch {
		if c, ok := batch[i].Other().(capture.CUPTICall); ok {
			a.att.foreignCUPTICall(c) // the attacher's, not the pipeline's
			continue
		}
		a.pipe.Feed(batch[i])
	}
	a.queue.Done(batch)
}

// drainInput hands everything queued to the pipeline (before a tick, so that
// a tick sees all records that had arrived).
func (a *Agent) drainInput() {
	for {
		select {
		case batch := <-a.queue.C():
			a.handleBatch(batch)
		case f := <-a.ctl:
			f()
		default:
			return
		}
	}
}

// gpuEvidenceFor finds the GPU of (job, rank) through its process and
// summarises NVML's samples over the window. Main goroutine only.
func (a *Agent) gpuEvidenceFor(job string, rank int, start, end int64) *detector.GPUEvidence {
	for _, pe := range a.att.procs {
		if pe.job == job && pe.rank == rank {
			return a.gpu.ForPID(pe.proc.PID, start, end)
		}
	}
	return nil
}

// Close releases the BPF objects (links, maps, programs). Call it after Run.
func (a *Agent) Close() error {
	var gerr error
	if a.gpu != nil {
		gerr = a.gpu.Close()
	}
	return errors.Join(gerr, a.probes.Close())
}

func (a *Agent) refreshCounters() {
	if st, err := a.probes.Stats(); err == nil {
		a.counters.set("ringbuf_lost", int64(st.Lost()))
		a.counters.set("attach_files_refused", int64(st.FilesRefused))
		a.counters.set("attach_opened_map_files", int64(st.OpenedMapFiles))
		a.counters.set("attach_opened_path", int64(st.OpenedPath))
	}
	a.counters.set("events_decoded", int64(a.reader.Decoded()))
	if p50, p99, ok := a.conv.LatencyQuantiles(); ok {
		a.counters.set("device_latency_p50_us", p50/1000)
		a.counters.set("device_latency_p99_us", p99/1000)
	}
	for id := range a.probeCounts {
		if n := a.probeCounts[id].Load(); n > 0 {
			a.counters.set("probe_"+bpf.ProbeID(id).String(), int64(n))
		}
	}
	ws := a.watcher.Stats()
	a.counters.set("processes_tracked", int64(ws.Tracked))
	a.counters.set("processes_added", int64(ws.ProcessesAdded))
	a.counters.set("processes_exited", int64(ws.ProcessesExited))
	a.counters.set("discovery_denied", int64(ws.Denied))
	a.counters.set("discovery_oversized", int64(ws.Oversized))
	a.counters.set("discovery_refused_policy", int64(ws.RefusedPolicy))
	a.counters.set("discovery_refused_quota", int64(ws.RefusedQuota))
	a.counters.set("discovery_events_deferred", int64(ws.EventsDeferred))
	a.counters.set("input_queue_len", a.queue.Len())
	a.refreshPipeline()
	a.refreshSinks()
	a.refreshRuntime()
	cs := a.controlState()
	a.lastControl.Store(&cs)
}

// Summaries returns the detector's end-of-run summaries; call after Run.
func (a *Agent) Summaries() []detector.Summary { return a.pipe.Summaries() }

// Counters returns a copy of the agent's health counters.
func (a *Agent) Counters() map[string]int64 { return a.counters.snapshot() }

// markerProbe finds the synchronisation probe named name.
func markerProbe(name string) (bpf.ProbeID, bool) {
	for _, s := range bpf.Specs() {
		if s.Class == bpf.ClassSyncWait && s.Name() == name {
			return s.ID, true
		}
	}
	return 0, false
}

// monotonicNow is CLOCK_MONOTONIC, the clock of the BPF records and the
// library's batches (one reader for the whole module: internal/monoclock).
func monotonicNow() int64 { return monoclock.Now() }

// refreshPlacements sends again the identity of each rank whose GPU NVML
// found (or moved: the context that holds most memory changed) since: a
// process creates its CUDA context after discovery found it, so its first
// RankInfo rarely has one. Main goroutine only.
func (a *Agent) refreshPlacements() {
	for _, pe := range a.att.procs {
		if a.att.placeGPU(pe) {
			a.log.Debug("rank's GPU found", "pid", pe.proc.PID, "rank", pe.rank, "gpu", pe.info.Placement.GPU.Index, "uuid", pe.info.Placement.GPU.UUID)
			a.pipe.SetRank(pe.info)
		}
	}
}
