package capture

import (
	"testing"

	"github.com/slowrank/slowrank/agent/pipeline"
	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/correlate"
)

func torchEvent(probe bpf.ProbeID, pid, tid uint32, start, end uint64, self uint64) *bpf.TorchEvent {
	return &bpf.TorchEvent{Header: bpf.Header{Type: bpf.EventTorch, Probe: probe, PID: pid, TID: tid,
		StartNs: start, EndNs: end}, Self: self}
}

// c10::ivalue::Future::wait is a collective wait (coll_wait) only in a
// process that has issued a torch collective; before that, and in other
// processes, it is counted and dropped. Any thread of such a process counts
// (DDP waits on the thread that finishes the backward pass).
func TestConvertFutureWait(t *testing.T) {
	cnt := newCounters()
	conv := newConverter(cnt, false)
	const pid, other = 10, 20
	hosts := func(out []pipeline.Input) []correlate.HostCall {
		var hs []correlate.HostCall
		for _, in := range out {
			h, ok := in.HostCall()
			if !ok {
				t.Fatalf("non-host input %+v", in)
			}
			hs = append(hs, h)
		}
		return hs
	}

	// A wait before any collective of the process: not a collective wait.
	if out := conv.Convert(torchEvent(bpf.ProbeTorchFutureWait, pid, pid, 1, 5, 0xf00), nil); len(out) != 0 {
		t.Fatalf("wait before any collective: %+v", hosts(out))
	}
	// The all-reduce of a bucket (main thread), then the wait on its future
	// from another thread of the same process.
	out := conv.Convert(torchEvent(bpf.ProbeTorchGlooAllreduce, pid, pid, 10, 11, 0xa0), nil)
	out = conv.Convert(torchEvent(bpf.ProbeTorchFutureWait, pid, pid+1, 12, 30, 0xf00), out)
	// Another process's wait stays unrelated to pid's collectives.
	out = conv.Convert(torchEvent(bpf.ProbeTorchFutureWait, other, other, 12, 30, 0xf01), out)
	got := hosts(out)
	want := []correlate.HostCall{
		{PID: pid, TID: pid, Kind: correlate.HostCollective, Op: "allreduce", Comm: 0xa0, StartNS: 10, EndNS: 11},
		{PID: pid, TID: pid + 1, Kind: correlate.HostCollWait, StartNS: 12, EndNS: 30},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("#%d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if n := cnt.get("torch_future_waits_ignored"); n != 2 {
		t.Errorf("torch_future_waits_ignored = %d, want 2", n)
	}

	// An NCCL process: its torch collectives are redundant for the steps but
	// still make its futures' waits collective waits.
	const nccl = 30
	conv.Convert(&bpf.CollEvent{Header: bpf.Header{Type: bpf.EventColl, Probe: bpf.ProbeNCCLAllReduce, PID: nccl, TID: nccl,
		StartNs: 1, EndNs: 2}, Count: 8}, nil)
	out = conv.Convert(torchEvent(bpf.ProbeTorchNCCLAllreduce, nccl, nccl, 3, 4, 0xb0), nil)
	out = conv.Convert(torchEvent(bpf.ProbeTorchFutureWait, nccl, nccl, 5, 6, 0xf02), out)
	if got := hosts(out); len(got) != 1 || got[0].Kind != correlate.HostCollWait || got[0].Op != "" {
		t.Errorf("NCCL process: %+v, want one coll wait", got)
	}

	// A forgotten (exited) process starts over: a reused pid's first wait
	// is not a collective wait.
	conv.Forget(pid)
	if out := conv.Convert(torchEvent(bpf.ProbeTorchFutureWait, pid, pid, 40, 50, 0xf00), nil); len(out) != 0 {
		t.Errorf("wait of a forgotten pid: %+v", hosts(out))
	}
}
