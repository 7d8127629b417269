package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/slowrank/slowrank/agent"
	"github.com/slowrank/slowrank/agent/duty"
	"github.com/slowrank/slowrank/agent/localapi"
	"github.com/slowrank/slowrank/detector"
)

// captureRun runs the CLI with args and returns what it printed on stdout
// and its exit code.
func captureRun(t *testing.T, args ...string) (string, int) {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stdout
	os.Stdout = f
	err = newApp().Run(append([]string{"slowrank"}, args...))
	os.Stdout = saved
	if cerr := f.Close(); cerr != nil {
		t.Fatal(cerr)
	}
	code := 0
	var ec cli.ExitCoder
	switch {
	case errors.As(err, &ec):
		code = ec.ExitCode()
	case err != nil:
		code = 1
	}
	b, _ := os.ReadFile(f.Name())
	if err != nil && err.Error() != "" {
		b = append(b, []byte("\nerror: "+err.Error())...)
	}
	return string(b), code
}

// fakeAgent serves a fixed status through a real server.
type fakeAgent struct {
	mu   sync.Mutex
	cs   agent.ControlState
	reqs []agent.ControlRequest
	// procs, when set, replace the status's process list.
	procs []agent.ProcessView
}

func (f *fakeAgent) Status() agent.Status {
	since := int64(3)
	v := detector.Verdict{Kind: "verdict", Job: "ft-2949-1944304736853", Window: 7, Rank: 2, State: detector.StateStraggler,
		Phase: "host", ValueMS: 32.95, ReferenceMS: 20.86, ReferenceRank: 1, Deviation: 0.58, AlertActive: true, SinceWindow: &since}
	c := detector.Verdict{Kind: "verdict", Job: "ft-2949-1944304736853", Window: 5, Rank: 2, State: detector.StateCandidate,
		Phase: "host", Deviation: 0.57, ReferenceRank: 1}
	step := func(r int, host float64) detector.Step {
		return detector.Step{Job: "ft-2949-1944304736853", Rank: r, Step: 572, Phases: map[string]float64{"step": 52, "host": host, "sync_wait": 31}}
	}
	procs := []agent.ProcessView{{PID: 4242, Rank: 0, Job: "ft-2949-1944304736853", Libraries: []string{"libcuda.so.1", "libcudart.so.12", "libnccl.so.2"}},
		{PID: 4243, Rank: 2, Job: "ft-2949-1944304736853", Libraries: []string{"libnccl.so.2"}, Injected: true}}
	f.mu.Lock()
	if f.procs != nil {
		procs = f.procs
	}
	f.mu.Unlock()
	return agent.Status{
		Uptime: 33 * time.Second, Processes: 4, Attached: 3, Events: 24110, Windows: 22, Facts: 4764, Verdicts: 17,
		DeviceState: "no-lib",
		Ranks: []agent.RankView{
			{Job: "ft-2949-1944304736853", Rank: 0, Step: step(0, 20.9)},
			{Job: "ft-2949-1944304736853", Rank: 2, Step: step(2, 33.0), Verdict: &v},
		},
		Alerts:   []detector.Verdict{v},
		Recent:   []detector.Verdict{c, v},
		Procs:    procs,
		Counters: map[string]int64{"events": 24110, "ringbuf_lost": 0, "attach_errors": 1},
		Overhead: &agent.Overhead{Budget: 0.003, Cost: duty.CostEstimate{Cost: 0.0245, Low: 0.0205, High: 0.029, Pairs: 64, Measured: true},
			Refused: "the ledger pays for 3.3 s of full collection, less than the 5s an escalation needs: 15s costs 0.424 s at 2.83 % of step time " +
				"(the upper end of the cost measured from 11 pairs), 0.129 s are left of 1.035 s (0.30 % of 5m45s of training and the escalation)",
			Device: 0.0016, Uprobes: 0.0009, Library: 0.0001, Total: 0.0026, Training: time.Hour, EscalationsGranted: 4, EscalationsRefused: 110},
	}
}

func (f *fakeAgent) ControlState(context.Context) (agent.ControlState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cs, nil
}

func (f *fakeAgent) Control(_ context.Context, req agent.ControlRequest) (agent.ControlState, error) {
	if err := req.Validate(); err != nil {
		return agent.ControlState{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, req)
	switch req.Action {
	case agent.ActionPause:
		f.cs.Paused = true
	case agent.ActionResume:
		f.cs.Paused = false
	case agent.ActionSet:
		if req.Window != nil {
			f.cs.Detector.Window = *req.Window
			f.cs.DetectorSwaps++
		}
		if req.Threshold != nil {
			f.cs.Detector.Threshold = *req.Threshold
		}
	}
	return f.cs, nil
}

func startFake(t *testing.T) (*fakeAgent, string) {
	t.Helper()
	f := &fakeAgent{cs: agent.ControlState{
		Detector: agent.DetectorSettings{Window: agent.Duration(2 * time.Second), Threshold: 0.05, Floor: agent.Duration(time.Millisecond), Consecutive: 3},
		Records:  agent.RecordCounts{Late: 4}, Facts: agent.FactCounts{Late: 1},
	}}
	sock := filepath.Join(t.TempDir(), "agent.sock")
	srv, err := localapi.NewServer(agent.LocalAPI(f, "test", func() agent.ExportHealth {
		return agent.ExportHealth{OTel: "otlp", Endpoint: "http://127.0.0.1:4318", Counters: map[string]int64{"spans_exported": 120, "spans_dropped_queue_full": 0},
			Files: map[string]string{"verdicts": "/var/lib/slowrank/verdicts.jsonl"}}
	}), localapi.ServerConfig{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Error(err)
		}
	})
	return f, sock
}

func checkWidth(t *testing.T, out string, width int) {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if len(line) > width {
			t.Errorf("line of %d columns (> %d): %q", len(line), width, line)
		}
	}
}

func TestStatusCommand(t *testing.T) {
	_, sock := startFake(t)
	out, code := captureRun(t, "status", "--socket", sock)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	for _, want := range []string{
		"slowrank agent test at " + sock, "collection running", "window 2s  threshold 0.05", "attached   4 processes, 3 libraries",
		"4243", "events 24110  lost 0", "late: records 4, facts 1", "attach errors 1",
		"otel otlp http://127.0.0.1:4318: healthy, spans 120", "verdicts /var/lib/slowrank/verdicts.jsonl",
		"ALERTS", "rank 2    host      straggler  +58.0% vs r1", "last verdicts", "candidate",
		"spent 0.260% of 0.300% (device 0.160%, uprobes 0.090%, lib 0.010%)", "escalations 4 granted, 110 refused",
		"last escalation refused: the ledger pays for 3.3 s of full", "collection, less than the 5s an escalation needs",
		"cost 2.45% [2.05%, 2.90%] from 64 pairs",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	checkWidth(t, out, 80)

	out, code = captureRun(t, "status", "--socket", sock, "--json")
	var rep agent.StatusReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 {
		t.Fatalf("status --json: %v (exit %d)\n%s", err, code, out)
	}
	if rep.Events != 24110 || rep.Control == nil || rep.Export == nil || len(rep.Ranks) != 2 {
		t.Fatalf("report %+v", rep)
	}

	out, code = captureRun(t, "status", "--socket", filepath.Join(t.TempDir(), "none.sock"))
	if code != 1 || !strings.Contains(out, "no agent answers") {
		t.Fatalf("no agent: exit %d: %s", code, out)
	}
}

func TestTopCommand(t *testing.T) {
	f, sock := startFake(t)
	f.cs.Paused = true
	out, code := captureRun(t, "top", "--socket", sock, "--count", "2", "--interval", "100ms")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	if n := strings.Count(out, "RANK  STEP#"); n != 2 {
		t.Fatalf("%d frames, want 2:\n%s", n, out)
	}
	if strings.Contains(out, "\x1b[") {
		t.Fatalf("escape sequences written to a file:\n%q", out)
	}
	if !strings.Contains(out, "COLLECTION PAUSED") || !strings.Contains(out, "STRAGGLER") {
		t.Fatalf("top output:\n%s", out)
	}
	checkWidth(t, out, 80)
}

func TestTopWithoutAgent(t *testing.T) {
	out, code := captureRun(t, "top", "--socket", filepath.Join(t.TempDir(), "none.sock"), "--count", "1")
	if code != 0 || !strings.Contains(out, "no agent answers") || !strings.Contains(out, "retrying") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

func TestControlCommand(t *testing.T) {
	f, sock := startFake(t)
	out, code := captureRun(t, "control", "pause", "--socket", sock)
	if code != 0 || !strings.Contains(out, "collection PAUSED") {
		t.Fatalf("pause: exit %d:\n%s", code, out)
	}
	out, code = captureRun(t, "control", "set", "--socket", sock, "--window", "4s", "--threshold", "0.1")
	if code != 0 || !strings.Contains(out, "window 4s  threshold 0.1") {
		t.Fatalf("set: exit %d:\n%s", code, out)
	}
	last := f.reqs[len(f.reqs)-1]
	if last.Action != "set" || time.Duration(*last.Window) != 4*time.Second || *last.Threshold != 0.1 || last.Floor != nil || last.Consecutive != nil {
		t.Fatalf("request %+v", last)
	}
	if out, code := captureRun(t, "control", "set", "--socket", sock, "--phase-threshold", "host=0.15,compute=0"); code != 0 {
		t.Fatalf("set phase thresholds: exit %d:\n%s", code, out)
	}
	if last := f.reqs[len(f.reqs)-1]; len(last.PhaseThresholds) != 2 || last.PhaseThresholds["host"] != 0.15 || last.PhaseThresholds["compute"] != 0 {
		t.Fatalf("phase thresholds request %+v", last)
	}
	for _, bad := range []string{"host", "host=-1", "=0.1"} {
		if out, code := captureRun(t, "control", "set", "--socket", sock, "--phase-threshold", bad); code != exitUsage {
			t.Fatalf("--phase-threshold %q: exit %d:\n%s", bad, code, out)
		}
	}
	if out, code := captureRun(t, "control", "set", "--socket", sock); code != exitUsage {
		t.Fatalf("empty set: exit %d:\n%s", code, out)
	}
	if out, code := captureRun(t, "control", "set", "--socket", sock, "--duty-share", "2"); code != exitUsage {
		t.Fatalf("bad share: exit %d:\n%s", code, out)
	}
	if _, code := captureRun(t, "control", "resume", "--socket", sock); code != 0 || f.cs.Paused {
		t.Fatalf("resume: exit %d", code)
	}
}

func TestVerdictLine(t *testing.T) {
	v := detector.Verdict{Job: strings.Repeat("j", 40), Window: 12345, Rank: 1000003, State: detector.StateUncertain, Phase: "exposed_comm",
		Hint: "gpu_stream_stall", AlertActive: true}
	if l := verdictLine(v); len(l) > 77 || !strings.Contains(l, "uncertain*") {
		t.Fatalf("%d columns: %q", len(l), l)
	}
}

func TestWriteStatusWithoutControl(t *testing.T) {
	var b bytes.Buffer
	writeStatus(&b, agent.StatusReport{ControlError: "agent not answering: context deadline exceeded"}, "/run/x.sock", 8)
	if !strings.Contains(b.String(), "collection unknown") || !strings.Contains(b.String(), "(none yet)") {
		t.Fatalf("%s", b.String())
	}
}

func TestThresholdTextNamesOverrides(t *testing.T) {
	tests := []struct {
		d    agent.DetectorSettings
		want string
	}{
		{agent.DetectorSettings{Threshold: 0.05}, "0.05"},
		{agent.DetectorSettings{Threshold: 0.05, PhaseThresholds: map[string]float64{"host": 0.15, "compute": 0.08}}, "0.05 (compute 0.08, host 0.15)"},
	}
	for _, tc := range tests {
		if got := thresholdText(tc.d); got != tc.want {
			t.Errorf("thresholdText(%+v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

// A process kept on the uprobes with its reason widens the NCCL column:
// COLL starts at the same place in the header and every row.
func TestWriteStatusAlignsALongNCCLPath(t *testing.T) {
	var b bytes.Buffer
	var rep agent.StatusReport
	rep.Procs = []agent.ProcessView{
		{PID: 10, Rank: 0, Job: "j", NCCL: "plugin v5", NCCLUprobes: "detached"},
		{PID: 11, Rank: 1, Job: "j", NCCL: "uprobes (alltoall: plugin reports it per peer)", NCCLUprobes: "attached"},
	}
	writeStatus(&b, rep, "/run/x.sock", 0)
	var cols []int
	for _, line := range strings.Split(b.String(), "\n") {
		for _, word := range []string{" COLL ", " off ", " on "} {
			if i := strings.Index(line, word); i >= 0 && (strings.HasPrefix(line, "  PID") || strings.HasPrefix(line, "  1")) {
				cols = append(cols, i)
				break
			}
		}
	}
	if len(cols) != 3 || cols[0] != cols[1] || cols[1] != cols[2] {
		t.Fatalf("COLL column at %v, want one place in the header and both rows:\n%s", cols, b.String())
	}
}

// TestStatusOverheadShowsPluginOnlyWhenSpent: the NCCL profiler plugin's
// share of the spend has its own line once it is charged, and none before
// (a job without --nccl-plugin reads as it did).
func TestStatusOverheadShowsPluginOnlyWhenSpent(t *testing.T) {
	line := "NCCL operations the profiler plugin recorded, in spent: "
	for _, tc := range []struct {
		name   string
		plugin float64
		want   string // "": no plugin line
	}{
		{"no plugin operations: no line", 0, ""},
		{"plugin operations charged", 0.00042, line + "0.042%"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			writeOverhead(&b, agent.Overhead{Budget: 0.003, Uprobes: 0.0009, NCCLPlugin: tc.plugin, Library: 0.0001,
				Total: 0.001 + tc.plugin, Training: time.Hour})
			out := b.String()
			if got := strings.Contains(out, line); got != (tc.want != "") || !strings.Contains(out, tc.want) {
				t.Fatalf("overhead display, want %q:\n%s", tc.want, out)
			}
			checkWidth(t, out, 80)
		})
	}
}

// TestStatusOverheadShowsKernelChannels: the NCCL plugin's kernel-channel
// trial has a line of its own once there is one, within 80 columns however
// wide its figures.
func TestStatusOverheadShowsKernelChannels(t *testing.T) {
	for _, tc := range []struct {
		name string
		k    *duty.KernelChannels
		want string // "": no line
	}{
		{"no plugin: no line", nil, ""},
		{"a trial", &duty.KernelChannels{State: duty.KernelChannelsTrial, With: 3, Apart: 2}, "cost measured apart, 3/2 blocks"},
		{"found dear", &duty.KernelChannels{State: duty.KernelChannelsDenied, Cost: 0.0493, Low: 0.0412, High: 0.0574, Limit: 0.01},
			"NCCL kernel channels off: +4.93% [+4.12, +5.74] (limit 1%)"},
		{"wide figures", &duty.KernelChannels{State: duty.KernelChannelsKept, Cost: -0.1234, Low: -0.2987, High: 0.125, Limit: 0.025},
			"NCCL kernel channels on: -12.34% [-29.87, +12.50] (limit 2.5%)"},
		{"the operator's", &duty.KernelChannels{State: duty.KernelChannelsDenied}, "NCCL kernel channels off (--nccl-kernel-channels)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			writeOverhead(&b, agent.Overhead{Budget: 0.003, Training: time.Hour, KernelChannels: tc.k})
			out := b.String()
			if got := strings.Contains(out, "kernel channels"); got != (tc.want != "") || !strings.Contains(out, tc.want) {
				t.Fatalf("overhead display, want %q:\n%s", tc.want, out)
			}
			checkWidth(t, out, 80)
		})
	}
}

// A printed command whose output cannot be written (a full disk under a
// redirection) fails, instead of exiting 0 with its output cut.
func TestWriteOutFailsWhenTheOutputCannotBeWritten(t *testing.T) {
	f, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skipf("/dev/full: %v", err)
	}
	defer func() { _ = f.Close() }() // nothing reached it
	var b bytes.Buffer
	writeControl(&b, agent.ControlState{})
	if err := writeOut(f, &b); err == nil {
		t.Fatal("writing to a full disk succeeded")
	}
}
