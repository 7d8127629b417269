package capture

import (
	"slices"
	"testing"

	"github.com/slowrank/slowrank/agent/pipeline"
	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/correlate"
)

// The probe table names ops in correlate's vocabulary (bpf imports no
// other package): a collective's op must be one of correlate's constants,
// or the topology would take its traffic for other traffic.
func TestSpecOpsAreCorrelateOps(t *testing.T) {
	collectives := []correlate.Op{
		correlate.OpAllReduce, correlate.OpBroadcast, correlate.OpReduce, correlate.OpAllGather,
		correlate.OpReduceScatter, correlate.OpAllToAll, correlate.OpGather, correlate.OpScatter,
		correlate.OpSend, correlate.OpRecv, correlate.OpBarrier, correlate.OpSendRecv,
	}
	for _, s := range bpf.Specs() {
		op := probeOp(s.ID)
		switch s.Class {
		case bpf.ClassCollective, bpf.ClassTorchCollective:
			if !slices.Contains(collectives, op) {
				t.Errorf("%s: op %q is no correlate.Op constant", s.Name(), op)
			}
		case bpf.ClassSyncWait:
			if op != correlate.Op(s.Symbol) {
				t.Errorf("%s: op %q", s.Name(), op)
			}
		}
	}
}

// TestHostEventsDoNotAllocate: the reader goroutine's per-record path
// (convert into a recycled batch, hand it over) allocates nothing for host calls, the
// records that come by the hundred thousand per second.
func TestHostEventsDoNotAllocate(t *testing.T) {
	conv := newConverter(newCounters(), false)
	q := pipeline.NewQueue(1 << 16)
	coll := &bpf.CollEvent{Header: bpf.Header{Type: bpf.EventColl, Probe: bpf.ProbeNCCLAllReduce, PID: 7, StartNs: 1, EndNs: 2}, Count: 1024}
	sync := &bpf.SyncEvent{Header: bpf.Header{Type: bpf.EventSync, Probe: bpf.ProbeCUDAStreamSynchronize, PID: 7, StartNs: 3, EndNs: 4}}
	conv.Convert(coll, nil) // the process's state exists from here on
	batch := q.Get()
	allocs := testing.AllocsPerRun(100, func() {
		for range pipeline.Batch / 2 {
			batch = conv.Convert(coll, batch)
			batch = conv.Convert(sync, batch)
		}
		batch, _ = q.Offer(batch)
		q.Done(<-q.C())
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per %d host events", allocs, pipeline.Batch)
	}
}
