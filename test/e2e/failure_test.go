package e2e

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/otel/export"
	"github.com/slowrank/slowrank/test/testutil"
)

// traceOnly is an OTLP gRPC server that accepts traces and has no metrics
// service, so every metrics export fails with Unimplemented.
type traceOnly struct {
	coltracepb.UnimplementedTraceServiceServer
	spans atomic.Int64
}

func (s *traceOnly) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			s.spans.Add(int64(len(ss.Spans)))
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// TestExporterSurvivesBadEndpoints feeds a heavy straggler load to the
// exporter while its endpoint is down or rejecting. The caller is never
// blocked, memory stays bounded, losses are counted and Shutdown returns by
// its deadline; no goroutine outlives it. It needs no tool binaries.
func TestExporterSurvivesBadEndpoints(t *testing.T) {
	type endpoint struct {
		url, protocol string
		traceSrv      *traceOnly
	}
	cases := []struct {
		name  string
		setup func(t *testing.T) endpoint
	}{
		{"down/http", func(t *testing.T) endpoint {
			return endpoint{url: "http://" + testutil.FreeAddr(t), protocol: export.ProtocolHTTPProtobuf}
		}},
		{"down/grpc", func(t *testing.T) endpoint {
			return endpoint{url: "http://" + testutil.FreeAddr(t), protocol: export.ProtocolGRPC}
		}},
		{"503/http", func(t *testing.T) endpoint {
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				http.Error(w, "overloaded", http.StatusServiceUnavailable)
			}))
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv.Listener = l
			srv.Start()
			t.Cleanup(srv.Close)
			return endpoint{url: srv.URL, protocol: export.ProtocolHTTPProtobuf}
		}},
		{"no-metrics-service/grpc", func(t *testing.T) endpoint {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			gs := grpc.NewServer()
			ts := &traceOnly{}
			coltracepb.RegisterTraceServiceServer(gs, ts)
			go func() { _ = gs.Serve(l) }()
			t.Cleanup(gs.Stop)
			return endpoint{url: "http://" + l.Addr().String(), protocol: export.ProtocolGRPC, traceSrv: ts}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ignore := goleak.IgnoreCurrent()
			t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
			ep := tc.setup(t)
			runBadEndpoint(t, ep.url, ep.protocol, ep.traceSrv)
		})
	}
}

func runBadEndpoint(t *testing.T, url, protocol string, ts *traceOnly) {
	exp, err := export.New(context.Background(), export.Config{
		Job: "bad", HostName: "e2e-host", Endpoint: url, Protocol: protocol, Env: emptyEnv,
		Timeout: 500 * time.Millisecond, MetricInterval: 100 * time.Millisecond,
		Queue:  export.QueueConfig{MaxQueueSize: 2048, MaxExportBatchSize: 256, BatchTimeout: 50 * time.Millisecond},
		Policy: export.Policy{MaxBufferedSteps: 4000},
	})
	if err != nil {
		t.Fatal(err)
	}
	before := exp.Stats().ExportErrors
	runtime.GC()
	var m0 runtime.MemStats
	runtime.ReadMemStats(&m0)

	// 400 settled windows with a straggler (40 000 spans, far more than the
	// queue holds), then 8 000 facts of windows that never settle (twice the
	// buffer). Time every call: none may block on the dead endpoint.
	const ranks = 4
	var slowest time.Duration
	timed := func(f func()) {
		s := time.Now()
		f()
		slowest = max(slowest, time.Since(s))
	}
	step := int64(0)
	feedStart := time.Now()
	for w := int64(0); w < 400; w++ {
		for s := 0; s < stepsPerWindow; s++ {
			for r := 0; r < ranks; r++ {
				f := e2eFact("bad", r, step, step*int64(stepDur), (step+1)*int64(stepDur), true)
				timed(func() { exp.RecordStep(f, w) })
			}
			step++
		}
		v := e2eVerdict("bad", w, detector.StateStraggler, 3)
		timed(func() { exp.SettleWindow("bad", w, []detector.Verdict{v}) })
	}
	for i := 0; i < 2000; i++ {
		for r := 0; r < ranks; r++ {
			f := e2eFact("bad", r, step, step*int64(stepDur), (step+1)*int64(stepDur), false)
			timed(func() { exp.RecordStep(f, 400+int64(i/300)) }) // windows 400..406, within SettleLag
		}
		step++
	}
	feed := time.Since(feedStart)
	time.Sleep(1500 * time.Millisecond) // let exports fail and metrics retry

	runtime.GC()
	var m1 runtime.MemStats
	runtime.ReadMemStats(&m1)
	growth := int64(m1.HeapAlloc) - int64(m0.HeapAlloc)
	st := exp.Stats()
	t.Logf("fed 24000 facts in %v (slowest call %v); heap growth %d KiB; %+v", feed, slowest, growth>>10, st)

	if slowest > 250*time.Millisecond {
		t.Errorf("a RecordStep/SettleWindow call took %v: the caller was blocked", slowest)
	}
	if growth > 96<<20 {
		t.Errorf("heap grew by %d MiB: memory is not bounded", growth>>20)
	}
	if st.FactsDropped[export.DropBufferOverflow] == 0 {
		t.Errorf("buffer overflow not counted: %+v", st.FactsDropped)
	}
	if st.ExportErrors <= before {
		t.Errorf("export errors not counted (%d -> %d)", before, st.ExportErrors)
	}
	if ts == nil {
		if st.SpansExported != 0 {
			t.Errorf("%d spans exported to a dead endpoint", st.SpansExported)
		}
		if st.SpansDropped[export.DropQueueFull]+st.SpansDropped[export.DropExportFailed] == 0 {
			t.Errorf("no span drops counted: %+v", st.SpansDropped)
		}
	} else {
		if st.SpansExported == 0 || ts.spans.Load() == 0 {
			t.Errorf("the trace service received nothing (exported %d, server %d)", st.SpansExported, ts.spans.Load())
		}
		if st.MetricPointsFailed == 0 {
			t.Errorf("failed metric exports not counted")
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_ = exp.Shutdown(ctx) // an error (deadline) is expected here
	if d := time.Since(start); d > 2500*time.Millisecond {
		t.Errorf("Shutdown took %v with a 2s deadline", d)
	}
	t.Logf("shutdown in %v", time.Since(start))
}
