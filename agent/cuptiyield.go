package agent

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/slowrank/slowrank/agent/capture"
	"github.com/slowrank/slowrank/agent/discover"
	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/cupti"
)

// Another CUPTI client in a training process (torch.profiler's Kineto,
// nsys) shares CUPTI's global activity switches and its one pair of buffer
// callbacks with the injection library (CUPTI before 13.3 with a driver
// before r610 allows one activity client per process). The agent watches
// libcupti's entry points with uprobes; a call from any thread but the
// library's control thread is the other client's. yieldTracker turns those
// calls into the decision the library follows (Yield in
// cupti/slowrank_abi.h): while another client is active the library makes
// no CUPTI call, so the user's profile is complete, and it resumes after
// the other client's session ended.

const flushForced = 1 // CUPTI_ACTIVITY_FLAG_FLUSH_FORCED

// Timings of the decision.
const (
	// yieldGrace is how long after the other client's session ended
	// (its disables and forced flush) the library waits to take CUPTI back.
	yieldGrace = 2 * time.Second
	// cautiousQuiet: a client that held CUPTI's subscriber when the
	// library attached, with no call seen since, is taken for idle after
	// this long (Kineto keeps the subscriber from its first session on;
	// a session running at attach makes no watched call until it stops).
	cautiousQuiet = 60 * time.Second
)

// yieldTracker is the agent's view of other CUPTI clients in one process.
// Pure: time comes in with each call.
type yieldTracker struct {
	ctlTID       uint32
	active       bool
	since        int64 // first call of the active session
	lastStart    int64 // last call that starts or continues a session
	endAt        int64 // last call that ends a session (0: none since lastStart)
	cautious     bool  // active only because of a subscriber at attach
	foreignTID   uint32
	sessions     uint64
	lastDecision bool
	// foreign is what the other client registered and enabled, for the
	// library to give back if its own registration replaced it (handback in
	// cupti/slowrank_abi.h); foreignDirty: changed since last published.
	foreign      cupti.ForeignCallbacks
	foreignDirty bool
}

// call applies one libcupti call; it returns true when the decision changed.
func (y *yieldTracker) call(c capture.CUPTICall) bool {
	if c.TID == y.ctlTID && y.ctlTID != 0 {
		return false // the library's own call
	}
	y.foreignTID = c.TID
	y.noteForeign(c)
	switch c.Fn {
	case bpf.ProbeCUPTIDisable, bpf.ProbeCUPTIFinalize:
		y.endAt = c.TimeNs
	case bpf.ProbeCUPTIFlushAll:
		if c.Arg&flushForced != 0 {
			y.endAt = c.TimeNs
			break
		}
		y.start(c.TimeNs) // Kineto flushes at warm-up end, mid-session
	default: // subscribe, callbacks, clock, enable: a session starts
		y.start(c.TimeNs)
	}
	return y.decisionChanged()
}

// noteForeign records the other client's callbacks and activity kinds. The
// kinds are trusted (KindsKept) only once its session was seen from its
// registration on: kinds it enabled before the agent watched are unknown,
// and the library then re-enables every kind it switched off itself.
func (y *yieldTracker) noteForeign(c capture.CUPTICall) {
	f := &y.foreign
	switch c.Fn {
	case bpf.ProbeCUPTIRegisterCallbacks:
		f.RequestFn, f.CompleteFn, f.PairNs = c.Arg, c.Arg2, uint64(max(c.TimeNs, 1))
		f.KindsKept = true
	case bpf.ProbeCUPTIRegisterTimestamp:
		f.TimestampFn, f.TimestampNs = c.Arg, uint64(max(c.TimeNs, 1))
	case bpf.ProbeCUPTIEnable:
		if c.Arg < 64 {
			f.Kinds |= 1 << c.Arg
		}
	case bpf.ProbeCUPTIDisable:
		if c.Arg < 64 {
			f.Kinds &^= 1 << c.Arg
		}
	case bpf.ProbeCUPTIFinalize:
		f.Kinds = 0
	default:
		return
	}
	y.foreignDirty = true
}

func (y *yieldTracker) start(ts int64) {
	if !y.active || y.cautious {
		y.active, y.cautious, y.since = true, false, ts
		y.sessions++
	}
	y.lastStart, y.endAt = ts, 0
}

// attached notes that the library (re)attached and reports whether another
// client held CUPTI's subscriber slot.
func (y *yieldTracker) attached(now int64, foreignSubscriber bool) {
	if foreignSubscriber && !y.active {
		y.active, y.cautious, y.since, y.lastStart, y.endAt = true, true, now, now, 0
	}
}

// tick ends sessions whose end is old enough; true when the decision changed.
func (y *yieldTracker) tick(now int64) bool {
	if y.active {
		switch {
		case y.endAt != 0 && now-y.endAt >= int64(yieldGrace):
			y.active, y.cautious = false, false
		case y.cautious && now-y.lastStart >= int64(cautiousQuiet):
			y.active, y.cautious = false, false
		}
	}
	return y.decisionChanged()
}

func (y *yieldTracker) decisionChanged() bool {
	changed := y.active != y.lastDecision
	y.lastDecision = y.active
	return changed
}

// decision is what the library must be told.
func (y *yieldTracker) decision() (active bool, since uint64) {
	if !y.active || y.since < 0 {
		return y.active, 0
	}
	return true, uint64(y.since)
}

// cuptiState is what the agent knows of one process's injection library.
type cuptiState struct {
	track     yieldTracker
	lastBlock cupti.ControlBlock
	read      bool
	yieldGen  uint32 // last cupti_gen written
	hbSeq     uint32 // handback seqlock value last written (0: not read yet)
	// wrote, wroteActive: a decision was written, and which.
	wrote, wroteActive bool
}

// tendCUPTI reads every injection library's control block and writes the
// yield decision where the library waits for it or where it changed; it
// also refreshes duty configurations before their lease runs out.
func (t *attacher) tendCUPTI(now int64) {
	tended := false
	for _, pe := range t.procs {
		if pe.inject == nil || pe.mem.isGone() {
			continue
		}
		if t.injectAttaching(pe) {
			continue
		}
		if err := t.tendOne(pe, now); err != nil {
			t.count("cupti_control_errors", 1)
			t.log.Debug("injection library control block", "pid", pe.proc.PID, "err", err)
		}
		tended = true
	}
	if tended {
		t.refreshView() // the libraries' states in status
	}
}

func (t *attacher) tendOne(pe *procEntry, now int64) error {
	if err := t.controlAddr(pe); err != nil {
		return err
	}
	cb, err := cupti.ReadControl(pe.mem, int64(pe.ctlAddr))
	if err != nil {
		t.memRefused(pe, err)
		pe.ctlAddr = 0
		return err
	}
	// The library publishes its control thread's id in its own PID
	// namespace, the uprobes report the host's (capture.TIDMap). Until it is
	// translated, no decision is written: the library keeps waiting rather
	// than take its own calls for another client's.
	ctl, err := t.tids.Host(uint32(pe.proc.PID), cb.Status.CtlTID)
	if err != nil {
		return fmt.Errorf("control thread %d: %w", cb.Status.CtlTID, err)
	}
	cs := &pe.cupti
	cs.lastBlock, cs.read = cb, true
	cs.track.ctlTID = ctl
	waiting := cb.Status.Flags&cupti.StatusWaiting != 0
	if waiting {
		cs.track.attached(now, cb.Status.Flags&cupti.StatusForeignSubscriber != 0)
	}
	changed := cs.track.tick(now)
	if waiting || changed {
		return t.writeDecision(pe, cb.Yield.Gen)
	}
	return nil
}

// writeDecision publishes the other client's callbacks (when the library
// has a handback block and they changed) and then the yield decision,
// whose new generation makes the library read both.
func (t *attacher) writeDecision(pe *procEntry, seen uint32) error {
	if err := t.writeHandback(pe); err != nil {
		t.count("cupti_handback_errors", 1)
		t.log.Debug("write handback", "pid", pe.proc.PID, "err", err)
	}
	return t.writeYield(pe, seen)
}

func (t *attacher) writeHandback(pe *procEntry) error {
	cs := &pe.cupti
	addr := int64(cs.lastBlock.Status.HandbackAddr)
	if addr == 0 { // a library without hand-back: nothing to publish to
		cs.track.foreignDirty = false
	}
	if !cs.track.foreignDirty {
		return nil
	}
	if cs.hbSeq == 0 {
		hb, err := cupti.ReadHandback(pe.mem, addr)
		if err != nil {
			t.memRefused(pe, err)
			return err
		}
		cs.hbSeq = hb.Seq
	}
	seq, err := cupti.WriteHandback(pe.mem, addr, cs.hbSeq, cs.track.foreign)
	cs.hbSeq = seq
	if err != nil {
		t.memRefused(pe, err)
		if errors.Is(err, cupti.ErrBlockMoved) {
			cs.hbSeq = 0 // read it again next time
		}
		return err
	}
	cs.track.foreignDirty = false
	t.count("cupti_handback_writes", 1)
	return nil
}

// foreignCUPTICall handles a uprobe hit on libcupti.
func (t *attacher) foreignCUPTICall(c capture.CUPTICall) {
	for _, pe := range t.procs {
		if uint32(pe.proc.PID) != c.PID || pe.inject == nil {
			continue
		}
		if pe.cupti.track.ctlTID == 0 {
			// Not read yet: learn the control thread first.
			if err := t.tendOne(pe, c.TimeNs); err != nil {
				t.count("cupti_control_errors", 1)
			}
		}
		if c.TID == pe.cupti.track.ctlTID {
			t.count("cupti_own_calls", 1)
			return
		}
		t.count("cupti_foreign_calls", 1)
		if !pe.cupti.track.call(c) && !pe.cupti.track.foreignDirty {
			return
		}
		if err := t.writeDecision(pe, pe.cupti.lastBlock.Yield.Gen); err != nil {
			t.count("cupti_control_errors", 1)
			t.log.Debug("write yield", "pid", pe.proc.PID, "err", err)
		}
		return
	}
}

// writeYield writes the tracker's decision with a generation past both the
// one last read from the block (seen) and the one last written.
func (t *attacher) writeYield(pe *procEntry, seen uint32) error {
	active, since := pe.cupti.track.decision()
	gen := max(seen, pe.cupti.yieldGen) + 1
	if err := cupti.WriteYield(pe.mem, int64(pe.ctlAddr), cupti.Yield{Gen: gen, Active: active, ForeignSinceNs: since}); err != nil {
		t.memRefused(pe, err)
		pe.ctlAddr = 0
		return err
	}
	pe.cupti.yieldGen = gen
	t.count("cupti_decisions", 1)
	if pe.cupti.wrote && active == pe.cupti.wroteActive {
		return nil // the same decision again (new hand-back data)
	}
	pe.cupti.wrote, pe.cupti.wroteActive = true, active
	if active {
		t.count("cupti_yields", 1)
		t.log.Info("device collection yields to another CUPTI client (Kineto, nsys?)", "pid", pe.proc.PID,
			"tid", pe.cupti.track.foreignTID, "cautious", pe.cupti.track.cautious)
	} else if pe.cupti.track.sessions > 0 || pe.cupti.lastBlock.Status.State == cupti.StateYielded {
		t.count("cupti_resumes", 1)
	}
	return nil
}

// errInjectNotAttached: the injection library of a process has no
// attachment (its attach failed or is pending); its control block is not
// looked up.
var errInjectNotAttached = errors.New("injection library not attached")

// controlAddr finds the process's control block once.
func (t *attacher) controlAddr(pe *procEntry) error {
	if pe.ctlAddr != 0 {
		return nil
	}
	// The file belongs to whoever maps it: it is read only once the
	// bounded symbol reader of the attach has accepted it.
	if !t.libs.Attached(pe.inject.File) {
		return errInjectNotAttached
	}
	lib, err := t.inspectInjection(pe)
	if err != nil {
		return err
	}
	maps, err := discover.ReadMaps(t.procRoot, pe.proc.PID)
	if err != nil {
		return err
	}
	addr, err := cupti.ControlAddress(maps, pe.inject.File.Inode, lib)
	if err != nil {
		return err
	}
	cb, err := cupti.ReadControl(pe.mem, int64(addr))
	if err != nil {
		t.memRefused(pe, err)
		return err
	}
	pe.ctlAddr, pe.ctlGen = addr, cb.Generation
	return nil
}

// inspectInjection reads the control block's offset from the injection
// library file the process maps. Its path is another user's to rename a file
// onto: the file is opened once, through the mapping, or where that cannot be
// opened through the path checked against the mapping's device and inode
// (refused and counted otherwise, as the attach does: bpf/libfile.go), and
// read through that descriptor.
func (t *attacher) inspectInjection(pe *procEntry) (cupti.Library, error) {
	f, mapped, err := bpf.OpenMapped(bpf.LibSource{MapFiles: pe.inject.MapFilesPath, Path: pe.inject.HostPath, Want: bpf.FileID(pe.inject.File)})
	if errors.Is(err, bpf.ErrFileChanged) {
		t.count("inject_files_refused", 1)
	}
	if err != nil {
		return cupti.Library{}, fmt.Errorf("open injection library: %w", err)
	}
	defer func() { _ = f.Close() }() // read only
	if mapped {
		t.count("inject_opened_map_files", 1)
	} else {
		t.count("inject_opened_path", 1)
	}
	lib, err := cupti.InspectLibrary("/proc/self/fd/" + strconv.Itoa(int(f.Fd())))
	if err != nil {
		return cupti.Library{}, fmt.Errorf("inspect injection library %s: %w", pe.inject.HostPath, err)
	}
	return lib, nil
}

// memRefused counts a read or write of pe's memory that did not happen
// because the image is gone (once per image: nothing more is tried) or the
// block at the address is not the library's or moved (every time).
func (t *attacher) memRefused(pe *procEntry, err error) {
	switch {
	case errors.Is(err, errImageGone):
		if pe.mem != nil && !pe.mem.goneCounted {
			pe.mem.goneCounted = true
			t.count("proc_mem_image_gone", 1)
			t.log.Info("training process replaced its image (exec): no more reads or writes of its memory until it is found again",
				"pid", pe.proc.PID)
		}
	case errors.Is(err, cupti.ErrControl), errors.Is(err, cupti.ErrHandback), errors.Is(err, cupti.ErrBlockMoved):
		t.count("proc_mem_block_refused", 1)
	}
}

func (t *attacher) procPath(pid int, name string) string {
	root := t.procRoot
	if root == "" {
		root = "/proc"
	}
	return filepath.Join(root, strconv.Itoa(pid), name)
}
