package correlate

import (
	"encoding/json"
	"testing"
)

// The classes of the ops the agent gives, as the string classifier before
// Op had a type gave them (it lower-cased, dropped an "nccl" prefix and
// separators, and matched prefixes).
func TestOpFlags(t *testing.T) {
	for op, want := range map[Op]opFlags{
		OpAllReduce: opAllReduce, OpReduceScatter: opReduceScatter, OpAllGather: opAllGather,
		OpBroadcast: opBroadcast, OpReduce: opReduce, OpAllToAll: opAllToAll,
		OpSend: opSendRecv, OpRecv: opSendRecv, OpSendRecv: opSendRecv,
		OpGather: opOther, OpScatter: opOther, OpBarrier: opOther,
		"cudaStreamSynchronize": opOther, "nccl_unknown": opOther, "": opOther,
	} {
		if got := op.flags(); got != want {
			t.Errorf("%q: flags %b, want %b", op, got, want)
		}
	}
}

// A HostCall's JSON (the agent's captures, the committed replays) carries
// the op as a plain string, as it did when Op was a string.
func TestHostCallJSONOp(t *testing.T) {
	b, err := json.Marshal(HostCall{Kind: HostCollective, Op: OpAllReduce})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"PID":0,"TID":0,"Kind":1,"Op":"allreduce","Count":0,"Datatype":0,"Comm":0,"Stream":0,"StartNS":0,"EndNS":0}`
	if string(b) != want {
		t.Errorf("got  %s\nwant %s", b, want)
	}
	var h HostCall
	if err := json.Unmarshal([]byte(`{"Kind":2,"Op":"cudaStreamSynchronize"}`), &h); err != nil {
		t.Fatal(err)
	}
	if h.Op != "cudaStreamSynchronize" || h.Kind != HostSyncWait {
		t.Errorf("decoded %+v", h)
	}
}
