package capture

import (
	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/cupti"
)

// Twins (nccl_commmap.go) need the collective uprobes, which the attach
// manager closes once every process mapping libnccl is on the plugin path
// (agent/attach/collectives.go). A communicator created after that is named
// by its creation instead: the communicator-init uprobes stay attached, and
// NCCL calls the plugin's init inside the creating call (ncclCommInitRank*,
// ncclCommSplit; blocking communicators). So the plugin's comm record
// (rank, nranks, its init time) takes the ncclComm_t of the uprobes'
// CommInit of the same process whose interval holds that time, with the same
// rank and nranks (-1 in the uprobes' record, as ncclCommSplit's: any). The
// two come in either order: the record is in a batch that may leave while
// the creating call still runs, the uprobes report at its return. A
// communicator created in a group or non-blocking (its init runs later, in
// ncclGroupEnd or a thread of NCCL) finds no such CommInit and falls back on
// its twin: the uprobes are made again for it (PluginReady).

// uprobeInit is a communicator creation the uprobes reported.
type uprobeInit struct {
	start, end   int64
	comm         uint64
	rank, nranks int32 // -1: not known to the uprobes
	taken        bool  // a plugin communicator has its handle
}

// maxUprobeInits bounds the creations kept per process (the newest).
const maxUprobeInits = 256

// holds says whether the plugin's comm record cm is this creation's.
func (u *uprobeInit) holds(cm *cupti.NCCLComm) bool {
	t := int64(cm.InitNs)
	return !u.taken && u.start <= t && t <= u.end &&
		(u.rank < 0 || u.rank == cm.Rank) && (u.nranks < 0 || u.nranks == cm.NRanks)
}

// noteUprobeInit keeps a creation the uprobes reported and gives its handle
// to the plugin communicator whose record came first. Caller holds c.mu.
func (n *ncclCapture) noteUprobeInit(e *bpf.CommInitEvent) {
	u := uprobeInit{start: int64(e.StartNs), end: int64(e.EndNs), comm: e.Comm, rank: e.Rank, nranks: e.NRanks}
	for _, st := range n.comms {
		if st.hasInit && !st.resolved && !st.byInit && u.holds(&st.record) {
			st.byInit, st.handle, u.taken = true, u.comm, true
			break
		}
	}
	if len(n.inits) == maxUprobeInits {
		n.inits = append(n.inits[:0], n.inits[1:]...)
	}
	n.inits = append(n.inits, u)
}

// initHandle gives the plugin communicator st, whose record cm just came,
// the handle of the uprobes' creation of it, if they reported it already.
func (n *ncclCapture) initHandle(st *pluginCommState, cm *cupti.NCCLComm) {
	st.record = *cm
	for i := len(n.inits) - 1; i >= 0; i-- {
		if u := &n.inits[i]; u.holds(cm) {
			st.byInit, st.handle, u.taken = true, u.comm, true
			return
		}
	}
}

// A communicator record that its creation has not named yet may still be
// matched: the uprobes report the creating call at its return. Past
// commNameWait it needs its twin, so the process needs the collective
// uprobes; past commNameGrace (a communicator that makes no collective) it
// is no longer waited for.
const (
	commNameWait  = int64(500e6)
	commNameGrace = int64(5e9)
)

// PluginReady returns the processes whose collectives need no uprobe as of
// now (monotonic ns): on the plugin path, not kept on the uprobes by a
// collective the plugin reports per peer (convert_nccl.go), with no
// communicator that only a twin can still name.
func (c *Converter) PluginReady(now int64) map[uint32]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	ready := map[uint32]bool{}
	for pid, p := range c.procs {
		if p.nccl.plugin && p.nccl.perPeer == "" && !p.nccl.needsTwins(now) {
			ready[pid] = true
		}
	}
	return ready
}

// needsTwins: a communicator of the process waits for its twin.
func (n *ncclCapture) needsTwins(now int64) bool {
	for _, st := range n.comms {
		age := now - st.since
		if st.hasInit && !st.resolved && !st.byInit && age >= commNameWait && age < commNameGrace {
			return true
		}
	}
	return false
}
