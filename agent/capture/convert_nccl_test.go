package capture

import (
	"testing"

	"github.com/slowrank/slowrank/agent/pipeline"
	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/correlate"
	"github.com/slowrank/slowrank/cupti"
)

const (
	t0      = uint64(1_000_000_000_000) // a plausible CLOCK_MONOTONIC
	emitAt  = int64(t0 + 10_000_000)
	pidNCCL = 42
	hashA   = uint64(0xabcdef)
)

func pluginComm5(rank int32) cupti.NCCLComm {
	return cupti.NCCLComm{Version: 5, Hash: hashA, Rank: rank, NRanks: 8, NNodes: 1, InitNs: t0}
}

func pluginColl(tid uint32, start uint64) cupti.NCCLColl {
	return cupti.NCCLColl{
		Func: cupti.NCCLFuncAllReduce, Datatype: 10 /* bfloat16 */, CommHash: hashA, Rank: 3, NRanks: 8,
		Seq: 7, Count: 1024, Version: 5, HasAPI: true, APIStartNs: start, APIEndNs: start + 5,
		LaunchStartNs: start + 20, LaunchEndNs: start + 30, TID: tid,
	}
}

func hostCalls(in []pipeline.Input) []correlate.HostCall {
	var hs []correlate.HostCall
	for _, i := range in {
		if h, ok := i.HostCall(); ok {
			hs = append(hs, h)
		}
	}
	return hs
}

func uprobeColl(c *testConverter, tid uint32, start, end uint64) []pipeline.Input {
	return c.Convert(&bpf.CollEvent{Header: bpf.Header{
		Type: bpf.EventColl, Probe: bpf.ProbeNCCLAllReduce, PID: pidNCCL, TID: tid, StartNs: start, EndNs: end,
	}, Count: 1024, Datatype: 9}, nil)
}

func pluginBatch(c *testConverter, b cupti.Batch) []pipeline.Input {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ncclRecords(pidNCCL, c.proc(pidNCCL), &b, emitAt, nil)
}

func TestPluginCollectiveIsTheUprobesHostCall(t *testing.T) {
	for _, tc := range []struct {
		name       string
		coll       func() cupti.NCCLColl
		op         correlate.Op
		start, end int64
		dtype      uint32
	}{
		{"v5 takes the API call's interval", func() cupti.NCCLColl { return pluginColl(1, t0+100) },
			"allreduce", int64(t0 + 100), int64(t0 + 105), 9},
		{"v4 without API events takes the launch", func() cupti.NCCLColl {
			r := pluginColl(1, t0+100)
			r.HasAPI, r.APIStartNs, r.APIEndNs, r.Version = false, 0, 0, 4
			return r
		}, "allreduce", int64(t0 + 120), int64(t0 + 130), 9},
		{"op names are collOp's", func() cupti.NCCLColl {
			r := pluginColl(1, t0+100)
			r.Func = cupti.NCCLFuncReduceScatter
			return r
		}, "reducescatter", int64(t0 + 100), int64(t0 + 105), 9},
		{"an unknown datatype matches no real one", func() cupti.NCCLColl {
			r := pluginColl(1, t0+100)
			r.Datatype = 0
			return r
		}, "allreduce", int64(t0 + 100), int64(t0 + 105), ^uint32(0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newConverter(newCounters(), true)
			out := pluginBatch(c, cupti.Batch{NCCLComms: []cupti.NCCLComm{pluginComm5(3)}, NCCLColls: []cupti.NCCLColl{tc.coll()}})
			hs := hostCalls(out)
			if len(hs) != 1 {
				t.Fatalf("%d host calls, want 1", len(hs))
			}
			h := hs[0]
			want := correlate.HostCall{PID: pidNCCL, TID: 1, Kind: correlate.HostCollective, Op: tc.op, Count: 1024,
				Datatype: tc.dtype, Comm: pluginComm{hash: hashA, rank: 3}.handle(), StartNS: tc.start, EndNS: tc.end,
				NCCLSeq: 7, HasNCCLSeq: true}
			if h != want {
				t.Errorf("host call\n got %+v\nwant %+v", h, want)
			}
		})
	}
}

func TestPluginCommIsOneCommInitAndADestroy(t *testing.T) {
	c := newConverter(newCounters(), true)
	resent := pluginComm5(3)
	resent.Resent = true
	fin := pluginComm5(3)
	fin.Finalized, fin.FinalizeNs = true, t0+500
	// A comm is fed at its first collective record (which says its
	// handle); one that makes none is never fed, nor its finalize.
	out := pluginBatch(c, cupti.Batch{NCCLComms: []cupti.NCCLComm{pluginComm5(3), resent, pluginComm5(4), pluginComm5(5)}})
	if len(out) != 0 {
		t.Fatalf("%d inputs before the first collective record, want none (held)", len(out))
	}
	rank4 := pluginColl(2, t0+200)
	rank4.Rank = 4
	fin5 := pluginComm5(5)
	fin5.Finalized = true
	out = pluginBatch(c, cupti.Batch{NCCLColls: []cupti.NCCLColl{pluginColl(1, t0+100), rank4}, NCCLComms: []cupti.NCCLComm{fin5}})
	out = append(out, pluginBatch(c, cupti.Batch{NCCLComms: []cupti.NCCLComm{fin, fin}})...)
	var inits []correlate.CommInit
	var destroys []correlate.CommDestroy
	for _, in := range out {
		switch v := in.Other().(type) {
		case correlate.CommInit:
			inits = append(inits, v)
		case correlate.CommDestroy:
			destroys = append(destroys, v)
		}
	}
	if len(inits) != 2 || len(destroys) != 1 {
		t.Fatalf("%d inits, %d destroys; want 2 (ranks 3 and 4 of one hash, re-send ignored, rank 5 without a call) and 1", len(inits), len(destroys))
	}
	want := correlate.CommInit{PID: pidNCCL, Comm: pluginComm{hashA, 3}.handle(), NRanks: 8, Rank: 3, UniqueIDHash: hashA, AtNS: int64(t0)}
	if inits[0] != want {
		t.Errorf("comm init\n got %+v\nwant %+v", inits[0], want)
	}
	if inits[0].Comm == inits[1].Comm {
		t.Errorf("two local ranks of one communicator share a handle")
	}
	if destroys[0].Comm != want.Comm || destroys[0].AtNS != int64(t0+500) {
		t.Errorf("destroy %+v", destroys[0])
	}
}

// The switch from uprobes to the plugin: every call is counted once, by
// the uprobes up to the cut of its thread, by the plugin after it.
func TestCaptureSwitchCountsEachCallOnce(t *testing.T) {
	c := newConverter(newCounters(), true)
	var calls int
	count := func(in []pipeline.Input) { calls += len(hostCalls(in)) }
	// Calls 1 and 2 on thread 1, call 3 on thread 2: only the uprobes see them.
	count(uprobeColl(c, 1, t0+100, t0+110))
	count(uprobeColl(c, 1, t0+200, t0+210))
	count(uprobeColl(c, 2, t0+150, t0+160))
	if p := c.NCCLPaths()[pidNCCL]; p != "uprobes" {
		t.Fatalf("path before any plugin record %q, want uprobes", p)
	}
	// The first plugin batch repeats calls 2 and 3 (the mask flipped before
	// them) and has call 4 (thread 1) and 5 (thread 3, no uprobe call yet).
	count(pluginBatch(c, cupti.Batch{
		NCCLComms: []cupti.NCCLComm{pluginComm5(3)},
		NCCLColls: []cupti.NCCLColl{pluginColl(1, t0+202), pluginColl(2, t0+152), pluginColl(1, t0+302), pluginColl(3, t0+305)},
	}))
	if p := c.NCCLPaths()[pidNCCL]; p != "plugin v5" {
		t.Fatalf("path after the comm record %q, want plugin v5", p)
	}
	// The uprobes' calls 4 and 5 arrive after the switch: superseded. A
	// call of thread 2 before its cut, delivered late, is still theirs.
	count(uprobeColl(c, 1, t0+300, t0+310))
	count(uprobeColl(c, 3, t0+303, t0+309))
	count(uprobeColl(c, 2, t0+120, t0+130))
	if calls != 6 {
		t.Errorf("%d host calls for 6 calls", calls)
	}
	for key, want := range map[string]int64{
		"nccl_uprobe_events_superseded": 2, "nccl_plugin_records_superseded": 2, "nccl_plugin_colls": 2,
		"nccl_plugin_processes": 1,
	} {
		if got := c.counters.get(key); got != want {
			t.Errorf("%s = %d, want %d", key, got, want)
		}
	}
	if got := PluginOps(c.counters.get); got != 4 {
		t.Errorf("plugin operations charged %d, want the 4 records, fed or superseded", got)
	}
}

// NCCL 2.27 (no API events) starts a grouped collective at its launch in
// ncclGroupEnd, after the call returned: the group's end is in the cut.
func TestCaptureSwitchCutCoversTheGroupEnd(t *testing.T) {
	c := newConverter(newCounters(), true)
	uprobeColl(c, 1, t0+100, t0+110)
	c.Convert(&bpf.GroupEvent{Header: bpf.Header{Type: bpf.EventGroup, PID: pidNCCL, TID: 1, StartNs: t0 + 120, EndNs: t0 + 150}, HasReturn: true}, nil)
	r := pluginColl(1, 0)
	r.HasAPI, r.Version, r.LaunchStartNs, r.LaunchEndNs = false, 4, t0+130, t0+140
	comm := pluginComm5(3)
	comm.Version = 4
	if hs := hostCalls(pluginBatch(c, cupti.Batch{NCCLComms: []cupti.NCCLComm{comm}, NCCLColls: []cupti.NCCLColl{r}})); len(hs) != 0 {
		t.Errorf("the grouped call the uprobes reported came again from the plugin: %+v", hs)
	}
}

func TestPluginRecordsNotUsedAreCounted(t *testing.T) {
	for _, tc := range []struct {
		name, key string
		batch     cupti.Batch
	}{
		{"a collective before any comm record (the uprobes report the process)", "nccl_plugin_records_before_comm",
			cupti.Batch{NCCLColls: []cupti.NCCLColl{pluginColl(1, t0+100)}}},
		{"a collective from the far future", "nccl_plugin_records_implausible",
			cupti.Batch{NCCLComms: []cupti.NCCLComm{pluginComm5(3)}, NCCLColls: []cupti.NCCLColl{pluginColl(1, uint64(emitAt)+1e12)}}},
		{"a kernel record before the process is on the plugin (its call is the uprobes')", "nccl_kernel_records_off_plugin",
			cupti.Batch{NCCLComms: []cupti.NCCLComm{pluginComm5(3)}, NCCLKernels: []cupti.NCCLKernel{{CommHash: hashA, Rank: 3, Seq: 7}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newConverter(newCounters(), true)
			if hs := hostCalls(pluginBatch(c, tc.batch)); len(hs) != 0 {
				t.Errorf("%d host calls, want none", len(hs))
			}
			if got := c.counters.get(tc.key); got != 1 {
				t.Errorf("%s = %d, want 1", tc.key, got)
			}
			if got, want := PluginOps(c.counters.get), int64(len(tc.batch.NCCLColls)); got != want {
				t.Errorf("plugin operations charged %d, want %d (one per collective record)", got, want)
			}
		})
	}
}

// The plugin's kernel record of a collective becomes the CollKernel that
// names the call as its HostCall does (handle, op, NCCL seq); one that
// cannot be joined is counted by why.
func TestPluginKernelRecordsNameTheirCall(t *testing.T) {
	kernel := cupti.NCCLKernel{Func: cupti.NCCLFuncAllReduce, CommHash: hashA, Rank: 3, Seq: 7,
		GPUStartNs: t0 + 500, GPUEndNs: t0 + 900}
	for _, tc := range []struct {
		name string
		k    func(cupti.NCCLKernel) cupti.NCCLKernel
		key  string // "" : fed
	}{
		{"a collective's kernel is fed", func(k cupti.NCCLKernel) cupti.NCCLKernel { return k }, ""},
		{"a p2p kernel has no sequence number", func(k cupti.NCCLKernel) cupti.NCCLKernel {
			k.P2P, k.Func = true, cupti.NCCLFuncSend
			return k
		}, "nccl_kernel_records_p2p"},
		{"a suspect clock is not compared", func(k cupti.NCCLKernel) cupti.NCCLKernel { k.ClockSuspect = true; return k },
			"nccl_kernel_records_clock_suspect"},
		{"a communicator with no collective yet has no handle", func(k cupti.NCCLKernel) cupti.NCCLKernel { k.Rank = 4; return k },
			"nccl_kernel_records_off_plugin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newConverter(newCounters(), true)
			pluginBatch(c, cupti.Batch{NCCLComms: []cupti.NCCLComm{pluginComm5(3), pluginComm5(4)}, NCCLColls: []cupti.NCCLColl{pluginColl(1, t0+100)}})
			out := pluginBatch(c, cupti.Batch{NCCLKernels: []cupti.NCCLKernel{tc.k(kernel)}})
			var ks []correlate.CollKernel
			for _, in := range out {
				if k, ok := in.Other().(correlate.CollKernel); ok {
					ks = append(ks, k)
				}
			}
			if tc.key != "" {
				if len(ks) != 0 || c.counters.get(tc.key) != 1 {
					t.Errorf("fed %+v, %s = %d; want none fed and 1", ks, tc.key, c.counters.get(tc.key))
				}
				return
			}
			want := correlate.CollKernel{PID: pidNCCL, Comm: pluginComm{hash: hashA, rank: 3}.handle(), Op: correlate.OpAllReduce,
				NCCLSeq: 7, StartNS: int64(t0 + 500), EndNS: int64(t0 + 900)}
			if len(ks) != 1 || ks[0] != want || c.counters.get("nccl_kernel_records") != 1 {
				t.Errorf("fed %+v, want [%+v]", ks, want)
			}
		})
	}
}

// Off by default (Config.NCCLPlugin): the plugin's records are counted and
// ignored, the process stays on its uprobes, whose calls are all kept.
func TestPluginRecordsIgnoredUnlessEnabled(t *testing.T) {
	cnt := newCounters()
	c := newConverter(cnt, false)
	coll := pluginComm5(3)
	out := pluginBatch(c, cupti.Batch{NCCLComms: []cupti.NCCLComm{coll}})
	if len(out) != 0 {
		t.Fatalf("%d inputs from plugin records with the plugin path off", len(out))
	}
	if n := cnt.snapshot()["nccl_plugin_records_ignored"]; n != 1 {
		t.Errorf("nccl_plugin_records_ignored = %d, want 1", n)
	}
	if p := c.NCCLPaths()[pidNCCL]; p != "uprobes" {
		t.Errorf("capture path %q, want uprobes", p)
	}
	if len(hostCalls(uprobeColl(c, 1, t0+1000, t0+1010))) != 1 {
		t.Error("a uprobe collective after the plugin's comm record was dropped with the plugin path off")
	}
}

// The library turns NCCL's mask on only once the agent asked for the
// plugin, after the communicators' records: the calls between a comm
// record and the first collective record are the uprobes' alone, and kept.
func TestCallsBeforeTheFirstCollectiveRecordStayTheUprobes(t *testing.T) {
	c := newConverter(newCounters(), true)
	pluginBatch(c, cupti.Batch{NCCLComms: []cupti.NCCLComm{pluginComm5(3)}})
	calls := len(hostCalls(uprobeColl(c, 1, t0+100, t0+110))) + len(hostCalls(uprobeColl(c, 1, t0+200, t0+210)))
	if p := c.NCCLPaths()[pidNCCL]; p != "uprobes" {
		t.Fatalf("path after a comm record alone %q, want uprobes", p)
	}
	calls += len(hostCalls(pluginBatch(c, cupti.Batch{NCCLColls: []cupti.NCCLColl{pluginColl(1, t0+302)}})))
	calls += len(hostCalls(uprobeColl(c, 1, t0+300, t0+310))) // the same call: superseded
	if calls != 3 {
		t.Errorf("%d host calls for 3 calls", calls)
	}
	if p := c.NCCLPaths()[pidNCCL]; p != "plugin v5" {
		t.Errorf("path after the first collective record %q, want plugin v5", p)
	}
}

// ncclBcast calls ncclBroadcast: one broadcast fires both uprobes, the
// inner one reported first. It is one collective, as the plugin sees it.
func TestNestedBcastIsOneBroadcast(t *testing.T) {
	ev := func(probe bpf.ProbeID, tid uint32, start, end uint64) *bpf.CollEvent {
		return &bpf.CollEvent{Header: bpf.Header{Type: bpf.EventColl, Probe: probe, PID: pidNCCL, TID: tid, StartNs: start, EndNs: end},
			Count: 64, Datatype: 7}
	}
	for _, tc := range []struct {
		name   string
		events []*bpf.CollEvent
		want   int
	}{
		{"an ncclBcast around its ncclBroadcast", []*bpf.CollEvent{
			ev(bpf.ProbeNCCLBroadcast, 1, t0+20, t0+80), ev(bpf.ProbeNCCLBcast, 1, t0+10, t0+90)}, 1},
		{"an ncclBcast after a broadcast that ended before it", []*bpf.CollEvent{
			ev(bpf.ProbeNCCLBroadcast, 1, t0+20, t0+80), ev(bpf.ProbeNCCLBcast, 1, t0+100, t0+190)}, 2},
		{"an ncclBcast on another thread than the broadcast", []*bpf.CollEvent{
			ev(bpf.ProbeNCCLBroadcast, 2, t0+20, t0+80), ev(bpf.ProbeNCCLBcast, 1, t0+10, t0+90)}, 2},
		{"an ncclBcast of a library without the nesting", []*bpf.CollEvent{ev(bpf.ProbeNCCLBcast, 1, t0+10, t0+90)}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newConverter(newCounters(), false)
			var out []pipeline.Input
			for _, e := range tc.events {
				out = c.Convert(e, out)
			}
			if hs := hostCalls(out); len(hs) != tc.want {
				t.Errorf("%d host calls, want %d: %+v", len(hs), tc.want, hs)
			}
			if got, want := c.counters.get("nccl_uprobe_nested_calls"), int64(len(tc.events)-tc.want); got != want {
				t.Errorf("nccl_uprobe_nested_calls = %d, want %d", got, want)
			}
		})
	}
}
