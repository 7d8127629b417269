package cupti

import (
	"strconv"
	"sync"
)

// Default bounds of an Interner.
const (
	DefaultMaxProcesses    = 4096
	DefaultMaxNamesPerProc = 1 << 16
)

// Interner resolves kernel name ids per process. The library defines each
// name once per attach epoch (in a NameDef that precedes its first use), so
// the agent feeds every decoded batch to Observe and asks Name for ids.
// It is bounded (processes and names per process) and safe for concurrent
// use. A name that was never seen (a lost batch, an overflowing table)
// resolves to "kernel#<id>": the class travels in every kernel record, so
// classification never depends on the name being known.
type Interner struct {
	mu       sync.Mutex
	maxProcs int
	maxNames int
	procs    map[uint32]map[uint32]NameDef
	st       InternerStats
}

// InternerStats counts what an Interner did.
type InternerStats struct {
	Processes int    // processes tracked now
	Names     int    // names held now
	Missing   uint64 // Name lookups of unknown ids
	Refused   uint64 // definitions dropped by the bounds
	Redefined uint64 // ids re-sent with a different name (a reused pid?)
}

// NewInterner returns an Interner with the default bounds.
func NewInterner() *Interner {
	return NewInternerWithLimits(DefaultMaxProcesses, DefaultMaxNamesPerProc)
}

// NewInternerWithLimits returns an Interner holding at most maxProcs
// processes and maxNames names per process.
func NewInternerWithLimits(maxProcs, maxNames int) *Interner {
	return &Interner{maxProcs: maxProcs, maxNames: maxNames, procs: make(map[uint32]map[uint32]NameDef)}
}

// Observe records the name definitions of a batch read from process pid
// (the kernel tgid of the event, not Header.PID, which is namespaced).
// It returns how many definitions were new.
func (in *Interner) Observe(pid uint32, b *Batch) int {
	if len(b.Names) == 0 {
		return 0
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	names, ok := in.procs[pid]
	if !ok {
		if len(in.procs) >= in.maxProcs {
			in.st.Refused += uint64(len(b.Names))
			return 0
		}
		names = make(map[uint32]NameDef)
		in.procs[pid] = names
	}
	added := 0
	for _, n := range b.Names {
		old, seen := names[n.ID]
		if seen {
			if old.Name != n.Name {
				in.st.Redefined++
				names[n.ID] = n
			}
			continue
		}
		if len(names) >= in.maxNames {
			in.st.Refused++
			continue
		}
		names[n.ID] = n
		in.st.Names++
		added++
	}
	return added
}

// Lookup returns the definition of id in process pid.
func (in *Interner) Lookup(pid, id uint32) (NameDef, bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	n, ok := in.procs[pid][id]
	return n, ok
}

// Name returns the name of id in process pid, or "kernel#<id>" when it is
// not known (counted in InternerStats.Missing).
func (in *Interner) Name(pid, id uint32) string {
	if n, ok := in.Lookup(pid, id); ok {
		return n.Name
	}
	in.mu.Lock()
	in.st.Missing++
	in.mu.Unlock()
	return "kernel#" + strconv.FormatUint(uint64(id), 10)
}

// Forget drops a process's names (call it when the process exits: pids are
// reused).
func (in *Interner) Forget(pid uint32) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.st.Names -= len(in.procs[pid])
	delete(in.procs, pid)
}

// Stats returns the Interner's counters.
func (in *Interner) Stats() InternerStats {
	in.mu.Lock()
	defer in.mu.Unlock()
	s := in.st
	s.Processes = len(in.procs)
	return s
}
