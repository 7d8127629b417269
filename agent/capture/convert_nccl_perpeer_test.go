package capture

import (
	"testing"

	"github.com/slowrank/slowrank/agent/pipeline"
	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/cupti"
)

// uprobeCall is a libnccl collective of probe p as the uprobes report it.
func uprobeCall(c *testConverter, p bpf.ProbeID, tid uint32, start, end uint64) []pipeline.Input {
	return c.Convert(&bpf.CollEvent{Header: bpf.Header{
		Type: bpf.EventColl, Probe: p, PID: pidNCCL, TID: tid, StartNs: start, EndNs: end,
	}, Count: 64, Datatype: 7}, nil)
}

// perPeer is the plugin's records of an ncclAlltoAll on NCCL 2.28+ (a send
// and a receive per peer, P2P, nothing naming the collective), their API
// events inside the call that started at start.
func perPeer(tid uint32, start uint64, peers int) []cupti.NCCLColl {
	var rs []cupti.NCCLColl
	for i := range peers {
		for _, f := range []cupti.NCCLFunc{cupti.NCCLFuncSend, cupti.NCCLFuncRecv} {
			r := pluginColl(tid, start+1+uint64(i))
			r.Func, r.Count, r.Datatype, r.Seq, r.Root = f, 64, 8, 0, int32(i)
			r.P2P = true
			rs = append(rs, r)
		}
	}
	return rs
}

// A process whose uprobes saw an ncclAlltoAll, ncclGather or ncclScatter
// before any plugin collective never switches: every call is the uprobes',
// the plugin's records are withheld and counted, its collective uprobes are
// never "ready" to close, and status says why.
func TestPerPeerCollectiveKeepsTheProcessOnUprobes(t *testing.T) {
	for _, tc := range []struct {
		probe bpf.ProbeID
		path  string
	}{
		{bpf.ProbeNCCLAllToAll, "uprobes (alltoall: plugin reports it per peer)"},
		{bpf.ProbeNCCLGather, "uprobes (gather: plugin reports it per peer)"},
		{bpf.ProbeNCCLScatter, "uprobes (scatter: plugin reports it per peer)"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			c := newConverter(newCounters(), true)
			var fed int
			count := func(in []pipeline.Input) { fed += len(hostCalls(in)) }
			count(uprobeColl(c, 1, t0+50, t0+60))
			count(uprobeCall(c, tc.probe, 1, t0+100, t0+110))
			// The plugin's batch: the comm, the all-reduce, the collective's
			// per-peer records and a later all-reduce.
			recs := append([]cupti.NCCLColl{pluginColl(1, t0+52)}, perPeer(1, t0+100, 4)...)
			recs = append(recs, pluginColl(1, t0+202))
			count(pluginBatch(c, cupti.Batch{NCCLComms: []cupti.NCCLComm{pluginComm5(3)}, NCCLColls: recs}))
			count(uprobeColl(c, 1, t0+200, t0+210))
			if fed != 3 {
				t.Errorf("%d host calls for 3 calls", fed)
			}
			if got := c.counters.get("nccl_plugin_records_kept_on_uprobes"); got != int64(len(recs)) {
				t.Errorf("nccl_plugin_records_kept_on_uprobes = %d, want %d", got, len(recs))
			}
			if got := PluginOps(c.counters.get); got != int64(len(recs)) {
				t.Errorf("plugin operations charged %d, want the %d records: the process paid for each", got, len(recs))
			}
			for key, want := range map[string]int64{
				"nccl_processes_kept_on_uprobes": 1, "nccl_plugin_processes": 0, "nccl_plugin_colls": 0,
				"nccl_uprobe_events_superseded": 0, "nccl_plugin_records_superseded": 0,
			} {
				if got := c.counters.get(key); got != want {
					t.Errorf("%s = %d, want %d", key, got, want)
				}
			}
			if p := c.NCCLPaths()[pidNCCL]; p != tc.path {
				t.Errorf("path %q, want %q", p, tc.path)
			}
			if c.PluginReady(emitAt + commNameGrace)[pidNCCL] {
				t.Error("ready: its libnccl file's collective uprobes would be closed")
			}
		})
	}
}

// A process on the plugin path whose uprobes (still attached) then see an
// ncclAlltoAll returns to the uprobes: each call is fed once, by the
// plugin if the uprobes had dropped it, by the uprobes from the return on,
// per thread; it is no longer ready.
func TestPerPeerCollectiveAfterTheSwitchReturnsToUprobes(t *testing.T) {
	c := newConverter(newCounters(), true)
	// The uprobes' calls start at multiples of 10 ns, the plugin's not.
	var fed, fromPlugin int
	count := func(in []pipeline.Input) {
		for _, h := range hostCalls(in) {
			fed++
			if h.StartNS%10 != 0 {
				fromPlugin++
			}
		}
	}
	// Call 1 (thread 1) before the switch, the uprobes' alone.
	count(uprobeColl(c, 1, t0+100, t0+110))
	count(pluginBatch(c, cupti.Batch{NCCLComms: []cupti.NCCLComm{pluginComm5(3)}, NCCLColls: []cupti.NCCLColl{pluginColl(1, t0+202)}}))
	if !c.PluginReady(emitAt)[pidNCCL] {
		t.Fatal("not ready on the plugin path")
	}
	// Call 2 (thread 1, the plugin's record above) and call 3 (thread 2):
	// the uprobes leave them to the plugin.
	count(uprobeColl(c, 1, t0+200, t0+210))
	count(uprobeColl(c, 2, t0+250, t0+260))
	// NCCL 2.27 launches a grouped call in its ncclGroupEnd: call 4 on
	// thread 3, its group end after it.
	count(uprobeColl(c, 3, t0+270, t0+275))
	c.Convert(&bpf.GroupEvent{Header: bpf.Header{Type: bpf.EventGroup, PID: pidNCCL, TID: 3, StartNs: t0 + 276, EndNs: t0 + 290}, HasReturn: true}, nil)
	// The all-to-all (thread 1): back on the uprobes.
	count(uprobeCall(c, bpf.ProbeNCCLAllToAll, 1, t0+300, t0+310))
	// Call 5 (thread 2) after the return.
	count(uprobeColl(c, 2, t0+320, t0+330))
	// The plugin's batch: calls 3, 4 (v4 launch in the group end), the
	// all-to-all's per-peer records and call 5.
	v4 := pluginColl(3, 0)
	v4.HasAPI, v4.LaunchStartNs, v4.LaunchEndNs = false, t0+281, t0+285
	recs := append([]cupti.NCCLColl{pluginColl(2, t0+252), v4}, perPeer(1, t0+300, 4)...)
	recs = append(recs, pluginColl(2, t0+322))
	count(pluginBatch(c, cupti.Batch{NCCLColls: recs}))
	if fed != 6 || fromPlugin != 3 {
		t.Errorf("%d host calls (%d from the plugin) for 6 calls (2, 3 and 4 the plugin's)", fed, fromPlugin)
	}
	for key, want := range map[string]int64{
		"nccl_plugin_records_kept_on_uprobes": 8 + 1, "nccl_processes_kept_on_uprobes": 1,
		"nccl_uprobe_events_superseded": 3, "nccl_plugin_colls": 3,
	} {
		if got := c.counters.get(key); got != want {
			t.Errorf("%s = %d, want %d", key, got, want)
		}
	}
	if p := c.NCCLPaths()[pidNCCL]; p != "uprobes (alltoall: plugin reports it per peer)" {
		t.Errorf("path %q", p)
	}
	if c.PluginReady(emitAt + commNameGrace)[pidNCCL] {
		t.Error("still ready after the return: its collective uprobes would be closed")
	}
}

// Without --nccl-plugin nothing changes: the uprobes report everything and
// status says plain uprobes.
func TestPerPeerCollectiveWithThePluginPathOff(t *testing.T) {
	c := newConverter(newCounters(), false)
	if len(hostCalls(uprobeCall(c, bpf.ProbeNCCLAllToAll, 1, t0+100, t0+110))) != 1 {
		t.Error("the all-to-all was not fed")
	}
	pluginBatch(c, cupti.Batch{NCCLComms: []cupti.NCCLComm{pluginComm5(3)}, NCCLColls: perPeer(1, t0+100, 2)})
	if p := c.NCCLPaths()[pidNCCL]; p != "uprobes" {
		t.Errorf("path %q, want uprobes", p)
	}
	if n := c.counters.get("nccl_processes_kept_on_uprobes") + c.counters.get("nccl_plugin_records_kept_on_uprobes"); n != 0 {
		t.Errorf("kept-on-uprobes counters %d with the plugin path off", n)
	}
}
