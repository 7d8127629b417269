package reliability

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The memory bound given to the agent in the fault tests, and checked
// against its resident set sampled every 20 ms.
const (
	maxMemory     = 160 << 20
	maxMemoryFlag = "160MiB"
)

// parallelWithTools is needTools for a test that runs in parallel, in the
// directory it returns.
func parallelWithTools(t *testing.T) (*tools, string) {
	t.Helper()
	tl := needTools(t)
	t.Parallel()
	return tl, t.TempDir()
}

// startBoundedAgent starts the agent with the memory bound (and env added
// to its environment) and waits for its socket.
func startBoundedAgent(t *testing.T, tl *tools, dir string, env []string, extra ...string) *agentProc {
	t.Helper()
	ag := startAgentWith(t, tl, dir, nil, env, append(extra, "--max-memory", maxMemoryFlag)...)
	ag.waitSocket()
	return ag
}

// checkSurvived fails the test unless the agent is still running and its
// resident memory stayed within the bound.
func checkSurvived(t *testing.T, ag *agentProc) {
	t.Helper()
	if !ag.alive() {
		t.Fatalf("agent exited: %v", ag.waitErr)
	}
	if rss := ag.maxRSS.Load(); rss > maxMemory || rss == 0 {
		t.Errorf("agent max RSS %d MiB, bound %d MiB", rss>>20, maxMemory>>20)
	}
}

// TestFaultOTLPEndpoint runs the agent exporting over OTLP/HTTP to an
// endpoint that is down, one that answers after 5 s (the export timeout is
// 1 s) and one that rejects every request: the agent keeps judging and
// writing facts, stays within its memory bound, and counts the failures in
// its counters (status and metrics).
func TestFaultOTLPEndpoint(t *testing.T) {
	tl := needTools(t)
	cases := []struct {
		name    string
		handler http.HandlerFunc // nil: nothing listens
	}{
		{"down", nil},
		{"slow", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body) // the body is not what the test checks
			select {
			case <-time.After(5 * time.Second):
			case <-r.Context().Done():
			}
			w.WriteHeader(http.StatusOK)
		}},
		{"rejecting", func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body) // the body is not what the test checks
			http.Error(w, "rejected by test", http.StatusBadRequest)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			endpoint := "http://" + ln.Addr().String()
			if tc.handler == nil {
				ln.Close()
			} else {
				srv := &http.Server{Handler: tc.handler}
				go func() { _ = srv.Serve(ln) }() // http.ErrServerClosed at cleanup; failing to serve shows in the agent's counters
				t.Cleanup(func() { srv.Close() })
			}
			env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
				"OTEL_EXPORTER_OTLP_TIMEOUT=1000", "OTEL_METRIC_EXPORT_INTERVAL=500", "OTEL_BSP_SCHEDULE_DELAY=200"}
			facts := filepath.Join(dir, "facts.jsonl")
			ag := startBoundedAgent(t, tl, dir, env, "--otel", "on", "--sample-every", "1", "--facts", facts)
			tr := startTrainer(t, tl, dir, nil, nil, "--ranks", "2", "--duration", "7", "--step-ms", "5", "--gpu-ms", "5", "--sleep-before-start", "1000")
			st := ag.waitStatus("failed exports counted", 30*time.Second, func(st statusReport) bool {
				return st.Facts > 100 && exportFailures(st.Counters) > 0
			})
			tr.wait(t, 60*time.Second)
			checkSurvived(t, ag)
			start := time.Now()
			c := ag.stop()
			// Outputs get 10 s to flush at stop; detaching the uprobes takes
			// about 5 s more on a loaded 2-core machine.
			if d := time.Since(start); d > 30*time.Second {
				t.Errorf("agent took %v to stop with the endpoint %s", d, tc.name)
			}
			if n := len(readFacts(t, facts)); n < 100 {
				t.Errorf("only %d facts written while the endpoint was %s", n, tc.name)
			}
			t.Logf("endpoint %s: facts %d, live counters: export errors %d, spans exported %d, dropped export_failed %d queue_full %d; at stop: dropped export_failed %d shutdown %d; max RSS %d MiB",
				tc.name, st.Facts, st.Counters["otel_export_errors"], st.Counters["otel_spans_exported"], st.Counters["otel_spans_dropped_export_failed"],
				st.Counters["otel_spans_dropped_queue_full"], c["otel_spans_dropped_export_failed"], c["otel_spans_dropped_shutdown"], ag.maxRSS.Load()>>20)
		})
	}
}

func exportFailures(c map[string]int64) int64 {
	return c["otel_export_errors"] + c["otel_spans_dropped_export_failed"] + c["otel_metric_points_failed"]
}

// TestFaultJSONLDiskFull writes facts and verdicts to a 64 KiB tmpfs: the
// agent keeps running, the files stay valid JSONL (whole lines only), and
// the lines that could not be written are counted.
func TestFaultJSONLDiskFull(t *testing.T) {
	tl, dir := parallelWithTools(t)
	full := filepath.Join(dir, "full")
	if err := os.Mkdir(full, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "slowrank-test", full).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() {
		if err := exec.Command("umount", "-l", full).Run(); err != nil {
			t.Logf("umount %s: %v (a tmpfs left mounted)", full, err)
		}
	})
	facts, verdicts := filepath.Join(full, "facts.jsonl"), filepath.Join(full, "verdicts.jsonl")
	ag := startBoundedAgent(t, tl, dir, nil, "--facts", facts, "--verdicts", verdicts, "--emit-ok")
	tr := startTrainer(t, tl, dir, nil, nil, "--ranks", "4", "--duration", "5", "--step-ms", "3", "--gpu-ms", "4", "--sleep-before-start", "1000")
	st := ag.waitStatus("a failing facts file", 30*time.Second, func(st statusReport) bool {
		return st.Counters["jsonl_facts_write_failing"] == 1
	})
	tr.wait(t, 60*time.Second)
	checkSurvived(t, ag)
	c := ag.stop()
	fs := readFacts(t, facts) // every line must parse
	if c["jsonl_facts_lost"] == 0 {
		t.Errorf("no lost facts counted on a full disk (written %d)", c["jsonl_facts_written"])
	}
	if int64(len(fs)) != c["jsonl_facts_written"] {
		t.Errorf("file holds %d lines, agent counted %d written", len(fs), c["jsonl_facts_written"])
	}
	t.Logf("64 KiB disk: facts written %d (%d in the file), lost %d; verdicts written %d, lost %d; facts produced %d; max RSS %d MiB",
		c["jsonl_facts_written"], len(fs), c["jsonl_facts_lost"], c["jsonl_verdicts_written"], c["jsonl_verdicts_lost"], st.Facts, ag.maxRSS.Load()>>20)
}

// TestFaultElasticRestart crashes one rank of a job mid-window (the others
// fail on it, as NCCL ranks do), then starts the job again under the same id
// with new processes: the agent counts the exits, the correlator emits a new
// topology version for the job, and the new processes' steps are judged.
func TestFaultElasticRestart(t *testing.T) {
	tl, dir := parallelWithTools(t)
	facts := filepath.Join(dir, "facts.jsonl")
	ag := startBoundedAgent(t, tl, dir, nil, "--facts", facts)
	job := fmt.Sprintf("elastic-%d", os.Getpid())
	env := []string{"SLOWRANK_FAKE_JOB=" + job}
	// The first run trains for 1.5 s: its ranks wait 4 s first, so that
	// the agent has attached (attaching took 2.8 s once in CI while another
	// test package's uprobes were torn down) and its steps are seen.
	args := []string{"--ranks", "4", "--step-ms", "5", "--gpu-ms", "5", "--sleep-before-start", "4000"}
	first := startTrainer(t, tl, dir, nil, env, append(args, "--steps", "300", "--crash-rank", "2", "--crash-at-step", "150")...)
	<-first.done
	if first.err == nil {
		t.Fatal("the first run did not fail although rank 2 crashed")
	}
	ag.waitStatus("the exits", 10*time.Second, func(st statusReport) bool { return st.Counters["processes_exited"] >= 4 })
	// The restart reuses the lingering attachments; should the first run
	// have ended before the agent attached, it gets time to attach.
	second := startTrainer(t, tl, dir, nil, env, "--ranks", "4", "--step-ms", "5", "--gpu-ms", "5", "--sleep-before-start", "3000", "--steps", "300")
	second.wait(t, 60*time.Second)
	time.Sleep(1500 * time.Millisecond)
	checkSurvived(t, ag)
	c := ag.stop()
	versions := map[int]bool{}
	stepsByTopo := map[int]int{}
	for _, f := range readFacts(t, facts) {
		switch {
		case f.Kind == "topology" && f.Job == job:
			versions[f.Version] = true
		case f.Kind == "step" && f.Job == job:
			stepsByTopo[f.Topo]++
		}
	}
	if len(versions) < 2 || c["topology_versions"] < 2 {
		t.Errorf("topology versions %v (agent counted %d), want a new version after the restart", versions, c["topology_versions"])
	}
	// The first run's steps are under its topology; the restarted job's
	// under a later version.
	lo, hi := 1<<30, 0
	for v := range stepsByTopo {
		lo, hi = min(lo, v), max(hi, v)
	}
	if hi <= lo || stepsByTopo[hi] < 4*250 {
		t.Errorf("steps by topology version %v: want the restarted job's >= 1000 of 1200 steps under a version after the first run's", stepsByTopo)
	}
	if c["processes_exited"] < 8 {
		t.Errorf("processes_exited %d, want >= 8", c["processes_exited"])
	}
	t.Logf("topology versions %v (counted %d), steps by topology %v, processes added %d exited %d, detector late %d duplicates %d",
		versions, c["topology_versions"], stepsByTopo, c["processes_added"], c["processes_exited"], c["detector_late"], c["detector_duplicates"])
}

// TestFaultRingBufferOverflow bursts 300,000 probed calls at a 4 KiB ring
// buffer: records are lost, and every one of them is counted: events seen
// plus ringbuf_lost equals the calls made, and the loss shows in the
// status and the metrics.
func TestFaultRingBufferOverflow(t *testing.T) {
	tl, dir := parallelWithTools(t)
	ag := startBoundedAgent(t, tl, dir, nil, "--ringbuf-size", "4096")
	const calls = 300000
	// The burst starts 7 s after the process: the agent must have attached
	// by then (attaching takes seconds while other agents tear down).
	tr := startTrainer(t, tl, dir, nil, nil, "--ranks", "1", "--bench-calls", strconv.Itoa(calls), "--bench-symbol", "cudaStreamSynchronize", "--sleep-before-start", "7000")
	ag.waitStatus("libraries attached before the burst", 7*time.Second, func(st statusReport) bool { return st.Attached >= 3 })
	tr.wait(t, 120*time.Second)
	st := ag.waitStatus("every call seen or counted lost", 15*time.Second, func(st statusReport) bool {
		return st.Counters["probe_cudaStreamSynchronize"]+st.Counters["ringbuf_lost"] >= calls
	})
	metrics, err := ag.metrics()
	if err != nil {
		t.Fatal(err)
	}
	checkSurvived(t, ag)
	c := ag.stop()
	seen, lost := c["probe_cudaStreamSynchronize"], c["ringbuf_lost"]
	if lost == 0 {
		t.Fatalf("no loss with a 4 KiB ring buffer (seen %d)", seen)
	}
	// The bench makes 1,000 warm-up calls first and one more
	// cudaStreamSynchronize after every batch of 256 (faketrainer.c).
	made := int64(calls + 1000 + (1000+255)/256 + (calls+255)/256)
	if seen+lost != made {
		t.Errorf("seen %d + lost %d = %d, want exactly the %d calls made", seen, lost, seen+lost, made)
	}
	const series = `slowrank_records_dropped_total{reason="ringbuf_full"` // selfmetrics table
	if st.Lost == 0 || !strings.Contains(metrics, series) {
		t.Errorf("loss not visible: status lost %d, /metrics has %s: %v", st.Lost, series, strings.Contains(metrics, series))
	}
	t.Logf("burst of %d calls into a 4 KiB ring buffer: seen %d, lost %d (%.1f %%), status lost %d, max RSS %d MiB",
		calls, seen, lost, 100*float64(lost)/calls, st.Lost, ag.maxRSS.Load()>>20)
}

// TestFaultThousandThreads watches ranks with 1,000 threads each.
func TestFaultThousandThreads(t *testing.T) {
	tl, dir := parallelWithTools(t)
	facts := filepath.Join(dir, "facts.jsonl")
	ag := startBoundedAgent(t, tl, dir, nil, "--facts", facts)
	tr := startTrainer(t, tl, dir, nil, nil, "--ranks", "2", "--threads", "1000", "--steps", "300", "--step-ms", "5", "--gpu-ms", "5", "--sleep-before-start", "7000")
	ag.waitStatus("libraries attached before the first step", 7*time.Second, func(st statusReport) bool { return st.Attached >= 3 })
	tr.wait(t, 60*time.Second)
	time.Sleep(1500 * time.Millisecond)
	checkSurvived(t, ag)
	c := ag.stop()
	perRank := map[int]int{}
	for _, f := range readFacts(t, facts) {
		if f.Kind == "step" {
			perRank[f.Rank]++
		}
	}
	for r := 0; r < 2; r++ {
		if perRank[r] < 280 {
			t.Errorf("rank %d: %d steps, want >= 280 of 300", r, perRank[r])
		}
	}
	t.Logf("2 ranks x 1,000 threads: steps %v, events %d, lost %d, max RSS %d MiB, agent threads %d",
		perRank, c["events"], c["ringbuf_lost"]+c["events_lost_queue"], ag.maxRSS.Load()>>20, c["threads"])
}

// TestFaultLibraryReplacedOnDisk replaces libnccl while ranks map it (as a
// package upgrade does: a new file renamed over the old one). The attached
// agent keeps seeing the old library's calls (uprobes live on the inode);
// an agent started afterwards finds the mapping "(deleted)" and attaches
// through /proc/PID/map_files.
func TestFaultLibraryReplacedOnDisk(t *testing.T) {
	tl, dir := parallelWithTools(t)
	libs := filepath.Join(dir, "libs")
	if err := os.Mkdir(libs, 0o755); err != nil {
		t.Fatal(err)
	}
	nccl := filepath.Join(libs, "libnccl.so.2")
	if err := copyFile(filepath.Join(tl.libDir, "libnccl.so.2"), nccl, 0o755); err != nil {
		t.Fatal(err)
	}
	f1 := filepath.Join(dir, "facts1.jsonl")
	a1 := startBoundedAgent(t, tl, dir, nil, "--facts", f1)
	// Long enough for both agents; killed at the end.
	startTrainer(t, tl, dir, nil, []string{"LD_LIBRARY_PATH=" + libs}, "--ranks", "2", "--duration", "60", "--step-ms", "5", "--gpu-ms", "5", "--sleep-before-start", "1000")
	a1.waitStatus("steps", 20*time.Second, func(st statusReport) bool { return st.Facts >= 2*50 })
	// Replace the library on disk.
	if err := copyFile(filepath.Join(tl.libDir, "libnccl.so.2"), nccl+".new", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(nccl+".new", nccl); err != nil {
		t.Fatal(err)
	}
	before, _ := a1.status()
	st1 := a1.waitStatus("steps after the replacement", 10*time.Second, func(st statusReport) bool { return st.Facts >= before.Facts+2*50 })
	checkSurvived(t, a1)
	a1.stop()

	// A new agent: the ranks now map a deleted file.
	dir2 := t.TempDir()
	a2 := startAgent(t, tl, dir2, "--max-memory", maxMemoryFlag)
	st2 := a2.waitStatus("steps through the deleted library", 20*time.Second, func(st statusReport) bool {
		return st.Counters["probe_ncclAllReduce"] > 0 && st.Facts >= 2*50
	})
	checkSurvived(t, a2)
	c := a2.stop()
	if c["attach_errors"] != 0 {
		t.Errorf("attach errors: %d", c["attach_errors"])
	}
	t.Logf("library replaced: attached agent went on (%d -> %d facts); new agent attached %d libraries through map_files, %d allreduce calls, %d facts",
		before.Facts, st1.Facts, st2.Attached, st2.Counters["probe_ncclAllReduce"], st2.Facts)
}

// TestOutputFiles: outputs are created 0640 whatever the umask, and a
// symbolic link planted at an output path is refused (exit 2, the target
// untouched).
func TestOutputFiles(t *testing.T) {
	tl, dir := parallelWithTools(t)
	umask0 := []string{"sh", "-c", `umask 000; exec "$0" "$@"`}
	facts := filepath.Join(dir, "facts.jsonl")
	ag := startAgentWith(t, tl, dir, umask0, nil, "--facts", facts, "--verdicts", filepath.Join(dir, "verdicts.jsonl"))
	ag.waitSocket()
	ag.stop()
	for _, p := range []string{facts, filepath.Join(dir, "verdicts.jsonl")} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o640 {
			t.Errorf("%s created %v under umask 000, want 0640", p, fi.Mode().Perm())
		}
	}
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.jsonl")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(tl.slowrank, "agent", "--env-key", markOf(t), "--status-socket", "", "--state-dir", "", "--facts", link, "--duration", "1s")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err == nil || !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Errorf("agent with --facts at a symlink: %v, want exit 2\n%s", err, out)
	}
	if !strings.Contains(string(out), "--facts") || !strings.Contains(string(out), "symbolic link") {
		t.Errorf("error does not say what and where: %s", out)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Error("the symlink's target was modified")
	}
	if fi, _ := os.Lstat(link); fi.Mode()&os.ModeSymlink == 0 {
		t.Error("the symlink was replaced")
	}
}
