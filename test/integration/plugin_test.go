package integration

import (
	"cmp"
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
	collUprobes map[int]string // the collective uprobes' state status showed last
	libStates   map[int]string // the library's state status showed last
	counters    map[string]int64
	steps       map[int]int // steps found per rank
	// hitsAfterDetach are the ncclAllReduce uprobe hits from 300 ms after
	// status first showed every rank's collective uprobes detached (-1:
	// never shown); the 300 ms let the events of calls made before the
	// detach come through.
	hitsAfterDetach int64
	// lateComm are each rank pid's communicator from --split-at on, late
	// the collectives that reached the correlator under it, by source.
	lateComm               map[int]uint64
	lateUprobe, latePlugin map[int]int
	// perPeer are each rank pid's alltoall, gather and scatter calls the
	// correlator received (only the uprobes name them), p2p its sends and
	// receives.
	perPeer, p2p map[int]int
	// bcastUprobe and bcastPlugin are the broadcasts the correlator
	// received from each path (--bcast), all ranks together.
	bcastUprobe, bcastPlugin int
}

// runCapture runs a 4-rank trainer with env under the agent (plugin:
// Config.NCCLPlugin).
func runCapture(t *testing.T, plugin bool, env []string, args ...string) pathRun {
	t.Helper()
	var mu sync.Mutex
	var calls []correlate.HostCall
	paths, libStates, collUprobes := map[int]string{}, map[int]string{}, map[int]string{}
	var detachedAt time.Time
	hitsAtDetach := int64(-1)
	j := job{envKey: runKey("SLOWRANK_IT_PLUGIN_MARK"), env: env, ncclPlugin: plugin,
		dump: func(v any) {
			if h, ok := v.(correlate.HostCall); ok && h.Kind == correlate.HostCollective {
				mu.Lock()
				calls = append(calls, h)
				mu.Unlock()
			}
		},
		poll: func(a *agent.Agent) {
			procs := a.Status().Procs
			detached := len(procs) == 4
			for _, p := range procs {
				mu.Lock()
				if p.NCCL != "" {
					paths[p.PID] = p.NCCL
				}
				if p.CUPTI != "" {
					libStates[p.PID] = p.CUPTI
				}
				if p.NCCLUprobes != "" {
					collUprobes[p.PID] = p.NCCLUprobes
				}
				mu.Unlock()
				detached = detached && p.NCCLUprobes == "detached"
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case detached && detachedAt.IsZero():
				detachedAt = time.Now()
			case !detachedAt.IsZero() && hitsAtDetach < 0 && time.Since(detachedAt) >= 300*time.Millisecond:
				hitsAtDetach = a.Counters()["probe_ncclAllReduce"]
			}
		}}
	sink, a, truth := j.runAll(t, 2*time.Second, args...)
	r := pathRun{truth: truth, uprobe: map[int]int{}, plugin: map[int]int{}, foreignComm: map[int]int{}, paths: paths, libStates: libStates, collUprobes: collUprobes,
		counters: a.Counters(), steps: map[int]int{}, hitsAfterDetach: -1,
		lateComm: map[int]uint64{}, lateUprobe: map[int]int{}, latePlugin: map[int]int{}, perPeer: map[int]int{}, p2p: map[int]int{}}
	if hitsAtDetach >= 0 {
		r.hitsAfterDetach = r.counters["probe_ncclAllReduce"] - hitsAtDetach
	}
	for _, cm := range truth["comm"] {
		v, err := strconv.ParseUint(strings.TrimPrefix(cm.Comm, "0x"), 16, 64)
		if err != nil {
			t.Fatalf("truth: rank %d late comm %q: %v", cm.Rank, cm.Comm, err)
		}
		r.lateComm[cm.PID] = v
	}
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
		switch h.Op {
		case correlate.OpAllToAll, correlate.OpGather, correlate.OpScatter:
			r.perPeer[int(h.PID)]++
		case correlate.OpSend, correlate.OpRecv:
			r.p2p[int(h.PID)]++
		}
		if h.Op == "broadcast" {
			if h.Stream != 0 {
				r.bcastUprobe++
			} else {
				r.bcastPlugin++
			}
		}
		if h.Op != "allreduce" {
			continue
		}
		// The uprobes read the call's stream, the plugin knows none.
		late := h.Comm != 0 && h.Comm == r.lateComm[int(h.PID)]
		if h.Stream != 0 {
			r.uprobe[int(h.PID)]++
			if late {
				r.lateUprobe[int(h.PID)]++
			}
			continue
		}
		r.plugin[int(h.PID)]++
		if late {
			r.latePlugin[int(h.PID)]++
		}
		if c, ok := comm[int(h.PID)]; (!ok || h.Comm != c) && h.Comm != r.lateComm[int(h.PID)] {
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
	tests := []struct {
		name   string
		plugin string   // NCCL_PROFILER_PLUGIN ("" as if unset)
		env    []string // more of the trainer's environment
		args   []string
		off    bool   // the agent without --nccl-plugin
		want   string // the capture path of every rank
		steps  int    // 100 if 0
		// splitAt: the trainer creates a communicator at this step
		// (--split-at), after the collective uprobes were detached.
		splitAt int
	}{
		{name: "our plugin loaded, the agent's plugin path off: NCCL calls it for nothing, the uprobes report", plugin: lib, off: true, want: "uprobes"},
		{name: "our library as the profiler plugin is the plugin v5 path", plugin: lib, want: "plugin v5"},
		{name: "grouped buckets on the plugin are counted once", plugin: lib, args: []string{"--group"}, want: "plugin v5"},
		{name: "an NCCL 2.27 binds v4 and the launch is the call", plugin: lib, args: []string{"--group"},
			env: []string{"SLOWRANK_FAKE_NCCL_PROFILER_MAX=4"}, want: "plugin v4"},
		{name: "an NCCL 2.29 binds v6", plugin: lib, env: []string{"SLOWRANK_FAKE_NCCL_PROFILER_MAX=6"}, want: "plugin v6"},
		{name: "a communicator created after the detach takes the handle of its creation", plugin: lib, want: "plugin v5",
			steps: 250, splitAt: 200},
		{name: "no plugin named stays on uprobes", plugin: "", want: "uprobes"},
		{name: "a late communicator on the uprobes", plugin: "", want: "uprobes", steps: 250, splitAt: 200},
		{name: "plugin none stays on uprobes", plugin: "none", want: "uprobes"},
		{name: "another tool's plugin owns the slot, uprobes report", plugin: foreign, want: "uprobes"},
		// NCCL 2.28 reports an ncclAlltoAll to the plugin as a send and a
		// receive per peer: the process stays on the uprobes, its plugin
		// records withheld, its collective uprobes attached.
		{name: "all-to-alls keep a process on the uprobes", plugin: lib, args: []string{"--alltoall"},
			want: "uprobes (alltoall: plugin reports it per peer)"},
		// ncclBcast calls ncclBroadcast: both uprobes fire for one
		// broadcast, the plugin sees one call. Counted twice, the ranks
		// that switched later numbered their calls higher and their
		// arrival rows compared other calls (the H200's arrival runs).
		{name: "a broadcast per step through ncclBcast is one call on the uprobes", plugin: "", args: []string{"--bcast"}, want: "uprobes"},
		{name: "a broadcast per step through ncclBcast is one call across the switch", plugin: lib, args: []string{"--bcast"}, want: "plugin v5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := append([]string{"CUDA_INJECTION64_PATH=" + lib, "NCCL_PROFILER_PLUGIN=" + tt.plugin}, tt.env...)
			steps := cmp.Or(tt.steps, 150) // the detach comes after about 70 steps
			args := append([]string{"--steps", strconv.Itoa(steps), "--step-ms", "8", "--gpu-ms", "12", "--buckets", "4"}, tt.args...)
			if tt.splitAt > 0 {
				args = append(args, "--split-at", strconv.Itoa(tt.splitAt))
			}
			r := runCapture(t, !tt.off, env, args...)
			c := r.counters
			uprobes := !strings.HasPrefix(tt.want, "plugin")
			want, wantPerPeer := map[int]int{}, map[int]int{}
			for _, s := range r.truth["step"] {
				want[s.PID] += s.Calls["ncclAllReduce"]
				wantPerPeer[s.PID] += s.Calls["ncclAlltoAll"]
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
				if got := r.libStates[pid]; !uprobes && got != agent.PluginOnly {
					t.Errorf("pid %d: library state %q, want %q", pid, got, agent.PluginOnly)
				}
				if !uprobes && r.plugin[pid] == 0 {
					t.Errorf("pid %d: no collective from the plugin", pid)
				}
				if n := r.foreignComm[pid]; n != 0 {
					t.Errorf("pid %d: %d of the plugin's collectives not under the communicator's uprobe handle", pid, n)
				}
				if uprobes && r.plugin[pid] != 0 {
					t.Errorf("pid %d: %d collectives not from the uprobes", pid, r.plugin[pid])
				}
				// Only the uprobes name an all-to-all; the plugin's
				// per-peer records of it are never fed.
				if r.perPeer[pid] != wantPerPeer[pid] || wantPerPeer[pid] > 0 && r.p2p[pid] != 0 {
					t.Errorf("pid %d: the correlator got %d all-to-alls and %d sends/receives, the trainer made %d all-to-alls and none",
						pid, r.perPeer[pid], r.p2p[pid], wantPerPeer[pid])
				}
			}
			if lost := c["ringbuf_lost"] + c["events_lost_queue"]; lost != 0 {
				t.Errorf("lost %d events", lost)
			}
			// Every uprobe hit is fed or superseded (counted), every fed
			// plugin record counted: nothing vanishes at the switch.
			// An ncclBcast's hit is the nested call of the ncclBroadcast
			// hit inside it (counted), never a call of its own.
			uprobeFed, pluginFed := r.bcastUprobe, r.bcastPlugin
			for pid := range want {
				uprobeFed += r.uprobe[pid]
				pluginFed += r.plugin[pid]
			}
			hits := c["probe_ncclAllReduce"] + c["probe_ncclBroadcast"] + c["probe_ncclBcast"]
			if sup, nested := c["nccl_uprobe_events_superseded"], c["nccl_uprobe_nested_calls"]; hits != int64(uprobeFed)+sup+nested {
				t.Errorf("uprobe hits %d != fed %d + superseded %d + nested %d", hits, uprobeFed, sup, nested)
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
			if uprobes {
				wantProcs = 0
			}
			// All-to-alls: every plugin record withheld and counted (4
			// all-reduces and a send and a receive per peer per step once
			// NCCL's mask is on, after 52 of 150 steps in one run: 4,704
			// records, all the library queued), no process on the plugin
			// path (wantProcs).
			kept := c["nccl_plugin_records_kept_on_uprobes"]
			if len(tt.args) > 0 && tt.args[0] == "--alltoall" {
				steps := int64(len(r.truth["step"]))
				if n := c["nccl_processes_kept_on_uprobes"]; n != 4 {
					t.Errorf("nccl_processes_kept_on_uprobes %d, want 4", n)
				}
				for pid := range want {
					if got := r.collUprobes[pid]; got != "attached" {
						t.Errorf("pid %d: collective uprobes %q in status, want attached", pid, got)
					}
				}
				if kept < 12*4*10 || kept > 12*steps || kept > c["cupti_lib_nccl_colls"] {
					t.Errorf("nccl_plugin_records_kept_on_uprobes %d for %d rank steps of 12 records (the library queued %d)",
						kept, steps, c["cupti_lib_nccl_colls"])
				}
			} else if len(tt.args) > 0 && tt.args[0] == "--bcast" {
				steps := int64(len(r.truth["step"]))
				if n := c["nccl_uprobe_nested_calls"]; n < 4*10 || n > steps {
					t.Errorf("nccl_uprobe_nested_calls %d for %d rank steps of one ncclBcast", n, steps)
				}
				if n := c["correlate_arrival_misaligned"]; n != 0 {
					t.Errorf("%d calls misaligned with their peers' (a broadcast counted twice?)", n)
				}
			} else if kept != 0 || c["nccl_processes_kept_on_uprobes"] != 0 {
				t.Errorf("without all-to-alls: %d plugin records kept on the uprobes, %d processes", kept, c["nccl_processes_kept_on_uprobes"])
			}
			if n := c["nccl_plugin_processes"]; n != wantProcs {
				t.Errorf("nccl_plugin_processes %d, want %d", n, wantProcs)
			}
			// Steps: every one, whatever the path: the plugin's calls take
			// the uprobes' comm handle and are reordered with the
			// process's real-time synchronisations (agent/pipeline/reorder.go).
			// After a late communicator the job's cycle moves to it: it
			// takes the clock once the old one made no step for
			// PromoteCycles (16) of its steps, which are lost.
			allow := 8
			if tt.splitAt > 0 {
				allow += 16 + 2
			}
			for rank := 0; rank < 4; rank++ {
				if n := r.steps[rank]; n < steps-allow || n > steps {
					t.Errorf("rank %d: %d steps found, trainer ran %d (warm-up allowance 8)", rank, n, steps)
				}
			}
			// On the plugin path the collective uprobes are closed once
			// every rank's communicators are named: no hit after it.
			if !uprobes && (c["nccl_collective_probes_detached"] < 1 || r.hitsAfterDetach != 0) {
				t.Errorf("collective uprobes: detached %d times, %d hits after status showed them detached (-1: never shown)",
					c["nccl_collective_probes_detached"], r.hitsAfterDetach)
			}
			if n := c["nccl_collective_probes_detached"]; uprobes && n != 0 {
				t.Errorf("collective uprobes detached %d times on the uprobes path", n)
			}
			for pid := range want {
				if tt.splitAt > 0 && !uprobes && (r.latePlugin[pid] == 0 || r.lateUprobe[pid] != 0) {
					t.Errorf("pid %d: %d plugin and %d uprobe collectives under the late communicator %#x, want plugin ones only",
						pid, r.latePlugin[pid], r.lateUprobe[pid], r.lateComm[pid])
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
				"nccl_plugin_comms_mapped", "nccl_plugin_comms_mapped_by_init", "nccl_plugin_records_late",
				"nccl_collective_probes_detached", "nccl_collective_probes_reattached", "probe_ncclAllReduce",
				"nccl_plugin_records_kept_on_uprobes", "nccl_plugin_records_before_comm", "cupti_lib_nccl_colls"} {
				fmt.Fprintf(&b, " %s=%d", k, c[k])
			}
			t.Logf("counters:%s", b.String())
			t.Logf("%d all-reduces: uprobes %v, plugin %v; superseded: uprobe events %d, plugin records %d; steps %v; paths %v; uprobe hits after the detach %d; late communicator: plugin %v",
				total, r.uprobe, r.plugin, c["nccl_uprobe_events_superseded"], c["nccl_plugin_records_superseded"], r.steps, r.paths,
				r.hitsAfterDetach, r.latePlugin)
		})
	}
}
