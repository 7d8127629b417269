package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slowrank/slowrank/agent/discover"
	"github.com/slowrank/slowrank/agent/duty"
	"github.com/slowrank/slowrank/agent/localapi"
	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/detector"
)

// fakeController is a Controller without an agent.
type fakeController struct {
	mu      sync.Mutex
	state   ControlState
	reqs    []ControlRequest
	err     error
	blocked bool // ControlState/Control wait for ctx (a stopping agent)
}

func (f *fakeController) Status() Status {
	v := detector.Verdict{Job: "j", Rank: 2, State: detector.StateStraggler, Phase: "host", Deviation: 0.58, AlertActive: true}
	return Status{
		Uptime: 90 * time.Second, Processes: 4, Attached: 3, Events: 1234, Lost: 2, Windows: 10, Facts: 400, Verdicts: 7,
		DeviceState: "no-lib",
		Ranks: []RankView{
			{Job: "j", Rank: 0, Step: detector.Step{Job: "j", Rank: 0, Step: 9, Phases: map[string]float64{"step": 51.9, "host": 20.9}}},
			{Job: `we"ird\job`, Rank: 2, Step: detector.Step{Job: "j", Rank: 2, Step: 9, Phases: map[string]float64{"step": 52.2}}, Verdict: &v},
		},
		Alerts:   []detector.Verdict{v},
		Counters: map[string]int64{"events": 1234, "probe_ncclAllReduce": 99},
		Overhead: &duty.Overhead{Budget: 0.003, Cost: duty.CostEstimate{Cost: 0.02, Low: 0.018, High: 0.022, Pairs: 40, Measured: true},
			Device: 0.0015, Uprobes: 0.001, Library: 0.0001, Total: 0.0026, EscalationsGranted: 3, EscalationsRefused: 5},
	}
}

func (f *fakeController) ControlState(ctx context.Context) (ControlState, error) {
	f.mu.Lock()
	blocked := f.blocked
	st := f.state
	f.mu.Unlock()
	if blocked {
		<-ctx.Done()
		return ControlState{}, ctx.Err()
	}
	return st, nil
}

func (f *fakeController) Control(ctx context.Context, req ControlRequest) (ControlState, error) {
	if err := req.Validate(); err != nil {
		return ControlState{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.blocked {
		f.mu.Unlock()
		<-ctx.Done()
		f.mu.Lock()
		return ControlState{}, ctx.Err()
	}
	if f.err != nil {
		return f.state, f.err
	}
	f.reqs = append(f.reqs, req)
	switch req.Action {
	case ActionPause:
		f.state.Paused = true
	case ActionResume:
		f.state.Paused = false
	case ActionSet:
		if req.Window != nil {
			f.state.Detector.Window = *req.Window
			f.state.DetectorSwaps++
		}
	}
	return f.state, nil
}

func newFake() *fakeController {
	return &fakeController{state: ControlState{Detector: DetectorSettings{Window: Duration(5 * time.Second), Threshold: 0.05, Floor: Duration(time.Millisecond), Consecutive: 3}}}
}

// handlerConfig is what NewHandler took before the endpoint moved to
// package localapi: the agent's report fields and the handler's.
type handlerConfig struct {
	Control bool
	Version string
	Export  func() ExportHealth
	Timeout time.Duration
	Metrics http.Handler
}

// newHandler serves ctl as `slowrank agent` does: LocalAPI behind
// localapi's handler.
func newHandler(ctl Controller, c handlerConfig) http.Handler {
	return localapi.NewHandler(LocalAPI(ctl, c.Version, c.Export), localapi.HandlerConfig{Control: c.Control, Timeout: c.Timeout, Metrics: c.Metrics})
}

// unixClient talks HTTP over a Unix socket.
func unixClient(path string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		},
	}}
}

func do(t *testing.T, h http.Handler, method, path, body string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

func TestHandlerStatus(t *testing.T) {
	f := newFake()
	h := newHandler(f, handlerConfig{Control: true, Version: "v1", Export: func() ExportHealth {
		return ExportHealth{OTel: "otlp", Endpoint: "http://127.0.0.1:4318", Counters: map[string]int64{"spans_exported": 5}}
	}})
	code, body := do(t, h, "GET", "/status", "")
	if code != 200 {
		t.Fatalf("status %d: %s", code, body)
	}
	var rep StatusReport
	if err := json.Unmarshal([]byte(body), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Processes != 4 || rep.Events != 1234 || rep.Version != "v1" || rep.Control == nil || rep.Control.Detector.Consecutive != 3 ||
		rep.Export == nil || rep.Export.Counters["spans_exported"] != 5 || len(rep.Ranks) != 2 || rep.Ranks[1].Verdict == nil {
		t.Fatalf("report %+v", rep)
	}
	if time.Duration(rep.Control.Detector.Window) != 5*time.Second {
		t.Fatalf("window %v", rep.Control.Detector.Window)
	}
	if code, _ := do(t, h, "POST", "/status", ""); code != http.StatusMethodNotAllowed {
		t.Fatalf("POST /status: %d", code)
	}
	if code, _ := do(t, h, "GET", "/nope", ""); code != http.StatusNotFound {
		t.Fatalf("GET /nope: %d", code)
	}
	if code, body := do(t, h, "GET", "/", ""); code != 200 || !strings.Contains(body, "/control") {
		t.Fatalf("GET /: %d %s", code, body)
	}
}

// TestHandlerStatusStoppingAgent: a stopping agent does not answer control
// state requests; /status still answers quickly, saying so.
func TestHandlerStatusStoppingAgent(t *testing.T) {
	f := newFake()
	f.blocked = true
	h := newHandler(f, handlerConfig{Control: true, Timeout: 50 * time.Millisecond})
	start := time.Now()
	code, body := do(t, h, "GET", "/status", "")
	if code != 200 || !strings.Contains(body, "control_error") || time.Since(start) > 2*time.Second {
		t.Fatalf("status %d after %s: %s", code, time.Since(start), body)
	}
	if code, body := do(t, h, "POST", "/control", `{"action":"pause"}`); code != http.StatusServiceUnavailable {
		t.Fatalf("control on a stopping agent: %d %s", code, body)
	}
}

func TestHandlerControl(t *testing.T) {
	f := newFake()
	h := newHandler(f, handlerConfig{Control: true})
	tests := []struct {
		body string
		code int
		want string
	}{
		{`{"action":"pause"}`, 200, `"paused":true`},
		{`{"action":"resume"}`, 200, `"paused":false`},
		{`{"action":"set","window":"2s"}`, 200, `"window":"2s"`},
		{`{"action":"set"}`, 400, "needs at least one"},
		{`{"action":"set","window":5}`, 400, "want a string"},
		{`{"action":"set","windw":"5s"}`, 400, "unknown field"},
		{`{"action":"pause"}{"action":"resume"}`, 400, "one JSON object"},
		{`not json`, 400, "decode"},
		{`{"action":"jump"}`, 400, "unknown action"},
	}
	for _, tt := range tests {
		code, body := do(t, h, "POST", "/control", tt.body)
		if code != tt.code || !strings.Contains(body, tt.want) {
			t.Errorf("%s: %d %s, want %d containing %q", tt.body, code, body, tt.code, tt.want)
		}
	}
	if code, _ := do(t, h, "GET", "/control", ""); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /control: %d", code)
	}
	f.err = ErrSwapInProgress
	if code, body := do(t, h, "POST", "/control", `{"action":"set","threshold":0.1}`); code != http.StatusConflict || !strings.Contains(body, "settling") {
		t.Errorf("swap in progress: %d %s", code, body)
	}
	// Read-only endpoint (TCP): control refused.
	ro := newHandler(f, handlerConfig{})
	if code, body := do(t, ro, "POST", "/control", `{"action":"pause"}`); code != http.StatusForbidden {
		t.Errorf("control on TCP: %d %s", code, body)
	}
}

// TestHandlerPprof: the agent's own profiles are served on the Unix socket
// (the operator's) and never on TCP.
func TestHandlerPprof(t *testing.T) {
	f := newFake()
	tests := []struct {
		name    string
		control bool
		want    int
	}{
		{"unix socket", true, http.StatusOK},
		{"tcp", false, http.StatusNotFound},
	}
	for _, tt := range tests {
		h := newHandler(f, handlerConfig{Control: tt.control})
		if code, body := do(t, h, "GET", "/debug/pprof/goroutine?debug=1", ""); code != tt.want {
			t.Errorf("%s: GET /debug/pprof/goroutine: %d %.80s", tt.name, code, body)
		}
	}
}

func TestMetricsHandler(t *testing.T) {
	f := newFake()
	if code, _ := do(t, newHandler(f, handlerConfig{}), "GET", "/metrics", ""); code != http.StatusNotFound {
		t.Errorf("GET /metrics without a metrics handler: %d, want 404", code)
	}
	h := newHandler(f, handlerConfig{Metrics: promHandler(t, func(obs func(string, float64, ...string)) {
		observeStatus(obs, f.Status(), &f.state)
	})})
	code, body := do(t, h, "GET", "/metrics", "")
	if code != 200 {
		t.Fatalf("status %d", code)
	}
	for _, want := range []string{"slowrank_agent_events_read_total 1234", `slowrank_agent_probe_events_total{probe="ncclAllReduce"} 99`,
		"slowrank_agent_uptime_seconds 90", `slowrank_agent_device_collection_ratio{state="no-lib"} 1`,
		`slowrank_agent_overhead_spent_ratio{source="total"} 0.0026`, `slowrank_records_dropped_total{reason="ringbuf_full"} 0`,
		"slowrank_attach_errors_total 0"} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
}

// TestAgentControlPrivileged runs a real agent (BPF programs loaded, a real
// process tracked) behind a real server and drives it over the socket.
func TestAgentControlPrivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to load BPF programs")
	}
	if err := bpf.CheckSupport(); err != nil {
		t.Skipf("kernel lacks what the agent needs: %v", err)
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep:", err)
	}
	cmd := exec.Command(sleep, "60")
	cmd.Env = append(os.Environ(), "SLOWRANK_CONTROL_TEST_RANK=1", "OMPI_COMM_WORLD_RANK=0") // not RANK: other agents on the host select by it
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); _ = cmd.Wait() }) // reaps the killed child: Wait reports the kill

	cfg := DefaultConfig()
	cfg.HostName = "ctl"
	cfg.Selector = discover.Selector{EnvKey: "SLOWRANK_CONTROL_TEST_RANK"}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := a.Close(); err != nil {
			t.Error(err)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	srv, err := localapi.NewServer(LocalAPI(a, "", nil), localapi.ServerConfig{Socket: sock, Metrics: promHandler(t, a.Observe)})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	defer func() {
		if err := srv.Close(); err != nil {
			t.Error(err)
		}
	}()
	c := unixClient(sock)
	post := func(body string) ControlResponse {
		t.Helper()
		resp, err := c.Post("http://agent/control", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var cr ControlResponse
		if err := json.NewDecoder(resp.Body).Decode(&cr); err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %+v", body, resp.StatusCode, cr)
		}
		return cr
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.Status().Processes != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("process not found: %+v", a.Status())
		}
		time.Sleep(50 * time.Millisecond)
	}

	if cr := post(`{"action":"pause"}`); !cr.Control.Paused {
		t.Fatalf("pause: %+v", cr)
	}
	if cr := post(`{"action":"pause"}`); !cr.Control.Paused { // idempotent
		t.Fatalf("pause twice: %+v", cr)
	}
	cr := post(`{"action":"set","window":"2s","threshold":0.1,"consecutive":2,"duty_share":0.5}`)
	if cr.Control.DetectorSwaps != 1 || time.Duration(cr.Control.Detector.Window) != 2*time.Second ||
		cr.Control.Detector.Threshold != 0.1 || cr.Control.Duty == nil || cr.Control.Duty.PinnedShare != 0.5 {
		t.Fatalf("set: %+v", cr.Control)
	}
	if cr.Control.Duty.Period > Duration(2*time.Second) {
		t.Fatalf("duty period %s longer than the window", time.Duration(cr.Control.Duty.Period))
	}
	post(`{"action":"set","duty_auto":true}`)
	if cr := post(`{"action":"resume"}`); cr.Control.Paused || cr.Control.Duty.PinnedShare != 0 {
		t.Fatalf("resume: %+v", cr.Control)
	}
	var metrics string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		resp, err := c.Get("http://agent/metrics")
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		_, err = io.Copy(&buf, resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if metrics = buf.String(); strings.Contains(metrics, "slowrank_agent_paused_ratio 0\n") && strings.Contains(metrics, "slowrank_agent_processes 1\n") {
			break
		}
	}
	if !strings.Contains(metrics, "slowrank_agent_paused_ratio 0\n") || !strings.Contains(metrics, "slowrank_agent_processes 1\n") ||
		!strings.Contains(metrics, `slowrank_agent_control_actions_total{action="pause"} 1`+"\n") {
		t.Fatalf("metrics:\n%s", metrics)
	}
	cs := a.Counters()
	if cs["control_pauses"] != 1 || cs["control_resumes"] != 1 || cs["untrack_errors"] != 0 || cs["track_errors"] != 0 || cs["detector_swaps"] != 1 {
		t.Fatalf("counters %v", cs)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("agent did not stop")
	}
	// Stopped: control requests fail fast with 503, status still answers.
	h := newHandler(a, handlerConfig{Control: true, Timeout: 100 * time.Millisecond})
	if code, body := do(t, h, "POST", "/control", `{"action":"pause"}`); code != http.StatusServiceUnavailable {
		t.Fatalf("control after stop: %d %s", code, body)
	}
	if code, _ := do(t, h, "GET", "/status", ""); code != 200 {
		t.Fatalf("status after stop: %d", code)
	}
}
