package e2e

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slowrank/slowrank/test/testutil"
)

// TestAgentToJaegerAndPrometheus is the product end to end: a 4-rank fake job
// (real processes), the real agent attaching real uprobes and exporting OTLP
// to a real collector, which fans out to Jaeger and a Prometheus endpoint.
func TestAgentToJaegerAndPrometheus(t *testing.T) {
	testutil.RequireRoot(t, "to attach uprobes")
	bin := testutil.ToolsBin(t, "jaeger", "otelcol")
	st := startStack(t, bin)
	prom, noProm := startPrometheus(t, st, strings.TrimSuffix(strings.TrimPrefix(st.prom, "http://"), "/metrics"))
	// The agent and the fake trainer, built into a temporary directory.
	dir := t.TempDir()
	agentBin, trainer := testutil.BuildAgent(t, dir), testutil.BuildFakes(t, dir)
	job := fmt.Sprintf("e2e-agent-%d", time.Now().UnixNano())
	verdicts := filepath.Join(t.TempDir(), "verdicts.jsonl")
	statusAddr := testutil.FreeAddr(t)

	agentCmd := exec.Command(agentBin, "agent", "--window", "1s", "--lateness", "300ms", "--duration", "30s",
		"--env-key", "SLOWRANK_E2E_MARK", "--job", job, "--host-name", "e2e-host", "--otel", "on",
		"--verdicts", verdicts, "--status-socket", filepath.Join(t.TempDir(), "agent.sock"), "--status-addr", statusAddr)
	agentCmd.Env = append(os.Environ(),
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://"+st.otlpGRPC, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
		"OTEL_METRIC_EXPORT_INTERVAL=500")
	var agentOut testutil.LockedBuffer
	agentCmd.Stdout, agentCmd.Stderr = &agentOut, &agentOut
	if err := agentCmd.Start(); err != nil {
		t.Fatal(err)
	}
	agentDone := make(chan error, 1)
	go func() { agentDone <- agentCmd.Wait() }()
	t.Cleanup(func() {
		agentCmd.Process.Kill()
		if t.Failed() {
			t.Logf("agent output:\n%s", testutil.Tail(agentOut.String(), 3000))
		}
	})

	// Watch Jaeger for straggler traces while the job runs: first-seen
	// times give the latency from a step's end to its trace being queryable.
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var latencies []time.Duration
	seen := map[string]bool{}
	var promAt time.Time
	var wg sync.WaitGroup
	wg.Go(func() {
		q := url.Values{"service": {"slowrank"}, "tags": {`{"slowrank.state":"straggler"}`}, "limit": {"1000"}, "lookback": {"1h"}}
		for ctx.Err() == nil {
			var r jaegerResponse
			if err := getJSON(ctx, st.client, st.jaegerQuery+"/api/traces?"+q.Encode(), &r); err == nil {
				now := time.Now()
				mu.Lock()
				for _, tr := range r.Data {
					if seen[tr.TraceID] {
						continue
					}
					seen[tr.TraceID] = true
					for _, sp := range tr.Spans {
						if sp.OperationName == "train.step" && tagString(sp.Tags, "slowrank.state") == "straggler" {
							end := time.UnixMicro(sp.StartTime + sp.Duration)
							latencies = append(latencies, now.Sub(end))
						}
					}
				}
				mu.Unlock()
			}
			if body, err := getText(st.client, st.prom); err == nil && promAt.IsZero() && promGauge(body, "slowrank_straggler", job, "1", "host") == "1" {
				mu.Lock()
				promAt = time.Now()
				mu.Unlock()
			}
			sleepCtx(ctx, 200*time.Millisecond)
		}
	})

	time.Sleep(time.Second)
	start := time.Now()
	tr := exec.Command(trainer, "--ranks", "4", "--duration", "16", "--step-ms", "10", "--gpu-ms", "15",
		"--slow-rank", "1", "--slow-from-step", "200", "--slow-host-ms", "8", "--sleep-before-start", "1500")
	tr.Env = append(os.Environ(), "SLOWRANK_E2E_MARK=1")
	if out, err := tr.CombinedOutput(); err != nil {
		t.Fatalf("fake trainer: %v\n%s", err, out)
	}
	time.Sleep(3 * time.Second) // last windows settle and export
	cancel()
	wg.Wait()
	// While the agent still runs: every query of the shipped dashboard
	// returns data on a real Prometheus scraping the collector, and the
	// agent's own /metrics serves the same instruments.
	t.Run("dashboard", func(t *testing.T) {
		if prom == "" {
			t.Skip(noProm)
		}
		checkDashboard(t, st, prom, job)
	})
	if body, err := getText(st.client, "http://"+statusAddr+"/metrics"); err != nil {
		t.Errorf("agent /metrics: %v", err)
	} else {
		for _, want := range []string{`slowrank_records_dropped_total{reason="ringbuf_full"`, "\nslowrank_attach_errors_total",
			"\nslowrank_agent_uptime_seconds", "\nslowrank_straggler{", "\nslowrank_step_duration_milliseconds_bucket{"} {
			if !strings.Contains(body, want) {
				t.Errorf("agent /metrics lacks %s", want)
			}
		}
		if strings.Contains(body, "slowrank_component_events_total") {
			t.Errorf("agent /metrics has undeclared counters:\n%s", grepLines(body, "slowrank_component_events_total"))
		}
	}
	if err := agentCmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-agentDone:
		if err != nil {
			t.Fatalf("agent exited with %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("agent did not stop within 20 s of SIGINT")
	}

	if len(latencies) == 0 {
		t.Fatalf("no straggler trace reached Jaeger (run took %s)", time.Since(start).Round(time.Second))
	}
	// One straggler trace in full: every rank's train.step span, the verdict on rank 1.
	var any string
	for id := range seen {
		any = id
		break
	}
	var r jaegerResponse
	if err := getJSON(context.Background(), st.client, st.jaegerQuery+"/api/traces/"+any, &r); err != nil || len(r.Data) != 1 {
		t.Fatalf("get trace %s: %v (%d traces)", any, err, len(r.Data))
	}
	ranks := map[string]string{}
	for _, sp := range r.Data[0].Spans {
		if sp.OperationName == "train.step" {
			ranks[tagString(sp.Tags, "slowrank.rank")] = tagString(sp.Tags, "slowrank.state")
		}
	}
	if len(ranks) != 4 || ranks["1"] != "straggler" {
		t.Fatalf("trace %s: train.step spans by rank (state) = %v, want 4 ranks with rank 1 straggler", any, ranks)
	}
	if !hasVerdictEvent(r.Data[0]) {
		t.Error("the straggler's span has no slowrank.verdict event")
	}
	if promAt.IsZero() {
		body, _ := getText(st.client, st.prom)
		var lines []string
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, "slowrank_straggler") {
				lines = append(lines, l)
			}
		}
		t.Errorf("the collector's Prometheus endpoint never showed slowrank_straggler{rank=\"1\"} 1; it has:\n%s", strings.Join(lines, "\n"))
	}
	b, _ := os.ReadFile(verdicts)
	if !strings.Contains(string(b), `"rank":1,"state":"straggler","phase":"host"`) {
		t.Errorf("verdicts file lacks rank 1 host straggler:\n%s", testutil.Tail(string(b), 1000))
	}
	t.Logf("step end -> straggler trace queryable in Jaeger: median %s, p95 %s over %d traces",
		percentile(latencies, 0.5).Round(time.Millisecond), percentile(latencies, 0.95).Round(time.Millisecond), len(latencies))
}

func grepLines(body, prefix string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// promGauge returns the value of metric for (job, rank, phase) in a
// Prometheus exposition body, "" when absent.
func promGauge(body, metric, job, rank, phase string) string {
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, metric+"{") && strings.Contains(line, `slowrank_job_id="`+job+`"`) &&
			strings.Contains(line, `,rank="`+rank+`"`) && strings.Contains(line, `phase="`+phase+`"`) {
			f := strings.Fields(line)
			return f[len(f)-1]
		}
	}
	return ""
}
