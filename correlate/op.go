package correlate

// Op is what a host call did. A collective's (HostCollective, or a
// HostCollWait that is also one) is one of the constants below, by which
// the communicator's traffic is classified (topology.go). A
// synchronisation's (HostSyncWait, HostMarker) is its function's name,
// Op("cudaStreamSynchronize"). Step detection takes every op as a token,
// compared for equality and order only. Its JSON is the string.
type Op string

// Collective ops.
const (
	OpAllReduce     Op = "allreduce"
	OpBroadcast     Op = "broadcast"
	OpReduce        Op = "reduce"
	OpAllGather     Op = "allgather"
	OpReduceScatter Op = "reducescatter"
	OpAllToAll      Op = "alltoall"
	OpGather        Op = "gather"
	OpScatter       Op = "scatter"
	OpSend          Op = "send"
	OpRecv          Op = "recv"
	OpBarrier       Op = "barrier" // torch c10d
	// OpSendRecv is the NCCL profiler plugin's grouped point-to-point
	// operation. No API call of NCCL's has it, so its name is the plugin's
	// own ("nccl_" and its func name), which the agent always gave it.
	OpSendRecv Op = "nccl_send_recv"
)
