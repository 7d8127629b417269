package faketrainer_test

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/slowrank/slowrank/bpf"
)

// binDir is where TestMain built the fake libraries and the trainer; skip
// says why the tests cannot run when it is empty.
var (
	binDir string
	skip   string
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "faketrainer-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "create temp dir:", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	if err := build(tmp); err != nil {
		var sk skipError
		if !errors.As(err, &sk) {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		skip = sk.reason
	} else {
		binDir = filepath.Join(tmp, "fakelibs")
	}
	return m.Run()
}

type skipError struct{ reason string }

func (e skipError) Error() string { return e.reason }

// build runs the make fragment from the repository root into outDir.
func build(outDir string) error {
	for _, tool := range []string{"make", "gcc", "g++"} {
		if _, err := exec.LookPath(tool); err != nil {
			return skipError{fmt.Sprintf("%s not found: cannot build test/fakelibs", tool)}
		}
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		return fmt.Errorf("find repository root: %w", err)
	}
	if _, err := os.Stat(filepath.Join(root, "test", "fakelibs", "fakelibs.mk")); err != nil {
		return fmt.Errorf("find fakelibs.mk: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "-s", "-f", "test/fakelibs/fakelibs.mk", "fakelibs", "OUT_DIR="+outDir)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build fakelibs: %w\n%s", err, out)
	}
	return nil
}

// record is one line of the truth file (all kinds share it).
type record struct {
	Kind       string         `json:"kind"`
	Job        string         `json:"job"`
	Rank       int            `json:"rank"`
	World      int            `json:"world"`
	PID        int            `json:"pid"`
	Step       int            `json:"step"`
	StartNs    uint64         `json:"start_ns"`
	EndNs      uint64         `json:"end_ns"`
	DevEndNs   uint64         `json:"device_end_ns"`
	StepMs     float64        `json:"step_ms"`
	HostMs     float64        `json:"host_ms"`
	HostWorkMs float64        `json:"host_work_ms"`
	SyncWaitMs float64        `json:"sync_wait_ms"`
	GPUMs      float64        `json:"gpu_ms"`
	Slowed     bool           `json:"slowed"`
	Calls      map[string]int `json:"calls"`
	NCCL       string         `json:"nccl"`
	Steps      int            `json:"steps"`
	Exit       int            `json:"exit"`
	What       string         `json:"what"`       // burst: init or eval
	AfterStep  int            `json:"after_step"` // burst: the step before it (-1: before step 0)
}

type run struct {
	exitCode int
	stdout   string
	stderr   string
	elapsed  time.Duration
	records  []record
}

func (r run) kind(k string) []record {
	var out []record
	for _, rec := range r.records {
		if rec.Kind == k {
			out = append(out, rec)
		}
	}
	return out
}

// trainer runs the launcher with args (and a truth file) and parses the truth.
func trainer(t *testing.T, env []string, args ...string) run {
	t.Helper()
	if binDir == "" {
		t.Skip(skip)
	}
	truth := filepath.Join(t.TempDir(), "truth.jsonl")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "faketrainer"), append(args, "--truth", truth)...)
	cmd.Env = append(cleanEnv(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	r := run{stdout: stdout.String(), stderr: stderr.String(), elapsed: time.Since(start)}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		r.exitCode = exitErr.ExitCode()
	default:
		t.Fatalf("run faketrainer: %v\nstderr:\n%s", err, r.stderr)
	}
	if ctx.Err() != nil {
		t.Fatalf("faketrainer did not finish in time\nstderr:\n%s", r.stderr)
	}
	r.records = readTruth(t, truth)
	return r
}

// cleanEnv drops the launcher variables so that the trainer starts in
// launcher mode whatever the environment of the test, and the loader's
// (GPU hosts set LD_LIBRARY_PATH to the driver's libcuda.so.1).
func cleanEnv() []string {
	drop := []string{"RANK=", "LOCAL_RANK=", "WORLD_SIZE=", "LOCAL_WORLD_SIZE=", "GROUP_RANK=", "MASTER_ADDR=",
		"MASTER_PORT=", "TORCHELASTIC_RUN_ID=", "SLOWRANK_FAKE_", "LD_LIBRARY_PATH=", "LD_PRELOAD="}
	var env []string
	for _, kv := range os.Environ() {
		if !slices.ContainsFunc(drop, func(p string) bool { return strings.HasPrefix(kv, p) }) {
			env = append(env, kv)
		}
	}
	return env
}

func readTruth(t *testing.T, path string) []record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("open truth: %v", err)
	}
	defer func() { _ = f.Close() }() // read only
	var recs []record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		var rec record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("truth line %q: %v", sc.Text(), err)
		}
		recs = append(recs, rec)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read truth: %v", err)
	}
	return recs
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// stepsOf returns rank -> step -> record, failing on duplicates.
func stepsOf(t *testing.T, r run) map[int]map[int]record {
	t.Helper()
	out := map[int]map[int]record{}
	for _, rec := range r.kind("step") {
		if out[rec.Rank] == nil {
			out[rec.Rank] = map[int]record{}
		}
		if _, dup := out[rec.Rank][rec.Step]; dup {
			t.Fatalf("rank %d step %d reported twice", rec.Rank, rec.Step)
		}
		out[rec.Rank][rec.Step] = rec
	}
	return out
}

func checkComplete(t *testing.T, r run, ranks, steps int) map[int]map[int]record {
	t.Helper()
	if r.exitCode != 0 {
		t.Fatalf("faketrainer exit status %d\nstderr:\n%s", r.exitCode, r.stderr)
	}
	by := stepsOf(t, r)
	if len(by) != ranks {
		t.Fatalf("truth has %d ranks, want %d", len(by), ranks)
	}
	for rank := 0; rank < ranks; rank++ {
		for k := 0; k < steps; k++ {
			if _, ok := by[rank][k]; !ok {
				t.Fatalf("rank %d: step %d missing", rank, k)
			}
		}
		if len(by[rank]) != steps {
			t.Fatalf("rank %d: %d steps, want %d", rank, len(by[rank]), steps)
		}
	}
	done := r.kind("done")
	if len(done) != ranks {
		t.Fatalf("%d done records, want %d", len(done), ranks)
	}
	for _, d := range done {
		if d.Exit != 0 || d.Steps != steps {
			t.Errorf("rank %d done: exit %d steps %d, want 0 and %d", d.Rank, d.Exit, d.Steps, steps)
		}
	}
	return by
}

// collect returns f over the steps of rank in [from, to).
func collect(by map[int]map[int]record, rank, from, to int, f func(record) float64) []float64 {
	var xs []float64
	for k := from; k < to; k++ {
		if rec, ok := by[rank][k]; ok {
			xs = append(xs, f(rec))
		}
	}
	return xs
}

func hostMs(r record) float64 { return r.HostMs }

// spreadByStep returns, per step, max-min across ranks of device_end_ns and
// of end_ns in ms, checking that no device end comes after the sync returned.
func spreadByStep(t *testing.T, by map[int]map[int]record, ranks, steps int) (dev, host []float64) {
	t.Helper()
	for k := 0; k < steps; k++ {
		dlo, dhi, hlo, hhi := uint64(1<<63), uint64(0), uint64(1<<63), uint64(0)
		for rank := 0; rank < ranks; rank++ {
			rec := by[rank][k]
			if rec.DevEndNs == 0 {
				t.Fatalf("rank %d step %d: no device_end_ns", rank, k)
			}
			if rec.DevEndNs > rec.EndNs+100_000 || rec.DevEndNs < rec.StartNs {
				t.Errorf("rank %d step %d: device end %d outside [start %d, end %d]", rank, k, rec.DevEndNs,
					rec.StartNs, rec.EndNs)
			}
			dlo, dhi = min(dlo, rec.DevEndNs), max(dhi, rec.DevEndNs)
			hlo, hhi = min(hlo, rec.EndNs), max(hhi, rec.EndNs)
		}
		dev = append(dev, float64(dhi-dlo)/1e6)
		host = append(host, float64(hhi-hlo)/1e6)
	}
	return dev, host
}
func syncMs(r record) float64 { return r.SyncWaitMs }

// TestSlowHostRankCouplesPeers is the main model check: a host stall on one
// rank shows up as its host time and as the same amount of extra
// synchronisation wait on every other rank, with step ends aligned.
func TestSlowHostRankCouplesPeers(t *testing.T) {
	const (
		ranks    = 4
		steps    = 40
		slowRank = 2
		slowFrom = 10
		stallMs  = 15.0
	)
	r := trainer(t, nil, "--ranks", fmt.Sprint(ranks), "--steps", fmt.Sprint(steps), "--step-ms", "10",
		"--gpu-ms", "10", "--buckets", "4", "--kernels", "4", "--jitter", "0.02",
		"--slow-rank", fmt.Sprint(slowRank), "--slow-from-step", fmt.Sprint(slowFrom),
		"--slow-host-ms", fmt.Sprint(stallMs))
	by := checkComplete(t, r, ranks, steps)

	// Every step issues the same calls on every rank.
	for rank := 0; rank < ranks; rank++ {
		for k := 0; k < steps; k++ {
			c := by[rank][k].Calls
			if c["ncclAllReduce"] != 4 || c["cudaStreamSynchronize"] != 1 || c["cudaLaunchKernel"] != 9 {
				t.Fatalf("rank %d step %d calls %v, want 4 ncclAllReduce, 1 cudaStreamSynchronize, 9 cudaLaunchKernel",
					rank, k, c)
			}
			if want := rank == slowRank && k >= slowFrom; by[rank][k].Slowed != want {
				t.Fatalf("rank %d step %d slowed=%v, want %v", rank, k, by[rank][k].Slowed, want)
			}
		}
	}

	// Steps 1..slowFrom-1 are the baseline (step 0 includes warm-up skew);
	// the slowed window skips its first step.
	slowHost := median(collect(by, slowRank, slowFrom+1, steps, hostMs))
	for rank := 0; rank < ranks; rank++ {
		if rank == slowRank {
			continue
		}
		peerHost := median(collect(by, rank, slowFrom+1, steps, hostMs))
		if d := slowHost - peerHost; d < stallMs-4 || d > stallMs+4 {
			t.Errorf("rank %d: slow rank's host time exceeds it by %.2f ms, want about %.0f", rank, d, stallMs)
		}
		before := median(collect(by, rank, 1, slowFrom, syncMs))
		after := median(collect(by, rank, slowFrom+1, steps, syncMs))
		if d := after - before; d < stallMs-4 || d > stallMs+4 {
			t.Errorf("rank %d: sync_wait grew by %.2f ms (%.2f -> %.2f), want about %.0f", rank, d, before, after, stallMs)
		}
		t.Logf("rank %d: host %.2f ms, sync_wait %.2f -> %.2f ms", rank, peerHost, before, after)
	}
	slowBefore := median(collect(by, slowRank, 1, slowFrom, syncMs))
	slowAfter := median(collect(by, slowRank, slowFrom+1, steps, syncMs))
	if slowAfter > slowBefore+2 {
		t.Errorf("slow rank's own sync_wait grew %.2f -> %.2f ms; it should not wait for anyone", slowBefore, slowAfter)
	}
	t.Logf("slow rank %d: host %.2f ms, sync_wait %.2f -> %.2f ms", slowRank, slowHost, slowBefore, slowAfter)

	// Step k ends at the same time on every rank: the end-of-step sync returns
	// when the last collective completes everywhere. device_end_ns is the
	// modelled completion (on CLOCK_MONOTONIC); end_ns adds the wake-up latency
	// of each rank, so it gets a looser, statistical bound (a loaded machine
	// or peers tearing down after the last step delay some wake-ups).
	devSpreads, hostSpreads := spreadByStep(t, by, ranks, steps)
	devLate := 0
	for _, s := range devSpreads {
		if s > 1 {
			devLate++
		}
	}
	if m := median(devSpreads); m > 0.2 {
		t.Errorf("median device end spread %.3f ms across ranks, want <= 0.2", m)
	}
	if devLate > steps/10 {
		t.Errorf("%d of %d steps end on the devices more than 1 ms apart, want at most %d", devLate, steps, steps/10)
	}
	if m := median(hostSpreads); m > 1 {
		t.Errorf("median end_ns spread %.3f ms across ranks, want <= 1", m)
	}
	t.Logf("end spread across ranks: device median %.3f max %.3f ms; host median %.3f max %.3f ms; run took %v",
		median(devSpreads), slices.Max(devSpreads), median(hostSpreads), slices.Max(hostSpreads), r.elapsed)
}

// TestSlowGPURankCouplesPeers: extra device time on one rank makes the
// others wait in synchronisation while its host time stays normal.
func TestSlowGPURankCouplesPeers(t *testing.T) {
	const extra = 10.0
	r := trainer(t, nil, "--ranks", "2", "--steps", "20", "--step-ms", "5", "--gpu-ms", "10",
		"--slow-rank", "1", "--slow-from-step", "8", "--slow-gpu-ms", fmt.Sprint(extra), "--jitter", "0")
	by := checkComplete(t, r, 2, 20)
	before := median(collect(by, 0, 1, 8, syncMs))
	after := median(collect(by, 0, 9, 20, syncMs))
	if d := after - before; d < extra-3 || d > extra+3 {
		t.Errorf("rank 0 sync_wait grew by %.2f ms, want about %.0f", d, extra)
	}
	gpuSlow := median(collect(by, 1, 9, 20, func(r record) float64 { return r.GPUMs }))
	gpuPeer := median(collect(by, 0, 9, 20, func(r record) float64 { return r.GPUMs }))
	if d := gpuSlow - gpuPeer; d < extra-0.5 || d > extra+0.5 {
		t.Errorf("slow rank's gpu_ms exceeds its peer's by %.2f ms, want %.0f", d, extra)
	}
	hSlow, hPeer := median(collect(by, 1, 9, 20, hostMs)), median(collect(by, 0, 9, 20, hostMs))
	if hSlow > hPeer+extra/2 {
		t.Errorf("slow rank's host time %.2f ms vs %.2f: a device stall must not look like host time", hSlow, hPeer)
	}
	if by[1][10].Calls["cudaLaunchKernel"] != by[0][10].Calls["cudaLaunchKernel"]+1 {
		t.Errorf("slowed step should launch one extra kernel: %v vs %v", by[1][10].Calls, by[0][10].Calls)
	}
}

// TestDeadRankFailsPeersFast: a rank that dies must not hang the others.
func TestDeadRankFailsPeersFast(t *testing.T) {
	r := trainer(t, []string{"SLOWRANK_FAKE_TIMEOUT_MS=30000"}, "--ranks", "3", "--steps", "50",
		"--step-ms", "2", "--gpu-ms", "2", "--crash-rank", "1", "--crash-at-step", "5")
	// The launcher reports the first failed rank it reaps: the crashed one
	// (3) or a peer that noticed (4), whichever exits first.
	if r.exitCode != 3 && r.exitCode != 4 || !strings.Contains(r.stderr, "exited with status 3") {
		t.Fatalf("launcher exit status %d, want 3 or 4 and the crashed rank's status 3 reported\nstderr:\n%s", r.exitCode, r.stderr)
	}
	if r.elapsed > 10*time.Second {
		t.Errorf("took %v: peers should notice the dead rank well before the 30 s timeout", r.elapsed)
	}
	done := r.kind("done")
	if len(done) != 2 {
		t.Fatalf("%d done records, want 2 (the crashed rank writes none)", len(done))
	}
	for _, d := range done {
		if d.Exit == 0 || d.Steps > 6 {
			t.Errorf("rank %d: exit %d after %d steps; want a failure at step 5 or 6", d.Rank, d.Exit, d.Steps)
		}
	}
}

// TestVariants runs the code paths the probes care about: late dlopen of
// libnccl, groups, a separate communication stream, split communicators and
// every end-of-step synchronisation call.
func TestVariants(t *testing.T) {
	cases := []struct {
		name string
		args []string
		sym  string // a call every step must make
	}{
		{"dlopen", []string{"--dlopen-nccl", "--dlopen-delay-ms", "50"}, "ncclAllReduce"},
		{"group-comm-stream", []string{"--group", "--comm-stream"}, "ncclGroupStart"},
		{"split-init-plain", []string{"--split", "--init-plain", "--sync", "cu-stream"}, "cuStreamSynchronize"},
		{"event-device", []string{"--sync", "event", "--device-sync"}, "cudaEventSynchronize"},
		{"cu-ctx", []string{"--sync", "cu-ctx"}, "cuCtxSynchronize"},
		{"threads", []string{"--threads", "200"}, "cudaStreamSynchronize"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--ranks", "2", "--steps", "5", "--step-ms", "2", "--gpu-ms", "2"}, tc.args...)
			r := trainer(t, nil, args...)
			by := checkComplete(t, r, 2, 5)
			for rank := range 2 {
				for k := range 5 {
					if by[rank][k].Calls[tc.sym] == 0 {
						t.Fatalf("rank %d step %d: no %s in %v", rank, k, tc.sym, by[rank][k].Calls)
					}
				}
			}
			wantNCCL := "linked"
			if tc.name == "dlopen" {
				wantNCCL = "dlopen"
			}
			for _, rec := range r.kind("rank") {
				if rec.NCCL != wantNCCL {
					t.Errorf("rank %d: nccl %q, want %q", rec.Rank, rec.NCCL, wantNCCL)
				}
			}
		})
	}
}

// TestBursts: --init-bursts issues a parameter broadcast and a barrier
// storm before step 0, --eval-every an evaluation loop after every N-th
// step; each burst is one truth record of kind burst with its calls, and
// the steps carry none of them.
func TestBursts(t *testing.T) {
	r := trainer(t, nil, "--ranks", "2", "--steps", "7", "--step-ms", "2", "--gpu-ms", "2", "--init-bursts",
		"--eval-every", "3", "--eval-batches", "4")
	by := checkComplete(t, r, 2, 7)
	bursts := map[int][]record{}
	for _, b := range r.kind("burst") {
		bursts[b.Rank] = append(bursts[b.Rank], b)
	}
	for rank := range 2 {
		bs := bursts[rank]
		if len(bs) != 3 || bs[0].What != "init" || bs[0].AfterStep != -1 || bs[1].What != "eval" || bs[1].AfterStep != 2 ||
			bs[2].AfterStep != 5 {
			t.Fatalf("rank %d: bursts %+v, want init then eval after steps 2 and 5", rank, bs)
		}
		if c := bs[0].Calls; c["ncclBroadcast"] != 24*6 || c["ncclAllReduce"] != 40 || c["cudaStreamSynchronize"] != 24*6+40 {
			t.Errorf("rank %d: init burst calls %v", rank, c)
		}
		if c := bs[1].Calls; c["ncclAllReduce"] != 4 || c["cudaStreamSynchronize"] != 4 {
			t.Errorf("rank %d: eval burst calls %v", rank, c)
		}
		if bs[0].EndNs > by[rank][0].StartNs || bs[1].StartNs < by[rank][2].EndNs || bs[1].EndNs > by[rank][3].StartNs {
			t.Errorf("rank %d: bursts overlap the steps", rank)
		}
		for k := range 7 {
			if by[rank][k].Calls["ncclBroadcast"] != 0 || by[rank][k].Calls["ncclAllReduce"] != 4 {
				t.Errorf("rank %d step %d calls %v", rank, k, by[rank][k].Calls)
			}
		}
	}
}

// TestDurationAgreesOnLastStep: with --duration, rank 0 picks the last step
// and every rank runs exactly as many steps.
func TestDurationAgreesOnLastStep(t *testing.T) {
	r := trainer(t, nil, "--ranks", "3", "--duration", "0.3", "--step-ms", "3", "--gpu-ms", "3")
	if r.exitCode != 0 {
		t.Fatalf("exit status %d\nstderr:\n%s", r.exitCode, r.stderr)
	}
	done := r.kind("done")
	if len(done) != 3 {
		t.Fatalf("%d done records, want 3", len(done))
	}
	for _, d := range done {
		if d.Steps != done[0].Steps || d.Steps < 5 || d.Exit != 0 {
			t.Errorf("rank %d: %d steps, exit %d; rank %d ran %d", d.Rank, d.Steps, d.Exit, done[0].Rank, done[0].Steps)
		}
	}
}

// TestBench: the tight-loop mode prints one JSON line per rank.
func TestBench(t *testing.T) {
	r := trainer(t, nil, "--ranks", "1", "--bench-symbol", "cudaStreamSynchronize", "--bench-calls", "20000")
	if r.exitCode != 0 {
		t.Fatalf("exit status %d\nstderr:\n%s", r.exitCode, r.stderr)
	}
	var b struct {
		Kind      string  `json:"kind"`
		Symbol    string  `json:"symbol"`
		Calls     int     `json:"calls"`
		NsPerCall float64 `json:"ns_per_call"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), &b); err != nil {
		t.Fatalf("bench output %q: %v", r.stdout, err)
	}
	if b.Kind != "bench" || b.Symbol != "cudaStreamSynchronize" || b.Calls != 20000 || b.NsPerCall <= 0 {
		t.Fatalf("bench result %+v", b)
	}
	t.Logf("cudaStreamSynchronize on an idle stream: %.0f ns/call", b.NsPerCall)
}

// TestGloo: with --backend gloo the buckets are ProcessGroupGloo::allreduce
// calls of the fake libtorch_cpu.so (no NCCL call at all), step 0 has the
// warm-up bucket count, and the ranks stay coupled: a host stall on one
// rank is synchronisation wait on the others.
func TestGloo(t *testing.T) {
	const ranks, steps, slow = 3, 30, 1
	r := trainer(t, nil, "--backend", "gloo", "--gloo-cuda-sync", "--ranks", fmt.Sprint(ranks), "--steps", fmt.Sprint(steps),
		"--step-ms", "6", "--gpu-ms", "6", "--buckets", "4", "--warmup-buckets", "3", "--sync", "device",
		"--slow-rank", fmt.Sprint(slow), "--slow-from-step", "10", "--slow-host-ms", "10")
	by := checkComplete(t, r, ranks, steps)
	for rank := range ranks {
		for k := range steps {
			c := by[rank][k].Calls
			want := 4
			if k == 0 {
				want = 3
			}
			if c["c10d::ProcessGroupGloo::allreduce"] != want || c["ncclAllReduce"] != 0 || c["cudaDeviceSynchronize"] != 1 ||
				c["cudaStreamSynchronize"] != want {
				t.Fatalf("rank %d step %d: calls %v", rank, k, c)
			}
		}
	}
	for _, rec := range r.kind("rank") {
		if rec.NCCL != "none" {
			t.Errorf("rank %d: nccl %q, want none", rec.Rank, rec.NCCL)
		}
	}
	fast := median(collect(by, 0, 15, steps, syncMs)) - median(collect(by, 0, 2, 10, syncMs))
	if fast < 8 || fast > 12 {
		t.Errorf("rank 0 waits %.2f ms more once rank %d stalls 10 ms", fast, slow)
	}
	_, host := spreadByStep(t, by, ranks, steps)
	if m := median(host); m > 1 {
		t.Errorf("step ends spread %.2f ms across ranks", m)
	}
}

// TestTorchSymbols: libtorch_cpu.so exports every gloo method that the
// torch probes look for and that torch has, under the mangled prefix
// bpf/elfsym.go derives from the qualified name, and c10d::Work::wait.
func TestTorchSymbols(t *testing.T) {
	if binDir == "" {
		t.Skip(skip)
	}
	f, err := elf.Open(filepath.Join(binDir, "libtorch_cpu.so"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	// Torch has no ProcessGroupGloo::alltoall (only alltoall_base).
	absent := map[string]bool{"c10d::ProcessGroupGloo::alltoall": true}
	for _, s := range bpf.Specs() {
		q := s.Qualified
		if s.Kind != bpf.LibTorch || strings.Contains(q, "ProcessGroupNCCL") || absent[q] {
			continue
		}
		prefix := "_ZN"
		for _, part := range strings.Split(q, "::") {
			prefix += fmt.Sprint(len(part)) + part
		}
		prefix += "E"
		found := slices.ContainsFunc(syms, func(y elf.Symbol) bool {
			return strings.HasPrefix(y.Name, prefix) && elf.ST_TYPE(y.Info) == elf.STT_FUNC && y.Section != elf.SHN_UNDEF
		})
		if !found {
			t.Errorf("%s (%s...) not exported", q, prefix)
		}
	}
}

// TestForeignLibcudaIsRefusedWithTheReason: on GPU hosts LD_LIBRARY_PATH
// points at the driver's libcuda.so.1, which the loader prefers to the
// trainer's RUNPATH; the fake libraries would then die at their first call
// (exit 127, "undefined symbol"). The trainer must refuse at once and say
// which library it got and why.
func TestForeignLibcudaIsRefusedWithTheReason(t *testing.T) {
	if binDir == "" {
		t.Skip(skip)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "cuda.c")
	if err := os.WriteFile(src, []byte("int cuInit(unsigned int flags) { (void)flags; return 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-o", filepath.Join(dir, "libcuda.so.1"), src).CombinedOutput(); err != nil {
		t.Fatalf("build a stand-in for the driver's libcuda: %v\n%s", err, out)
	}
	cmd := exec.Command(filepath.Join(binDir, "faketrainer"), "--ranks", "1", "--steps", "3")
	cmd.Env = append(cleanEnv(), "LD_LIBRARY_PATH="+dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 2 {
		t.Fatalf("exit %v, want status 2 (usage)\nstderr:\n%s", err, stderr.String())
	}
	for _, want := range []string{filepath.Join(dir, "libcuda.so.1"), "LD_LIBRARY_PATH"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr does not name %q:\n%s", want, stderr.String())
		}
	}
}
