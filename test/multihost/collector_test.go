package multihost

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/slowrank/slowrank/aggregate"
	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/otel/forward"
	"github.com/slowrank/slowrank/otel/wire"
	"github.com/slowrank/slowrank/test/testutil"
)

type factsSink struct{ vs chan detector.Verdict }

func (f *factsSink) Topology(detector.Topology) {}
func (f *factsSink) Step(detector.Step, int64)  {}
func (f *factsSink) Settled(_ detector.SettledWindow, vs []detector.Verdict) {
	for _, v := range vs {
		select {
		case f.vs <- v:
		default:
		}
	}
}

// TestThroughCollector puts a real OpenTelemetry Collector (OTLP receiver,
// batch processor, OTLP/gRPC exporter with gzip and a bearer header: the
// exporter the loadbalancing exporter wraps for each backend) between two
// agents' forwarders and an aggregator: facts survive the collector's
// re-encoding and batching, the token passes, and the slow rank is found
// across two "hosts" whose clocks are a day apart.
func TestThroughCollector(t *testing.T) {
	bin := filepath.Join(testutil.ToolsBin(t, "otelcol"), "otelcol")
	det := detector.DefaultConfig()
	det.Window, det.Lateness = time.Second, time.Second
	sink := &factsSink{vs: make(chan detector.Verdict, 4096)}
	agg, err := aggregate.New(aggregate.Config{Detector: det, Sinks: []aggregate.Sink{sink}, StatsEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := aggregate.NewServer(aggregate.ServerConfig{Listen: "127.0.0.1:0", Token: "tok"}, agg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agg.Run(ctx) }()
	defer func() {
		_ = srv.Shutdown(context.Background())
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	colAddr := testutil.FreeAddr(t)
	cfg := fmt.Sprintf(`receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %q
processors:
  batch:
    timeout: 100ms
exporters:
  otlp_grpc/aggregator:
    endpoint: %q
    compression: gzip
    tls:
      insecure: true
    headers:
      authorization: "Bearer tok"
service:
  pipelines:
    logs:
      receivers: [otlp]
      processors: [batch]
      exporters: [otlp_grpc/aggregator]
  telemetry:
    metrics:
      level: none
`, colAddr, srv.Addr().String())
	cfgPath := filepath.Join(t.TempDir(), "otelcol.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	col := exec.Command(bin, "--config", cfgPath)
	out := &testutil.LockedBuffer{}
	col.Stdout, col.Stderr = out, out
	col.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := col.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = col.Process.Signal(syscall.SIGTERM)
		_ = col.Wait()
		if t.Failed() {
			t.Logf("--- otelcol ---\n%s", out.String())
		}
	}()

	// Two hosts, clocks a day apart, two ranks each; rank 2 is slow.
	var fwds []*forward.Forwarder
	for h := range 2 {
		offset := int64(h) * int64(24*time.Hour)
		f, err := forward.New(forward.Config{Endpoint: colAddr, HostName: fmt.Sprint("host", h),
			NowMono: func() int64 { return testutil.MonoNow() + offset }})
		if err != nil {
			t.Fatal(err)
		}
		fwds = append(fwds, f)
		f.Topology(detector.Topology{Kind: detector.KindTopology, Job: "cj", Version: 1,
			Ranks:  []detector.RankInfo{{Rank: 2 * h}, {Rank: 2*h + 1, LocalRank: 1}},
			Groups: []detector.Group{{ID: "world", Type: "world", Ranks: []int{0, 1, 2, 3}}}})
	}
	defer func() {
		for _, f := range fwds {
			_ = f.Close(context.Background())
		}
	}()
	found := false
	deadline := time.Now().Add(40 * time.Second)
	for step := int64(0); !found && time.Now().Before(deadline); step++ {
		time.Sleep(50 * time.Millisecond)
		for h, f := range fwds {
			end := testutil.MonoNow() + int64(h)*int64(24*time.Hour)
			for i := range 2 {
				r := 2*h + i
				// Rank 2's extra host time is exposed: its peers wait
				// for it in their collectives (the detector's evidence).
				host, wait := 10.0, 3.0
				if r == 2 {
					host, wait = 13, 0
				}
				f.Step(detector.Step{Kind: detector.KindStep, Job: "cj", Rank: r, Step: step, StartNS: end - 50e6, EndNS: end,
					Phases: map[string]float64{detector.PhaseHost: host, detector.PhaseCollWait: wait, detector.PhaseStep: 50}}, 0)
			}
		}
	drain:
		for {
			select {
			case v := <-sink.vs:
				if v.State == detector.StateStraggler {
					if v.Rank != 2 || v.Phase != detector.PhaseHost {
						t.Fatalf("unexpected straggler %+v", v)
					}
					found = true
				}
			default:
				break drain
			}
		}
	}
	if !found {
		t.Fatalf("no straggler through the collector; aggregator %+v, server %+v", agg.Stats(), srv.Stats())
	}
	if st := srv.Stats(); st.Rejected != 0 || st.Unauthorized != 0 {
		t.Errorf("server %+v", st)
	}
}

// TestLoadBalancingConfigRoutesByJob pins the contract between
// deploy/otelcol-loadbalancing.yaml and the forwarder's records: the
// collector routes by the attribute the forwarder puts on the resource.
// The collector itself, with the contrib loadbalancing exporter, runs in
// test/e2e's TestLoadBalancedAggregators.
func TestLoadBalancingConfigRoutesByJob(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "deploy", "otelcol-loadbalancing.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(b)
	for _, want := range []string{
		"routing_key: attributes",
		fmt.Sprintf("routing_attributes: [%q]", wire.AttrJob),
		"exporters: [loadbalancing]",
	} {
		if !strings.Contains(cfg, want) {
			t.Errorf("deploy/otelcol-loadbalancing.yaml lacks %q", want)
		}
	}
	ld := wire.EncodeLogs("h", nil, []detector.Step{{Job: "j1", Phases: map[string]float64{}}}, nil)
	res := ld.ResourceLogs().At(0).Resource().Attributes().AsRaw()
	if len(res) != 2 || res[wire.AttrJob] != "j1" {
		t.Fatalf("forwarded resource %v: must be the job alone (plus service.name)", res)
	}
}
