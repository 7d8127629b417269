package pipeline

import (
	"slices"

	"github.com/slowrank/slowrank/correlate"
)

// pluginReorder restores, for processes on the NCCL plugin path, the order
// the correlator needs: a process's host calls in the order of their end.
// The uprobes report synchronisations, groups and torch calls in real time,
// the plugin its collectives in the injection library's batches, which are
// emitted at most every 100 ms. Fed as they come, each step's collectives
// would follow the next step's synchronisations and no step would be found.
// So the host calls and communicator records of such a process wait here
// until event time has passed their end by pluginHold, and are released in
// time order. A plugin record that comes later than that is still fed, after
// calls that ended later (counted, nccl_plugin_records_late).
//
// Owned by the pipeline's owner goroutine.
type pluginReorder struct {
	procs map[uint32]*heldInputs
	count func(name string, n int64) // nil: not counted
}

// pluginHold is how long after its end a call of a plugin-path process is
// held: the library drains its ring every 50 ms and flushes a batch at least
// every 100 ms; the rest is margin for a loaded host.
const pluginHold = int64(400e6)

// maxHeldPerProcess bounds what one process may hold: beyond it the oldest
// are released early (counted, nccl_plugin_reorder_overflow).
const maxHeldPerProcess = 1 << 16

type heldInputs struct {
	items    []heldInput
	released int64 // time of the latest input released
}

type heldInput struct {
	at int64 // the end of a call, the time of a comm record
	in Input
}

func newPluginReorder(count func(name string, n int64)) *pluginReorder {
	if count == nil {
		count = func(string, int64) {}
	}
	return &pluginReorder{procs: map[uint32]*heldInputs{}, count: count}
}

// start puts pid on the plugin path: its inputs are held from now on.
func (r *pluginReorder) start(pid uint32) {
	if r.procs[pid] == nil {
		r.procs[pid] = &heldInputs{}
	}
}

// hold keeps in if it belongs to a process on the plugin path and must wait
// for the plugin's records; false: feed it now.
func (r *pluginReorder) hold(in Input, emit func(Input)) bool {
	if len(r.procs) == 0 {
		return false
	}
	pid, at, ok := holdKey(in)
	if !ok {
		return false
	}
	h := r.procs[pid]
	if h == nil {
		return false
	}
	if at < h.released {
		r.count("nccl_plugin_records_late", 1)
	}
	h.items = append(h.items, heldInput{at: at, in: in})
	if len(h.items) > maxHeldPerProcess {
		r.count("nccl_plugin_reorder_overflow", int64(h.release(h.sorted()[maxHeldPerProcess/2-1].at, emit)))
	}
	return true
}

// holdKey says which inputs wait: host calls and communicator records,
// whose order against the calls matters to the correlator.
func holdKey(in Input) (pid uint32, at int64, ok bool) {
	switch in.kind {
	case inputHost:
		return in.host.PID, in.host.EndNS, true
	case inputOther:
		switch v := in.other.(type) {
		case correlate.CommInit:
			return v.PID, v.AtNS, true
		case correlate.CommDestroy:
			return v.PID, v.AtNS, true
		}
	}
	return 0, 0, false
}

// release feeds, in time order, every held input that ended pluginHold or
// more before now.
func (r *pluginReorder) release(now int64, emit func(Input)) {
	for _, h := range r.procs {
		h.release(now-pluginHold, emit)
	}
}

// forget feeds everything pid holds and takes it off the plugin path (the
// process exited).
func (r *pluginReorder) forget(pid uint32, emit func(Input)) {
	if h := r.procs[pid]; h != nil {
		h.release(maxTime, emit)
		delete(r.procs, pid)
	}
}

// flush feeds everything held (the agent stops).
func (r *pluginReorder) flush(emit func(Input)) {
	for pid := range r.procs {
		r.forget(pid, emit)
	}
}

// held returns the number of inputs held over all processes.
func (r *pluginReorder) held() int {
	n := 0
	for _, h := range r.procs {
		n += len(h.items)
	}
	return n
}

const maxTime = int64(^uint64(0) >> 1)

// sorted orders the held inputs by time, keeping arrival order among equal
// times (a call's group end and its next call, a comm record and its first
// call), and returns them.
func (h *heldInputs) sorted() []heldInput {
	slices.SortStableFunc(h.items, func(a, b heldInput) int {
		switch {
		case a.at < b.at:
			return -1
		case a.at > b.at:
			return 1
		}
		return 0
	})
	return h.items
}

// release feeds the held inputs at or before cutoff, in time order, and
// returns how many.
func (h *heldInputs) release(cutoff int64, emit func(Input)) int {
	if len(h.items) == 0 {
		return 0
	}
	items := h.sorted()
	n := 0
	for n < len(items) && items[n].at <= cutoff {
		emit(items[n].in)
		h.released = max(h.released, items[n].at)
		n++
	}
	rest := copy(items, items[n:])
	clear(items[rest:])
	h.items = items[:rest]
	return n
}
