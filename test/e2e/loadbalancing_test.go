package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/otel/export"
	"github.com/slowrank/slowrank/otel/forward"
	"github.com/slowrank/slowrank/test/testutil"
)

// lbAggregator is one `slowrank aggregate` behind the loadbalancing
// collector.
type lbAggregator struct {
	name, addr, facts string
	proc              *testutil.Proc
}

// TestLoadBalancedAggregators runs the multi-host path of docs/deploy.md:
// two hosts' forwarders → the Collector with deploy/otelcol-loadbalancing.yaml
// (the project's own build, contrib loadbalancing exporter) → two real
// `slowrank aggregate` processes → the Collector of deploy/otelcol.yaml →
// Jaeger. Every job's facts must reach exactly one aggregator (each one
// judges all ranks of its jobs), both aggregators must get jobs, and each
// job's slow rank must be found in Jaeger with the aggregator that received
// the job as the exporting process. Where a job lands depends on the hash
// ring of the aggregators' (free, so random) ports: jobs are added one at a
// time until both aggregators have one, at most lbMaxJobs.
func TestLoadBalancedAggregators(t *testing.T) {
	bin := testutil.ToolsBin(t, "jaeger", "otelcol")
	setup := time.Now()
	st := startStack(t, bin)
	slowrank := testutil.BuildAgent(t, t.TempDir())
	root := testutil.RepoRoot(t)
	dir := t.TempDir()
	const token = "lb-e2e-token"
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	aggs := make([]*lbAggregator, 2)
	for i := range aggs {
		a := &lbAggregator{name: fmt.Sprintf("agg-%d", i), addr: testutil.FreeAddr(t), facts: filepath.Join(dir, fmt.Sprintf("facts-%d.jsonl", i))}
		a.proc = startServer(t, a.name, slowrank, []string{"aggregate", "--listen", a.addr, "--host-name", a.name,
			"--token-file", tokenFile, "--window", "1s", "--lateness", "500ms", "--facts", a.facts,
			"--otel", "on", "--stats-every", "0", "--duration", "3m"},
			map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + st.otlpGRPC, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
		waitTCP(t, a.addr)
		aggs[i] = a
	}
	lbGRPC, lbHTTP := testutil.FreeAddr(t), testutil.FreeAddr(t)
	lb := startServer(t, "otelcol-loadbalancing", filepath.Join(bin, "otelcol"),
		[]string{"--config", filepath.Join(root, "deploy", "otelcol-loadbalancing.yaml")},
		map[string]string{
			"SLOWRANK_LB_GRPC": lbGRPC, "SLOWRANK_LB_HTTP": lbHTTP,
			"SLOWRANK_AGGREGATOR_1": aggs[0].addr, "SLOWRANK_AGGREGATOR_2": aggs[1].addr,
			"SLOWRANK_AGGREGATOR_TOKEN": token, "SLOWRANK_OTELCOL_LOG_LEVEL": "warn",
		})
	waitTCP(t, lbGRPC)
	select {
	case <-lb.Done:
		t.Fatalf("the loadbalancing collector exited: %v\n%s", lb.Err, testutil.Tail(lb.Out.String(), 3000))
	default:
	}

	// Two hosts, clocks a day apart (the aggregator compares none), two
	// ranks of every job each. Rank 2 is slow in host time, which its peers
	// wait for in their collectives (the detector's evidence).
	hosts := make([]*forward.Forwarder, 2)
	for h := range hosts {
		offset := int64(h) * int64(24*time.Hour)
		f, err := forward.New(forward.Config{Endpoint: lbGRPC, HostName: fmt.Sprint("lb-host", h),
			NowMono: func() int64 { return testutil.MonoNow() + offset }})
		if err != nil {
			t.Fatal(err)
		}
		hosts[h] = f
	}
	defer func() {
		for _, f := range hosts {
			_ = f.Close(context.Background())
		}
	}()

	runID := time.Now().UnixNano()
	var jobs []string
	addJob := func() {
		job := fmt.Sprintf("lb-%d-%d", runID, len(jobs))
		jobs = append(jobs, job)
		for h, f := range hosts {
			f.Topology(detector.Topology{Kind: detector.KindTopology, Job: job, Version: 1,
				Ranks:  []detector.RankInfo{{Rank: 2 * h, Host: fmt.Sprint("lb-host", h)}, {Rank: 2*h + 1, LocalRank: 1, Host: fmt.Sprint("lb-host", h)}},
				Groups: []detector.Group{{ID: "world", Type: "world", Ranks: []int{0, 1, 2, 3}}}})
		}
	}
	addJob()

	start := time.Now()
	t.Logf("setup (Jaeger, collectors, slowrank build, aggregators): %v", start.Sub(setup).Round(100*time.Millisecond))
	deadline := start.Add(lbTimeLimit)
	found := map[string]string{} // job -> aggregator whose spans name its slow rank in Jaeger
	var landed map[string][]string
	nextCheck := time.Now()
	for step := int64(0); time.Now().Before(deadline); step++ {
		time.Sleep(50 * time.Millisecond)
		for h, f := range hosts {
			end := testutil.MonoNow() + int64(h)*int64(24*time.Hour)
			for _, job := range jobs {
				for i := range 2 {
					r := 2*h + i
					host, wait := 10.0, 3.0
					if r == 2 {
						host, wait = 13, 0
					}
					f.Step(detector.Step{Kind: detector.KindStep, Job: job, Rank: r, Step: step, StartNS: end - 50e6, EndNS: end,
						Phases: map[string]float64{detector.PhaseHost: host, detector.PhaseCollWait: wait, detector.PhaseStep: 50}}, 0)
				}
			}
		}
		if time.Now().Before(nextCheck) {
			continue
		}
		nextCheck = time.Now().Add(time.Second)
		landed = jobsPerAggregator(t, aggs)
		for job, where := range landed {
			if len(where) > 1 {
				t.Fatalf("job %s reached aggregators %v: one job must reach exactly one", job, where)
			}
		}
		if used := aggregatorsUsed(landed); len(landed) == len(jobs) && len(used) < len(aggs) && len(jobs) < lbMaxJobs {
			addJob()
		}
		for _, job := range jobs {
			if _, ok := found[job]; !ok {
				if agg := stragglerAggregator(t, st, job); agg != "" {
					found[job] = agg
					t.Logf("job %s: rank 2 named straggler by %s after %v", job, agg, time.Since(start).Round(100*time.Millisecond))
				}
			}
		}
		if len(found) == len(jobs) && len(aggregatorsUsed(landed)) == len(aggs) {
			break
		}
	}
	elapsed := time.Since(start)

	// Stop the aggregators (SIGTERM flushes their facts files) and judge
	// where every job's facts went.
	for _, a := range aggs {
		a.proc.Stop()
		out := a.proc.Out.String()
		if !strings.Contains(out, "aggregator stopped") {
			t.Errorf("%s did not stop cleanly:\n%s", a.name, testutil.Tail(out, 2000))
		}
		// The token passed the collector and no record was refused.
		if !strings.Contains(out, "rejected=0 unauthorized=0") {
			t.Errorf("%s refused requests or records:\n%s", a.name, testutil.Tail(out, 2000))
		}
	}
	landed = jobsPerAggregator(t, aggs)
	t.Logf("%d jobs over %d aggregators in %v (aggregators stopped in %v): %v", len(jobs), len(aggs),
		elapsed.Round(100*time.Millisecond), time.Since(start.Add(elapsed)).Round(100*time.Millisecond), landed)
	if used := aggregatorsUsed(landed); len(used) != len(aggs) {
		t.Errorf("jobs reached only %v of %d aggregators (jobs %v)", used, len(aggs), landed)
	}
	for _, job := range jobs {
		where := landed[job]
		if len(where) != 1 {
			t.Errorf("job %s reached aggregators %v, want exactly one", job, where)
			continue
		}
		switch agg := found[job]; {
		case agg == "":
			t.Errorf("job %s: no straggler trace of rank 2 in Jaeger within %v", job, lbTimeLimit)
		case agg != where[0]:
			t.Errorf("job %s: its facts reached %s but %s exported its straggler", job, where[0], agg)
		}
	}
}

// TestCollectorConfigsValidate: both shipped collector files pass `otelcol
// validate` with the project's own build (the loadbalancing file needs the
// contrib loadbalancing exporter in it).
func TestCollectorConfigsValidate(t *testing.T) {
	bin := filepath.Join(testutil.ToolsBin(t, "otelcol"), "otelcol")
	for _, name := range []string{"otelcol.yaml", "otelcol-loadbalancing.yaml"} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "validate", "--config", filepath.Join(testutil.RepoRoot(t), "deploy", name))
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("otelcol validate: %v\n%s", err, out)
			}
		})
	}
}

const (
	lbTimeLimit = 90 * time.Second
	lbMaxJobs   = 12
)

// jobsPerAggregator reads every aggregator's --facts file: for each job, the
// aggregators that judged facts of it.
func jobsPerAggregator(t *testing.T, aggs []*lbAggregator) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, a := range aggs {
		f, err := os.Open(a.facts)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 1<<16), 1<<22)
		for sc.Scan() {
			var fact struct {
				Kind string `json:"kind"`
				Job  string `json:"job"`
			}
			// The last line may be half written: skip what does not decode.
			if json.Unmarshal(sc.Bytes(), &fact) != nil || fact.Kind != detector.KindStep {
				continue
			}
			if !slices.Contains(out[fact.Job], a.name) {
				out[fact.Job] = append(out[fact.Job], a.name)
			}
		}
		_ = f.Close() // read only
		if err := sc.Err(); err != nil {
			t.Fatalf("%s: %v", a.facts, err)
		}
	}
	return out
}

func aggregatorsUsed(landed map[string][]string) []string {
	var used []string
	for _, where := range landed {
		for _, a := range where {
			if !slices.Contains(used, a) {
				used = append(used, a)
			}
		}
	}
	slices.Sort(used)
	return used
}

// stragglerAggregator searches Jaeger by tag, as an operator would, for a
// train.step span of the job's rank 2 in state straggler, and returns the
// host.name of the process (the aggregator) that exported it; "" if none yet.
func stragglerAggregator(t *testing.T, st *stack, job string) string {
	t.Helper()
	q := url.Values{"service": {"slowrank"}, "tags": {`{"slowrank.state":"straggler","slowrank.job.id":"` + job + `"}`},
		"limit": {"20"}, "lookback": {"1h"}}
	var r jaegerResponse
	if err := getJSON(context.Background(), st.client, st.jaegerQuery+"/api/traces?"+q.Encode(), &r); err != nil {
		return ""
	}
	for _, tr := range r.Data {
		for _, sp := range tr.Spans {
			if sp.OperationName != export.SpanStep || tagString(sp.Tags, "slowrank.state") != "straggler" {
				continue
			}
			if rank := tagString(sp.Tags, string(export.AttrRank)); rank != "2" {
				t.Errorf("job %s: rank %s named straggler, want 2", job, rank)
				continue
			}
			return tagString(tr.Processes[sp.ProcessID].Tags, "host.name")
		}
	}
	return ""
}
