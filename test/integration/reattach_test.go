package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slowrank/slowrank/correlate"
	"github.com/slowrank/slowrank/test/testutil"
)

// The collective uprobes of a libnccl file are closed once every process
// mapping it is on the plugin path, and made again through the first user
// that is not (docs/nccl-profiler-plugin.md §7 "Detach"; the attach
// manager's table tests, agent/attach, cover the decisions). Here with real
// uprobes: job A runs on the plugin path until its collective uprobes are
// detached; while it runs, job B starts on the same libnccl file without
// our plugin. B's collectives need the uprobes: the agent makes them again,
// B is counted from them, and A, whose calls now trap again, is still
// counted once (its uprobe events are superseded by its plugin records).
// When B is gone, A alone needs no uprobes: they are closed again.

// reattachRun is what the agent showed of the two jobs.
type reattachRun struct {
	truthA, truthB map[string][]testutil.TruthRecord
	// uprobe and plugin are each rank pid's all-reduces the correlator
	// received by source (the uprobes read the call's stream, the plugin
	// knows none); foreignComm the plugin's ones not under the rank's
	// ncclComm_t.
	uprobe, plugin, foreignComm map[int]int
	paths                       map[int]string   // the capture path status showed last
	coll                        map[int][]string // every libnccl collective uprobe state status showed, in order
	counters                    map[string]int64
	steps                       map[string]map[int]int     // by job and rank
	stepEnds                    map[string]map[int][]int64 // by job and rank
	truthJob                    map[string]string          // "A"/"B" -> the job id
	// Phases, each -1 when never reached. hitsAfterDetach: ncclAllReduce
	// uprobe hits from 300 ms after status first showed A's uprobes
	// detached until B started; aUprobeAtReattach, aUprobeAtEnd: A's
	// uprobe all-reduces fed when the re-attach was first counted and at
	// the end; supersededAfterReattach: nccl_uprobe_events_superseded
	// counted from the re-attach to the end; hitsAfterRedetach: hits from
	// 300 ms after status showed A detached again, once B exited.
	hitsAfterDetach, supersededAfterReattach, hitsAfterRedetach int64
	aUprobeAtReattach, aUprobeAtEnd                             int
	// bAttachAfter is how long after status first showed a process of B
	// it showed all 4 with the collective uprobes attached (polled every
	// 100 ms): B's calls meanwhile trap nowhere.
	bAttachAfter time.Duration
}

// runReattach runs job A (4 ranks on our plugin) under an agent with
// --nccl-plugin and, once A's collective uprobes are detached, job B (4
// ranks, the same fake libraries) with envB.
func runReattach(t *testing.T, envB []string) reattachRun {
	t.Helper()
	lib := testutil.SharedInjectionLibrary(t)
	key := runKey("SLOWRANK_IT_REATTACH_MARK")
	var mu sync.Mutex
	var calls []correlate.HostCall
	dump := func(v any) {
		if h, ok := v.(correlate.HostCall); ok && h.Kind == correlate.HostCollective && h.Op == "allreduce" {
			mu.Lock()
			calls = append(calls, h)
			mu.Unlock()
		}
	}
	jA := job{envKey: key, ncclPlugin: true, dump: dump,
		env: []string{"CUDA_INJECTION64_PATH=" + lib, "NCCL_PROFILER_PLUGIN=" + lib}}
	jB := job{envKey: key, env: envB}
	sink, a, stop := jA.startAgent(t, 2*time.Second)

	// A runs about 14 s: detached after about 3, B from about 3.5 to 8.
	const stepsA, stepsB = 600, 150
	shape := []string{"--step-ms", "8", "--gpu-ms", "12", "--buckets", "4"}
	cmdA, truthA := jA.trainer(t, append([]string{"--steps", strconv.Itoa(stepsA)}, shape...)...)
	cmdB, truthB := jB.trainer(t, append([]string{"--steps", strconv.Itoa(stepsB)}, shape...)...)
	// B's environment is the test's with no NCCL_PROFILER_PLUGIN but envB's.
	cmdB.Env = slices.DeleteFunc(cmdB.Env, func(kv string) bool {
		return strings.HasPrefix(kv, "NCCL_PROFILER_PLUGIN=") && !slices.Contains(envB, kv)
	})
	var outA, outB testutil.LockedBuffer
	cmdA.Stdout, cmdA.Stderr = &outA, &outA
	cmdB.Stdout, cmdB.Stderr = &outB, &outB
	doneA := testutil.StartCmd(t, cmdA)
	jobOf := func(cmd *exec.Cmd) string { return fmt.Sprintf("ft-%d-", cmd.Process.Pid) }
	prefixA := jobOf(cmdA)

	r := reattachRun{uprobe: map[int]int{}, plugin: map[int]int{}, foreignComm: map[int]int{}, paths: map[int]string{},
		coll: map[int][]string{}, steps: map[string]map[int]int{}, stepEnds: map[string]map[int][]int64{},
		hitsAfterDetach: -1, supersededAfterReattach: -1, hitsAfterRedetach: -1, aUprobeAtReattach: -1}
	// aUprobe is A's uprobe all-reduces fed so far (A's pids: the jobs'
	// status rows; mu held).
	aPIDs := map[int]bool{}
	aUprobe := func() int {
		n := 0
		for _, h := range calls {
			if aPIDs[int(h.PID)] && h.Stream != 0 {
				n++
			}
		}
		return n
	}
	var detachedAt, redetachedAt, bSeen, bAttached time.Time
	var hitsAtDetach, hitsAtRedetach, supersededAtReattach int64 = -1, -1, -1
	startB := make(chan struct{})
	bStarted, bExited := false, false
	stopPoll := pollEvery(100*time.Millisecond, func() {
		procs := a.Status().Procs
		c := a.Counters()
		mu.Lock()
		defer mu.Unlock()
		nA, detachedA, nB, attachedB := 0, true, 0, true
		for _, p := range procs {
			if p.NCCL != "" {
				r.paths[p.PID] = p.NCCL
			}
			if s := r.coll[p.PID]; p.NCCLUprobes != "" && (len(s) == 0 || s[len(s)-1] != p.NCCLUprobes) {
				r.coll[p.PID] = append(s, p.NCCLUprobes)
			}
			if strings.HasPrefix(p.Job, prefixA) {
				aPIDs[p.PID] = true
				nA++
				detachedA = detachedA && p.NCCLUprobes == "detached"
			} else {
				nB++
				attachedB = attachedB && p.NCCLUprobes == "attached"
			}
		}
		detachedA = detachedA && nA == 4
		if nB > 0 && bSeen.IsZero() {
			bSeen = time.Now()
		}
		if nB == 4 && attachedB && bAttached.IsZero() {
			bAttached = time.Now()
		}
		switch {
		case !bStarted && detachedA && detachedAt.IsZero():
			detachedAt = time.Now()
		case !bStarted && !detachedAt.IsZero() && time.Since(detachedAt) >= 300*time.Millisecond:
			hitsAtDetach = c["probe_ncclAllReduce"]
			bStarted = true
			close(startB)
		case bStarted && supersededAtReattach < 0 && c["nccl_collective_probes_reattached"] > 0:
			supersededAtReattach = c["nccl_uprobe_events_superseded"]
			r.aUprobeAtReattach = aUprobe()
		case bExited && detachedA && redetachedAt.IsZero():
			redetachedAt = time.Now()
		case !redetachedAt.IsZero() && hitsAtRedetach < 0 && time.Since(redetachedAt) >= 300*time.Millisecond:
			hitsAtRedetach = c["probe_ncclAllReduce"]
		}
	})
	defer stopPoll()
	var errA error
	select {
	case <-startB:
	case errA = <-doneA:
		stopPoll()
		t.Fatalf("job A ended (%v) before status showed its collective uprobes detached: paths %v, collective uprobes %v\n%s",
			errA, r.paths, r.coll, testutil.Tail(outA.String(), 4000))
	case <-time.After(60 * time.Second):
		stopPoll()
		t.Fatalf("status did not show job A's collective uprobes detached within 60 s: paths %v, collective uprobes %v", r.paths, r.coll)
	}
	hitsBeforeB := a.Counters()["probe_ncclAllReduce"]
	if err := cmdB.Run(); err != nil {
		t.Fatalf("job B: %v\n%s", err, testutil.Tail(outB.String(), 4000))
	}
	mu.Lock()
	bExited = true
	mu.Unlock()
	if errA = <-doneA; errA != nil {
		t.Fatalf("job A: %v\n%s", errA, testutil.Tail(outA.String(), 4000))
	}
	stopPoll()
	for i, path := range []string{truthA, truthB} {
		if d := dumpPath(t); d != "" {
			if b, err := os.ReadFile(path); err == nil {
				if err := os.WriteFile(fmt.Sprintf("%s.%c.truth", d, 'A'+i), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	stop()

	r.truthA, r.truthB = testutil.ReadTruth(t, truthA), testutil.ReadTruth(t, truthB)
	r.counters = a.Counters()
	c := r.counters
	if hitsAtDetach >= 0 {
		r.hitsAfterDetach = hitsBeforeB - hitsAtDetach
	}
	if supersededAtReattach >= 0 {
		r.supersededAfterReattach = c["nccl_uprobe_events_superseded"] - supersededAtReattach
	}
	if hitsAtRedetach >= 0 {
		r.hitsAfterRedetach = c["probe_ncclAllReduce"] - hitsAtRedetach
	}
	comm := map[int]uint64{}
	r.truthJob = map[string]string{}
	for name, truth := range map[string]map[string][]testutil.TruthRecord{"A": r.truthA, "B": r.truthB} {
		for _, rk := range truth["rank"] {
			v, err := strconv.ParseUint(strings.TrimPrefix(rk.Comm, "0x"), 16, 64)
			if err != nil {
				t.Fatalf("truth %s: rank %d comm %q: %v", name, rk.Rank, rk.Comm, err)
			}
			comm[rk.PID] = v
			r.truthJob[name] = rk.Job
		}
	}
	mu.Lock()
	defer mu.Unlock()
	r.aUprobeAtEnd = aUprobe()
	if !bSeen.IsZero() && !bAttached.IsZero() {
		r.bAttachAfter = bAttached.Sub(bSeen)
	}
	for _, h := range calls {
		pid := int(h.PID)
		if h.Stream != 0 {
			r.uprobe[pid]++
			continue
		}
		r.plugin[pid]++
		if c, ok := comm[pid]; !ok || h.Comm != c {
			r.foreignComm[pid]++
		}
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	for _, s := range sink.steps {
		if r.steps[s.Job] == nil {
			r.steps[s.Job], r.stepEnds[s.Job] = map[int]int{}, map[int][]int64{}
		}
		r.steps[s.Job][s.Rank]++
		r.stepEnds[s.Job][s.Rank] = append(r.stepEnds[s.Job][s.Rank], s.EndNS)
	}
	return r
}

func TestNCCLCollectiveUprobesReattachForAJobOffThePlugin(t *testing.T) {
	testutil.RequireAgent(t, "to attach uprobes")
	lib := testutil.SharedInjectionLibrary(t)
	foreign := filepath.Join(filepath.Dir(testutil.SharedFakeTrainer(t)), "libnccl-profiler-foreign.so")
	tests := []struct {
		name string
		envB []string // job B's environment (NCCL_PROFILER_PLUGIN unset unless here)
	}{
		{"job B without NCCL_PROFILER_PLUGIN", []string{"CUDA_INJECTION64_PATH=" + lib}},
		{"job B with another tool's plugin", []string{"CUDA_INJECTION64_PATH=" + lib, "NCCL_PROFILER_PLUGIN=" + foreign}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runReattach(t, tt.envB)
			checkReattach(t, r)
		})
	}
}

func checkReattach(t *testing.T, r reattachRun) {
	t.Helper()
	c := r.counters
	want := map[string]map[int]int{"A": {}, "B": {}} // all-reduces per rank pid
	for name, truth := range map[string]map[string][]testutil.TruthRecord{"A": r.truthA, "B": r.truthB} {
		for _, s := range truth["step"] {
			want[name][s.PID] += s.Calls["ncclAllReduce"]
		}
		if len(want[name]) != 4 {
			t.Fatalf("truth of job %s has %d rank processes, want 4", name, len(want[name]))
		}
	}

	// Every all-reduce of each rank reaches the correlator exactly once: A
	// from the uprobes until its switch, then from the plugin (its uprobe
	// events while B ran are superseded, not fed), B from the uprobes only.
	for name, pids := range want {
		for pid, n := range pids {
			if got := r.uprobe[pid] + r.plugin[pid]; got != n {
				t.Errorf("job %s pid %d: the correlator got %d all-reduces (%d from uprobes, %d from the plugin), the trainer made %d",
					name, pid, got, r.uprobe[pid], r.plugin[pid], n)
			}
			wantPath := map[string]string{"A": "plugin v5", "B": "uprobes"}[name]
			if got := r.paths[pid]; got != wantPath {
				t.Errorf("job %s pid %d: capture path %q, want %q", name, pid, got, wantPath)
			}
			if name == "A" && r.plugin[pid] == 0 {
				t.Errorf("job A pid %d: no collective from the plugin", pid)
			}
			if name == "B" && r.plugin[pid] != 0 {
				t.Errorf("job B pid %d: %d collectives not from the uprobes", pid, r.plugin[pid])
			}
			if n := r.foreignComm[pid]; n != 0 {
				t.Errorf("job %s pid %d: %d of the plugin's collectives not under the communicator's uprobe handle", name, pid, n)
			}
		}
	}
	// Nothing vanishes: every uprobe hit, A's and B's, is fed or counted
	// superseded, every fed plugin record is counted.
	uprobeFed, pluginFed := 0, 0
	for _, n := range r.uprobe {
		uprobeFed += n
	}
	for _, n := range r.plugin {
		pluginFed += n
	}
	if hits, sup := c["probe_ncclAllReduce"], c["nccl_uprobe_events_superseded"]; hits != int64(uprobeFed)+sup {
		t.Errorf("uprobe hits %d != fed %d + superseded %d", hits, uprobeFed, sup)
	}
	if c["nccl_plugin_colls"] != int64(pluginFed) {
		t.Errorf("nccl_plugin_colls %d, the correlator got %d plugin collectives", c["nccl_plugin_colls"], pluginFed)
	}
	for _, k := range []string{"ringbuf_lost", "events_lost_queue", "nccl_collective_detach_errors", "nccl_collective_reattach_errors",
		"nccl_plugin_records_late", "nccl_plugin_reorder_overflow", "nccl_plugin_comms_unmapped"} {
		if n := c[k]; n != 0 {
			t.Errorf("%s %d, want 0", k, n)
		}
	}
	if n := c["nccl_plugin_processes"]; n != 4 {
		t.Errorf("nccl_plugin_processes %d, want 4 (job A's)", n)
	}

	// The uprobes' story: detached for A (no hit until B came), made again
	// for B, and A's hits from then on superseded: none of them fed.
	if r.hitsAfterDetach != 0 {
		t.Errorf("%d ncclAllReduce uprobe hits after status showed job A's collective uprobes detached (-1: never shown)", r.hitsAfterDetach)
	}
	if n := c["nccl_collective_probes_reattached"]; n < 1 {
		t.Errorf("collective uprobes re-attached %d times, want at least 1 (job B needs them)", n)
	}
	if r.supersededAfterReattach <= 0 {
		t.Errorf("%d uprobe events superseded after the re-attach (-1: never re-attached): job A's calls should trap again and be dropped",
			r.supersededAfterReattach)
	}
	if r.aUprobeAtReattach < 0 || r.aUprobeAtEnd != r.aUprobeAtReattach {
		t.Errorf("job A's uprobe all-reduces fed: %d when the re-attach was counted (-1: never), %d at the end: its uprobe events after the re-attach were used",
			r.aUprobeAtReattach, r.aUprobeAtEnd)
	}
	// Status showed every process of both jobs the file's state: A's went
	// detached, attached (B's arrival), detached (B's exit); B's attached.
	for name, pids := range want {
		for pid := range pids {
			got := strings.Join(r.coll[pid], ",")
			wantColl := map[string]string{"A": "detached,attached,detached", "B": "attached"}[name]
			if !strings.Contains(got, wantColl) {
				t.Errorf("job %s pid %d: collective uprobes shown %q, want %q among them", name, pid, got, wantColl)
			}
		}
	}
	if n := c["nccl_collective_probes_detached"]; n < 2 || r.hitsAfterRedetach != 0 {
		t.Errorf("collective uprobes detached %d times (want 2: before B and after it), %d hits after status showed them detached again (-1: never shown)",
			n, r.hitsAfterRedetach)
	}

	// Steps: every one of each job's ranks (warm-up allowance 8), ending
	// where the trainer's do (a preempted read of the clock moves one past
	// the 1 ms match, TestAgentCountsEveryCallAndMatchesGroundTruth).
	for name, truth := range map[string]map[string][]testutil.TruthRecord{"A": r.truthA, "B": r.truthB} {
		jobID := r.truthJob[name]
		byRank := truthByRank(truth["step"])
		unmatched, found := 0, 0
		for rank := 0; rank < 4; rank++ {
			steps := len(byRank[rank])
			if n := r.steps[jobID][rank]; n < steps-8 || n > steps {
				t.Errorf("job %s rank %d: %d steps found, trainer ran %d (warm-up allowance 8)", name, rank, n, steps)
			}
			for _, end := range r.stepEnds[jobID][rank] {
				found++
				if _, ok := testutil.NearestStep(byRank[rank], end); !ok {
					unmatched++
				}
			}
		}
		if unmatched > found/100 {
			t.Errorf("job %s: %d of %d steps match no step of the truth", name, unmatched, found)
		}
		t.Logf("job %s (%s): steps %v, %d of %d match no step of the truth", name, jobID, r.steps[jobID], unmatched, found)
	}

	var b strings.Builder
	for _, k := range []string{"nccl_collective_probes_detached", "nccl_collective_probes_reattached", "probe_ncclAllReduce",
		"nccl_uprobe_events_superseded", "nccl_plugin_records_superseded", "nccl_plugin_colls", "nccl_plugin_comms_mapped",
		"nccl_plugin_comms_mapped_by_init", "correlate_reordered", "correlate_late"} {
		fmt.Fprintf(&b, " %s=%d", k, c[k])
	}
	t.Logf("counters:%s", b.String())
	t.Logf("all-reduces: uprobes %v, plugin %v; paths %v; collective uprobes %v; hits after the detach %d, after the second %d; superseded after the re-attach %d; A's uprobe-fed at the re-attach %d, at the end %d; B attached %s after it showed",
		r.uprobe, r.plugin, r.paths, r.coll, r.hitsAfterDetach, r.hitsAfterRedetach, r.supersededAfterReattach, r.aUprobeAtReattach, r.aUprobeAtEnd,
		r.bAttachAfter)
}
