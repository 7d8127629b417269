package sensitivity

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/slowrank/slowrank/test/testutil"
)

const (
	ranks    = 4
	slowRank = 1
	// The jobs: the schedule runs the demo's 20 ms of host work and 30 ms
	// of device time a step (about 42 ms a step on 2 cores: GPU-bound);
	// the rank slow from its first step is on a host-bound job, 20 ms of
	// host work and 5 ms of device time. A GPU-bound job without device
	// records gives no evidence for a stall present from its first step:
	// the stalled rank still waits for its own device, so its signature
	// equals hidden jitter's and there is no past to compare with
	// (DESIGN.md section 4, "Not found"); the real injection library's
	// records decide it (bench/gpu/sensitivity.sh on the H200).
	stepMS             = "20"
	gpuBoundMS, hostMS = "30", "5"
	// The agent: 1-s windows (20 steps), so the whole schedule fits in
	// about a minute; the rest at its defaults (2 s of lateness, 3
	// windows, 5 %). Lateness stays at its default: at a job's start the
	// first rank's steps reach the detector about 2 s of steps before the
	// others' (83 steps of rank 0 before rank 1's first, one run), and a
	// shorter one settled the first window without them.
	window, lateness   = "1s", "2s"
	windowS, latenessS = 1.0, 2.0
	// The schedule in steps: warm-up, then per magnitude slow and healthy.
	warmSteps, slowSteps, healthySteps = 120, 100, 100
	startSteps                         = 240 // the rank slow from its first step
	startMag                           = 10.0
	thresholdPct                       = 5.0 // the agent's default --threshold
)

var mags = []float64{5, 10, 25} // % of the healthy step

// phase is one entry of the plan that sensitivity.py reads from the truth's
// meta line; from/to are the trainer's steps.
type phase struct {
	Name   string  `json:"name"`
	Kind   *string `json:"kind"`
	MagPct float64 `json:"mag_pct"`
	From   int     `json:"from_step"`
	To     int     `json:"to_step"`
}

func schedulePlan() []phase {
	host := "host"
	plan := []phase{{Name: "warmup", From: 0, To: warmSteps}}
	k := warmSteps
	for _, m := range mags {
		plan = append(plan, phase{Name: fmt.Sprintf("host-%g", m), Kind: &host, MagPct: m, From: k, To: k + slowSteps})
		k += slowSteps
		plan = append(plan, phase{Name: fmt.Sprintf("host-%g-healthy", m), From: k, To: k + healthySteps})
		k += healthySteps
	}
	return plan
}

func fromStartPlan() []phase {
	host := "host"
	return []phase{{Name: fmt.Sprintf("host-%g-from-start", startMag), Kind: &host, MagPct: startMag, From: 0, To: startSteps}}
}

// TestSensitivityFakeJob runs the schedule and the slow-from-start job
// under the real agent and judges both by the truth against issue 33's
// targets; it logs the table either way (about 60 s).
func TestSensitivityFakeJob(t *testing.T) {
	testutil.RequireAgent(t, "to attach uprobes")
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("needs python3 for bench/gpu/sensitivity.py")
	}
	agent := testutil.BuildAgent(t, t.TempDir())
	trainer := testutil.SharedFakeTrainer(t)
	// A Kubernetes pod without hostPID: the job in its own PID namespace.
	pidns := []string{"unshare", "--pid", "--fork", "--mount-proc", "--kill-child"}
	for _, tc := range []struct {
		name  string
		gpuMS string
		plan  []phase
		from  bool
		wrap  []string // what the trainer is started under
	}{
		{"schedule", gpuBoundMS, schedulePlan(), false, nil},
		{"slow-from-start", hostMS, fromStartPlan(), true, nil},
		{"slow-from-start-in-its-own-pid-namespace", hostMS, fromStartPlan(), true, pidns},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.wrap != nil {
				if _, err := exec.LookPath(tc.wrap[0]); err != nil {
					t.Skipf("needs %s (util-linux)", tc.wrap[0])
				}
			}
			step := healthyStep(t, trainer, tc.gpuMS)
			t.Logf("healthy step %.2f ms: stalls of %v %% are %v ms", step, mags, stallsMS(step, mags))
			dir := t.TempDir()
			verdicts := runJob(t, agent, trainer, dir, tc.gpuMS, tc.wrap, tc.plan, step)
			res := judge(t, py, dir, verdicts, tc.plan, step, tc.from)
			checkTargets(t, res)
		})
	}
}

func stallsMS(step float64, ms []float64) []string {
	var out []string
	for _, m := range ms {
		out = append(out, fmt.Sprintf("%.2f", m/100*step))
	}
	return out
}

// trainerEnv: the test's environment without launcher or loader variables
// (GPU hosts set LD_LIBRARY_PATH to the driver's libcuda.so.1), plus add.
func trainerEnv(add ...string) []string {
	drop := []string{"RANK=", "LOCAL_RANK=", "WORLD_SIZE=", "LOCAL_WORLD_SIZE=", "GROUP_RANK=", "MASTER_ADDR=",
		"MASTER_PORT=", "TORCHELASTIC_RUN_ID=", "SLOWRANK_FAKE_", "LD_LIBRARY_PATH=", "LD_PRELOAD="}
	var env []string
	for _, kv := range os.Environ() {
		if !slices.ContainsFunc(drop, func(p string) bool { return strings.HasPrefix(kv, p) }) {
			env = append(env, kv)
		}
	}
	return append(env, add...)
}

// runTrainer runs the fake trainer to its end, under wrap (a command and
// its arguments, e.g. unshare) when it is not empty.
func runTrainer(t *testing.T, trainer, gpuMS string, wrap []string, truth string, env []string, args ...string) {
	t.Helper()
	argv := append(append(slices.Clone(wrap), trainer, "--ranks", fmt.Sprint(ranks), "--step-ms", stepMS, "--gpu-ms", gpuMS,
		"--truth", truth), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = trainerEnv(env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("fake trainer: %v\n%s", err, testutil.Tail(string(out), 2000))
	}
}

// truthStep is what the analysis needs of the fake trainer's step truth.
type truthStep struct {
	Kind    string  `json:"kind"`
	Rank    int     `json:"rank"`
	Step    int     `json:"step"`
	StartNS int64   `json:"start_ns"`
	EndNS   int64   `json:"end_ns"`
	StepMS  float64 `json:"step_ms"`
	InjHost float64 `json:"injected_host_ms"`
}

func readSteps(t *testing.T, path string) []truthStep {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }() // read only
	var out []truthStep
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		var s truthStep
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatalf("truth line %q: %v", sc.Text(), err)
		}
		if s.Kind == "step" {
			out = append(out, s)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// healthyStep: the median step of a short job without an agent, the step
// that the magnitudes are shares of.
func healthyStep(t *testing.T, trainer, gpuMS string) float64 {
	t.Helper()
	truth := filepath.Join(t.TempDir(), "truth.jsonl")
	runTrainer(t, trainer, gpuMS, nil, truth, nil, "--steps", "60")
	var ms []float64
	for _, s := range readSteps(t, truth) {
		if s.Step >= 10 {
			ms = append(ms, s.StepMS)
		}
	}
	if len(ms) == 0 {
		t.Fatal("no steps in the healthy job's truth")
	}
	sort.Float64s(ms)
	return ms[len(ms)/2]
}

// runJob runs the agent around one fake job following plan and returns
// the agent's verdicts file; the trainer's truth goes to dir/truth.jsonl.
func runJob(t *testing.T, agent, trainer, dir, gpuMS string, wrap []string, plan []phase, step float64) string {
	t.Helper()
	verdicts, facts := filepath.Join(dir, "verdicts.jsonl"), filepath.Join(dir, "facts.jsonl")
	// SLOWRANK_SENS_KEEP=DIR keeps each job's facts there, to replay.
	if keep := os.Getenv("SLOWRANK_SENS_KEEP"); keep != "" {
		facts = filepath.Join(keep, filepath.Base(t.Name())+"-facts.jsonl")
		verdicts = filepath.Join(keep, filepath.Base(t.Name())+"-verdicts.jsonl")
	}
	ag := testutil.StartProc(t, "agent", 30*time.Second, 4000, nil, agent, "agent", "--env-key", "SLOWRANK_SENS_MARK",
		"--window", window, "--lateness", lateness, "--otel", "off", "--job", "sens-"+filepath.Base(t.Name()),
		"--host-name", "sens-host", "--facts", facts, "--verdicts", verdicts,
		"--status-socket", filepath.Join(dir, "agent.sock"))
	time.Sleep(time.Second) // the agent's first scan
	var spec []string
	for _, p := range plan {
		if p.Kind != nil {
			spec = append(spec, fmt.Sprintf("%d-%d:%.3f", p.From, p.To, p.MagPct/100*step))
		}
	}
	runTrainer(t, trainer, gpuMS, wrap, filepath.Join(dir, "truth.jsonl"), []string{"SLOWRANK_SENS_MARK=1"},
		"--steps", fmt.Sprint(plan[len(plan)-1].To), "--slow-rank", fmt.Sprint(slowRank),
		"--slow-phases", strings.Join(spec, ","), "--sleep-before-start", "1000")
	time.Sleep(2 * time.Second) // the last windows settle
	ag.Stop()
	if ag.Err != nil {
		t.Errorf("agent: %v\n%s", ag.Err, testutil.Tail(ag.Out.String(), 3000))
	}
	return verdicts
}

// writeRun turns the fake truth into sensitivity.py's run folder: per rank
// a meta line (plan, slow rank), the step the magnitudes are shares of,
// and each step with its phase and injected stall.
func writeRun(t *testing.T, dir string, plan []phase, step float64, fromStart bool) string {
	t.Helper()
	run := filepath.Join(dir, "run")
	if err := os.MkdirAll(run, 0o755); err != nil {
		t.Fatal(err)
	}
	phaseOf := func(k int) string {
		for _, p := range plan {
			if k >= p.From && k < p.To {
				return p.Name
			}
		}
		return "after"
	}
	files := map[int]*bufio.Writer{}
	for r := range ranks {
		f, err := os.Create(filepath.Join(run, fmt.Sprintf("rank%d.jsonl", r)))
		if err != nil {
			t.Fatal(err)
		}
		w := bufio.NewWriter(f)
		defer func() {
			if err := errors.Join(w.Flush(), f.Close()); err != nil {
				t.Fatal(err) // a run cut short would be judged as it is
			}
		}()
		files[r] = w
		writeJSON(t, w, map[string]any{"meta": true, "rank": r, "world": ranks, "slow_rank": slowRank, "device": "fake",
			"plan": plan, "args": map[string]any{"from_start": fromStart}})
		writeJSON(t, w, map[string]any{"calibration": true, "rank": r, "ref_step_ms": step})
	}
	for _, s := range readSteps(t, filepath.Join(dir, "truth.jsonl")) {
		writeJSON(t, files[s.Rank], map[string]any{"rank": s.Rank, "step": s.Step, "phase": phaseOf(s.Step),
			"start_ns": s.StartNS, "end_ns": s.EndNS, "step_ms": s.StepMS, "host_ms": s.InjHost, "gpu_ms": 0})
	}
	return run
}

func writeJSON(t *testing.T, w *bufio.Writer, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
}

// result is the part of sensitivity.py's judgement that the test checks.
type result struct {
	Phases []struct {
		Name        string   `json:"name"`
		Kind        *string  `json:"kind"`
		MagPct      float64  `json:"mag_pct"`
		Named       bool     `json:"named"`
		TimeToVerd  *float64 `json:"time_to_verdict_s"`
		StepRisePct *float64 `json:"step_rise_pct"`
	} `json:"phases"`
	False struct {
		FalseAlerts int `json:"false_alerts"`
		OtherRanks  int `json:"other_ranks"`
		Warmup      int `json:"warmup"`
		Healthy     int `json:"healthy"`
	} `json:"false"`
	LimitS float64 `json:"limit_s"`
}

func judge(t *testing.T, py, dir, verdicts string, plan []phase, step float64, fromStart bool) result {
	t.Helper()
	run := writeRun(t, dir, plan, step, fromStart)
	out, md := filepath.Join(dir, "summary.json"), filepath.Join(dir, "summary.md")
	cmd := exec.Command(py, filepath.Join(testutil.RepoRoot(t), "bench", "gpu", "sensitivity.py"), "analyze", run,
		"--verdicts", verdicts, "--window-s", fmt.Sprint(windowS), "--lateness-s", fmt.Sprint(latenessS),
		"--json", out, "--md", md, "--title", "fake job, "+filepath.Base(t.Name()))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sensitivity.py analyze: %v\n%s", err, b)
	}
	if b, err := os.ReadFile(md); err == nil {
		t.Logf("\n%s", b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var all struct {
		Judged map[string]result `json:"judged"`
	}
	if err := json.Unmarshal(b, &all); err != nil {
		t.Fatal(err)
	}
	res, ok := all.Judged["slowrank"]
	if !ok || len(res.Phases) != len(plan) {
		t.Fatalf("analysis judged %d of %d phases:\n%s", len(res.Phases), len(plan), b)
	}
	return res
}

// checkTargets: issue 33's targets, every exposed slowdown of 5 % or more
// of the step named on the slow rank, and no false alert. The fake job
// synchronises its stream every step, so a host stall before the forward
// pass lengthens every rank's step by its whole length: each stall is
// exposed by construction. A stall of 5 % of the step is then a rise of
// 5 %, the threshold itself, which the detector's "more than 5 %" names or
// holds hidden by a coin toss of the window's noise (one CI run: named in
// the 4th window instead of the 3rd); it is logged, and the targets are the
// stalls of twice the threshold and more. The step rise is the truth's,
// logged only: on a loaded 2-core machine the healthy phases either side
// of a stall differ by up to 15 %, more than the stalls under test. A stall
// from the first step is judged the same way. The time allowed is half a
// window more than the 3 windows + lateness: a window's median is
// slow only when more than half its steps are, so a stall that begins in
// the second half of a window starts its streak in the next one
// (bench/results/README.md, "Sensitivity vs NVRx").
func checkTargets(t *testing.T, res result) {
	t.Helper()
	limit := res.LimitS + windowS/2
	for _, p := range res.Phases {
		if p.Kind == nil || p.MagPct < 5 {
			continue
		}
		rise := math.NaN()
		if p.StepRisePct != nil {
			rise = *p.StepRisePct
		}
		when := "never"
		if p.TimeToVerd != nil {
			when = fmt.Sprintf("after %.1f s", *p.TimeToVerd)
		}
		switch {
		case p.MagPct < 2*thresholdPct:
			t.Logf("%s (job step %+.1f %%): a stall at the threshold, rank %d named %s (not a target)", p.Name, rise, slowRank, when)
		case p.TimeToVerd == nil || *p.TimeToVerd > limit:
			t.Errorf("%s (job step %+.1f %%): rank %d named %s, want within %.1f s", p.Name, rise, slowRank, when, limit)
		}
	}
	if f := res.False; f.FalseAlerts != 0 {
		t.Errorf("%d false alerts (other ranks %d, slow rank in warm-up %d, in healthy phases %d), want 0",
			f.FalseAlerts, f.OtherRanks, f.Warmup, f.Healthy)
	}
}
