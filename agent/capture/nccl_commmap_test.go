package capture

import (
	"testing"

	"github.com/slowrank/slowrank/agent/pipeline"
	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/correlate"
	"github.com/slowrank/slowrank/cupti"
)

const uprobeComm = uint64(0x7f00_1234_5000) // the trainer's ncclComm_t

func uprobeCollOn(c *testConverter, tid uint32, comm, start, end uint64) []pipeline.Input {
	return c.Convert(&bpf.CollEvent{Header: bpf.Header{
		Type: bpf.EventColl, Probe: bpf.ProbeNCCLAllReduce, PID: pidNCCL, TID: tid, StartNs: start, EndNs: end,
	}, Count: 1024, Datatype: 9, Comm: comm}, nil)
}

func commInits(in []pipeline.Input) []correlate.CommInit {
	var cs []correlate.CommInit
	for _, i := range in {
		if ci, ok := i.Other().(correlate.CommInit); ok {
			cs = append(cs, ci)
		}
	}
	return cs
}

// The plugin's calls carry the handle the uprobes gave the same
// communicator, so that its step detection goes on across the switch.
func TestPluginCommTakesTheUprobesHandle(t *testing.T) {
	for _, tc := range []struct {
		name string
		// fedBefore: the uprobes fed a call of the comm before the switch.
		fedBefore bool
		// twinTID: the thread of the uprobes' twin of the plugin's call.
		twinTID    uint32
		v4         bool // the record's start is its launch in ncclGroupEnd, after the call
		wantHandle uint64
		wantInit   bool // a CommInit fed under the handle
		counter    string
	}{
		{name: "a comm the correlator knows from the uprobes", fedBefore: true, twinTID: 3,
			wantHandle: uprobeComm, counter: "nccl_plugin_comms_mapped"},
		{name: "a comm created after the switch gets the plugin's init under the uprobes' handle", twinTID: 3,
			wantHandle: uprobeComm, wantInit: true, counter: "nccl_plugin_comms_mapped"},
		{name: "NCCL 2.27 launches after the call returned", fedBefore: true, twinTID: 3, v4: true,
			wantHandle: uprobeComm, counter: "nccl_plugin_comms_mapped"},
		{name: "no twin on the record's thread keeps the plugin's handle", fedBefore: true, twinTID: 4,
			wantHandle: pluginComm{hashA, 3}.handle(), wantInit: true, counter: "nccl_plugin_comms_unmapped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newConverter(newCounters(), true)
			// A call of another size on another comm makes thread 3's cut
			// (the switch's record below is the uprobes'), never a twin.
			c.Convert(&bpf.CollEvent{Header: bpf.Header{
				Type: bpf.EventColl, Probe: bpf.ProbeNCCLAllReduce, PID: pidNCCL, TID: 3, StartNs: t0 + 40, EndNs: t0 + 60,
			}, Count: 64, Datatype: 9, Comm: 0xdead0000}, nil)
			if tc.fedBefore {
				if len(hostCalls(uprobeCollOn(c, tc.twinTID, uprobeComm, t0+100, t0+110))) != 1 {
					t.Fatal("the uprobes' call before the switch was not fed")
				}
			}
			// Switch on a record the uprobes reported (superseded), then
			// the uprobes see call 2 in real time, the plugin a batch later.
			pluginBatch(c, cupti.Batch{NCCLComms: []cupti.NCCLComm{pluginComm5(3)}, NCCLColls: []cupti.NCCLColl{pluginColl(3, t0+50)}})
			if hs := hostCalls(uprobeCollOn(c, tc.twinTID, uprobeComm, t0+1000, t0+1100)); len(hs) != 0 {
				t.Fatalf("the uprobes' call after the switch was fed: %+v", hs)
			}
			r := pluginColl(3, t0+1002)
			if tc.v4 {
				r.HasAPI, r.Version, r.LaunchStartNs, r.LaunchEndNs = false, 4, t0+1200, t0+1210
			}
			out := pluginBatch(c, cupti.Batch{NCCLColls: []cupti.NCCLColl{r}})
			hs := hostCalls(out)
			if len(hs) != 1 || hs[0].Comm != tc.wantHandle {
				t.Fatalf("plugin calls %+v, want one under handle %#x", hs, tc.wantHandle)
			}
			inits := commInits(out)
			if got := len(inits) == 1 && inits[0].Comm == tc.wantHandle && inits[0].NRanks == 8; got != tc.wantInit || len(inits) > 1 {
				t.Errorf("comm inits %+v, want one under %#x: %v", inits, tc.wantHandle, tc.wantInit)
			}
			if n := c.counters.get(tc.counter); n != 1 {
				t.Errorf("%s = %d, want 1", tc.counter, n)
			}
			// Later calls of the comm keep the handle, with no second init.
			out = pluginBatch(c, cupti.Batch{NCCLColls: []cupti.NCCLColl{pluginColl(9, t0+5000)}})
			if hs := hostCalls(out); len(hs) != 1 || hs[0].Comm != tc.wantHandle || len(commInits(out)) != 0 {
				t.Errorf("a later call: %+v, inits %+v", hs, commInits(out))
			}
		})
	}
}

// A thread's latest calls are kept, bounded; the newest call containing
// the plugin's start is its twin.
func TestTwinRingFindsTheCallAroundTheStart(t *testing.T) {
	var r twinRing
	for i := range twinRingSize + 10 { // the first 10 are overwritten
		r.add(twinCall{start: int64(i * 100), end: int64(i*100 + 50), comm: uint64(i + 1), count: 1024, datatype: 9, probe: bpf.ProbeNCCLAllReduce})
	}
	for _, tc := range []struct {
		name  string
		start int64
		op    correlate.Op
		count uint64
		want  uint64
		ok    bool
	}{
		{"inside call 200", 200*100 + 10, "allreduce", 1024, 201, true},
		{"after call 200's end, before 201: the launch of call 200", 200*100 + 70, "allreduce", 1024, 201, true},
		{"another count is no twin", 200*100 + 10, "allreduce", 512, 0, false},
		{"another op is no twin", 200*100 + 10, "allgather", 1024, 0, false},
		{"an overwritten call is not found", 5*100 + 10, "allreduce", 1024, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := r.find(tc.op, tc.count, 9, tc.start, 0)
			if ok != tc.ok || got != tc.want {
				t.Errorf("find = %d, %v; want %d, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
