package forward

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/internal/monoclock"
	"github.com/slowrank/slowrank/otel/wire"
	"github.com/slowrank/slowrank/selfmetrics"
)

// fakeLogs is an OTLP/gRPC logs receiver that records requests and fails
// the first failN calls with failCode.
type fakeLogs struct {
	plogotlp.UnimplementedGRPCServer
	mu       sync.Mutex
	reqs     []plog.Logs
	calls    atomic.Int64
	failN    int64
	failCode codes.Code
	reject   int64
}

func (f *fakeLogs) Export(_ context.Context, req plogotlp.ExportRequest) (plogotlp.ExportResponse, error) {
	if n := f.calls.Add(1); n <= f.failN {
		return plogotlp.NewExportResponse(), status.Error(f.failCode, "not now")
	}
	ld := plog.NewLogs()
	req.Logs().CopyTo(ld)
	f.mu.Lock()
	f.reqs = append(f.reqs, ld)
	f.mu.Unlock()
	resp := plogotlp.NewExportResponse()
	if f.reject > 0 {
		resp.PartialSuccess().SetRejectedLogRecords(f.reject)
	}
	return resp, nil
}

func (f *fakeLogs) records() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, ld := range f.reqs {
		n += ld.LogRecordCount()
	}
	return n
}

func startFakeLogs(t *testing.T, f *fakeLogs) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	plogotlp.RegisterGRPCServer(s, f)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return ln.Addr().String()
}

func newTestForwarder(t *testing.T, cfg Config) *Forwarder {
	t.Helper()
	if cfg.HostName == "" {
		cfg.HostName = "h1"
	}
	if cfg.FlushInterval == 0 {
		cfg.FlushInterval = 10 * time.Millisecond
	}
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.retryBase = 5 * time.Millisecond
	t.Cleanup(func() { _ = f.Close(context.Background()) })
	return f
}

func fwdStep(rank int, step int64, end int64) detector.Step {
	return detector.Step{Kind: detector.KindStep, Job: "j1", Rank: rank, Step: step, Host: "h1", StartNS: end - 20e6, EndNS: end,
		Phases: map[string]float64{detector.PhaseStep: 20, detector.PhaseHost: 4.5}, GPU: true, Topo: 2, Epoch: 9,
		Workload: &detector.Workload{FP: "abc", Tokens: 100}}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestForwarderSchema(t *testing.T) {
	fake := &fakeLogs{}
	addr := startFakeLogs(t, fake)
	now := int64(50e9)
	f := newTestForwarder(t, Config{Endpoint: addr, NowMono: func() int64 { return now },
		MonoToWall: func(ns int64) time.Time { return time.Unix(1_700_000_000, ns) }})
	topo := detector.Topology{Kind: detector.KindTopology, Job: "j1", Version: 2, Ranks: []detector.RankInfo{{Rank: 0, Host: "h1"}}}
	f.Topology(topo)
	f.Step(fwdStep(0, 7, now-1e9), 0)
	waitFor(t, "two records", func() bool { return fake.records() == 2 })

	fake.mu.Lock()
	ld := fake.reqs[0]
	fake.mu.Unlock()
	if ld.ResourceLogs().Len() != 1 {
		t.Fatalf("%d resources", ld.ResourceLogs().Len())
	}
	rl := ld.ResourceLogs().At(0)
	if got := rl.Resource().Attributes().AsRaw(); len(got) != 2 || got["service.name"] != "slowrank" || got["slowrank.job.id"] != "j1" {
		t.Fatalf("resource %v: want only service.name and the job (routing by resource = by job)", got)
	}
	sl := rl.ScopeLogs().At(0)
	if sl.Scope().Name() != wire.ScopeName {
		t.Errorf("scope %q", sl.Scope().Name())
	}
	if v, _ := sl.Scope().Attributes().Get("slowrank.sent_mono_ns"); v.Int() != now {
		t.Errorf("sent stamp %v, want %d", v.AsRaw(), now)
	}
	tr, st := sl.LogRecords().At(0), sl.LogRecords().At(1)
	if tr.EventName() != wire.EventTopology || tr.TraceID() != wire.RouteTraceID("j1") || st.TraceID() != wire.RouteTraceID("j1") {
		t.Errorf("event %q, trace ids %v %v", tr.EventName(), tr.TraceID(), st.TraceID())
	}
	var back detector.Topology
	if err := json.Unmarshal([]byte(tr.Body().Str()), &back); err != nil || back.Version != 2 || back.Job != "j1" {
		t.Errorf("topology body %q: %v", tr.Body().Str(), err)
	}
	want := map[string]any{
		"slowrank.kind": "step", "slowrank.host": "h1", "slowrank.rank": int64(0), "slowrank.step": int64(7),
		"slowrank.start_ns": now - 1e9 - 20e6, "slowrank.end_ns": now - 1e9, "slowrank.gpu": true,
		"slowrank.topology.version": int64(2), "slowrank.epoch": int64(9), "slowrank.workload.fp": "abc",
		"slowrank.workload.tokens": int64(100), "slowrank.phase.step_ms": 20.0, "slowrank.phase.host_ms": 4.5,
	}
	got := st.Attributes().AsRaw()
	if len(got) != len(want) {
		t.Errorf("attributes %v", got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v (%T), want %v", k, got[k], got[k], v)
		}
	}
	if st.Timestamp() != pcommon.NewTimestampFromTime(time.Unix(1_700_000_000, now-1e9)) {
		t.Errorf("timestamp %v", st.Timestamp())
	}
}

func TestForwarderNeverBlocksAndDropsOldest(t *testing.T) {
	// Nothing listens there.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	f := newTestForwarder(t, Config{Endpoint: addr, QueueSize: 100, Timeout: 50 * time.Millisecond, MaxBatch: 10})
	start := time.Now()
	now := MonoNowForTest()
	for i := range 100_000 {
		f.Step(fwdStep(i%8, int64(i), now), 0)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("100k Step calls took %v", d)
	}
	st := f.Stats()
	if st.Queued > 100 {
		t.Fatalf("queue holds %d > 100", st.Queued)
	}
	if got := st.Dropped[DropQueueFull]; got < 100_000-110 {
		t.Fatalf("dropped %d as queue_full", got)
	}
	waitFor(t, "failures", func() bool { return f.Stats().Failures > 0 })
}

// MonoNowForTest reads CLOCK_MONOTONIC.
func MonoNowForTest() int64 { return monoclock.Now() }

func TestForwarderRetriesWithFreshSendStamp(t *testing.T) {
	fake := &fakeLogs{failN: 3, failCode: codes.Unavailable}
	addr := startFakeLogs(t, fake)
	var clock atomic.Int64
	clock.Store(100e9)
	f := newTestForwarder(t, Config{Endpoint: addr, NowMono: func() int64 { return clock.Add(1e6) }})
	f.Step(fwdStep(1, 1, 99e9), 0)
	waitFor(t, "delivery after retries", func() bool { return fake.records() == 1 && f.Stats().Sent == 1 })
	st := f.Stats()
	if st.Failures != 3 || st.Sent != 1 || st.Requests != 1 {
		t.Fatalf("%+v", st)
	}
	fake.mu.Lock()
	v, _ := fake.reqs[0].ResourceLogs().At(0).ScopeLogs().At(0).Scope().Attributes().Get("slowrank.sent_mono_ns")
	fake.mu.Unlock()
	if v.Int() <= 100e9+3e6 {
		t.Errorf("the delivered attempt carries sent=%d: not refreshed on retry", v.Int())
	}
}

func TestForwarderPermanentErrorIsNotRetried(t *testing.T) {
	fake := &fakeLogs{failN: 1 << 30, failCode: codes.InvalidArgument}
	addr := startFakeLogs(t, fake)
	f := newTestForwarder(t, Config{Endpoint: addr})
	f.Step(fwdStep(1, 1, MonoNowForTest()), 0)
	waitFor(t, "rejection", func() bool { return f.Stats().Dropped[DropRejected] == 1 })
	time.Sleep(50 * time.Millisecond)
	if n := fake.calls.Load(); n != 1 {
		t.Fatalf("%d calls for a permanent error", n)
	}
}

func TestForwarderDropsStaleFacts(t *testing.T) {
	fake := &fakeLogs{}
	addr := startFakeLogs(t, fake)
	now := int64(1000e9)
	f := newTestForwarder(t, Config{Endpoint: addr, MaxAge: 5 * time.Second, NowMono: func() int64 { return now }})
	f.Step(fwdStep(0, 1, now-6e9), 0) // ended 6 s ago
	f.Step(fwdStep(0, 2, now-1e9), 0)
	waitFor(t, "one record", func() bool { return fake.records() == 1 })
	if got := f.Stats().Dropped[DropStale]; got != 1 {
		t.Fatalf("stale drops %d", got)
	}
}

func TestForwarderResendsTopologyAndPartialSuccess(t *testing.T) {
	fake := &fakeLogs{reject: 1}
	addr := startFakeLogs(t, fake)
	f := newTestForwarder(t, Config{Endpoint: addr, TopologyEvery: 30 * time.Millisecond})
	f.Topology(detector.Topology{Kind: detector.KindTopology, Job: "j1", Version: 1})
	// The fake counts a call when it receives it; the forwarder counts the
	// rejection only after the response, so wait on the forwarder's count.
	waitFor(t, "topology re-sent and each partial success counted", func() bool {
		return fake.calls.Load() >= 3 && f.Stats().Dropped[DropRejected] >= 3
	})
	if st := f.Stats(); st.Sent != 0 {
		t.Fatalf("rejected records counted as sent: %+v", st)
	}
}

func TestForwarderCloseFlushes(t *testing.T) {
	fake := &fakeLogs{}
	addr := startFakeLogs(t, fake)
	f, err := New(Config{Endpoint: addr, HostName: "h1", FlushInterval: time.Hour, MaxBatch: 7})
	if err != nil {
		t.Fatal(err)
	}
	now := MonoNowForTest()
	for i := range 5 {
		f.Step(fwdStep(0, int64(i), now), 0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if fake.records() != 5 {
		t.Fatalf("%d records delivered on close", fake.records())
	}
	f.Step(fwdStep(0, 9, now), 0)
	if got := f.Stats().Dropped[DropShutdown]; got != 1 {
		t.Fatalf("step after close: shutdown drops %d", got)
	}
	// Close against a dead aggregator returns by the deadline.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	g, err := New(Config{Endpoint: dead, HostName: "h1", Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	g.Step(fwdStep(0, 1, now), 0)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	start := time.Now()
	_ = g.Close(ctx2)
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Close took %v against a dead aggregator", d)
	}
	if got := g.Stats().Dropped[DropShutdown]; got != 1 {
		t.Fatalf("shutdown drops %d", got)
	}
}

func TestForwarderHTTP(t *testing.T) {
	var calls atomic.Int64
	var gotAuth atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		gotAuth.Store(r.Header.Get("Authorization"))
		if r.URL.Path != "/v1/logs" || r.Header.Get("Content-Type") != "application/x-protobuf" ||
			r.Header.Get("Content-Encoding") != "gzip" { // gzip'ed by default
			http.Error(w, "bad", http.StatusBadRequest)
			return
		}
		if n == 1 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body, _ := io.ReadAll(zr)
		req := plogotlp.NewExportRequest()
		if err := req.UnmarshalProto(body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		resp := plogotlp.NewExportResponse()
		resp.PartialSuccess().SetRejectedLogRecords(1)
		b, _ := resp.MarshalProto()
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(b)
	}))
	defer srv.Close()
	f := newTestForwarder(t, Config{Endpoint: srv.URL, Token: "tok"})
	now := MonoNowForTest()
	f.Step(fwdStep(0, 1, now), 0)
	f.Step(fwdStep(1, 1, now), 0)
	waitFor(t, "delivery", func() bool { return f.Stats().Requests == 1 })
	st := f.Stats()
	if st.Failures != 1 || st.Sent != 1 || st.Dropped[DropRejected] != 1 {
		t.Fatalf("%+v", st)
	}
	if gotAuth.Load() != "Bearer tok" {
		t.Fatalf("authorization %q", gotAuth.Load())
	}
}

func TestForwarderConfigErrors(t *testing.T) {
	for _, ep := range []string{"", "ftp://x:1", "grpc://nohostport", "grpc://h:1/path", "http://"} {
		_, err := New(Config{Endpoint: ep, HostName: "h"})
		if !errors.Is(err, ErrConfig) {
			t.Errorf("endpoint %q: %v", ep, err)
		}
	}
	if _, err := New(Config{Endpoint: "h:1"}); err == nil || !strings.Contains(err.Error(), "host name") {
		t.Errorf("no host name: %v", err)
	}
}

// TestCounterKeysDeclared: the keys the forwarder reports are declared in
// selfmetrics.Table, so that every drop reaches the metrics.
func TestCounterKeysDeclared(t *testing.T) {
	f, err := New(Config{Endpoint: "127.0.0.1:1", HostName: "h"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close(context.Background()) }() // nothing was sent: only its counters' names matter here
	keys := f.Counters()
	for _, reason := range []string{DropQueueFull, DropStale, DropRejected, DropShutdown, DropTopology} {
		if _, ok := keys["forward_dropped_"+reason]; !ok {
			t.Errorf("drop reason %q has no counter", reason)
		}
	}
	for k := range keys {
		if _, s, ok := selfmetrics.Lookup(k); !ok || strings.HasSuffix(s.Key, "*") {
			t.Errorf("counter %q is not declared in selfmetrics.Table", k)
		}
	}
}
