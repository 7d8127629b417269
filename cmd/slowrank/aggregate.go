package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/slowrank/slowrank/agent"
	"github.com/slowrank/slowrank/aggregate"
	"github.com/slowrank/slowrank/internal/certfile"
	"github.com/slowrank/slowrank/otel/forward"
	"github.com/slowrank/slowrank/selfmetrics"
)

func aggregateCommand() *cli.Command {
	return &cli.Command{
		Name:      "aggregate",
		Usage:     "judge the ranks of every host of a job behind an OTLP endpoint (agents: --aggregator)",
		UsageText: "slowrank aggregate --listen ADDR [--facts F] [--verdicts F] [--window D] [--tls-cert F --tls-key F [--tls-client-ca F]] [--token-file F]",
		Description: "Receives the step and topology facts that agents forward (slowrank agent\n" +
			"--aggregator ADDR) as OTLP log records over gRPC or HTTP on one port, merges the\n" +
			"hosts' topologies, runs the detector across all ranks of each job and exports\n" +
			"verdicts like an agent (JSONL, OpenTelemetry per the OTEL_* variables). Windows\n" +
			"are cut on this host's clock (receive time minus the age each fact had when sent):\n" +
			"hosts' clocks are never compared. A host that goes silent makes its ranks\n" +
			"uncertain. Binds 127.0.0.1 unless --listen says otherwise; use --tls-cert/--tls-key\n" +
			"and --token-file (or --tls-client-ca) off a private network. SIGINT/SIGTERM settle\n" +
			"the last window.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "listen", Value: aggregate.DefaultListen, Usage: "host:port of the OTLP receiver (gRPC and HTTP on one port)", EnvVars: []string{"SLOWRANK_LISTEN"}},
			&cli.StringFlag{Name: "facts", Usage: "write the facts as judged (JSONL, times on this host's clock) to this file", EnvVars: []string{"SLOWRANK_FACTS"}},
			&cli.StringFlag{Name: "verdicts", Usage: "write verdicts and final summaries (JSONL) to this file", EnvVars: []string{"SLOWRANK_VERDICTS"}},
			&cli.StringFlag{Name: "tls-cert", Usage: "serve TLS with this PEM certificate (needs --tls-key)", EnvVars: []string{"SLOWRANK_TLS_CERT"}},
			&cli.StringFlag{Name: "tls-key", Usage: "PEM private key of --tls-cert", EnvVars: []string{"SLOWRANK_TLS_KEY"}},
			&cli.StringFlag{Name: "tls-client-ca", Usage: "require client certificates signed by these PEM CAs; a client may then speak only for the hosts its certificate names (DNS names, else common name)", EnvVars: []string{"SLOWRANK_TLS_CLIENT_CA"}},
			&cli.StringFlag{Name: "token-file", Usage: "require 'authorization: Bearer <token>' with the token in this file on every request", EnvVars: []string{"SLOWRANK_TOKEN_FILE"}},
			&cli.IntFlag{Name: "max-request-bytes", Value: 4 << 20, Usage: "largest request body (compressed and decompressed) or gRPC message", EnvVars: []string{"SLOWRANK_MAX_REQUEST_BYTES"}},
			&cli.IntFlag{Name: "max-hosts", Value: 1 << 16, Usage: "hosts tracked over all jobs (facts of more are refused, counted)", EnvVars: []string{"SLOWRANK_MAX_HOSTS"}},
			&cli.IntFlag{Name: "max-conns", Value: 4096, Usage: "open connections", EnvVars: []string{"SLOWRANK_MAX_CONNS"}},
			&cli.IntFlag{Name: "max-conns-per-source", Value: 64, Usage: "open connections of one source address (an IPv6 /64 is one); raise it behind a gateway collector", EnvVars: []string{"SLOWRANK_MAX_CONNS_PER_SOURCE"}},
			&cli.IntFlag{Name: "max-concurrent", Value: 16, Usage: "requests decoded at once (a body is read whole before it waits for one)", EnvVars: []string{"SLOWRANK_MAX_CONCURRENT"}},
			&cli.StringFlag{Name: "max-memory", Value: "256MiB", Usage: "request bodies held at once, being read or waiting to be decoded (bytes, or with KiB, MiB, GiB); at least --max-request-bytes", EnvVars: []string{"SLOWRANK_MAX_MEMORY"}},
			&cli.IntFlag{Name: "max-ranks", Value: 1 << 19, Usage: "ranks with state over all jobs (a rank gets state from its steps only)", EnvVars: []string{"SLOWRANK_MAX_RANKS"}},
			&cli.IntFlag{Name: "max-ranks-per-host", Value: 1024, Usage: "ranks one host name may send steps for, over all its jobs", EnvVars: []string{"SLOWRANK_MAX_RANKS_PER_HOST"}},
			&cli.IntFlag{Name: "max-jobs-per-host", Value: 16, Usage: "jobs one host name may take part in at once", EnvVars: []string{"SLOWRANK_MAX_JOBS_PER_HOST"}},
			&cli.IntFlag{Name: "max-ranks-per-client", Usage: "ranks one client (its client certificate, else its source address) may send steps for, whatever host names it claims (default: --max-ranks/16, at least 1024)", EnvVars: []string{"SLOWRANK_MAX_RANKS_PER_CLIENT"}},
			&cli.IntFlag{Name: "max-hosts-per-client", Usage: "host names one client may bring in (default: --max-hosts/16, at least 64); raise it behind a collector that relays a fleet", EnvVars: []string{"SLOWRANK_MAX_HOSTS_PER_CLIENT"}},
			&cli.IntFlag{Name: "max-jobs-per-client", Usage: "jobs one client's hosts may take part in at once (default 64, a quarter of the 256 jobs the detector tracks); behind a collector it bounds every job this aggregator gets", EnvVars: []string{"SLOWRANK_MAX_JOBS_PER_CLIENT"}},
			&cli.IntFlag{Name: "max-queue-per-client", Usage: "facts of one client waiting for the detector (default: a quarter of the queue); beyond it its requests get a retryable refusal", EnvVars: []string{"SLOWRANK_MAX_QUEUE_PER_CLIENT"}},
			&cli.StringFlag{Name: "host-name", Usage: "host name in telemetry (default: os.Hostname)", EnvVars: []string{"SLOWRANK_HOST_NAME"}},
			&cli.StringFlag{Name: "otel", Value: "auto", Usage: "OpenTelemetry export: auto (on when OTEL_EXPORTER_OTLP_ENDPOINT is set), on, off, stdout", EnvVars: []string{"SLOWRANK_OTEL"}},
			&cli.IntFlag{Name: "sample-every", Value: 20, Usage: "export every rank's span of one step in N as a baseline (anomalous windows: all)", EnvVars: []string{"SLOWRANK_SAMPLE_EVERY"}},
			&cli.DurationFlag{Name: "stats-every", Value: 30 * time.Second, Usage: "log the aggregator's counters this often (0: never)", EnvVars: []string{"SLOWRANK_STATS_EVERY"}},
			&cli.DurationFlag{Name: "duration", Usage: "stop after this long (0: until SIGINT/SIGTERM)", EnvVars: []string{"SLOWRANK_DURATION"}},
		}, detectorFlags()...),
		Action: runAggregate,
	}
}

// readToken reads a bearer token file: the first line, trimmed; it must not
// be empty and should not be readable by others.
func readToken(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		slog.Warn("token file is readable by group or others", "path", path, "mode", fi.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	tok, _, _ := strings.Cut(string(data), "\n")
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	return tok, nil
}

func runAggregate(c *cli.Context) error {
	det, err := detectorConfig(c)
	if err != nil {
		return err
	}
	log := slog.Default()
	host := c.String("host-name")
	if host == "" {
		host, _ = os.Hostname()
	}
	maxMemory, err := checkAggregateLimits(c)
	if err != nil {
		return err
	}
	var token string
	if p := c.String("token-file"); p != "" {
		if token, err = readToken(p); err != nil {
			return cli.Exit(err.Error(), exitUsage)
		}
	}
	if (c.String("tls-cert") == "") != (c.String("tls-key") == "") {
		return cli.Exit("--tls-cert and --tls-key go together", exitUsage)
	}
	if c.String("tls-client-ca") != "" && c.String("tls-cert") == "" {
		return cli.Exit("--tls-client-ca needs --tls-cert and --tls-key", exitUsage)
	}
	sinks, closeSinks, err := openSinks(c, agent.Config{HostName: host}, []string{selfmetrics.Aggregate})
	if err != nil {
		return err
	}
	agg, err := aggregate.New(aggregate.Config{
		Detector:          det,
		Sinks:             sinks.list(),
		MaxHosts:          c.Int("max-hosts"),
		MaxRanks:          c.Int("max-ranks"),
		MaxRanksPerHost:   c.Int("max-ranks-per-host"),
		MaxJobsPerHost:    c.Int("max-jobs-per-host"),
		MaxRanksPerClient: c.Int("max-ranks-per-client"),
		MaxHostsPerClient: c.Int("max-hosts-per-client"),
		MaxJobsPerClient:  c.Int("max-jobs-per-client"),
		MaxQueuePerClient: c.Int("max-queue-per-client"),
		StatsEvery:        statsEvery(c.Duration("stats-every")),
		Logger:            log,
	})
	if err != nil {
		_ = closeSinks(context.Background(), nil) // nothing written yet: the start's error is the one to return
		return cli.Exit(err.Error(), exitUsage)
	}
	srv, err := aggregate.NewServer(aggregate.ServerConfig{
		Listen:            c.String("listen"),
		TLSCertFile:       c.String("tls-cert"),
		TLSKeyFile:        c.String("tls-key"),
		ClientCAFile:      c.String("tls-client-ca"),
		Token:             token,
		MaxRequestBytes:   c.Int("max-request-bytes"),
		MaxConns:          c.Int("max-conns"),
		MaxConnsPerSource: c.Int("max-conns-per-source"),
		MaxConcurrent:     c.Int("max-concurrent"),
		MaxMemory:         maxMemory,
		Logger:            log,
	}, agg)
	if err != nil {
		_ = closeSinks(context.Background(), nil) // nothing written yet: the start's error is the one to return
		return cli.Exit(err.Error(), exitUsage)
	}
	sinks.self.set(observeCounters(func() map[string]int64 { return aggregateCounters(agg, srv) }))

	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if d := c.Duration("duration"); d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	log.Info("aggregator running", "listen", srv.Addr().String(), "window", det.Window, "lateness", det.Lateness)
	runErr := make(chan error, 1)
	go func() { runErr <- agg.Run(ctx) }()
	<-ctx.Done()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		log.Warn("stopping the receiver", "err", err)
	}
	if err := <-runErr; err != nil {
		return err
	}
	summaries := agg.Summaries()
	if err := closeSinks(shutdownCtx, summaries); err != nil {
		log.Warn("closing outputs", "err", err)
	}
	st, ss := agg.Stats(), srv.Stats()
	log.Info("aggregator stopped", "requests", ss.Requests, "records", ss.Records, "rejected", ss.Rejected,
		"unauthorized", ss.Unauthorized, "busy", ss.Busy, "facts", st.Facts, "windows", st.Windows, "late", st.LateFacts)
	for _, s := range summaries {
		log.Info("summary", "job", s.Job, "stragglers", s.Stragglers, "windows", s.Windows, "facts", s.Facts)
	}
	return nil
}

// checkAggregateLimits refuses limits that the aggregator would otherwise
// replace by its defaults without a word (0 or negative sizes), limits that
// contradict each other and negative durations; it returns --max-memory in
// bytes.
func checkAggregateLimits(c *cli.Context) (int64, error) {
	for _, name := range []string{"max-request-bytes", "max-hosts", "max-conns", "max-conns-per-source", "max-concurrent",
		"max-ranks", "max-ranks-per-host", "max-jobs-per-host"} {
		if n := c.Int(name); n < 1 {
			return 0, cli.Exit(fmt.Sprintf("--%s must be positive, got %d", name, n), exitUsage)
		}
	}
	for _, name := range []string{"max-ranks-per-client", "max-hosts-per-client", "max-jobs-per-client", "max-queue-per-client"} {
		if n := c.Int(name); n < 0 {
			return 0, cli.Exit(fmt.Sprintf("--%s must be positive (or 0 for the default), got %d", name, n), exitUsage)
		}
	}
	if n, all := c.Int("max-hosts-per-client"), c.Int("max-hosts"); n > all {
		return 0, cli.Exit(fmt.Sprintf("--max-hosts-per-client %d is more than --max-hosts %d", n, all), exitUsage)
	}
	if c.Int("max-conns-per-source") > c.Int("max-conns") {
		return 0, cli.Exit(fmt.Sprintf("--max-conns-per-source %d is more than --max-conns %d", c.Int("max-conns-per-source"), c.Int("max-conns")), exitUsage)
	}
	mem, err := parseBytes(c.String("max-memory"))
	if err != nil {
		return 0, cli.Exit(fmt.Sprintf("--max-memory: %v", err), exitUsage)
	}
	if mem < int64(c.Int("max-request-bytes")) {
		return 0, cli.Exit(fmt.Sprintf("--max-memory %d is below one request (--max-request-bytes %d)", mem, c.Int("max-request-bytes")), exitUsage)
	}
	for _, name := range []string{"stats-every", "duration"} {
		if d := c.Duration(name); d < 0 {
			return 0, cli.Exit(fmt.Sprintf("--%s must not be negative, got %s", name, d), exitUsage)
		}
	}
	return mem, nil
}

// parseBytes reads a positive size: a number of bytes, optionally followed
// by KiB, MiB or GiB.
func parseBytes(s string) (int64, error) {
	num, unit := s, int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, unit = n, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if err != nil || n < 1 || n > math.MaxInt64/unit {
		return 0, fmt.Errorf("want a positive size such as 268435456, 512MiB or 2GiB, got %q", s)
	}
	return n * unit, nil
}

func statsEvery(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}

// aggregateCounters feeds the aggregator's counters and gauges to the
// self-metrics (keys of selfmetrics.Table).
func aggregateCounters(agg *aggregate.Aggregator, srv *aggregate.Server) map[string]int64 {
	st, ss := agg.Stats(), srv.Stats()
	return map[string]int64{
		"aggregate_requests":             ss.Requests,
		"aggregate_records":              ss.Records,
		"aggregate_rejected":             ss.Rejected,
		"aggregate_ignored":              ss.Ignored,
		"aggregate_unauthorized":         ss.Unauthorized,
		"aggregate_too_large":            ss.TooLarge,
		"aggregate_bad_requests":         ss.BadRequests,
		"aggregate_busy":                 ss.Busy,
		"aggregate_slow_bodies":          ss.SlowBodies,
		"aggregate_refused_conns":        ss.RefusedConns,
		"aggregate_evicted_conns":        ss.EvictedConns,
		"aggregate_impersonation":        ss.Impersonation,
		"aggregate_cert_reload_failures": ss.CertReloadFailures,
		"aggregate_refused_ranks":        st.RefusedRanks,
		"aggregate_refused_ranks_client": st.RefusedRanksClient,
		"aggregate_refused_hosts_client": st.RefusedHostsClient,
		"aggregate_refused_queue_client": st.RefusedQueueClient,
		"aggregate_refused_topos":        st.RefusedTopos,
		"aggregate_facts":                st.Facts,
		"aggregate_late":                 st.LateFacts,
		"aggregate_refused_hosts":        st.RefusedHosts,
		"aggregate_topo_versions":        st.TopoVersions,
		"aggregate_hosts_forgotten":      st.ForgottenHosts,
		"aggregate_refused_queue":        st.RefusedQueue,
		"aggregate_refused_jobs":         st.RefusedJobs,
		"aggregate_invalid":              st.Invalid,
		"aggregate_hosts":                int64(st.Hosts),
		"aggregate_silent_hosts":         int64(st.SilentHosts),
		"aggregate_queued":               st.Queued,
		"aggregate_lag_ns":               int64(st.Lag),
	}
}

// aggregatorFlags are the agent's flags for forwarding facts to
// `slowrank aggregate`.
func aggregatorFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "aggregator", Usage: "also forward step and topology facts to this slowrank aggregate (host:port or grpc:// for OTLP/gRPC, grpcs:// with TLS, http:// or https:// for OTLP/HTTP); the local detector keeps running", EnvVars: []string{"SLOWRANK_AGGREGATOR"}},
		&cli.StringFlag{Name: "aggregator-token-file", Usage: "send 'authorization: Bearer <token>' with the token in this file", EnvVars: []string{"SLOWRANK_AGGREGATOR_TOKEN_FILE"}},
		&cli.StringFlag{Name: "aggregator-compression", Value: "gzip", Usage: "gzip or none: how request bodies to the aggregator are sent", EnvVars: []string{"SLOWRANK_AGGREGATOR_COMPRESSION"}},
		&cli.StringFlag{Name: "aggregator-ca", Usage: "PEM CA certificates that verify a grpcs:// or https:// aggregator (default: the system's)", EnvVars: []string{"SLOWRANK_AGGREGATOR_CA"}},
		&cli.StringFlag{Name: "aggregator-cert", Usage: "PEM client certificate for a grpcs:// or https:// aggregator that requires one (--tls-client-ca: it names the hosts this agent may speak for); reloaded when renewed", EnvVars: []string{"SLOWRANK_AGGREGATOR_CERT"}},
		&cli.StringFlag{Name: "aggregator-key", Usage: "PEM private key of --aggregator-cert", EnvVars: []string{"SLOWRANK_AGGREGATOR_KEY"}},
	}
}

// openForwarder builds the forwarding sink when --aggregator is given.
func openForwarder(c *cli.Context, host string) (*forward.Forwarder, error) {
	ep := c.String("aggregator")
	if ep == "" {
		return nil, nil
	}
	cfg := forward.Config{Endpoint: ep, HostName: host, Logger: slog.Default()}
	switch comp := c.String("aggregator-compression"); comp {
	case "gzip":
	case "none":
		cfg.NoCompression = true
	default:
		return nil, cli.Exit(fmt.Sprintf("--aggregator-compression %q: want gzip or none", comp), exitUsage)
	}
	if p := c.String("aggregator-token-file"); p != "" {
		tok, err := readToken(p)
		if err != nil {
			return nil, cli.Exit("--aggregator-token-file: "+err.Error(), exitUsage)
		}
		cfg.Token = tok
	}
	if p := c.String("aggregator-ca"); p != "" {
		pem, err := os.ReadFile(p)
		if err != nil {
			return nil, cli.Exit(fmt.Sprintf("--aggregator-ca: %v", err), exitUsage)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, cli.Exit(fmt.Sprintf("--aggregator-ca: no PEM certificate in %s", p), exitUsage)
		}
	}
	if err := clientCert(c, &cfg); err != nil {
		return nil, err
	}
	f, err := forward.New(cfg)
	if err != nil {
		return nil, cli.Exit(fmt.Sprintf("--aggregator: %v", err), exitUsage)
	}
	slog.Info("forwarding facts to the aggregator", "aggregator", ep)
	return f, nil
}

// clientCert loads --aggregator-cert and --aggregator-key into cfg: both or
// neither, and only for a TLS endpoint (a certificate offered over
// plaintext would never be asked for, and the user would think it was).
func clientCert(c *cli.Context, cfg *forward.Config) error {
	cert, key := c.String("aggregator-cert"), c.String("aggregator-key")
	if cert == "" && key == "" {
		return nil
	}
	if cert == "" || key == "" {
		return cli.Exit("--aggregator-cert and --aggregator-key go together", exitUsage)
	}
	if !strings.HasPrefix(cfg.Endpoint, "grpcs://") && !strings.HasPrefix(cfg.Endpoint, "https://") {
		return cli.Exit(fmt.Sprintf("--aggregator-cert needs a grpcs:// or https:// --aggregator, got %q", cfg.Endpoint), exitUsage)
	}
	r, err := certfile.New(cert, key, "aggregator client certificate", slog.Default().With("component", "forward"))
	if err != nil {
		return cli.Exit("--aggregator-cert: "+err.Error(), exitUsage)
	}
	cfg.ClientCert = r
	return nil
}

// closeForwarder sends what is queued within ctx and logs what was lost.
func closeForwarder(ctx context.Context, f *forward.Forwarder) {
	if f == nil {
		return
	}
	if err := f.Close(ctx); err != nil {
		slog.Warn("closing the forwarder", "err", err)
	}
	st := f.Stats()
	slog.Info("forwarder stopped", "sent", st.Sent, "requests", st.Requests, "failures", st.Failures, "dropped", st.Dropped)
}
