package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/signal"
	"os/user"
	"regexp"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/urfave/cli/v2"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/slowrank/slowrank/agent"
	"github.com/slowrank/slowrank/agent/discover"
	"github.com/slowrank/slowrank/agent/duty"
	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/otel/export"
	"github.com/slowrank/slowrank/selfmetrics"
)

func agentCommand() *cli.Command {
	return &cli.Command{
		Name:      "agent",
		Usage:     "watch training processes on this host and report the slow rank (root)",
		UsageText: "slowrank agent [--pid N ...] [--match REGEX] [--facts F] [--verdicts F] [--window 5s] [--live]",
		Description: "Finds training processes (default: processes whose environment has RANK; or\n" +
			"--pid, --match), attaches eBPF uprobes to the NCCL, CUDA and torch libraries they\n" +
			"map, steers the CUPTI injection library's duty cycle under an overhead budget,\n" +
			"cuts steps and phases, judges ranks and exports OpenTelemetry spans and metrics\n" +
			"per the standard OTEL_* variables. SIGINT/SIGTERM stop it after the last window\n" +
			"is settled and exported. Needs root, or CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, CAP_SYS_ADMIN\n" +
			"(uprobes on Linux 6.16+), CAP_DAC_READ_SEARCH and CAP_DAC_OVERRIDE (processes of other\n" +
			"users); it refuses to start without a required one and drops all others at start.",
		Flags: append([]cli.Flag{
			&cli.IntSliceFlag{Name: "pid", Usage: "watch this process (repeatable); it must exist", EnvVars: []string{"SLOWRANK_PID"}},
			&cli.StringFlag{Name: "match", Usage: "watch processes whose executable, comm or command line matches this regexp", EnvVars: []string{"SLOWRANK_MATCH"}},
			&cli.StringFlag{Name: "env-key", Value: "RANK", Usage: "without --pid/--match: watch processes whose environment has this variable", EnvVars: []string{"SLOWRANK_ENV_KEY"}},
			&cli.StringSliceFlag{Name: "allow-uid", Usage: "only processes of this user (uid or name; repeatable) may be ranks, with those of --allow-cgroup (default: every owner)", EnvVars: []string{"SLOWRANK_ALLOW_UID"}},
			&cli.StringSliceFlag{Name: "allow-cgroup", Usage: "only processes in this cgroup v2 subtree (e.g. /kubepods.slice, /system.slice/slurmstepd.scope; repeatable) may be ranks, with those of --allow-uid", EnvVars: []string{"SLOWRANK_ALLOW_CGROUP"}},
			&cli.IntFlag{Name: "owner-quota", Value: discover.DefaultOwnerQuota, Usage: "processes tracked at most per owner (a uid; for root, a cgroup), so that one owner's flood cannot take every slot", EnvVars: []string{"SLOWRANK_OWNER_QUOTA"}},
			&cli.StringFlag{Name: "facts", Usage: "write step and topology facts (JSONL) to this file", EnvVars: []string{"SLOWRANK_FACTS"}},
			&cli.StringFlag{Name: "verdicts", Usage: "write verdicts and a final summary (JSONL) to this file", EnvVars: []string{"SLOWRANK_VERDICTS"}},
			&cli.StringFlag{Name: "host-name", Usage: "host name in facts and telemetry (default: os.Hostname)", EnvVars: []string{"SLOWRANK_HOST_NAME"}},
			&cli.StringFlag{Name: "job", Usage: "job id (default: from the processes' environment, e.g. TORCHELASTIC_RUN_ID)", EnvVars: []string{"SLOWRANK_JOB"}},
			&cli.Float64Flag{Name: "overhead-budget", Value: duty.DefaultConfig().Budget, Usage: "overhead the agent may add to training (uprobes, device records, escalations), as a fraction of step time", EnvVars: []string{"SLOWRANK_OVERHEAD_BUDGET"}},
			&cli.DurationFlag{Name: "uprobe-cost", Value: duty.DefaultConfig().UprobeCost, Usage: "cost of one uprobe trap in a training process, charged to the overhead budget where it lengthens the step (conservative: the H200 measured 1.0-1.35us a trap in a host-bound NCCL loop)", EnvVars: []string{"SLOWRANK_UPROBE_COST"}},
			&cli.DurationFlag{Name: "nccl-plugin-cost", Value: duty.DefaultConfig().NCCLPluginCost, Usage: "cost of one NCCL operation the injection library records as NCCL's profiler plugin (--nccl-plugin), charged to the overhead budget in full (twice the upper end the H200 measured, 0.29-0.49us an operation: kernel-channel events were not measured)", EnvVars: []string{"SLOWRANK_NCCL_PLUGIN_COST"}},
			&cli.BoolFlag{Name: "device-collection", Value: true, Usage: "steer the injection library's duty cycle (off: leave its default)", EnvVars: []string{"SLOWRANK_DEVICE_COLLECTION"}},
			&cli.StringFlag{Name: "step-marker", Usage: "end a step at every return of this synchronisation call (e.g. cudaDeviceSynchronize) instead of detecting steps from the collective period", EnvVars: []string{"SLOWRANK_STEP_MARKER"}},
			&cli.BoolFlag{Name: "nccl-plugin", Usage: "take NCCL collectives from the injection library's profiler-plugin records where a job sets NCCL_PROFILER_PLUGIN to it (experimental: a libnccl file's collective uprobes are detached once every process mapping it is on the plugin path, and attached again when one is not; its comm-init and group uprobes stay; not yet run on a real NCCL); off: the uprobes report", EnvVars: []string{"SLOWRANK_NCCL_PLUGIN"}},
			&cli.StringFlag{Name: "nccl-kernel-channels", Value: "auto", Usage: "the NCCL plugin's kernel-channel events (GPU start and end of each collective: the device arrival order), in the duty cycle's on-phases: auto measures their cost apart (on-blocks with and without them) and keeps them only below 1 % of step time in an on-phase, so that an NCCL release whose profiler path regressed is found by measurement; on; off", EnvVars: []string{"SLOWRANK_NCCL_KERNEL_CHANNELS"}},
			&cli.BoolFlag{Name: "probe-torch", Usage: "attach torch c10d probes: needed for gloo jobs (blocking coll_wait); NCCL jobs are seen through libnccl", EnvVars: []string{"SLOWRANK_PROBE_TORCH"}},
			&cli.StringFlag{Name: "otel", Value: "auto", Usage: "OpenTelemetry export: auto (on when OTEL_EXPORTER_OTLP_ENDPOINT is set), on, off, stdout", EnvVars: []string{"SLOWRANK_OTEL"}},
			&cli.IntFlag{Name: "sample-every", Value: 20, Usage: "export every rank's span of one step in N as a baseline (anomalous windows: all)", EnvVars: []string{"SLOWRANK_SAMPLE_EVERY"}},
			&cli.StringFlag{Name: "dump-events", Usage: "write every raw capture record (host calls, device intervals) as JSONL to this file (debugging; large)", EnvVars: []string{"SLOWRANK_DUMP_EVENTS"}},
			&cli.BoolFlag{Name: "live", Usage: "print a live per-rank table to stdout", EnvVars: []string{"SLOWRANK_LIVE"}},
			&cli.DurationFlag{Name: "live-interval", Value: time.Second, Usage: "refresh period of the live table", EnvVars: []string{"SLOWRANK_LIVE_INTERVAL"}},
			&cli.DurationFlag{Name: "duration", Usage: "stop after this long (0: until SIGINT/SIGTERM)", EnvVars: []string{"SLOWRANK_DURATION"}},
			&cli.BoolFlag{Name: "single-uprobes", Usage: "attach one perf-event uprobe per function even where the kernel has uprobe_multi links (Linux 6.6+); detaching then takes about 0.1 s per function", EnvVars: []string{"SLOWRANK_SINGLE_UPROBES"}},
			&cli.IntFlag{Name: "ringbuf-size", Value: 8 << 20, Usage: "BPF ring buffer bytes (power of two)", EnvVars: []string{"SLOWRANK_RINGBUF_SIZE"}},
		}, append(append(append(reliabilityFlags(), aggregatorFlags()...), statusServerFlags()...), detectorFlags()...)...),
		Action: runAgent,
	}
}

func agentConfig(c *cli.Context) (agent.Config, error) {
	cfg := agent.DefaultConfig()
	det, err := detectorConfig(c)
	if err != nil {
		return cfg, err
	}
	cfg.Detector = det
	cfg.Selector = agent.Selector{PIDs: c.IntSlice("pid"), EnvKey: c.String("env-key")}
	if m := c.String("match"); m != "" {
		re, err := regexp.Compile(m)
		if err != nil {
			return cfg, cli.Exit(fmt.Sprintf("--match: %v", err), exitUsage)
		}
		cfg.Selector.Match = re
	}
	if cfg.Selector.Policy, err = selectionPolicy(c); err != nil {
		return cfg, err
	}
	cfg.HostName = c.String("host-name")
	if cfg.HostName == "" {
		cfg.HostName, _ = os.Hostname()
	}
	cfg.Job = c.String("job")
	cfg.Duty.Budget = c.Float64("overhead-budget")
	if !(cfg.Duty.Budget > 0 && cfg.Duty.Budget < 1) {
		return cfg, cli.Exit(fmt.Sprintf("--overhead-budget must be in (0, 1), got %g", cfg.Duty.Budget), exitUsage)
	}
	cfg.Duty.UprobeCost = c.Duration("uprobe-cost")
	if cfg.Duty.UprobeCost < 0 || cfg.Duty.UprobeCost > time.Millisecond {
		return cfg, cli.Exit(fmt.Sprintf("--uprobe-cost must be in [0, 1ms], got %s", cfg.Duty.UprobeCost), exitUsage)
	}
	cfg.Duty.NCCLPluginCost = c.Duration("nccl-plugin-cost")
	if cfg.Duty.NCCLPluginCost < 0 || cfg.Duty.NCCLPluginCost > time.Millisecond {
		return cfg, cli.Exit(fmt.Sprintf("--nccl-plugin-cost must be in [0, 1ms], got %s", cfg.Duty.NCCLPluginCost), exitUsage)
	}
	cfg.DeviceCollection = c.Bool("device-collection")
	cfg.ProbeTorch = c.Bool("probe-torch")
	cfg.NCCLPlugin = c.Bool("nccl-plugin")
	kch, err := duty.ParseKernelChannelMode(c.String("nccl-kernel-channels"))
	if err != nil {
		return cfg, cli.Exit("--nccl-kernel-channels: "+err.Error(), exitUsage)
	}
	cfg.Duty.KernelChannels = kch
	cfg.StepMarker = c.String("step-marker")
	cfg.RingBufferSize = c.Int("ringbuf-size")
	cfg.SingleUprobes = c.Bool("single-uprobes")
	return cfg, nil
}

// selectionPolicy reads --allow-uid, --allow-cgroup and --owner-quota.
func selectionPolicy(c *cli.Context) (discover.Policy, error) {
	p := discover.Policy{AllowCgroups: c.StringSlice("allow-cgroup"), OwnerQuota: c.Int("owner-quota")}
	for _, u := range c.StringSlice("allow-uid") {
		uid, err := lookupUID(u)
		if err != nil {
			return p, cli.Exit(fmt.Sprintf("--allow-uid %q: %v", u, err), exitUsage)
		}
		p.AllowUIDs = append(p.AllowUIDs, uid)
	}
	if p.OwnerQuota < 1 {
		return p, cli.Exit(fmt.Sprintf("--owner-quota must be at least 1, got %d", p.OwnerQuota), exitUsage)
	}
	if err := discover.CheckPolicy(p); err != nil {
		return p, cli.Exit(fmt.Sprintf("--allow-cgroup: %v", err), exitUsage)
	}
	return p, nil
}

// lookupUID takes a uid or a user name.
func lookupUID(s string) (int, error) {
	if uid, err := strconv.Atoi(s); err == nil {
		if uid < 0 {
			return 0, fmt.Errorf("negative uid")
		}
		return uid, nil
	}
	u, err := user.Lookup(s)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(u.Uid)
}

func runAgent(c *cli.Context) error {
	// The stop signals are caught before anything is built: a SIGINT or
	// SIGTERM while the agent starts (loading BPF, while a predecessor's
	// uprobes are still being closed) stops it as soon as it is built,
	// instead of being lost or killing it half-built. Notify also takes
	// SIGINT back from "ignored", which a shell hands to the commands it
	// starts in the background of a script. A signal caught before the
	// capability drop's re-execution stops the agent there (secureAgent
	// looks at the channel itself, one hop closer to the signal than a
	// context); the new image catches them again from here.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	cfg, err := agentConfig(c)
	if err != nil {
		return err
	}
	if err := checkStatusServerFlags(c); err != nil {
		return err
	}
	if err := reliabilityConfig(c, &cfg); err != nil {
		return err
	}
	log := slog.Default()
	cfg.Logger = log
	if err := secureAgent(sig, c, &cfg, log); err != nil { // config.go: capabilities, epoch
		if errors.Is(err, errStoppedWhileStarting) {
			log.Info("agent stopped while it was starting")
			return nil
		}
		return err
	}
	ctx, stop := context.WithCancel(c.Context)
	defer stop()
	go func() {
		select {
		case <-sig:
			stop()
		case <-ctx.Done():
		}
	}()
	comps := []string{selfmetrics.Agent, selfmetrics.Library}
	if c.String("aggregator") != "" {
		comps = append(comps, selfmetrics.Forward)
	}
	sinks, closeSinks, err := openSinks(c, cfg, comps)
	if err != nil {
		return err
	}
	cfg.Sinks = sinks.list()
	if path := c.String("dump-events"); path != "" {
		dump, err := export.NewJSONLWriter(path)
		if err != nil {
			_ = closeSinks(context.Background(), nil) // nothing written yet: the start's error is the one to return
			return cli.Exit(fmt.Sprintf("--dump-events: %v", err), exitUsage)
		}
		defer func() {
			// The dump is not among the outputs whose losses are metrics:
			// say here what it lost.
			if err := dump.Close(); err != nil {
				log.Warn("closing --dump-events", "err", err)
			}
			if n := dump.Lost(); n > 0 {
				log.Warn("--dump-events lost records", "lost", n)
			}
		}()
		defer reopenOnHangup(dump)()
		cfg.Dump = func(v any) { dump.Write(dumpRecord{Type: fmt.Sprintf("%T", v), Record: v}) }
	}
	fwd, err := openForwarder(c, cfg.HostName)
	if err != nil {
		_ = closeSinks(context.Background(), nil) // nothing written yet: the start's error is the one to return
		return err
	}
	if fwd != nil {
		cfg.Sinks = append(cfg.Sinks, fwd)
	}
	a, err := buildAgent(ctx, cfg, log)
	if err != nil {
		closeForwarder(context.Background(), fwd)
		_ = closeSinks(context.Background(), nil) // nothing written yet: the start's error is the one to return
		if errors.Is(err, errStoppedWhileStarting) {
			log.Info("agent stopped while it was starting")
			return nil
		}
		return agentStartError(err)
	}
	defer func() {
		if err := a.Close(); err != nil {
			log.Warn("releasing the BPF objects", "err", err)
		}
	}()
	statusSrv, closeStatus := startStatusServer(c, a, sinks) // status.go: local endpoint
	defer closeStatus()
	sinks.self.set(observeAgent(a, statusSrv))

	if d := c.Duration("duration"); d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	if c.Bool("live") {
		go liveView(ctx, a, c.Duration("live-interval"), log)
	}
	log.Info("agent running", "host", cfg.HostName, "epoch", cfg.Epoch, "window", cfg.Detector.Window)
	if err := a.Run(ctx); err != nil {
		return err
	}
	summaries := a.Summaries()
	if c.Bool("live") {
		if err := renderView(os.Stdout, a.Status(), false); err != nil {
			log.Warn("live view not written", "err", err)
		}
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	closeForwarder(shutdownCtx, fwd)
	if err := closeSinks(shutdownCtx, summaries); err != nil {
		log.Warn("closing outputs", "err", err)
	}
	counters := a.Counters()
	if statusSrv != nil {
		maps.Copy(counters, statusSrv.Counters())
	}
	logCounters(log, counters, cfg.Sinks) // config.go: every loss, in one line
	for _, s := range summaries {
		log.Info("summary", "job", s.Job, "stragglers", s.Stragglers, "windows", s.Windows, "facts", s.Facts)
	}
	return nil
}

// errStoppedWhileStarting: a stop signal came before the agent was built.
var errStoppedWhileStarting = errors.New("stopped while starting")

// startGrace bounds how long a stop signal waits for agent.New to finish
// (it takes no context) before the agent exits without it: everything it
// holds in the kernel (uprobe links, maps, ring buffer) is a descriptor the
// exit closes.
const startGrace = 3 * time.Second

// buildAgent builds the agent unless ctx ends first: then it waits up to
// startGrace for the build to close what it made, and returns
// errStoppedWhileStarting.
func buildAgent(ctx context.Context, cfg agent.Config, log *slog.Logger) (*agent.Agent, error) {
	type built struct {
		a   *agent.Agent
		err error
	}
	if ctx.Err() != nil {
		return nil, errStoppedWhileStarting
	}
	done := make(chan built, 1)
	go func() {
		a, err := agent.New(cfg)
		done <- built{a, err}
	}()
	select {
	case b := <-done:
		if b.err == nil && ctx.Err() != nil {
			if err := b.a.Close(); err != nil {
				log.Warn("releasing the BPF objects", "err", err)
			}
			return nil, errStoppedWhileStarting
		}
		return b.a, b.err
	case <-ctx.Done():
	}
	select {
	case b := <-done:
		if b.err == nil {
			if err := b.a.Close(); err != nil {
				log.Warn("releasing the BPF objects", "err", err)
			}
		}
	case <-time.After(startGrace):
		log.Warn("agent still starting after a stop signal: exiting without it", "waited", startGrace)
	}
	return nil, errStoppedWhileStarting
}

// dumpRecord is one line of --dump-events: the record's Go type and fields.
type dumpRecord struct {
	Type   string `json:"type"`
	Record any    `json:"record"`
}

// agentStartError turns start-up failures into actionable one-line errors.
func agentStartError(err error) error {
	switch {
	case errors.Is(err, discover.ErrNoSuchProcess):
		return cli.Exit(err.Error(), exitUsage)
	case errors.Is(err, bpf.ErrPermission):
		return cli.Exit(fmt.Sprintf("%v: run as root or grant CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE", err), 1)
	case errors.Is(err, bpf.ErrNotSupported):
		return cli.Exit(fmt.Sprintf("%v: the kernel lacks BPF ring buffers or uprobes (need Linux 5.8+ with CONFIG_UPROBES and BTF); run slowrank doctor", err), 1)
	}
	return err
}

// liveView draws the agent's table on stdout every period. A stdout that
// cannot be written ends the view, said once in the log; the agent runs on.
func liveView(ctx context.Context, a *agent.Agent, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	tty := isTerminal(os.Stdout)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := renderView(os.Stdout, a.Status(), tty); err != nil {
				log.Warn("live view stopped: stdout cannot be written", "err", err)
				return
			}
		}
	}
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// sinkSet holds the agent's outputs.
type sinkSet struct {
	facts, verdicts *export.JSONLWriter
	// otel exports the metrics (and with otelOn, spans and OTLP): it also
	// exists with --otel off when a status endpoint serves /metrics.
	otel   *export.Exporter
	otelOn bool
	self   *selfSource
	// metrics serves /metrics (nil without a status endpoint).
	metrics http.Handler
}

func (s *sinkSet) list() []agent.Sink {
	var out []agent.Sink
	if s.facts != nil || s.verdicts != nil {
		out = append(out, &export.JSONLSink{Facts: s.facts, Verdicts: s.verdicts})
	}
	if s.otel != nil {
		out = append(out, export.OTelSink{Exporter: s.otel})
	}
	return out
}

// openSinks opens the outputs. comps are the self-metrics components that
// sinkSet.self will speak for.
func openSinks(c *cli.Context, cfg agent.Config, comps []string) (*sinkSet, func(context.Context, []detector.Summary) error, error) {
	s := &sinkSet{self: &selfSource{}}
	fail := func(err error) (*sinkSet, func(context.Context, []detector.Summary) error, error) {
		// Nothing was written yet: the configuration's error is the one to return.
		if s.facts != nil {
			_ = s.facts.Close()
		}
		if s.verdicts != nil {
			_ = s.verdicts.Close()
		}
		return nil, nil, cli.Exit(err.Error(), exitUsage)
	}
	var err error
	if p := c.String("facts"); p != "" {
		if s.facts, err = export.NewJSONLWriter(p); err != nil {
			return fail(fmt.Errorf("--facts: %w", err))
		}
	}
	if p := c.String("verdicts"); p != "" {
		if s.verdicts, err = export.NewJSONLWriter(p); err != nil {
			return fail(fmt.Errorf("--verdicts: %w", err))
		}
	}
	mode := c.String("otel")
	if mode == "auto" {
		mode = "off"
		if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
			mode = "on"
		}
	}
	var readers []sdkmetric.Reader
	if c.String("status-socket") != "" || c.String("status-addr") != "" {
		// /metrics: the same instruments as OTLP, read by the OpenTelemetry
		// Prometheus exporter from the one MeterProvider.
		reg := prometheus.NewRegistry()
		pe, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
		if err != nil {
			return fail(fmt.Errorf("metrics endpoint: %w", err))
		}
		readers = append(readers, pe)
		s.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	}
	oc := export.Config{HostName: cfg.HostName, ServiceVersion: version, Logger: slog.Default(), MetricReaders: readers,
		Self: []selfmetrics.Source{{Components: comps, Observe: s.self.observe}}}
	oc.Policy.SampleEvery = c.Int("sample-every")
	switch mode {
	case "off":
		oc.Traces, oc.Metrics = export.KindNone, export.KindNone
	case "on":
		s.otelOn = true
	case "stdout":
		s.otelOn = true
		oc.Traces, oc.Metrics = "console", "none"
	default:
		return fail(fmt.Errorf("--otel must be auto, on, off or stdout, got %q", mode))
	}
	if s.otelOn || len(readers) > 0 {
		if s.otel, err = export.New(c.Context, oc); err != nil {
			return fail(fmt.Errorf("--otel: %w", err))
		}
	}
	stopHangup := reopenOnHangup(s.facts, s.verdicts)
	closeAll := func(ctx context.Context, summaries []detector.Summary) error {
		stopHangup()
		var errs []error
		for _, sum := range summaries {
			if s.verdicts != nil {
				s.verdicts.Write(sum)
			}
			if s.otel != nil {
				s.otel.RecordSummary(sum)
			}
		}
		if s.otel != nil {
			errs = append(errs, s.otel.Shutdown(ctx))
		}
		for _, w := range []*export.JSONLWriter{s.facts, s.verdicts} {
			if w != nil {
				errs = append(errs, w.Close())
				if n := w.Lost(); n > 0 {
					errs = append(errs, fmt.Errorf("%d JSONL lines could not be written", n))
				}
			}
		}
		return errors.Join(errs...)
	}
	return s, closeAll, nil
}

// selfSource feeds the agent's (or the aggregator's) self-metrics to the
// metric exporter once it exists.
type selfSource struct {
	fn atomic.Pointer[func(func(string, float64, ...string))]
}

func (s *selfSource) set(fn func(func(string, float64, ...string))) { s.fn.Store(&fn) }

func (s *selfSource) observe(obs func(string, float64, ...string)) {
	if fn := s.fn.Load(); fn != nil {
		(*fn)(obs)
	}
}

// observeCounters adapts a map of counters to selfSource.set.
func observeCounters(f func() map[string]int64) func(func(string, float64, ...string)) {
	return func(obs func(string, float64, ...string)) {
		for k, v := range f() {
			obs(k, float64(v))
		}
	}
}
