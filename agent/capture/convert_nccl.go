package capture

import (
	"strconv"

	"github.com/slowrank/slowrank/agent/pipeline"
	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/correlate"
	"github.com/slowrank/slowrank/cupti"
)

// ncclCapture is one process's NCCL capture path: which of the two it is
// on, the per-thread cuts between them, and the communicators' names on
// the plugin path (doc.go says how the two paths share the calls).
type ncclCapture struct {
	plugin  bool
	version uint8            // profiler API NCCL bound (4, 5, 6)
	cut     map[uint32]int64 // per thread; frozen at the switch
	// perPeer is the first collective the plugin reports per peer
	// (alltoall, gather, scatter) the uprobes saw the process make: set,
	// the process is on the uprobes path for good. superseded is per
	// thread the end of the last libnccl call the uprobes dropped for the
	// plugin (frozen when perPeer is set); heard: a plugin record came.
	perPeer    correlate.Op
	superseded map[uint32]int64
	heard      bool
	// comms are the plugin's communicators (nccl_commmap.go), twins the
	// latest uprobe collectives per thread (kept with Config.NCCLPlugin),
	// fed the uprobes' handles the correlator knows.
	comms map[pluginComm]*pluginCommState
	twins map[uint32]*twinRing
	fed   map[uint64]bool
	// inits are the uprobes' communicator creations (nccl_comminit.go);
	// switchedAt is when the process went on the plugin path (the emit
	// time of the batch that put it there).
	inits      []uprobeInit
	switchedAt int64
}

// pluginComm names a communicator of the plugin path in one process:
// (commHash, rank) is unique among a process's live communicators (a
// single-process multi-GPU job holds one per local rank of the same hash).
type pluginComm struct {
	hash uint64
	rank int32
}

// handle is the Comm the plugin path's HostCalls carry: the correlator
// keys communicators by handle, and the plugin never sees ncclComm_t.
func (k pluginComm) handle() uint64 {
	h := k.hash ^ uint64(uint32(k.rank)+1)*0x9e3779b97f4a7c15
	if h == 0 {
		h = 1
	}
	return h
}

// maxCutThreads bounds the per-thread cut of a process (threads that made
// libnccl calls before the switch); beyond it, later threads get no cut,
// which can only double count their calls at the switch, never lose them.
const maxCutThreads = 4096

// keepUprobe records a libnccl call the uprobes reported while the process
// is on uprobes (always kept), and says whether to keep one on the plugin
// path.
// Caller holds c.mu.
func (n *ncclCapture) keepUprobe(tid uint32, endNs int64) bool {
	if !n.plugin {
		if n.cut == nil {
			n.cut = map[uint32]int64{}
		}
		if v, ok := n.cut[tid]; ok || len(n.cut) < maxCutThreads {
			n.cut[tid] = max(v, endNs)
		}
		return true
	}
	if endNs <= n.cut[tid] && n.cut[tid] != 0 || n.perPeer != "" {
		return true
	}
	n.noteSuperseded(tid, endNs)
	return false
}

// noteSuperseded records that the uprobes left the thread's libnccl call
// ending at endNs to the plugin (bounded like the cut: beyond it, a later
// thread's calls just before a return to the uprobes are seen by neither
// path).
func (n *ncclCapture) noteSuperseded(tid uint32, endNs int64) {
	if n.superseded == nil {
		n.superseded = map[uint32]int64{}
	}
	if v, ok := n.superseded[tid]; ok || len(n.superseded) < maxCutThreads {
		n.superseded[tid] = max(v, endNs)
	}
}

// withheld says whether the plugin's call that started at startNs on
// thread tid is the uprobes' to report: the process makes collectives the
// plugin reports per peer, and the uprobes did not leave that call to the
// plugin.
func (n *ncclCapture) withheld(tid uint32, startNs int64) bool {
	if n.perPeer == "" {
		return false
	}
	v, ok := n.superseded[tid]
	return !ok || startNs > v
}

// perPeerOp: the plugin of NCCL 2.28+ reports the collective as its
// per-peer sends and receives.
func perPeerOp(op correlate.Op) bool {
	return op == correlate.OpAllToAll || op == correlate.OpGather || op == correlate.OpScatter
}

// reportedByUprobes says whether the uprobes already reported the plugin's
// call that started at startNs on thread tid.
func (n *ncclCapture) reportedByUprobes(tid uint32, startNs int64) bool {
	v, ok := n.cut[tid]
	return ok && startNs <= v
}

// ncclUprobeInit notes a libnccl comm-init uprobe event: before the switch
// it makes the thread's cut; with the plugin path on, it is the creation the
// plugin's comm record of it is matched to (nccl_comminit.go).
func (c *Converter) ncclUprobeInit(e *bpf.CommInitEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := &c.proc(e.PID).nccl
	if !n.plugin {
		n.keepUprobe(e.TID, int64(e.EndNs))
	}
	if c.ncclPlugin {
		n.markFed(e.Comm)
		n.noteUprobeInit(e)
	}
}

// ncclUprobeColl filters a libnccl collective like ncclUprobe and, with
// the plugin path on, keeps it as the twin of the plugin's record of the
// same call (nccl_commmap.go).
func (c *Converter) ncclUprobeColl(e *bpf.CollEvent) bool {
	c.mu.Lock() // procs is shared with Forget (main goroutine)
	p := c.proc(e.PID)
	if p.nestedBcast(e) {
		c.mu.Unlock()
		c.count("nccl_uprobe_nested_calls", 1)
		return false
	}
	if op := probeOp(e.Probe); c.ncclPlugin && p.nccl.perPeer == "" && perPeerOp(op) {
		p.nccl.perPeer = op // on the uprobes from this call on, for good
		c.count("nccl_processes_kept_on_uprobes", 1)
	}
	keep := p.nccl.keepUprobe(e.TID, int64(e.EndNs))
	if c.ncclPlugin {
		p.nccl.noteUprobeColl(e, keep)
	}
	if keep {
		p.sawNCCL = true
	}
	c.mu.Unlock()
	if !keep {
		c.count("nccl_uprobe_events_superseded", 1)
	}
	return keep
}

// nestedBcast says whether e is an ncclBcast around the ncclBroadcast the
// uprobes reported just before on its thread: NCCL's ncclBcast calls
// ncclBroadcast, so both uprobes fire for one broadcast, the inner call
// returning (and reported) first. The outer one is dropped: counted twice,
// a broadcast made the call counts of the two capture paths differ (the
// plugin sees one), and the arrival rows of a rank that switched paths
// later than its peers compared calls a step apart on the H200.
func (p *convProc) nestedBcast(e *bpf.CollEvent) bool {
	switch e.Probe {
	case bpf.ProbeNCCLBroadcast:
		if p.lastBroadcast == nil {
			p.lastBroadcast = map[uint32]callSpan{}
		}
		if _, ok := p.lastBroadcast[e.TID]; ok || len(p.lastBroadcast) < maxCutThreads {
			p.lastBroadcast[e.TID] = callSpan{e.StartNs, e.EndNs}
		}
	case bpf.ProbeNCCLBcast:
		in, ok := p.lastBroadcast[e.TID]
		return ok && in.start >= e.StartNs && in.end <= e.EndNs
	}
	return false
}

// ncclGroupEnd feeds an ncclGroupEnd's end to the cut (the launch of a
// group's collectives, the plugin's start of them on NCCL 2.27, happens in
// it). Group events are never superseded: the plugin reports no groups.
func (c *Converter) ncclGroupEnd(e *bpf.GroupEvent) {
	c.mu.Lock()
	switch n := &c.proc(e.PID).nccl; {
	case !n.plugin:
		n.keepUprobe(e.TID, int64(e.EndNs))
	case n.perPeer == "":
		n.noteSuperseded(e.TID, int64(e.EndNs)) // NCCL 2.27 launches a group's calls here
	}
	c.mu.Unlock()
}

// hostTIDs gives the plugin's records of process pid the host's thread
// ids, which the uprobes' calls carry (nstid.go). A record whose thread is
// gone before it was seen keeps its namespace's id: it matches no uprobe
// call, so at a switch of capture path it may be counted twice, never lost
// (nccl_plugin_tids_unmapped).
func (c *Converter) hostTIDs(pid uint32, colls []cupti.NCCLColl) {
	if c.tids == nil || !c.ncclPlugin {
		return
	}
	var from, to uint32 // the last translation: a batch is mostly one thread's
	for i := range colls {
		if tid := colls[i].TID; tid == from && from != 0 {
			colls[i].TID = to
			continue
		}
		h, err := c.tids.Host(pid, colls[i].TID)
		if err != nil {
			c.count("nccl_plugin_tids_unmapped", 1)
			continue
		}
		from, to = colls[i].TID, h
		colls[i].TID = h
	}
}

// ncclRecords converts the plugin's records of one batch. Caller holds c.mu.
func (c *Converter) ncclRecords(pid uint32, p *convProc, b *cupti.Batch, emitted int64, out []pipeline.Input) []pipeline.Input {
	if !c.ncclPlugin {
		if n := len(b.NCCLComms) + len(b.NCCLColls) + len(b.NCCLKernels); n > 0 {
			c.count("nccl_plugin_records_ignored", int64(n)) // Config.NCCLPlugin off: the uprobes report
		}
		return out
	}
	// Finalizations last: a batch holds a communicator's last collectives
	// and its finalize, which forgets it.
	for _, cm := range b.NCCLComms {
		if !cm.Finalized {
			out = c.ncclComm(pid, p, cm, emitted, out)
		}
	}
	for _, r := range b.NCCLColls {
		out = c.ncclColl(pid, p, r, emitted, out)
	}
	for _, cm := range b.NCCLComms {
		if cm.Finalized {
			out = c.ncclComm(pid, p, cm, emitted, out)
		}
	}
	for _, k := range b.NCCLKernels {
		out = c.ncclKernel(pid, p, k, out)
	}
	return out
}

// ncclComm keeps each communicator's comm record (inits and the re-sends
// of every attach epoch) until its first collective says which handle it
// takes (nccl_commmap.go), and turns its finalize into a CommDestroy.
func (c *Converter) ncclComm(pid uint32, p *convProc, cm cupti.NCCLComm, emitted int64, out []pipeline.Input) []pipeline.Input {
	n := &p.nccl
	n.version, n.heard = cm.Version, true
	k := pluginComm{hash: cm.Hash, rank: cm.Rank}
	if n.comms == nil {
		n.comms = map[pluginComm]*pluginCommState{}
	}
	st := n.comms[k]
	if cm.Finalized {
		if st != nil {
			delete(n.comms, k)
			if st.resolved {
				out = append(out, pipeline.OtherInput(correlate.CommDestroy{PID: pid, Comm: st.handle, AtNS: int64(cm.FinalizeNs)}))
			}
		}
		return out
	}
	if st != nil && st.hasInit {
		return out
	}
	if st == nil && len(n.comms) >= MaxPluginComms {
		c.count("nccl_plugin_comms_refused", 1)
		return out
	}
	if st == nil {
		st = &pluginCommState{}
		n.comms[k] = st
	}
	st.hasInit, st.since = true, emitted
	st.init = correlate.CommInit{
		PID: pid, NRanks: int(cm.NRanks), Rank: int(cm.Rank), UniqueIDHash: cm.Hash, AtNS: int64(cm.InitNs),
	}
	n.initHandle(st, &cm)
	c.count("nccl_plugin_comms", 1)
	return out
}

// switchToPlugin puts the process on the plugin path at its first
// collective record: the pipeline reorders its inputs from then on.
func (c *Converter) switchToPlugin(pid uint32, n *ncclCapture, emitted int64, out []pipeline.Input) []pipeline.Input {
	n.plugin, n.switchedAt = true, emitted
	c.count("nccl_plugin_processes", 1)
	return append(out, pipeline.OtherInput(pipeline.PluginPath{PID: pid}))
}

// MaxPluginComms bounds the communicators one process's plugin records may
// make the agent track (the library tracks 256).
const MaxPluginComms = 1024

// ncclColl turns one plugin collective into the HostCall the uprobes make of
// the same call: same op names, count, ncclDataType_t; Comm is the
// communicator's plugin handle. The interval is the user's call up to its
// enqueue (CollApi, v5), or NCCL's launch (v4, no API events).
func (c *Converter) ncclColl(pid uint32, p *convProc, r cupti.NCCLColl, emitted int64, out []pipeline.Input) []pipeline.Input {
	n := &p.nccl
	n.heard = true
	if !n.plugin && n.perPeer != "" {
		// Never switched: the uprobes report every call of this process.
		c.count("nccl_plugin_records_kept_on_uprobes", 1)
		return out
	}
	if !n.plugin {
		if len(n.comms) == 0 {
			// No comm record yet: the uprobes still report this process.
			c.count("nccl_plugin_records_before_comm", 1)
			return out
		}
		out = c.switchToPlugin(pid, n, emitted, out)
	}
	start, end := r.LaunchStartNs, r.LaunchEndNs
	if r.HasAPI {
		start, end = r.APIStartNs, r.APIEndNs
	}
	if !plausibleSpan(start, end, emitted) {
		c.count("nccl_plugin_records_implausible", 1)
		return out
	}
	if n.reportedByUprobes(r.TID, int64(start)) {
		c.count("nccl_plugin_records_superseded", 1)
		return out
	}
	if n.withheld(r.TID, int64(start)) {
		c.count("nccl_plugin_records_kept_on_uprobes", 1)
		return out
	}
	c.count("nccl_plugin_colls", 1)
	p.sawNCCL = true // torch's c10d collectives are then redundant, as with uprobes
	comm, out := c.resolve(pid, n, pluginComm{hash: r.CommHash, rank: r.Rank}, &r, int64(start), out)
	return append(out, pipeline.HostInput(correlate.HostCall{
		PID: pid, TID: r.TID, Kind: correlate.HostCollective, Op: ncclOp(r.Func),
		Count: r.Count, Datatype: ncclDatatype(r.Datatype), Comm: comm,
		StartNS: int64(start), EndNS: int64(end),
		// A p2p call has no NCCL sequence number, a copy-engine one no
		// kernel: neither has a kernel record to join.
		NCCLSeq: r.Seq, HasNCCLSeq: !r.P2P && !r.CE,
	}))
}

// ncclKernel turns the plugin's kernel record of a collective into the
// CollKernel that the correlator joins with the call's HostCall by (Comm,
// Op, NCCL seq): the device arrival order (correlate/devarrival.go). It is
// not a DeviceInterval: CUPTI's record of the same kernel is one, in the
// duty cycle's on-phases both come, and the kernel would count twice.
func (c *Converter) ncclKernel(pid uint32, p *convProc, k cupti.NCCLKernel, out []pipeline.Input) []pipeline.Input {
	n := &p.nccl
	st := n.comms[pluginComm{hash: k.CommHash, rank: k.Rank}]
	var why string
	switch {
	case k.P2P:
		why = "nccl_kernel_records_p2p" // no sequence number names the call
	case k.ClockSuspect:
		why = "nccl_kernel_records_clock_suspect"
	case !n.plugin || n.perPeer != "" || st == nil || !st.resolved:
		why = "nccl_kernel_records_off_plugin" // its call is the uprobes' (or not fed): nothing to join
	}
	if why != "" {
		c.count(why, 1)
		return out
	}
	c.count("nccl_kernel_records", 1)
	return append(out, pipeline.OtherInput(correlate.CollKernel{
		PID: pid, Comm: st.handle, Op: ncclOp(k.Func), NCCLSeq: k.Seq,
		StartNS: int64(k.GPUStartNs), EndNS: int64(k.GPUEndNs),
	}))
}

// pluginOpCounters are the counters that every plugin collective or
// send/recv record converted with Config.NCCLPlugin on ends in, exactly
// one each (ncclColl): whether fed, superseded, withheld or dropped, the
// training process paid for its recording.
var pluginOpCounters = [...]string{
	"nccl_plugin_colls", "nccl_plugin_records_superseded", "nccl_plugin_records_kept_on_uprobes",
	"nccl_plugin_records_implausible", "nccl_plugin_records_before_comm",
}

// PluginOps is the number of NCCL operations the plugin recorded, of all
// processes, since the agent started, read through get from the counters
// that Config.Count fed: what the duty ledger charges them by (the agent's
// planDuty). Records the library dropped on its full ring never reach the
// Converter, but the process paid for them: they are charged too, from
// the library's own count (a dropped kernel record is charged as an
// operation: an upper bound).
func PluginOps(get func(name string) int64) int64 {
	var n int64
	for _, k := range pluginOpCounters {
		n += get(k)
	}
	return n + get(libRingFull)
}

// libRingFull is the library's count of plugin records dropped on its full
// ring (SLOWRANK_STAT_NCCL_RING_FULL, summed by libStats).
var libRingFull = "cupti_lib_" + cupti.StatNCCLRingFull.String()

// ncclOp names a plugin operation with the op of the uprobe of the same
// call.
func ncclOp(f cupti.NCCLFunc) correlate.Op {
	switch f {
	case cupti.NCCLFuncAllReduce:
		return correlate.OpAllReduce
	case cupti.NCCLFuncBroadcast:
		return correlate.OpBroadcast
	case cupti.NCCLFuncReduce:
		return correlate.OpReduce
	case cupti.NCCLFuncAllGather:
		return correlate.OpAllGather
	case cupti.NCCLFuncReduceScatter:
		return correlate.OpReduceScatter
	case cupti.NCCLFuncSend:
		return correlate.OpSend
	case cupti.NCCLFuncRecv:
		return correlate.OpRecv
	case cupti.NCCLFuncAllToAll:
		return correlate.OpAllToAll
	case cupti.NCCLFuncGather:
		return correlate.OpGather
	case cupti.NCCLFuncScatter:
		return correlate.OpScatter
	case cupti.NCCLFuncSendRecv:
		return correlate.OpSendRecv
	}
	return correlate.Op("nccl_" + f.String())
}

// ncclDatatype is the ncclDataType_t the uprobes read (ncclInt8 = 0 ...):
// the plugin's enum is NCCL's plus one, 0 meaning unknown, which maps to
// an out-of-range value so it never equals a real type in a signature.
func ncclDatatype(d cupti.NCCLDatatype) uint32 {
	if d == 0 {
		return ^uint32(0)
	}
	return uint32(d) - 1
}

// ncclPath is the process's capture path as status shows it.
func (n *ncclCapture) path() string {
	if n.perPeer != "" && n.heard {
		return "uprobes (" + string(n.perPeer) + ": plugin reports it per peer)"
	}
	if !n.plugin {
		return "uprobes"
	}
	if n.version != 0 {
		return "plugin v" + strconv.Itoa(int(n.version))
	}
	return "plugin"
}

// NCCLPaths returns the capture path of every process the Converter knows.
func (c *Converter) NCCLPaths() map[uint32]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[uint32]string, len(c.procs))
	for pid, p := range c.procs {
		m[pid] = p.nccl.path()
	}
	return m
}
