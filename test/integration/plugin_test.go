package integration

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/slowrank/slowrank/agent"
	"github.com/slowrank/slowrank/correlate"
	"github.com/slowrank/slowrank/test/testutil"
)

// The NCCL capture paths end to end (docs/nccl-profiler-plugin.md §7): the
// fake NCCL loads NCCL_PROFILER_PLUGIN as NCCL >= 2.23 does, and the agent
// takes each process's collectives from the injection library's plugin
// records or, where the plugin is not ours or not loaded, from the libnccl
// uprobes. Whatever the path, every ncclAllReduce of the trainer reaches
// the correlator exactly once, also across the switch from uprobes (which
// report from the first call) to the plugin (from its first comm record).

// pathRun is what one trainer run under the agent showed.
type pathRun struct {
	truth map[string][]testutil.TruthRecord
	// host is each rank pid's collectives the correlator received, by
	// source: the uprobes carry the trainer's ncclComm_t, the plugin a
	// handle of its own.
	uprobe, plugin map[int]int
	// foreignComm counts the plugin's calls that did not carry the
	// trainer's ncclComm_t, the handle the uprobes gave the communicator.
	foreignComm map[int]int
	paths       map[int]string // the capture path status showed last
	libStates   map[int]string // the library's state status showed last
	counters    map[string]int64
	steps       map[int]int // steps found per rank
}

// runCapture runs a 4-rank trainer with env under the agent (plugin:
// Config.NCCLPlugin).
func runCapture(t *testing.T, plugin bool, env []string, args ...string) pathRun {
	t.Helper()
	var mu sync.Mutex
	var calls []correlate.HostCall
	paths, libStates := map[int]string{}, map[int]string{}
	j := job{envKey: runKey("SLOWRANK_IT_PLUGIN_MARK"), env: env, ncclPlugin: plugin,
		dump: func(v any) {
			if h, ok := v.(correlate.HostCall); ok && h.Kind == correlate.HostCollective {
				mu.Lock()
				calls = append(calls, h)
				mu.Unlock()
			}
		},
		poll: func(a *agent.Agent) {
			for _, p := range a.Status().Procs {
				mu.Lock()
				if p.NCCL != "" {
					paths[p.PID] = p.NCCL
				}
				if p.CUPTI != "" {
					libStates[p.PID] = p.CUPTI
				}
				mu.Unlock()
			}
		}}
	sink, a, truth := j.runAll(t, 2*time.Second, args...)
	r := pathRun{truth: truth, uprobe: map[int]int{}, plugin: map[int]int{}, foreignComm: map[int]int{}, paths: paths, libStates: libStates,
		counters: a.Counters(), steps: map[int]int{}}
	comm := map[int]uint64{}
	for _, rk := range truth["rank"] {
		v, err := strconv.ParseUint(strings.TrimPrefix(rk.Comm, "0x"), 16, 64)
		if err != nil {
			t.Fatalf("truth: rank %d comm %q: %v", rk.Rank, rk.Comm, err)
		}
		comm[rk.PID] = v
	}
	mu.Lock()
	defer mu.Unlock()
	for _, h := range calls {
		if h.Op != "allreduce" {
			continue
		}
		// The uprobes read the call's stream, the plugin knows none.
		if h.Stream != 0 {
			r.uprobe[int(h.PID)]++
			continue
		}
		r.plugin[int(h.PID)]++
		if c, ok := comm[int(h.PID)]; !ok || h.Comm != c {
			r.foreignComm[int(h.PID)]++
		}
	}
	for _, s := range sink.steps {
		r.steps[s.Rank]++
	}
	return r
}

func TestNCCLCapturePathMatrix(t *testing.T) {
	testutil.RequireAgent(t, "to attach uprobes")
	lib := testutil.SharedInjectionLibrary(t)
	foreign := filepath.Join(filepath.Dir(testutil.SharedFakeTrainer(t)), "libnccl-profiler-foreign.so")
	const steps = 100
	tests := []struct {
		name   string
		plugin string   // NCCL_PROFILER_PLUGIN ("" as if unset)
		env    []string // more of the trainer's environment
		args   []string
		off    bool   // the agent without --nccl-plugin
		want   string // the capture path of every rank
	}{
		{name: "our plugin loaded, the agent's plugin path off: NCCL calls it for nothing, the uprobes report", plugin: lib, off: true, want: "uprobes"},
		{name: "our library as the profiler plugin is the plugin v5 path", plugin: lib, want: "plugin v5"},
		{name: "grouped buckets on the plugin are counted once", plugin: lib, args: []string{"--group"}, want: "plugin v5"},
		{name: "an NCCL 2.27 binds v4 and the launch is the call", plugin: lib, args: []string{"--group"},
			env: []string{"SLOWRANK_FAKE_NCCL_PROFILER_MAX=4"}, want: "plugin v4"},
		{name: "an NCCL 2.29 binds v6", plugin: lib, env: []string{"SLOWRANK_FAKE_NCCL_PROFILER_MAX=6"}, want: "plugin v6"},
		{name: "no plugin named stays on uprobes", plugin: "", want: "uprobes"},
		{name: "plugin none stays on uprobes", plugin: "none", want: "uprobes"},
		{name: "another tool's plugin owns the slot, uprobes report", plugin: foreign, want: "uprobes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := append([]string{"CUDA_INJECTION64_PATH=" + lib, "NCCL_PROFILER_PLUGIN=" + tt.plugin}, tt.env...)
			args := append([]string{"--steps", strconv.Itoa(steps), "--step-ms", "8", "--gpu-ms", "12", "--buckets", "4"}, tt.args...)
			r := runCapture(t, !tt.off, env, args...)
			c := r.counters
			want := map[int]int{}
			for _, s := range r.truth["step"] {
				want[s.PID] += s.Calls["ncclAllReduce"]
			}
			if len(want) != 4 {
				t.Fatalf("truth has %d rank processes, want 4", len(want))
			}
			total := 0
			for pid, n := range want {
				total += n
				if got := r.uprobe[pid] + r.plugin[pid]; got != n {
					t.Errorf("pid %d: the correlator got %d all-reduces (%d from uprobes, %d from the plugin), the trainer made %d",
						pid, got, r.uprobe[pid], r.plugin[pid], n)
				}
				if got := r.paths[pid]; got != tt.want {
					t.Errorf("pid %d: capture path %q, want %q", pid, got, tt.want)
				}
				// The fake CUDA never loads CUDA_INJECTION64_PATH: where NCCL
				// loaded the library, status says it is the plugin only.
				if got := r.libStates[pid]; tt.want != "uprobes" && got != agent.PluginOnly {
					t.Errorf("pid %d: library state %q, want %q", pid, got, agent.PluginOnly)
				}
				if tt.want != "uprobes" && r.plugin[pid] == 0 {
					t.Errorf("pid %d: no collective from the plugin", pid)
				}
				if n := r.foreignComm[pid]; n != 0 {
					t.Errorf("pid %d: %d of the plugin's collectives not under the communicator's uprobe handle", pid, n)
				}
				if tt.want == "uprobes" && r.plugin[pid] != 0 {
					t.Errorf("pid %d: %d collectives not from the uprobes", pid, r.plugin[pid])
				}
			}
			if lost := c["ringbuf_lost"] + c["events_lost_queue"]; lost != 0 {
				t.Errorf("lost %d events", lost)
			}
			// Every uprobe hit is fed or superseded (counted), every fed
			// plugin record counted: nothing vanishes at the switch.
			uprobeFed, pluginFed := 0, 0
			for pid := range want {
				uprobeFed += r.uprobe[pid]
				pluginFed += r.plugin[pid]
			}
			if hits, sup := c["probe_ncclAllReduce"], c["nccl_uprobe_events_superseded"]; hits != int64(uprobeFed)+sup {
				t.Errorf("uprobe hits %d != fed %d + superseded %d", hits, uprobeFed, sup)
			}
			if c["nccl_plugin_colls"] != int64(pluginFed) {
				t.Errorf("nccl_plugin_colls %d, the correlator got %d plugin collectives", c["nccl_plugin_colls"], pluginFed)
			}
			// With the plugin path off the agent leaves the library's NCCL
			// mask at 0: NCCL calls the plugin for nothing and no record
			// comes (an older library would send them: counted, ignored).
			if n := c["cupti_lib_nccl_colls"]; tt.off && n != 0 {
				t.Errorf("the library recorded %d collectives with the agent's plugin path off", n)
			}
			wantProcs := int64(4)
			if tt.want == "uprobes" {
				wantProcs = 0
			}
			if n := c["nccl_plugin_processes"]; n != wantProcs {
				t.Errorf("nccl_plugin_processes %d, want %d", n, wantProcs)
			}
			// Steps: every one, whatever the path: the plugin's calls take
			// the uprobes' comm handle and are reordered with the
			// process's real-time synchronisations (agent/reorder.go).
			for rank := 0; rank < 4; rank++ {
				if n := r.steps[rank]; n < steps-8 || n > steps {
					t.Errorf("rank %d: %d steps found, trainer ran %d (warm-up allowance 8)", rank, n, steps)
				}
			}
			if n := c["nccl_plugin_comms_unmapped"]; n != 0 {
				t.Errorf("%d plugin communicators kept a handle of their own", n)
			}
			if n := c["nccl_plugin_records_late"] + c["nccl_plugin_reorder_overflow"]; n != 0 {
				t.Errorf("%d plugin records came after the hold or overflowed it", n)
			}
			var b strings.Builder
			for _, k := range []string{"correlate_late", "correlate_retracted_steps", "correlate_relocks", "correlate_irregular_calls",
				"correlate_init_calls", "correlate_burst_steps", "correlate_unassigned", "correlate_reordered", "correlate_arrival_timeouts",
				"nccl_plugin_comms_mapped", "nccl_plugin_records_late"} {
				fmt.Fprintf(&b, " %s=%d", k, c[k])
			}
			t.Logf("counters:%s", b.String())
			t.Logf("%d all-reduces: uprobes %v, plugin %v; superseded: uprobe events %d, plugin records %d; steps %v; paths %v",
				total, r.uprobe, r.plugin, c["nccl_uprobe_events_superseded"], c["nccl_plugin_records_superseded"], r.steps, r.paths)
		})
	}
}
