package capture

import (
	"github.com/slowrank/slowrank/agent/pipeline"
	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/correlate"
	"github.com/slowrank/slowrank/cupti"
)

// A communicator has two names: the uprobes see its ncclComm_t, the plugin
// its (commHash, rank). The correlator keys a process's communicators by
// one handle, and the step detection of a communicator lives on it: if the
// plugin's calls came under a handle of their own after the switch, the
// communicator the steps were locked on would go quiet and a new one would
// have to learn the cycle again. So the plugin's communicator takes the
// uprobes' handle where the same call was seen by both: the uprobes trap
// every call while they are attached, a plugin record's call started on the
// same thread inside the uprobes' interval of a call with the same op and
// count (or, on NCCL 2.27, whose launch comes later in ncclGroupEnd, after
// it). The first record of a communicator decides; a communicator whose
// twin is not found keeps the plugin's handle (nccl_plugin_comms_unmapped).

// twinCall is one collective as the uprobes reported it.
type twinCall struct {
	start, end int64
	comm       uint64
	count      uint64
	datatype   uint32
	probe      bpf.ProbeID
}

// twinRing keeps a thread's latest uprobe collectives, oldest first from
// next: enough to still hold a call when the plugin's batch with its record
// comes (a batch is at most ~150 ms late; FSDP makes hundreds of calls per
// step on one thread).
type twinRing struct {
	calls [twinRingSize]twinCall
	next  int
	n     int
}

const (
	twinRingSize = 256
	// maxTwinThreads bounds the threads per process whose calls are kept.
	maxTwinThreads = 64
	// twinMaxLag bounds how long after the uprobes' call a v4 launch may
	// come (in the ncclGroupEnd of the call's group).
	twinMaxLag = int64(1e9)
)

func (r *twinRing) add(c twinCall) {
	r.calls[r.next] = c
	r.next = (r.next + 1) % twinRingSize
	r.n = min(r.n+1, twinRingSize)
}

// find returns the comm of the call the plugin's record (op, count,
// datatype, its start) names: the newest call containing start, else the
// newest that started before it within twinMaxLag; none that started
// before notBefore (the communicator's creation: an older call is another
// communicator's).
func (r *twinRing) find(op correlate.Op, count uint64, datatype uint32, start, notBefore int64) (uint64, bool) {
	var before uint64
	found := false
	for i := 1; i <= r.n; i++ {
		c := &r.calls[(r.next-i+twinRingSize)%twinRingSize]
		if c.count != count || c.datatype != datatype || probeOp(c.probe) != op || c.start > start || c.start < notBefore {
			continue
		}
		if start <= c.end {
			return c.comm, true
		}
		if !found && start-c.start <= twinMaxLag {
			before, found = c.comm, true
		}
	}
	return before, found
}

// noteUprobeColl keeps a uprobe collective as a possible twin and, if it was
// fed, marks its communicator known to the correlator. Caller holds c.mu.
func (n *ncclCapture) noteUprobeColl(e *bpf.CollEvent, fed bool) {
	if fed {
		n.markFed(e.Comm)
	}
	if n.twins == nil {
		n.twins = map[uint32]*twinRing{}
	}
	r := n.twins[e.TID]
	if r == nil {
		if len(n.twins) >= maxTwinThreads {
			return
		}
		r = &twinRing{}
		n.twins[e.TID] = r
	}
	r.add(twinCall{start: int64(e.StartNs), end: int64(e.EndNs), comm: e.Comm, count: e.Count, datatype: e.Datatype, probe: e.Probe})
}

// markFed records that the correlator got a CommInit or a collective under
// the uprobes' handle comm (bounded: beyond it, a plugin CommInit may be
// fed for a communicator it knows, which only re-creates it).
func (n *ncclCapture) markFed(comm uint64) {
	if n.fed == nil {
		n.fed = map[uint64]bool{}
	}
	if len(n.fed) < MaxPluginComms {
		n.fed[comm] = true
	}
}

// pluginCommState is a plugin communicator of one process: its comm record
// (held until its first collective says which handle it takes) and the
// handle its calls carry once resolved.
type pluginCommState struct {
	init    correlate.CommInit
	hasInit bool // a comm record came (else only collectives did)
	record  cupti.NCCLComm
	// since is when its record came (the batch's emit time), for
	// PluginReady's wait for its creation.
	since int64
	// byInit: handle is the ncclComm_t of the uprobes' creation of it
	// (nccl_comminit.go), found before its first collective.
	byInit   bool
	resolved bool
	handle   uint64
}

// name gives st, at its first collective r, the handle its calls carry,
// and returns the counter of how: its creation (found already), its twin,
// or neither (the plugin's own handle).
func (n *ncclCapture) name(st *pluginCommState, k pluginComm, r *cupti.NCCLColl, start int64) string {
	if st.byInit {
		return "nccl_plugin_comms_mapped_by_init"
	}
	if ring := n.twins[r.TID]; ring != nil {
		if h, ok := ring.find(ncclOp(r.Func), r.Count, ncclDatatype(r.Datatype), start, int64(st.record.InitNs)); ok {
			st.handle = h
			return "nccl_plugin_comms_mapped"
		}
	}
	st.handle = k.handle()
	return "nccl_plugin_comms_unmapped"
}

// resolve gives the handle of the plugin communicator k at its collective
// r, and feeds its CommInit under that handle unless the correlator knows
// the communicator already (from the uprobes). Caller holds c.mu.
func (c *Converter) resolve(pid uint32, n *ncclCapture, k pluginComm, r *cupti.NCCLColl, start int64, out []pipeline.Input) (uint64, []pipeline.Input) {
	st := n.comms[k]
	if st == nil {
		if len(n.comms) >= MaxPluginComms {
			c.count("nccl_plugin_comms_refused", 1)
			return k.handle(), out
		}
		st = &pluginCommState{}
		n.comms[k] = st
	}
	if st.resolved {
		return st.handle, out
	}
	st.resolved = true
	c.count(n.name(st, k, r, start), 1)
	if st.hasInit && !n.fed[st.handle] {
		ci := st.init
		ci.PID, ci.Comm = pid, st.handle
		out = append(out, pipeline.OtherInput(ci))
		n.markFed(st.handle)
	}
	return st.handle, out
}
