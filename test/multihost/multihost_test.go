// Package multihost runs slowrank across "hosts" made of network
// namespaces on one machine: three host namespaces, each with two ranks of
// one 6-rank fake training job and a real agent (real uprobes) forwarding
// its facts with --aggregator, and an aggregator namespace joined to each
// host by its own veth pair. It needs root, `ip netns` and what the agent
// needs (BPF ring buffers, uprobes); otherwise it skips and says why.
//
// The six ranks are coupled through the fake libraries' shared memory
// (/dev/shm is shared: `ip netns exec` only changes the network), so the
// job is one synchronous job across the three hosts, as on real hosts.
// Each agent only watches its own host's ranks (--env-key names a variable
// only those ranks carry), as PID namespaces would arrange on real hosts.
package multihost

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/test/testutil"
)

const (
	hosts        = 3
	ranksPerHost = 2
	slowRank     = 3 // on host1
	cutHost      = 2 // ranks 4 and 5
	window       = 2 * time.Second
	lateness     = 1500 * time.Millisecond
)

// requirements skips unless this machine can run the test.
func requirements(t *testing.T) {
	t.Helper()
	testutil.RequireRoot(t, "(network namespaces, uprobes)")
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip")
	}
	testutil.RequireAgentSupport(t)
	probe := "srmh-probe-" + randomID(t)
	if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
		t.Skipf("ip netns does not work here: %v: %s", err, out)
	}
	_ = exec.Command("ip", "netns", "del", probe).Run()
}

func randomID(t *testing.T) string {
	b := make([]byte, 2)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// netns is the test's network: ns(agg) holds one end of a veth pair per
// host, 10.213.<i>.1/24; ns(host i) the other end, 10.213.<i>.2/24.
type netns struct {
	id string
}

func (n netns) agg() string          { return "srmh-" + n.id + "-agg" }
func (n netns) host(i int) string    { return fmt.Sprintf("srmh-%s-h%d", n.id, i) }
func (n netns) aggLink(i int) string { return fmt.Sprintf("sra%d-%s", i, n.id) }
func (n netns) hostIf(i int) string  { return fmt.Sprintf("srh%d-%s", i, n.id) }
func aggAddr(i int) string           { return fmt.Sprintf("10.213.%d.1", i) }

func setupNetwork(t *testing.T) netns {
	t.Helper()
	n := netns{id: randomID(t)}
	t.Cleanup(func() {
		for i := range hosts {
			_ = exec.Command("ip", "netns", "del", n.host(i)).Run()
		}
		_ = exec.Command("ip", "netns", "del", n.agg()).Run()
	})
	run(t, "ip", "netns", "add", n.agg())
	run(t, "ip", "-n", n.agg(), "link", "set", "lo", "up")
	for i := range hosts {
		run(t, "ip", "netns", "add", n.host(i))
		run(t, "ip", "link", "add", n.aggLink(i), "type", "veth", "peer", "name", n.hostIf(i))
		run(t, "ip", "link", "set", n.aggLink(i), "netns", n.agg())
		run(t, "ip", "link", "set", n.hostIf(i), "netns", n.host(i))
		run(t, "ip", "-n", n.agg(), "addr", "add", aggAddr(i)+"/24", "dev", n.aggLink(i))
		run(t, "ip", "-n", n.agg(), "link", "set", n.aggLink(i), "up")
		run(t, "ip", "-n", n.host(i), "addr", "add", fmt.Sprintf("10.213.%d.2/24", i), "dev", n.hostIf(i))
		run(t, "ip", "-n", n.host(i), "link", "set", n.hostIf(i), "up")
		run(t, "ip", "-n", n.host(i), "link", "set", "lo", "up")
	}
	return n
}

// start runs argv inside namespace ns with extra environment; cleanup stops
// it (SIGTERM, SIGKILL after 10 s) and shows its output when the test failed.
// (ip netns exec execs the command: the pid is the command's.)
func start(t *testing.T, name, ns string, env []string, argv ...string) *testutil.Proc {
	t.Helper()
	return testutil.StartProc(t, name, 10*time.Second, 3000, env, append([]string{"ip", "netns", "exec", ns}, argv...)...)
}

// verdicts reads the aggregator's verdict file (JSONL, written every 200 ms).
func verdicts(t *testing.T, path string) ([]detector.Verdict, []detector.Summary) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		return nil, nil
	}
	defer func() { _ = f.Close() }() // read only
	var vs []detector.Verdict
	var ss []detector.Summary
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var head struct{ Kind string }
		if json.Unmarshal(sc.Bytes(), &head) != nil {
			continue // a line being written
		}
		switch head.Kind {
		case detector.KindVerdict:
			var v detector.Verdict
			if json.Unmarshal(sc.Bytes(), &v) == nil {
				vs = append(vs, v)
			}
		case detector.KindSummary:
			var s detector.Summary
			if json.Unmarshal(sc.Bytes(), &s) == nil {
				ss = append(ss, s)
			}
		}
	}
	return vs, ss
}

// states returns rank → state → count over verdicts of windows inside
// [from, to] (aggregator CLOCK_MONOTONIC, the same clock as ours).
func states(vs []detector.Verdict, from, to int64) (map[int]map[string]int, int) {
	out := map[int]map[string]int{}
	wins := map[int64]bool{}
	for _, v := range vs {
		if v.WindowStartNS < from || v.WindowEndNS > to {
			continue
		}
		wins[v.Window] = true
		if out[v.Rank] == nil {
			out[v.Rank] = map[string]int{}
		}
		out[v.Rank][v.State]++
	}
	return out, len(wins)
}

func waitUntil(t *testing.T, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func only(m map[string]int, state string) bool { return len(m) == 1 && m[state] > 0 }

// healthyButNoisy: judged in every window (ok), with at most one window a
// candidate: what a healthy rank may show on a loaded machine.
func healthyButNoisy(m map[string]int) bool {
	return len(m) == 2 && m[detector.StateOK] > 0 && m[detector.StateCandidate] == 1
}

// unexpected lists rank's verdicts in [from, to] whose state is not want,
// with phase and reason: what a failure must show to be diagnosed.
func unexpected(vs []detector.Verdict, rank int, want string, from, to int64) string {
	var b strings.Builder
	for _, v := range vs {
		if v.Rank != rank || v.State == want || v.WindowStartNS < from || v.WindowEndNS > to {
			continue
		}
		fmt.Fprintf(&b, "\n\twindow %d %s %s %+.1f%% ref rank %d of %d: %s", v.Window, v.State, v.Phase,
			100*v.Deviation, v.ReferenceRank, v.ComparableCount, v.Reason)
	}
	return b.String()
}

func TestSlowRankAcrossHostsAndSilentHost(t *testing.T) {
	requirements(t)
	testStart := time.Now()
	binDir := t.TempDir()
	slowrank, trainer := testutil.BuildAgent(t, binDir), testutil.BuildFakes(t, binDir)
	t.Logf("built in %v", time.Since(testStart).Round(time.Millisecond))
	n := setupNetwork(t)
	dir := t.TempDir()
	vpath := filepath.Join(dir, "verdicts.jsonl")
	job := "mh-" + n.id

	agg := start(t, "aggregator", n.agg(), nil, slowrank, "aggregate", "--listen", "0.0.0.0:4317",
		"--verdicts", vpath, "--facts", filepath.Join(dir, "facts.jsonl"), "--window", window.String(),
		"--lateness", lateness.String(), "--emit-ok", "--otel", "off", "--stats-every", "5s")
	var agents []*testutil.Proc
	for i := range hosts {
		agents = append(agents, start(t, fmt.Sprintf("agent host%d", i), n.host(i), nil, slowrank, "agent",
			"--env-key", fmt.Sprintf("SRMH_%s_H%d", n.id, i), "--host-name", fmt.Sprintf("host%d", i),
			"--aggregator", aggAddr(i)+":4317", "--window", window.String(), "--otel", "off"))
	}
	waitUntil(t, "the agents to load their probes", 30*time.Second, func() bool {
		for _, a := range agents {
			if !strings.Contains(a.Out.String(), "agent running") {
				return false
			}
		}
		return true
	})
	// One 6-rank job: two ranks per host, rank 3 (host1) slow in host time
	// from step 250 (about 10 s), after the 3 windows of healthy steps that
	// a stall without device records needs to show against the job's own
	// step time (DESIGN.md section 4).
	for r := range hosts * ranksPerHost {
		i := r / ranksPerHost
		env := []string{
			fmt.Sprintf("RANK=%d", r), fmt.Sprintf("LOCAL_RANK=%d", r%ranksPerHost),
			fmt.Sprintf("WORLD_SIZE=%d", hosts*ranksPerHost), fmt.Sprintf("LOCAL_WORLD_SIZE=%d", ranksPerHost),
			fmt.Sprintf("GROUP_RANK=%d", i), "MASTER_ADDR=10.213.0.2", "MASTER_PORT=29500",
			"TORCHELASTIC_RUN_ID=" + job, "SLOWRANK_FAKE_JOB=" + job, fmt.Sprintf("SRMH_%s_H%d=1", n.id, i),
		}
		start(t, fmt.Sprintf("rank %d", r), n.host(i), env, trainer, "--duration", "90", "--step-ms", "20",
			"--gpu-ms", "30", "--slow-rank", fmt.Sprint(slowRank), "--slow-from-step", "250", "--slow-host-ms", "12")
	}

	// 1. The slow rank is found across hosts, every rank is judged.
	var tFound int64
	waitUntil(t, "rank 3 to be a straggler with all six ranks judged", 40*time.Second, func() bool {
		vs, _ := verdicts(t, vpath)
		for _, v := range vs {
			if v.Rank == slowRank && v.State == detector.StateStraggler {
				tFound = v.WindowEndNS
			}
		}
		if tFound == 0 {
			return false
		}
		got, _ := states(vs, tFound-int64(window), tFound)
		return len(got) == hosts*ranksPerHost
	})
	t.Logf("straggler found %v into the test", time.Since(testStart).Round(time.Millisecond))

	// 2. Cut host2's link: only its ranks become uncertain.
	tCut := testutil.MonoNow()
	run(t, "ip", "-n", n.agg(), "link", "set", n.aggLink(cutHost), "down")
	time.Sleep(10 * time.Second)
	tHeal := testutil.MonoNow()
	run(t, "ip", "-n", n.agg(), "link", "set", n.aggLink(cutHost), "up")
	// Windows wholly inside the cut and settled before the heal.
	var during map[int]map[string]int
	var cutVerdicts []detector.Verdict
	waitUntil(t, "the windows of the cut to settle", 10*time.Second, func() bool {
		var nw int
		cutVerdicts, _ = verdicts(t, vpath)
		during, nw = states(cutVerdicts, tCut, tHeal-int64(lateness))
		return nw >= 3
	})
	for r := range hosts * ranksPerHost {
		want, who := detector.StateOK, ""
		switch {
		case r/ranksPerHost == cutHost:
			want, who = detector.StateUncertain, " (cut host)"
		case r == slowRank:
			want, who = detector.StateStraggler, " (the straggler)"
		}
		if want == detector.StateOK && healthyButNoisy(during[r]) {
			// Six ranks, three agents and the aggregator on CI's two
			// loaded cores: a healthy rank's host median can sit 5 %
			// above its peers' for one window (twice in CI's runs so far).
			// That is a candidate, never an alert (the summary below
			// names rank 3 only); say what it was.
			t.Logf("rank %d during the cut: %v:%s", r, during[r], unexpected(cutVerdicts, r, want, tCut, tHeal-int64(lateness)))
			continue
		}
		if !only(during[r], want) {
			t.Errorf("rank %d%s during the cut: %v, want only %s:%s", r, who, during[r], want,
				unexpected(cutVerdicts, r, want, tCut, tHeal-int64(lateness)))
		}
	}

	// 3. Healed: the cut host's ranks are judged again.
	var after map[int]map[string]int
	waitUntil(t, "the cut host's ranks to be judged again", 25*time.Second, func() bool {
		vs, _ := verdicts(t, vpath)
		var nw int
		after, nw = states(vs, tHeal+int64(window), testutil.MonoNow())
		return nw >= 2 && only(after[4], detector.StateOK) && only(after[5], detector.StateOK)
	})
	if !only(after[slowRank], detector.StateStraggler) {
		t.Errorf("rank 3 after the heal: %v", after[slowRank])
	}
	t.Logf("judged again %v after the heal", time.Duration(testutil.MonoNow()-tHeal).Round(time.Millisecond))

	// 4. Stop: agents first (they flush), then the aggregator (summary).
	for _, a := range agents {
		a.Stop()
	}
	agg.Stop()
	_, sums := verdicts(t, vpath)
	if len(sums) != 1 || sums[0].Job != job || len(sums[0].Stragglers) != 1 || sums[0].Stragglers[0] != slowRank {
		t.Errorf("summaries %+v, want job %s with straggler [3]", sums, job)
	}
	if !strings.Contains(agg.Out.String(), "host silent") || !strings.Contains(agg.Out.String(), "host reporting again") {
		t.Errorf("the aggregator did not log the silence and the return of host2")
	}
	t.Logf("whole test %v", time.Since(testStart).Round(time.Millisecond))
}
