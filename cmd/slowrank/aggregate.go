package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/slowrank/slowrank/agent"
	"github.com/slowrank/slowrank/aggregate"
	"github.com/slowrank/slowrank/otel"
)

func aggregateCommand() *cli.Command {
	return &cli.Command{
		Name:      "aggregate",
		Usage:     "judge the ranks of every host of a job behind an OTLP endpoint (agents: --aggregator)",
		UsageText: "slowrank aggregate --listen ADDR [--facts F] [--verdicts F] [--window D] [--tls-cert F --tls-key F] [--token-file F]",
		Description: "Receives the step and topology facts that agents forward (slowrank agent\n" +
			"--aggregator ADDR) as OTLP log records over gRPC or HTTP on one port, merges the\n" +
			"hosts' topologies, runs the detector across all ranks of each job and exports\n" +
			"verdicts like an agent (JSONL, OpenTelemetry per the OTEL_* variables). Windows\n" +
			"are cut on this host's clock (receive time minus the age each fact had when sent):\n" +
			"hosts' clocks are never compared. A host that goes silent makes its ranks\n" +
			"uncertain. Binds 127.0.0.1 unless --listen says otherwise; use --tls-cert/--tls-key\n" +
			"and --token-file off a private network. SIGINT/SIGTERM settle the last window.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "listen", Value: aggregate.DefaultListen, Usage: "host:port of the OTLP receiver (gRPC and HTTP on one port)", EnvVars: []string{"SLOWRANK_LISTEN"}},
			&cli.StringFlag{Name: "facts", Usage: "write the facts as judged (JSONL, times on this host's clock) to this file", EnvVars: []string{"SLOWRANK_FACTS"}},
			&cli.StringFlag{Name: "verdicts", Usage: "write verdicts and final summaries (JSONL) to this file", EnvVars: []string{"SLOWRANK_VERDICTS"}},
			&cli.StringFlag{Name: "tls-cert", Usage: "serve TLS with this PEM certificate (needs --tls-key)", EnvVars: []string{"SLOWRANK_TLS_CERT"}},
			&cli.StringFlag{Name: "tls-key", Usage: "PEM private key of --tls-cert", EnvVars: []string{"SLOWRANK_TLS_KEY"}},
			&cli.StringFlag{Name: "token-file", Usage: "require 'authorization: Bearer <token>' with the token in this file on every request", EnvVars: []string{"SLOWRANK_TOKEN_FILE"}},
			&cli.IntFlag{Name: "max-request-bytes", Value: 4 << 20, Usage: "largest request body (compressed and decompressed) or gRPC message", EnvVars: []string{"SLOWRANK_MAX_REQUEST_BYTES"}},
			&cli.IntFlag{Name: "max-hosts", Value: 1 << 16, Usage: "hosts tracked over all jobs (facts of more are refused, counted)", EnvVars: []string{"SLOWRANK_MAX_HOSTS"}},
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
	if err := checkAggregateLimits(c); err != nil {
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
	sinks, closeSinks, err := openSinks(c, agent.Config{HostName: host})
	if err != nil {
		return err
	}
	var aggSinks []aggregate.Sink
	for _, s := range sinks.list() {
		aggSinks = append(aggSinks, s)
	}
	agg, err := aggregate.New(aggregate.Config{
		Detector:   det,
		Sinks:      aggSinks,
		MaxHosts:   c.Int("max-hosts"),
		StatsEvery: statsEvery(c.Duration("stats-every")),
		Logger:     log,
	})
	if err != nil {
		closeSinks(context.Background(), nil)
		return cli.Exit(err.Error(), exitUsage)
	}
	srv, err := aggregate.NewServer(aggregate.ServerConfig{
		Listen:          c.String("listen"),
		TLSCertFile:     c.String("tls-cert"),
		TLSKeyFile:      c.String("tls-key"),
		Token:           token,
		MaxRequestBytes: c.Int("max-request-bytes"),
		Logger:          log,
	}, agg)
	if err != nil {
		closeSinks(context.Background(), nil)
		return cli.Exit(err.Error(), exitUsage)
	}
	if sinks.otel != nil {
		sinks.counters.set(func() map[string]int64 { return aggregateCounters(agg, srv) })
	}

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
// replace by its defaults without a word (0 or negative sizes) and negative
// durations.
func checkAggregateLimits(c *cli.Context) error {
	for _, name := range []string{"max-request-bytes", "max-hosts"} {
		if n := c.Int(name); n < 1 {
			return cli.Exit(fmt.Sprintf("--%s must be positive, got %d", name, n), exitUsage)
		}
	}
	for _, name := range []string{"stats-every", "duration"} {
		if d := c.Duration(name); d < 0 {
			return cli.Exit(fmt.Sprintf("--%s must not be negative, got %s", name, d), exitUsage)
		}
	}
	return nil
}

func statsEvery(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}

// aggregateCounters feeds the aggregator's monotonic counters to the
// self-metrics (slowrank.component.events{name}).
func aggregateCounters(agg *aggregate.Aggregator, srv *aggregate.Server) map[string]int64 {
	st, ss := agg.Stats(), srv.Stats()
	return map[string]int64{
		"aggregate_requests":        ss.Requests,
		"aggregate_records":         ss.Records,
		"aggregate_rejected":        ss.Rejected,
		"aggregate_ignored":         ss.Ignored,
		"aggregate_unauthorized":    ss.Unauthorized,
		"aggregate_too_large":       ss.TooLarge,
		"aggregate_bad_requests":    ss.BadRequests,
		"aggregate_busy":            ss.Busy,
		"aggregate_facts":           st.Facts,
		"aggregate_late":            st.LateFacts,
		"aggregate_refused_hosts":   st.RefusedHosts,
		"aggregate_topo_versions":   st.TopoVersions,
		"aggregate_hosts_forgotten": st.ForgottenHosts,
	}
}

// aggregatorFlags are the agent's flags for forwarding facts to
// `slowrank aggregate`.
func aggregatorFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "aggregator", Usage: "also forward step and topology facts to this slowrank aggregate (host:port or grpc:// for OTLP/gRPC, grpcs:// with TLS, http:// or https:// for OTLP/HTTP); the local detector keeps running", EnvVars: []string{"SLOWRANK_AGGREGATOR"}},
		&cli.StringFlag{Name: "aggregator-token-file", Usage: "send 'authorization: Bearer <token>' with the token in this file", EnvVars: []string{"SLOWRANK_AGGREGATOR_TOKEN_FILE"}},
		&cli.StringFlag{Name: "aggregator-ca", Usage: "PEM CA certificates that verify a grpcs:// or https:// aggregator (default: the system's)", EnvVars: []string{"SLOWRANK_AGGREGATOR_CA"}},
	}
}

// openForwarder builds the forwarding sink when --aggregator is given.
func openForwarder(c *cli.Context, host string) (*otel.Forwarder, error) {
	ep := c.String("aggregator")
	if ep == "" {
		return nil, nil
	}
	cfg := otel.ForwardConfig{Endpoint: ep, HostName: host, Logger: slog.Default()}
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
	f, err := otel.NewForwarder(cfg)
	if err != nil {
		return nil, cli.Exit(fmt.Sprintf("--aggregator: %v", err), exitUsage)
	}
	slog.Info("forwarding facts to the aggregator", "aggregator", ep)
	return f, nil
}

// closeForwarder sends what is queued within ctx and logs what was lost.
func closeForwarder(ctx context.Context, f *otel.Forwarder) {
	if f == nil {
		return
	}
	if err := f.Close(ctx); err != nil {
		slog.Warn("closing the forwarder", "err", err)
	}
	st := f.Stats()
	slog.Info("forwarder stopped", "sent", st.Sent, "requests", st.Requests, "failures", st.Failures, "dropped", st.Dropped)
}
