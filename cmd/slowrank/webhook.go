package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/slowrank/slowrank/agent"
	"github.com/slowrank/slowrank/agent/admission"
	"github.com/slowrank/slowrank/internal/certfile"
	"github.com/slowrank/slowrank/selfmetrics"
)

func webhookCommand() *cli.Command {
	return &cli.Command{
		Name:      "webhook",
		Usage:     "serve the mutating admission webhook that gives opted-in pods the injection library",
		UsageText: "slowrank webhook --cert F --key F [--listen ADDR] [--lib-dir DIR] [--nccl-plugin]",
		Description: "Answers the API server's admission.k8s.io/v1 AdmissionReviews of Pod creations\n" +
			"over HTTPS on " + admission.MutatePath + " (health: " + admission.HealthPath + "). A pod labelled " + admission.InjectLabel + "=true\n" +
			"gets the node's library directory as a read-only hostPath volume, a read-only mount\n" +
			"in every container (init containers excepted) and CUDA_INJECTION64_PATH (with\n" +
			"--nccl-plugin also NCCL_PROFILER_PLUGIN); a value a container sets itself is kept\n" +
			"and the answer warns about it. Every pod is admitted: bad input is answered\n" +
			"without a patch, with a warning. The certificate is reloaded when its files change\n" +
			"and on SIGHUP. SIGINT/SIGTERM stop it. The chart deploys it (webhook.enabled).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:8443", Usage: "host:port of the HTTPS server (in a pod: :8443, for the API server to reach it)", EnvVars: []string{"SLOWRANK_LISTEN"}},
			&cli.StringFlag{Name: "cert", Usage: "PEM certificate of the server (a Secret's tls.crt); required", EnvVars: []string{"SLOWRANK_WEBHOOK_CERT"}},
			&cli.StringFlag{Name: "key", Usage: "PEM private key of --cert (tls.key); required", EnvVars: []string{"SLOWRANK_WEBHOOK_KEY"}},
			&cli.StringFlag{Name: "lib-dir", Value: "/opt/slowrank/lib", Usage: "the nodes' library directory (the chart's libDir), mounted at the same path", EnvVars: []string{"SLOWRANK_LIB_DIR"}},
			&cli.BoolFlag{Name: "nccl-plugin", Usage: "also set NCCL_PROFILER_PLUGIN to the library (NCCL's profiler plugin path, agent --nccl-plugin)", EnvVars: []string{"SLOWRANK_NCCL_PLUGIN"}},
			&cli.IntFlag{Name: "max-request-bytes", Value: admission.DefaultMaxRequestBytes, Usage: "largest AdmissionReview body (a larger one is admitted unpatched)", EnvVars: []string{"SLOWRANK_MAX_REQUEST_BYTES"}},
			&cli.StringFlag{Name: "otel", Value: "auto", Usage: "self-metrics over OTLP: auto (on when OTEL_EXPORTER_OTLP_ENDPOINT is set), on, off", EnvVars: []string{"SLOWRANK_OTEL"}},
			&cli.StringFlag{Name: "host-name", Usage: "host name in telemetry (default: os.Hostname)", EnvVars: []string{"SLOWRANK_HOST_NAME"}},
			&cli.DurationFlag{Name: "stats-every", Value: 5 * time.Minute, Usage: "log the counters this often (0: never)", EnvVars: []string{"SLOWRANK_STATS_EVERY"}},
			&cli.DurationFlag{Name: "duration", Usage: "stop after this long (0: until SIGINT/SIGTERM)", EnvVars: []string{"SLOWRANK_DURATION"}},
		},
		Action: runWebhook,
	}
}

func runWebhook(c *cli.Context) error {
	if c.String("cert") == "" || c.String("key") == "" {
		return cli.Exit("webhook: --cert and --key are required (the API server calls webhooks over HTTPS only)", exitUsage)
	}
	if !path.IsAbs(c.String("lib-dir")) {
		return cli.Exit(fmt.Sprintf("--lib-dir must be an absolute path, got %q", c.String("lib-dir")), exitUsage)
	}
	if n := c.Int("max-request-bytes"); n < 1 {
		return cli.Exit(fmt.Sprintf("--max-request-bytes must be positive, got %d", n), exitUsage)
	}
	if c.Duration("stats-every") < 0 || c.Duration("duration") < 0 {
		return cli.Exit("--stats-every and --duration must not be negative", exitUsage)
	}
	if m := c.String("otel"); m == "stdout" {
		return cli.Exit("--otel must be auto, on or off (the webhook exports metrics only)", exitUsage)
	}
	log := slog.Default()
	certs, err := certfile.New(c.String("cert"), c.String("key"), "webhook certificate", log.With("component", "webhook"))
	if err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	h, err := admission.New(admission.Config{
		Options:         admission.Options{LibDir: c.String("lib-dir"), NCCLPlugin: c.Bool("nccl-plugin")},
		MaxRequestBytes: int64(c.Int("max-request-bytes")),
		Logger:          log,
	})
	if err != nil {
		return cli.Exit(err.Error(), exitUsage)
	}
	ln, err := net.Listen("tcp", c.String("listen"))
	if err != nil {
		return cli.Exit(fmt.Sprintf("--listen: %v", err), exitUsage)
	}
	host := c.String("host-name")
	if host == "" {
		host, _ = os.Hostname()
	}
	sinks, closeSinks, err := openSinks(c, agent.Config{HostName: host}, []string{selfmetrics.Webhook})
	if err != nil {
		ln.Close()
		return err
	}
	sinks.self.set(observeCounters(func() map[string]int64 { return webhookCounters(h, certs) }))

	ctx, stop := signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if d := c.Duration("duration"); d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	go reloadOnHangup(ctx, certs, log)
	if d := c.Duration("stats-every"); d > 0 {
		go logWebhookStats(ctx, d, h, log)
	}
	srv := admission.NewServer("", h, certs.GetCertificate)
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(ln, "", "") }()
	log.Info("webhook running", "listen", ln.Addr().String(), "lib_dir", c.String("lib-dir"), "nccl_plugin", c.Bool("nccl-plugin"))
	select {
	case <-ctx.Done():
	case err := <-served:
		return errors.Join(fmt.Errorf("serving the webhook: %w", err), closeSinks(context.Background(), nil))
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("stopping the webhook", "err", err)
	}
	if err := closeSinks(shutdownCtx, nil); err != nil {
		log.Warn("closing outputs", "err", err)
	}
	st := h.Stats()
	log.Info("webhook stopped", "requests", st.Requests, "patched", st.Patched, "not_opted_in", st.NotOptedIn,
		"unchanged", st.Unchanged, "not_pod_create", st.NotPod, "bad_request", st.Errors, "values_kept", st.ValuesKept)
	return nil
}

// reloadOnHangup reloads the certificate on SIGHUP (it is also reloaded when
// its files change).
func reloadOnHangup(ctx context.Context, certs *certfile.Reloader, log *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			if err := certs.Reload(); err != nil {
				log.Warn("SIGHUP: keeping the previous certificate", "err", err)
			} else {
				log.Info("SIGHUP: webhook certificate reloaded")
			}
		}
	}
}

func logWebhookStats(ctx context.Context, every time.Duration, h *admission.Handler, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			st := h.Stats()
			log.Info("webhook stats", "requests", st.Requests, "patched", st.Patched, "not_opted_in", st.NotOptedIn,
				"unchanged", st.Unchanged, "not_pod_create", st.NotPod, "bad_request", st.Errors, "values_kept", st.ValuesKept)
		}
	}
}

// webhookCounters feeds the webhook's counters to the self-metrics (keys
// of selfmetrics.Table).
func webhookCounters(h *admission.Handler, certs *certfile.Reloader) map[string]int64 {
	st := h.Stats()
	return map[string]int64{
		"webhook_patched":              st.Patched,
		"webhook_not_opted_in":         st.NotOptedIn,
		"webhook_unchanged":            st.Unchanged,
		"webhook_not_pod_create":       st.NotPod,
		"webhook_bad_request":          st.Errors,
		"webhook_values_kept":          st.ValuesKept,
		"webhook_cert_reload_failures": certs.Failures(),
	}
}
