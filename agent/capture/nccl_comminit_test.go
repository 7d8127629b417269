package capture

import (
	"testing"

	"github.com/slowrank/slowrank/agent/pipeline"
	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/cupti"
)

const (
	hashB     = uint64(0xb0b)
	splitComm = uint64(0x7f00_1234_9000) // the ncclComm_t of a communicator created after the detach
)

// uprobeInit is the uprobes' report of a creating call start..end of a
// communicator rank of nranks (-1: not known, as for ncclCommSplit).
func uprobeInitOf(c *testConverter, start, end uint64, rank, nranks int32) []pipeline.Input {
	return c.Convert(&bpf.CommInitEvent{Header: bpf.Header{
		Type: bpf.EventCommInit, Probe: bpf.ProbeNCCLCommSplit, PID: pidNCCL, TID: 3, StartNs: start, EndNs: end,
	}, Comm: splitComm, CommValid: true, Rank: rank, NRanks: nranks, IsSplit: rank < 0, Parent: uprobeComm}, nil)
}

// onPluginPath puts the process on the plugin path on communicator A, its
// collective uprobes then detached (no uprobe collective comes any more).
func onPluginPath(t *testing.T, c *testConverter) {
	t.Helper()
	uprobeCollOn(c, 3, uprobeComm, t0+100, t0+110)
	// The switch's record is the uprobes' call (superseded); the next one
	// names communicator A by its twin.
	pluginBatch(c, cupti.Batch{NCCLComms: []cupti.NCCLComm{pluginComm5(3)}, NCCLColls: []cupti.NCCLColl{pluginColl(3, t0+102)}})
	uprobeCollOn(c, 3, uprobeComm, t0+200, t0+210) // superseded: the plugin's
	pluginBatch(c, cupti.Batch{NCCLColls: []cupti.NCCLColl{pluginColl(3, t0+202)}})
	if p := c.NCCLPaths()[pidNCCL]; p != "plugin v5" {
		t.Fatalf("path %q, want plugin v5", p)
	}
}

// A communicator created after the detach takes the ncclComm_t of the
// uprobes' creation of it, matched by its init time, rank and nranks.
func TestPluginCommTakesTheHandleOfItsCreation(t *testing.T) {
	const initAt = t0 + 2_000_500 // inside the creating call below
	for _, tc := range []struct {
		name         string
		recordFirst  bool  // the plugin's record comes before the uprobes' return
		rank, nranks int32 // as the uprobes read them
		initNs       uint64
		wantHandle   uint64
		counter      string
	}{
		{name: "the uprobes' creation first", rank: 3, nranks: 8, initNs: initAt,
			wantHandle: splitComm, counter: "nccl_plugin_comms_mapped_by_init"},
		{name: "the plugin's record first", recordFirst: true, rank: 3, nranks: 8, initNs: initAt,
			wantHandle: splitComm, counter: "nccl_plugin_comms_mapped_by_init"},
		{name: "ncclCommSplit: rank and nranks unknown to the uprobes", rank: -1, nranks: -1, initNs: initAt,
			wantHandle: splitComm, counter: "nccl_plugin_comms_mapped_by_init"},
		{name: "another rank is another communicator", rank: 2, nranks: 8, initNs: initAt,
			wantHandle: pluginComm{hashB, 3}.handle(), counter: "nccl_plugin_comms_unmapped"},
		{name: "another size is another communicator", rank: 3, nranks: 4, initNs: initAt,
			wantHandle: pluginComm{hashB, 3}.handle(), counter: "nccl_plugin_comms_unmapped"},
		{name: "an init outside the call is another communicator's", recordFirst: true, rank: 3, nranks: 8, initNs: t0 + 3_000_000,
			wantHandle: pluginComm{hashB, 3}.handle(), counter: "nccl_plugin_comms_unmapped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newConverter(newCounters(), true)
			onPluginPath(t, c)
			rec := cupti.NCCLComm{Version: 5, Hash: hashB, Rank: 3, NRanks: 8, InitNs: tc.initNs}
			var out []pipeline.Input
			if tc.recordFirst {
				out = append(out, pluginBatch(c, cupti.Batch{NCCLComms: []cupti.NCCLComm{rec}})...)
			}
			fedInit := commInits(uprobeInitOf(c, t0+2_000_000, t0+2_001_000, tc.rank, tc.nranks))
			if len(fedInit) != 1 || fedInit[0].Comm != splitComm {
				t.Fatalf("the uprobes' creation fed %+v, want its CommInit", fedInit)
			}
			if !tc.recordFirst {
				out = append(out, pluginBatch(c, cupti.Batch{NCCLComms: []cupti.NCCLComm{rec}})...)
			}
			r := pluginColl(3, t0+3_000_100)
			r.CommHash = hashB
			out = append(out, pluginBatch(c, cupti.Batch{NCCLColls: []cupti.NCCLColl{r}})...)
			hs := hostCalls(out)
			if len(hs) != 1 || hs[0].Comm != tc.wantHandle {
				t.Fatalf("plugin calls %+v, want one under %#x", hs, tc.wantHandle)
			}
			// The uprobes' CommInit names a matched communicator; an
			// unmatched one gets the plugin's under its own handle.
			inits := commInits(out)
			if matched := tc.wantHandle == splitComm; matched && len(inits) != 0 || !matched && (len(inits) != 1 || inits[0].Comm != tc.wantHandle) {
				t.Errorf("plugin CommInits %+v", inits)
			}
			if n := c.counters.get(tc.counter); n != 1 {
				t.Errorf("%s = %d, want 1", tc.counter, n)
			}
		})
	}
}

// A process needs the collective uprobes while one of its communicators
// can only be named by a twin: its creation was not seen (grouped or
// non-blocking) and it has made no collective yet.
func TestPluginReadyWaitsForUnnamedCommunicators(t *testing.T) {
	c := newConverter(newCounters(), true)
	if c.PluginReady(emitAt)[pidNCCL] {
		t.Fatal("ready before the plugin path")
	}
	onPluginPath(t, c)
	if !c.PluginReady(emitAt + commNameWait)[pidNCCL] {
		t.Fatal("not ready with every communicator named")
	}
	// A record whose creation the uprobes did not report (emitted at emitAt).
	pluginBatch(c, cupti.Batch{NCCLComms: []cupti.NCCLComm{{Version: 5, Hash: hashB, Rank: 3, NRanks: 8, InitNs: t0 + 5_000_000}}})
	for _, tc := range []struct {
		at    int64
		ready bool
	}{
		{emitAt + commNameWait - 1, true},   // its creation may still be reported
		{emitAt + commNameWait, false},      // only its twin can name it: attach again
		{emitAt + commNameGrace - 1, false}, // still
		{emitAt + commNameGrace, true},      // a communicator without collectives is not waited for
	} {
		if got := c.PluginReady(tc.at)[pidNCCL]; got != tc.ready {
			t.Errorf("at +%d ns: ready %v, want %v", tc.at-emitAt, got, tc.ready)
		}
	}
	r := pluginColl(3, t0+6_000_000)
	r.CommHash = hashB
	pluginBatch(c, cupti.Batch{NCCLColls: []cupti.NCCLColl{r}}) // its first collective names it
	if !c.PluginReady(emitAt + commNameWait)[pidNCCL] {
		t.Error("not ready once the communicator is named")
	}
}
