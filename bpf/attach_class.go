package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf/link"
)

// A uprobe traps in every process that maps its file, whatever the BPF
// program then filters: where another capture path reports a class of calls
// for every process that maps the library (NCCL's profiler plugin for the
// collectives, docs/nccl-profiler-plugin.md §7), the agent closes that
// class's uprobes and makes them again when a process that needs them maps
// the file. The functions stay resolved, so making them again reads no ELF.

// DetachClass closes the uprobes of the attachment's functions of class and
// returns how many functions it closed (0 when none is attached). With
// uprobe_multi the class is its own links (one per direction, or one per
// function where the shared one failed), so nothing else is touched. Like
// Close it waits for kernel grace periods.
func (a *Attachment) DetachClass(class ProbeClass) (int, error) {
	a.mu.Lock()
	var off, kept []probeLinks
	n := 0
	for _, l := range a.links {
		if l.class == class {
			off = append(off, l)
			a.parked = append(a.parked, l.fns...)
			n += len(l.fns)
		} else {
			kept = append(kept, l)
		}
	}
	a.links = kept
	a.mu.Unlock()
	return n, closeProbes(off)
}

// ReattachClass makes again the uprobes DetachClass closed for class,
// opening the library as src names it: a current mapping of the file by a
// live process (the one the attachment was made through may have exited),
// or where that cannot be opened its path, which must open the
// attachment's File (else ErrFileChanged, counted in Stats.FilesRefused,
// and the functions stay parked). The uprobes are made through that open
// file, as AttachLibrary made them: one shared link per direction where the
// kernel has uprobe_multi, function by function where that fails. It
// returns how many functions it attached; a function that fails stays
// parked for the next call.
func (a *Attachment) ReattachClass(class ProbeClass, src LibSource) (int, error) {
	a.mu.Lock()
	var todo, rest []resolved
	for _, r := range a.parked {
		if r.spec.Class == class {
			todo = append(todo, r)
		} else {
			rest = append(rest, r)
		}
	}
	a.parked = rest
	a.mu.Unlock()
	if len(todo) == 0 {
		return 0, nil
	}
	src.Want = a.File // the functions' offsets are this file's
	lf, err := a.p.openLibFile(src)
	if err != nil {
		a.park(todo)
		return 0, err
	}
	defer lf.Close()
	ex, err := link.OpenExecutable(lf.attachPath())
	if err != nil {
		a.park(todo)
		return 0, fmt.Errorf("open executable: %w", err)
	}
	// No reference counter: it is the CUPTI probe's, never parked.
	made, failed := a.p.attachClass(ex, a.Path, class, todo, nil)
	var errs []error
	for _, r := range todo {
		if err := failed[r.offset]; err != nil {
			errs = append(errs, err)
			a.park([]resolved{r})
		}
	}
	a.mu.Lock()
	closed := a.closed
	if !closed {
		a.links = append(a.links, made...)
	}
	a.mu.Unlock()
	if closed { // Close ran meanwhile: nobody owns these any more
		return 0, errors.Join(append(errs, closeProbes(made))...)
	}
	return len(todo) - len(failed), errors.Join(errs...)
}

// Detached tells how many functions of class DetachClass closed and
// ReattachClass has not made again.
func (a *Attachment) Detached(class ProbeClass) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, r := range a.parked {
		if r.spec.Class == class {
			n++
		}
	}
	return n
}

func (a *Attachment) park(rs []resolved) {
	a.mu.Lock()
	if !a.closed {
		a.parked = append(a.parked, rs...)
	}
	a.mu.Unlock()
}
