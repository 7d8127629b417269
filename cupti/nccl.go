package cupti

import "unsafe"

// The NCCL profiler plugin's records (slowrank_nccl.c; SLOWRANK_REC_NCCL_*
// in slowrank_abi.h). They travel in the same batches as the CUPTI records.
// All times are CLOCK_MONOTONIC ns; 0 means absent.

// NCCLFunc is the operation (SLOWRANK_NCCL_FUNC_*).
//
//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type NCCLFunc -linecomment
type NCCLFunc uint8

// NCCL operations. The line comments are the String() names (stringer
// -linecomment, ncclfunc_string.go). correlate.OpSendRecv is "nccl_" and
// its name, as is the op the agent gives any operation without a uprobe op
// of its own (agent/capture/convert_nccl.go).
const (
	NCCLFuncUnknown       NCCLFunc = iota // unknown
	NCCLFuncBroadcast                     // broadcast
	NCCLFuncReduce                        // reduce
	NCCLFuncAllGather                     // all_gather
	NCCLFuncReduceScatter                 // reduce_scatter
	NCCLFuncAllReduce                     // all_reduce
	NCCLFuncSendRecv                      // send_recv
	NCCLFuncSend                          // send
	NCCLFuncRecv                          // recv
	NCCLFuncAllToAll                      // all_to_all
	NCCLFuncGather                        // gather
	NCCLFuncScatter                       // scatter
)

// NCCLDatatype is the element type (SLOWRANK_NCCL_DT_*): NCCL's
// ncclDataType_t plus one, 0 meaning unknown.
//
//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type NCCLDatatype -linecomment
type NCCLDatatype uint8

// NCCL element types. The line comments are the String() names (stringer
// -linecomment, nccldatatype_string.go).
const (
	NCCLDatatypeUnknown    NCCLDatatype = iota // unknown
	NCCLDatatypeInt8                           // int8
	NCCLDatatypeUint8                          // uint8
	NCCLDatatypeInt32                          // int32
	NCCLDatatypeUint32                         // uint32
	NCCLDatatypeInt64                          // int64
	NCCLDatatypeUint64                         // uint64
	NCCLDatatypeFloat16                        // float16
	NCCLDatatypeFloat32                        // float32
	NCCLDatatypeFloat64                        // float64
	NCCLDatatypeBfloat16                       // bfloat16
	NCCLDatatypeFloat8e4m3                     // float8e4m3
	NCCLDatatypeFloat8e5m2                     // float8e5m2
)

var ncclDatatypeSizes = [numNCCLDatatypes]uint64{0, 1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1}

// Size is the element size in bytes, 0 when unknown.
func (d NCCLDatatype) Size() uint64 {
	if int(d) < len(ncclDatatypeSizes) {
		return ncclDatatypeSizes[d]
	}
	return 0
}

// NCCLAlgo is the algorithm NCCL chose (SLOWRANK_NCCL_ALGO_*).
//
//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type NCCLAlgo -linecomment
type NCCLAlgo uint8

// NCCL algorithms. The line comments are the String() names (stringer
// -linecomment, ncclalgo_string.go).
const (
	NCCLAlgoUnknown       NCCLAlgo = iota // unknown
	NCCLAlgoTree                          // tree
	NCCLAlgoRing                          // ring
	NCCLAlgoCollNetDirect                 // collnet_direct
	NCCLAlgoCollNetChain                  // collnet_chain
	NCCLAlgoNVLS                          // nvls
	NCCLAlgoNVLSTree                      // nvls_tree
	NCCLAlgoPAT                           // pat
)

// NCCLProto is the protocol NCCL chose (SLOWRANK_NCCL_PROTO_*).
//
//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type NCCLProto -linecomment
type NCCLProto uint8

// NCCL protocols. The line comments are the String() names (stringer
// -linecomment, ncclproto_string.go).
const (
	NCCLProtoUnknown NCCLProto = iota // unknown
	NCCLProtoLL                       // ll
	NCCLProtoLL128                    // ll128
	NCCLProtoSimple                   // simple
)

// NCCLComm is a communicator, sent at its init, again at every attach epoch
// (Resent) and at its finalize (Finalized, FinalizeNs).
type NCCLComm struct {
	Version    uint8 // profiler API NCCL bound: 4, 5 or 6
	Finalized  bool
	Resent     bool
	ID         uint16 // the library's slot, unique among the process's live comms
	Hash       uint64 // NCCL's commHash: equal on every member
	Rank       int32
	NRanks     int32
	NNodes     int32
	InitNs     uint64
	FinalizeNs uint64
}

// NCCLColl is one collective or send/recv on the host. (CommHash, Func, Seq)
// names the same collective on every rank of the communicator.
type NCCLColl struct {
	Func      NCCLFunc
	Datatype  NCCLDatatype
	Algo      NCCLAlgo
	Proto     NCCLProto
	CommHash  uint64
	Rank      int32
	NRanks    int32
	Seq       uint64 // NCCL's per-(comm, func) sequence number; 0 for p2p; with CE the comm's CE counter
	Count     uint64 // elements
	Root      int32  // root (collectives) or peer (P2P)
	NChannels uint8
	Version   uint8
	P2P       bool
	// HasAPI: APIStartNs/APIEndNs bracket the task's append inside the
	// user's call (CollApi/P2pApi events, NCCL >= 2.28); the launch comes
	// after it, in the group end.
	HasAPI bool
	Graph  bool // captured into a CUDA graph
	// CE: a copy-engine collective (CeColl event, profiler API v6, NCCL >=
	// 2.29): Seq is the comm's CE counter (ceSeqNum, shared by all CE
	// functions), not the per-function one; no kernel channels.
	CE            bool
	APIStartNs    uint64
	APIEndNs      uint64
	LaunchStartNs uint64 // NCCL's launch of the operation (Coll event); its end is "enqueued", not "done"
	LaunchEndNs   uint64
	TID           uint32
	CommID        uint32
}

// Bytes is Count times the element size (0 when the datatype is unknown).
func (c NCCLColl) Bytes() uint64 { return c.Count * c.Datatype.Size() }

// NCCLKernel is the GPU execution of one operation, from its kernel-channel
// events: first channel start to last channel stop. Join it to its NCCLColl
// by (CommHash, Rank, Func, Seq).
type NCCLKernel struct {
	Func          NCCLFunc
	P2P           bool
	Partial       bool // fewer channels reported than announced
	ClockSuspect  bool // the converted end lies more than NCCLClockSlackNs after the host saw it
	Channels      uint8
	NChannels     uint8
	CommHash      uint64
	Seq           uint64
	Rank          int32
	CommID        uint32
	GPUStartNs    uint64
	GPUEndNs      uint64 // 0 when no channel reported a stop timer
	HostSeenNs    uint64 // when the plugin saw the last stop: an upper bound on GPUEndNs unless ClockSuspect
	ClockOffsetNs int64  // monotonic = globaltimer + offset, already applied
}

const (
	ncclCommSize   = int(unsafe.Sizeof(rawNCCLComm{}))
	ncclCollSize   = int(unsafe.Sizeof(rawNCCLColl{}))
	ncclKernelSize = int(unsafe.Sizeof(rawNCCLKernel{}))
)

func decodeNCCLComm(r []byte) NCCLComm {
	var c rawNCCLComm
	fl := r[unsafe.Offsetof(c.Flags)]
	return NCCLComm{
		Version:    r[unsafe.Offsetof(c.Version)],
		Finalized:  fl&ncclCommFinalized != 0,
		Resent:     fl&ncclCommResent != 0,
		ID:         u16(r, unsafe.Offsetof(c.Comm_id)),
		Hash:       u64(r, unsafe.Offsetof(c.Comm_hash)),
		Rank:       int32(u32(r, unsafe.Offsetof(c.Rank))),
		NRanks:     int32(u32(r, unsafe.Offsetof(c.Nranks))),
		NNodes:     int32(u32(r, unsafe.Offsetof(c.Nnodes))),
		InitNs:     u64(r, unsafe.Offsetof(c.Init_ns)),
		FinalizeNs: u64(r, unsafe.Offsetof(c.Finalize_ns)),
	}
}

func decodeNCCLColl(r []byte) NCCLColl {
	var c rawNCCLColl
	fl := u16(r, unsafe.Offsetof(c.Flags))
	return NCCLColl{
		Func:          NCCLFunc(r[unsafe.Offsetof(c.Func)]),
		Datatype:      NCCLDatatype(r[unsafe.Offsetof(c.Datatype)]),
		Algo:          NCCLAlgo(r[unsafe.Offsetof(c.Algo)]),
		Proto:         NCCLProto(r[unsafe.Offsetof(c.Proto)]),
		CommHash:      u64(r, unsafe.Offsetof(c.Comm_hash)),
		Rank:          int32(u32(r, unsafe.Offsetof(c.Rank))),
		NRanks:        int32(u32(r, unsafe.Offsetof(c.Nranks))),
		Seq:           u64(r, unsafe.Offsetof(c.Seq)),
		Count:         u64(r, unsafe.Offsetof(c.Count)),
		Root:          int32(u32(r, unsafe.Offsetof(c.Root))),
		NChannels:     r[unsafe.Offsetof(c.Nchannels)],
		Version:       r[unsafe.Offsetof(c.Version)],
		P2P:           fl&ncclFlagP2P != 0,
		HasAPI:        fl&ncclFlagAPI != 0,
		Graph:         fl&ncclFlagGraph != 0,
		CE:            fl&ncclFlagCE != 0,
		APIStartNs:    u64(r, unsafe.Offsetof(c.Api_start_ns)),
		APIEndNs:      u64(r, unsafe.Offsetof(c.Api_end_ns)),
		LaunchStartNs: u64(r, unsafe.Offsetof(c.Launch_start_ns)),
		LaunchEndNs:   u64(r, unsafe.Offsetof(c.Launch_end_ns)),
		TID:           u32(r, unsafe.Offsetof(c.Tid)),
		CommID:        u32(r, unsafe.Offsetof(c.Comm_id)),
	}
}

func decodeNCCLKernel(r []byte) NCCLKernel {
	var k rawNCCLKernel
	fl := r[unsafe.Offsetof(k.Flags)]
	return NCCLKernel{
		Func:          NCCLFunc(r[unsafe.Offsetof(k.Func)]),
		P2P:           fl&ncclFlagP2P != 0,
		Partial:       fl&ncclFlagPartial != 0,
		ClockSuspect:  fl&ncclFlagClockSuspect != 0,
		Channels:      r[unsafe.Offsetof(k.Channels)],
		NChannels:     r[unsafe.Offsetof(k.Nchannels)],
		CommHash:      u64(r, unsafe.Offsetof(k.Comm_hash)),
		Seq:           u64(r, unsafe.Offsetof(k.Seq)),
		Rank:          int32(u32(r, unsafe.Offsetof(k.Rank))),
		CommID:        u32(r, unsafe.Offsetof(k.Comm_id)),
		GPUStartNs:    u64(r, unsafe.Offsetof(k.Gpu_start_ns)),
		GPUEndNs:      u64(r, unsafe.Offsetof(k.Gpu_end_ns)),
		HostSeenNs:    u64(r, unsafe.Offsetof(k.Host_seen_ns)),
		ClockOffsetNs: int64(u64(r, unsafe.Offsetof(k.Clock_offset_ns))),
	}
}

func encodeNCCLComm(r []byte, c NCCLComm) {
	var rc rawNCCLComm
	r[unsafe.Offsetof(rc.Version)] = c.Version
	var fl byte
	if c.Finalized {
		fl |= ncclCommFinalized
	}
	if c.Resent {
		fl |= ncclCommResent
	}
	r[unsafe.Offsetof(rc.Flags)] = fl
	le.PutUint16(r[unsafe.Offsetof(rc.Comm_id):], c.ID)
	le.PutUint64(r[unsafe.Offsetof(rc.Comm_hash):], c.Hash)
	le.PutUint32(r[unsafe.Offsetof(rc.Rank):], uint32(c.Rank))
	le.PutUint32(r[unsafe.Offsetof(rc.Nranks):], uint32(c.NRanks))
	le.PutUint32(r[unsafe.Offsetof(rc.Nnodes):], uint32(c.NNodes))
	le.PutUint64(r[unsafe.Offsetof(rc.Init_ns):], c.InitNs)
	le.PutUint64(r[unsafe.Offsetof(rc.Finalize_ns):], c.FinalizeNs)
}

func encodeNCCLColl(r []byte, c NCCLColl) {
	var rc rawNCCLColl
	r[unsafe.Offsetof(rc.Func)] = byte(c.Func)
	r[unsafe.Offsetof(rc.Datatype)] = byte(c.Datatype)
	r[unsafe.Offsetof(rc.Algo)] = byte(c.Algo)
	r[unsafe.Offsetof(rc.Proto)] = byte(c.Proto)
	le.PutUint64(r[unsafe.Offsetof(rc.Comm_hash):], c.CommHash)
	le.PutUint32(r[unsafe.Offsetof(rc.Rank):], uint32(c.Rank))
	le.PutUint32(r[unsafe.Offsetof(rc.Nranks):], uint32(c.NRanks))
	le.PutUint64(r[unsafe.Offsetof(rc.Seq):], c.Seq)
	le.PutUint64(r[unsafe.Offsetof(rc.Count):], c.Count)
	le.PutUint32(r[unsafe.Offsetof(rc.Root):], uint32(c.Root))
	var fl uint16
	if c.P2P {
		fl |= ncclFlagP2P
	}
	if c.HasAPI {
		fl |= ncclFlagAPI
	}
	if c.Graph {
		fl |= ncclFlagGraph
	}
	if c.CE {
		fl |= ncclFlagCE
	}
	le.PutUint16(r[unsafe.Offsetof(rc.Flags):], fl)
	r[unsafe.Offsetof(rc.Nchannels)] = c.NChannels
	r[unsafe.Offsetof(rc.Version)] = c.Version
	le.PutUint64(r[unsafe.Offsetof(rc.Api_start_ns):], c.APIStartNs)
	le.PutUint64(r[unsafe.Offsetof(rc.Api_end_ns):], c.APIEndNs)
	le.PutUint64(r[unsafe.Offsetof(rc.Launch_start_ns):], c.LaunchStartNs)
	le.PutUint64(r[unsafe.Offsetof(rc.Launch_end_ns):], c.LaunchEndNs)
	le.PutUint32(r[unsafe.Offsetof(rc.Tid):], c.TID)
	le.PutUint32(r[unsafe.Offsetof(rc.Comm_id):], c.CommID)
}

func encodeNCCLKernel(r []byte, k NCCLKernel) {
	var rk rawNCCLKernel
	r[unsafe.Offsetof(rk.Func)] = byte(k.Func)
	var fl byte
	if k.P2P {
		fl |= ncclFlagP2P
	}
	if k.Partial {
		fl |= ncclFlagPartial
	}
	if k.ClockSuspect {
		fl |= ncclFlagClockSuspect
	}
	r[unsafe.Offsetof(rk.Flags)] = fl
	r[unsafe.Offsetof(rk.Channels)] = k.Channels
	r[unsafe.Offsetof(rk.Nchannels)] = k.NChannels
	le.PutUint64(r[unsafe.Offsetof(rk.Comm_hash):], k.CommHash)
	le.PutUint64(r[unsafe.Offsetof(rk.Seq):], k.Seq)
	le.PutUint32(r[unsafe.Offsetof(rk.Rank):], uint32(k.Rank))
	le.PutUint32(r[unsafe.Offsetof(rk.Comm_id):], k.CommID)
	le.PutUint64(r[unsafe.Offsetof(rk.Gpu_start_ns):], k.GPUStartNs)
	le.PutUint64(r[unsafe.Offsetof(rk.Gpu_end_ns):], k.GPUEndNs)
	le.PutUint64(r[unsafe.Offsetof(rk.Host_seen_ns):], k.HostSeenNs)
	le.PutUint64(r[unsafe.Offsetof(rk.Clock_offset_ns):], uint64(k.ClockOffsetNs))
}
