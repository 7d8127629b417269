package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/slowrank/slowrank/test/testutil"
)

// repoRoot is the repository root (tests run in test/reliability).
var repoRoot, _ = filepath.Abs("../..")

func TestMain(m *testing.M) {
	if os.Geteuid() == 0 {
		waitForSiblings(4 * time.Minute)
	}
	code := m.Run()
	if buildStarted.Load() {
		if tl, err := buildTools(); err == nil && tl != nil {
			os.RemoveAll(tl.dir)
		}
	}
	os.Exit(code)
}

// siblings are the test binaries of packages that attach real uprobes with
// tight timing (a trainer sleeping 1.5 s before its first step). These tests
// SIGKILL and restart agents: the kernel then closes the killed agent's BPF
// links one after another (about 50 ms each, serialised with every other
// uprobe registration on the host; 10 links on the fake job with uprobe_multi,
// 43 with --single-uprobes), which delays their attaches. `go test ./...` runs
// packages in parallel, so this package waits for them to finish first.
var siblings = []string{"integration.tes", "e2e.test", "multihost.test"}

func waitForSiblings(limit time.Duration) {
	deadline := time.Now().Add(limit)
	logged := false
	for time.Now().Before(deadline) {
		busy := ""
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			if _, err := strconv.Atoi(e.Name()); err != nil {
				continue
			}
			b, err := os.ReadFile("/proc/" + e.Name() + "/comm")
			if err != nil {
				continue
			}
			for _, s := range siblings {
				if strings.TrimSpace(string(b)) == s {
					busy = s
				}
			}
		}
		if busy == "" {
			return
		}
		if !logged {
			fmt.Fprintf(os.Stderr, "reliability: waiting for %s to finish (uprobe teardown here would delay its attaches)\n", busy)
			logged = true
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// buildStarted: some test asked for the tools (TestMain cleans up only then).
var buildStarted atomic.Bool

// tools are the binaries the tests run, built once per test binary.
type tools struct {
	dir      string
	slowrank string // the agent binary (built without -race, as shipped)
	trainer  string // fake trainer
	libDir   string // fake NCCL/CUDA libraries
	injectee string // stand-in process that loads the injection library
	cuptiLib string // libslowrank_cupti.so ("" when it cannot be built here)
	cuptiErr error
}

var buildTools = sync.OnceValues(func() (*tools, error) {
	dir, err := os.MkdirTemp("", "slowrank-reliability-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil { // trainers run as nobody in some tests
		return nil, err
	}
	tl := &tools{dir: dir, slowrank: filepath.Join(dir, "slowrank"), libDir: filepath.Join(dir, "fakelibs"),
		trainer: filepath.Join(dir, "fakelibs", "faketrainer"), injectee: filepath.Join(dir, "injectee")}
	run := func(name string, args ...string) error {
		cmd := exec.Command(name, args...)
		cmd.Dir = repoRoot
		cmd.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := run("go", "build", "-o", tl.slowrank, "./cmd/slowrank"); err != nil {
		return nil, err
	}
	if err := run("make", "-s", "-f", "test/fakelibs/fakelibs.mk", "fakelibs", "OUT_DIR="+dir); err != nil {
		return nil, err
	}
	if err := run("cc", "-std=c11", "-O2", "-Wall", "-Icupti", "-o", tl.injectee, "test/reliability/testdata/injectee.c", "-ldl"); err != nil {
		return nil, err
	}
	// The injection library: `make test` builds it into bin/ (cupti-test).
	if lib := filepath.Join(repoRoot, "bin", "libslowrank_cupti.so"); fileExists(lib) {
		tl.cuptiLib = filepath.Join(dir, "libslowrank_cupti.so")
		if err := copyFile(lib, tl.cuptiLib, 0o755); err != nil {
			return nil, err
		}
	} else if err := run("make", "-s", "-f", "cupti/cupti.mk", "cupti", "OUT_DIR="+dir); err != nil {
		tl.cuptiErr = err
	} else {
		tl.cuptiLib = filepath.Join(dir, "libslowrank_cupti.so")
	}
	for _, p := range []string{tl.libDir, tl.injectee} {
		if err := os.Chmod(p, 0o755); err != nil && !errors.Is(err, fs.ErrNotExist) { // not built: its tests skip
			return nil, err
		}
	}
	return tl, nil
})

func needTools(t *testing.T) *tools {
	t.Helper()
	testutil.RequireAgent(t, "to run the agent")
	buildStarted.Store(true)
	tl, err := buildTools()
	if err != nil {
		t.Fatal(err)
	}
	return tl
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func copyFile(from, to string, mode os.FileMode) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, mode)
}

// markOf is the environment variable that selects a test's processes, so
// that agents of tests running in parallel never watch each other's.
func markOf(t *testing.T) string {
	var b strings.Builder
	for _, r := range t.Name() {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	// The pid keeps agents of the same test run elsewhere on the host (another
	// checkout's test run) off this run's trainers.
	return fmt.Sprintf("SLOWRANK_REL_%s_%d", strings.ToUpper(b.String()), os.Getpid())
}

// agentProc is `slowrank agent` running as a subprocess.
type agentProc struct {
	t       *testing.T
	cmd     *exec.Cmd
	sock    string
	logPath string
	done    chan struct{}
	waitErr error
	maxRSS  atomic.Int64
	started time.Time
}

// startAgent starts the agent binary watching the processes marked for t,
// with its status socket, state directory and log in dir.
func startAgent(t *testing.T, tl *tools, dir string, extra ...string) *agentProc {
	t.Helper()
	return startAgentWith(t, tl, dir, nil, nil, extra...)
}

// startCollectingAgent starts the agent as startAgent does and sets its
// duty share to 1: device records collected all the time.
func startCollectingAgent(t *testing.T, tl *tools, dir string) *agentProc {
	t.Helper()
	ag := startAgent(t, tl, dir)
	ag.waitSocket()
	set := exec.Command(tl.slowrank, "control", "set", "--socket", ag.sock, "--duty-share", "1")
	if out, err := set.CombinedOutput(); err != nil {
		t.Fatalf("control set: %v\n%s", err, out)
	}
	return ag
}

// startAgentWith also takes a command prefix (setpriv ...) and extra
// environment.
func startAgentWith(t *testing.T, tl *tools, dir string, prefix, env []string, extra ...string) *agentProc {
	t.Helper()
	p := &agentProc{t: t, sock: filepath.Join(dir, "agent.sock"), logPath: filepath.Join(dir, fmt.Sprintf("agent-%d.log", time.Now().UnixNano())), done: make(chan struct{})}
	args := append([]string{"--log-level", "info", "agent", "--env-key", markOf(t), "--status-socket", p.sock,
		"--state-dir", filepath.Join(dir, "state"), "--window", "1s", "--lateness", "500ms"}, extra...)
	argv := append(append(append([]string(nil), prefix...), tl.slowrank), args...)
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Env = append(cleanEnv(), env...)
	logf, err := os.Create(p.logPath)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		_ = logf.Close() // the agent's own log, written by it and read by name
		close(p.done)
	}()
	go p.sampleRSS()
	t.Cleanup(func() {
		if p.alive() {
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("agent log %s:\n%s", p.logPath, grepLog(p.logPath))
		}
	})
	return p
}

// cleanEnv is the environment without OpenTelemetry or slowrank settings of
// the caller.
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "OTEL_") || strings.HasPrefix(kv, "SLOWRANK_") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

func (p *agentProc) pid() int { return p.cmd.Process.Pid }

func (p *agentProc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// sampleRSS records the largest resident set of the agent every 20 ms.
func (p *agentProc) sampleRSS() {
	tk := time.NewTicker(20 * time.Millisecond)
	defer tk.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-tk.C:
			if rss, err := rssOf(p.pid()); err == nil && rss > p.maxRSS.Load() {
				p.maxRSS.Store(rss)
			}
		}
	}
}

func rssOf(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, err := strconv.ParseInt(f[0], 10, 64)
				return n << 10, err
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS for %d", pid)
}

// statusReport is the part of GET /status that the tests read.
type statusReport struct {
	Processes int              `json:"processes"`
	Attached  int              `json:"libraries_attached"`
	Events    int64            `json:"events"`
	Lost      int64            `json:"lost"`
	Facts     int64            `json:"facts"`
	Counters  map[string]int64 `json:"counters"`
}

// client is an HTTP client of the agent's Unix socket; the caller closes
// its idle connections.
func (p *agentProc) client() *http.Client {
	return &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", p.sock)
		}}}
}

// status asks the agent's Unix socket for its status.
func (p *agentProc) status() (statusReport, error) {
	var st statusReport
	c := p.client()
	defer c.CloseIdleConnections()
	resp, err := c.Get("http://agent/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("status: %s", resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// metrics returns GET /metrics.
func (p *agentProc) metrics() (string, error) {
	c := p.client()
	defer c.CloseIdleConnections()
	resp, err := c.Get("http://agent/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(resp.Body)
	return b.String(), err
}

// waitStatus polls the status until ok holds; it fails the test after
// timeout or when the agent exits.
func (p *agentProc) waitStatus(what string, timeout time.Duration, ok func(statusReport) bool) statusReport {
	p.t.Helper()
	deadline := time.Now().Add(timeout)
	var last statusReport
	var lastErr error
	for time.Now().Before(deadline) {
		if !p.alive() {
			p.t.Fatalf("agent exited (%v) while waiting for %s", p.waitErr, what)
		}
		st, err := p.status()
		if err == nil {
			last = st
			if ok(st) {
				return st
			}
		}
		lastErr = err
		time.Sleep(50 * time.Millisecond)
	}
	p.t.Fatalf("agent: no %s within %v (last status %+v, err %v)", what, timeout, last, lastErr)
	return last
}

// waitSocket waits (10 s at most) until the agent answers on its socket.
func (p *agentProc) waitSocket() {
	p.t.Helper()
	p.waitStatus("socket", 10*time.Second, func(statusReport) bool { return true })
}

// stop sends SIGTERM, waits and returns the counters the agent logs last.
func (p *agentProc) stop() map[string]int64 {
	p.t.Helper()
	if !p.alive() {
		p.t.Fatalf("agent had already exited: %v", p.waitErr)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		p.t.Fatal("agent did not stop within 30 s of SIGTERM")
	}
	if p.waitErr != nil {
		p.t.Fatalf("agent exit: %v", p.waitErr)
	}
	return p.finalCounters()
}

// kill sends SIGKILL and waits.
func (p *agentProc) kill() {
	p.cmd.Process.Kill()
	<-p.done
}

// finalCounters parses the agent's last "counters" log line.
func (p *agentProc) finalCounters() map[string]int64 {
	p.t.Helper()
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		p.t.Fatal(err)
	}
	var line string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, " msg=counters ") {
			line = l
		}
	}
	if line == "" {
		p.t.Fatalf("agent logged no counters line:\n%s", tailFile(p.logPath, 2000))
	}
	out := map[string]int64{}
	for _, f := range strings.Fields(line) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			out[k] = n
		}
	}
	return out
}

func (p *agentProc) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// trainer is a fake-trainer launcher running as a subprocess.
type trainer struct {
	cmd   *exec.Cmd
	truth string
	out   bytes.Buffer
	done  chan struct{}
	err   error
}

var jobSeq atomic.Int64

// startTrainer starts the fake trainer marked for t (its own job id and
// shared-memory segment) with args; prefix runs it (setpriv ...).
func startTrainer(t *testing.T, tl *tools, dir string, prefix, env []string, args ...string) *trainer {
	t.Helper()
	n := jobSeq.Add(1)
	tr := &trainer{truth: filepath.Join(dir, fmt.Sprintf("truth-%d.jsonl", n)), done: make(chan struct{})}
	argv := append(append(append([]string(nil), prefix...), tl.trainer), append([]string{"--truth", tr.truth}, args...)...)
	tr.cmd = exec.Command(argv[0], argv[1:]...)
	tr.cmd.Env = append(append(cleanEnv(), markOf(t)+"=1", fmt.Sprintf("SLOWRANK_FAKE_JOB=rel-%d-%d", os.Getpid(), n)), env...)
	tr.cmd.Stdout, tr.cmd.Stderr = &tr.out, &tr.out
	tr.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the cleanup kills the ranks too
	if err := tr.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { tr.err = tr.cmd.Wait(); close(tr.done) }()
	t.Cleanup(func() {
		select {
		case <-tr.done:
		default:
			_ = syscall.Kill(-tr.cmd.Process.Pid, syscall.SIGKILL) // its group may be gone already
			tr.cmd.Process.Kill()
			<-tr.done
		}
	})
	return tr
}

// wait waits for the trainer and fails the test on an error exit.
func (tr *trainer) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-tr.done:
	case <-time.After(timeout):
		tr.cmd.Process.Kill()
		<-tr.done
		t.Fatalf("fake trainer did not finish within %v:\n%s", timeout, tr.out.String())
	}
	if tr.err != nil {
		t.Fatalf("fake trainer: %v\n%s", tr.err, tr.out.String())
	}
}

// readTruth returns the steps (sorted by end) and the done records of a
// truth file.
func readTruth(t *testing.T, path string) (steps, done []testutil.TruthRecord) {
	t.Helper()
	recs := testutil.ReadTruth(t, path)
	steps, done = recs["step"], recs["done"]
	sort.Slice(steps, func(i, j int) bool { return steps[i].EndNS < steps[j].EndNS })
	return steps, done
}

// countLines counts the lines of a file containing sub.
func countLines(path, sub string) int {
	b, _ := os.ReadFile(path)
	return strings.Count(string(b), sub)
}

// fact is the part of a step fact the tests read.
type fact struct {
	Kind    string             `json:"kind"`
	Job     string             `json:"job"`
	Rank    int                `json:"rank"`
	Step    int64              `json:"step"`
	StartNS int64              `json:"start_ns"`
	EndNS   int64              `json:"end_ns"`
	Epoch   int                `json:"epoch"`
	Version int                `json:"version"`
	Topo    int                `json:"topo"`
	Phases  map[string]float64 `json:"phases"`
}

// readFacts reads a JSONL facts file; every line must be valid JSON.
func readFacts(t *testing.T, path string) []fact {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []fact
	for i, l := range strings.Split(string(b), "\n") {
		if l == "" {
			continue
		}
		var f fact
		if err := json.Unmarshal([]byte(l), &f); err != nil {
			t.Fatalf("%s line %d is not valid JSON (%v): %.200q", path, i+1, err, l)
		}
		out = append(out, f)
	}
	return out
}

func mean(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

func relDiff(a, b float64) float64 { return math.Abs(a-b) / b }

// grepLog returns the agent log without the per-poll noise, at most 12 KB.
func grepLog(path string) string {
	b, _ := os.ReadFile(path)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "pid=1 error=") {
			continue
		}
		if len(l) > 400 {
			l = l[:400]
		}
		out = append(out, l)
	}
	s := strings.Join(out, "\n")
	if len(s) > 12000 {
		s = s[len(s)-12000:]
	}
	return s
}
