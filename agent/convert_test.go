package agent

import (
	"slices"
	"testing"

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
