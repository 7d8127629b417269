package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/procfs"

	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/correlate"
	"github.com/slowrank/slowrank/cupti"
)

// attacher turns discovery events into attachments: one per library file
// (uprobes live on the inode and fire in every process mapping it), a BPF
// filter entry per training process, and duty-cycle writes into the
// injection library's control block. Only the agent's main goroutine calls it.
type attacher struct {
	a     *Agent
	libs  map[FileID]*libEntry
	procs map[ProcessKey]*procEntry
	// forgets are exited processes whose records may still be in flight.
	forgets  []pendingForget
	nextRank int
	closing  sync.WaitGroup
	// worker attaches libraries off the main goroutine (started on the
	// first library to attach).
	worker *attachWorker

	mu   sync.Mutex // guards view, read by Status from other goroutines
	view []ProcessView
}

type libEntry struct {
	kind LibraryKind
	path string
	att  *bpf.Attachment // nil while attaching or when attaching failed
	// attaching: queued for or in the attach worker.
	attaching bool
	// failed: the last attach failed; the next process mapping the
	// library retries it.
	failed bool
	// idleSince is when the last user went (monotonic ns; 0: in use).
	idleSince int64
	users     map[ProcessKey]bool
}

type procEntry struct {
	proc Process
	rank int
	job  string
	libs map[FileID]bool
	// injection library state (duty cycle writes)
	inject    *Library
	ctlAddr   uint64
	ctlGen    uint32
	lastDuty  cupti.Duty
	dutyValid bool
	dutyAt    time.Time  // last duty write: rewritten before the library's lease ends
	cupti     cuptiState // other CUPTI clients, the library's status
	// info is the identity sent to the pipeline, sent again when the
	// rank's GPU becomes known (placement.go).
	info correlate.RankInfo
}

type pendingForget struct {
	at   int64
	pid  uint32
	rank int
}

// ProcessView is what the agent knows of one training process.
type ProcessView struct {
	PID       int      `json:"pid"`
	Rank      int      `json:"rank"`
	Job       string   `json:"job"`
	Libraries []string `json:"libraries"`
	Injected  bool     `json:"injected"`
	// CUPTI is the injection library's state ("on", "off_phase", "yielded"
	// ...), with the other CUPTI client's thread when it yields to one.
	CUPTI string `json:"cupti,omitempty"`
	// NCCL is the capture path of its NCCL collectives: "plugin v5" once
	// the injection library's profiler-plugin records arrived, else
	// "uprobes" (convert_nccl.go).
	NCCL string `json:"nccl,omitempty"`
}

func newAttacher(a *Agent) *attacher {
	return &attacher{a: a, libs: map[FileID]*libEntry{}, procs: map[ProcessKey]*procEntry{}}
}

func (t *attacher) handle(ev Event) {
	switch e := ev.(type) {
	case *ProcessAdded:
		t.added(e.Process)
	case *LibraryMapped:
		t.mapped(e.ProcessKey, e.Library)
	case *LibraryUnmapped:
		t.unmapped(e.ProcessKey, e.Library.File)
	case *ProcessExited:
		t.exited(e.ProcessKey)
	}
	t.refreshView()
}

func (t *attacher) added(p Process) {
	if _, ok := t.procs[p.ProcessKey]; ok {
		return
	}
	rank := p.Identity.Rank
	if rank < 0 && strings.HasPrefix(p.SelectedBy, "env:") {
		// Selected by an environment marker but without a rank (a launcher
		// such as torchrun itself): not a rank, nothing to judge.
		t.a.counters.add("processes_without_rank", 1)
		return
	}
	if rank < 0 {
		rank = 1_000_000 + t.nextRank // no rank in the environment: a stable synthetic one
		t.nextRank++
	}
	job := t.a.cfg.Job
	if job == "" {
		job = p.Identity.JobID
	}
	if job == "" {
		job = "default"
	}
	if parent := t.rankParent(p, rank, job); parent != nil {
		t.a.counters.add("processes_rank_workers", 1)
		t.a.log.Info("process started by a rank with the rank's own identity (a compile or data-loader worker): not a rank",
			"pid", p.PID, "parent", parent.proc.PID, "rank", rank, "job", job)
		return
	}
	pe := &procEntry{proc: p, rank: rank, job: job, libs: map[FileID]bool{}}
	t.procs[p.ProcessKey] = pe
	localRank := p.Identity.LocalRank
	if localRank < 0 {
		localRank = 0
	}
	world := max(p.Identity.WorldSize, 0)
	// The rank's identity reaches the pipeline before any of its events:
	// BPF only emits them after Track, and the main goroutine owns both.
	pe.info = correlate.RankInfo{
		PID: uint32(p.PID), Rank: rank, LocalRank: localRank, WorldSize: world,
		Host: t.a.cfg.HostName, Job: job, Epoch: t.a.cfg.Epoch,
		MidRun:    t.a.midRun(p.StartTime),
		Placement: p.Identity.Placement(t.a.cfg.HostName),
	}
	t.a.placeGPU(pe)
	t.a.pipe.handle(pe.info)
	if t.a.control.paused {
		// Collection is paused: tracked on resume (control.go).
	} else if err := t.a.probes.Track(uint32(p.PID), uint32(rank)); err != nil {
		t.a.counters.add("track_errors", 1)
		t.a.log.Warn("track process", "pid", p.PID, "err", err)
	}
	t.a.log.Info("training process found", "pid", p.PID, "rank", rank, "job", job, "selected_by", p.SelectedBy)
}

// rankParent returns the tracked process that started p when it is the
// same rank of the same job and already maps a probed library: p inherited
// the rank's environment (torch.compile's compile workers, data-loader
// workers, anything forked after import torch) and is not another copy of
// the rank; tracked as one, it would be a silent rank-0 peer of the real
// one. A launcher that got RANK and started the trainer (a shell wrapper)
// maps no probed library, so its child is still the rank.
func (t *attacher) rankParent(p Process, rank int, job string) *procEntry {
	if p.Identity.Rank < 0 || p.PPID <= 0 {
		return nil
	}
	for _, pe := range t.procs {
		if pe.proc.PID == p.PPID && pe.rank == rank && pe.job == job && len(pe.libs) > 0 {
			return pe
		}
	}
	return nil
}

func (t *attacher) mapped(k ProcessKey, lib Library) {
	pe := t.procs[k]
	if pe == nil {
		return
	}
	pe.libs[lib.File] = true
	if lib.Kind == KindCUPTIInject {
		l := lib
		pe.inject, pe.dutyValid, pe.ctlAddr = &l, false, 0
	}
	le := t.libs[lib.File]
	if le != nil {
		le.users[k] = true
		if le.idleSince != 0 {
			le.idleSince = 0
			t.a.counters.add("attachments_reused", 1)
		}
		if !le.failed || le.attaching {
			return
		}
		// The attach through another process failed (it may have exited
		// meanwhile): try again through this one. Bounded by the number
		// of processes that map the library.
		t.a.counters.add("attach_retries", 1)
	} else {
		le = &libEntry{kind: lib.Kind, path: lib.Path, users: map[ProcessKey]bool{k: true}}
		t.libs[lib.File] = le
	}
	kind, ok := bpfKind(lib.Kind)
	if !ok || (kind == bpf.LibTorch && !t.a.cfg.ProbeTorch) {
		return
	}
	path := lib.HostPath
	if lib.Deleted {
		path = lib.MapFilesPath
	}
	if t.worker == nil {
		t.worker = newAttachWorker(t.a.probes.AttachLibrary, t.a.ctl, t.attachDone)
	}
	le.attaching = true
	t.worker.enqueue(attachJob{file: lib.File, path: path, name: lib.Path, pid: k.PID, kind: kind})
}

// injectAttaching: pe's injection library is still with the attach worker.
func (t *attacher) injectAttaching(pe *procEntry) bool {
	le := t.libs[pe.inject.File]
	return le != nil && le.attaching
}

// attachDone takes the worker's outcome for one library (main goroutine).
func (t *attacher) attachDone(o attachOutcome) {
	le := t.libs[o.job.file]
	if le == nil { // cannot happen: an attaching entry is kept until now
		if o.att != nil {
			o.att.Close()
		}
		return
	}
	le.attaching = false
	if len(le.users) == 0 {
		le.idleSince = monotonicNow() // every user went while it attached: linger, then detach
	}
	if o.err != nil {
		le.failed = true
		t.a.counters.add("attach_errors", 1)
		t.a.log.Warn("attach library", "path", o.job.name, "pid", o.job.pid, "err", o.err)
		if len(le.users) == 0 {
			delete(t.libs, o.job.file)
		}
		return
	}
	att := o.att
	le.att, le.failed = att, false
	if missing, required := att.Missing(); len(missing) > 0 {
		t.a.counters.add("symbols_missing", int64(len(missing)))
		// Once per library, by name: an operator who asked for a probe
		// (e.g. --probe-torch on a torch that does not export it) learns it
		// is absent, and what it would have measured is not.
		log := t.a.log.Info
		if required {
			log = t.a.log.Warn
		}
		log("library lacks probed symbols", "path", o.job.name, "missing", len(missing),
			"symbols", missingNames(missing, 6), "stripped", att.Stripped)
	}
	t.a.counters.add("libraries_attached", 1)
	t.a.counters.add("probes_attached", int64(att.Attached()))
	t.a.log.Info("attached", "library", filepath.Base(o.job.name), "kind", le.kind, "probes", att.Attached(),
		"took", o.took.Round(time.Millisecond), "queued", t.worker.pending())
	t.refreshView()
}

// missingNames lists up to max probe names, then how many more there are.
func missingNames(specs []bpf.ProbeSpec, max int) string {
	names := make([]string, 0, min(len(specs), max))
	for i, s := range specs {
		if i == max {
			names = append(names, fmt.Sprintf("and %d more", len(specs)-max))
			break
		}
		names = append(names, s.Name())
	}
	return strings.Join(names, ", ")
}

func (t *attacher) unmapped(k ProcessKey, f FileID) {
	if pe := t.procs[k]; pe != nil {
		delete(pe.libs, f)
		if pe.inject != nil && pe.inject.File == f {
			pe.inject = nil
		}
	}
	t.release(k, f)
}

// detachLinger is how long an attachment that no process uses any more stays
// attached. An elastic restart maps the same library files again within
// seconds: reusing the attachment spares the new processes the attach, and
// the kernel the teardown (grace periods, during which new uprobes wait), so the first steps after a restart are not missed.
const detachLinger = 15 * time.Second

// release drops k's use of library f; when nobody maps it any more, it is
// detached after detachLinger unless a process maps it again.
func (t *attacher) release(k ProcessKey, f FileID) {
	le := t.libs[f]
	if le == nil {
		return
	}
	delete(le.users, k)
	if len(le.users) > 0 {
		return
	}
	if le.attaching {
		return // attachDone decides
	}
	if le.att == nil {
		delete(t.libs, f)
		return
	}
	le.idleSince = monotonicNow()
}

// detachIdle detaches the attachments unused for detachLinger.
func (t *attacher) detachIdle(now int64) {
	for f, le := range t.libs {
		if le.idleSince != 0 && len(le.users) == 0 && now-le.idleSince >= int64(detachLinger) {
			t.detach(f, le)
		}
	}
}

// detach closes le's attachment. Detaching waits for kernel grace periods
// (seconds with perf-event uprobes): it runs in the background so the
// pipeline never waits for it.
func (t *attacher) detach(f FileID, le *libEntry) {
	delete(t.libs, f)
	if le.att != nil {
		t.closing.Add(1)
		go func() {
			defer t.closing.Done()
			le.att.Close()
		}()
		t.a.counters.add("libraries_detached", 1)
	}
}

func (t *attacher) exited(k ProcessKey) {
	pe := t.procs[k]
	if pe == nil {
		return
	}
	delete(t.procs, k)
	if err := t.a.probes.Untrack(uint32(k.PID)); err != nil {
		t.a.counters.add("untrack_errors", 1)
	}
	for f := range pe.libs {
		t.release(k, f)
	}
	t.forgets = append(t.forgets, pendingForget{at: monotonicNow() + int64(t.a.cfg.ForgetDelay), pid: uint32(k.PID), rank: pe.rank})
	t.a.log.Info("training process exited", "pid", k.PID, "rank", pe.rank)
}

// forgetDue tells the pipeline about exited processes whose in-flight
// records have had time to arrive.
func (t *attacher) forgetDue(now int64) {
	kept := t.forgets[:0]
	for _, f := range t.forgets {
		if f.at > now {
			kept = append(kept, f)
			continue
		}
		t.a.drainInput()
		t.a.pipe.handle(forget{pid: f.pid, rank: f.rank})
		t.a.conv.forgetPID(f.pid)
	}
	t.forgets = kept
	t.detachIdle(now)
}

// detachAll closes every attachment (on stop) and waits for the closes.
func (t *attacher) detachAll() {
	if t.worker != nil {
		t.worker.close() // closes the attachment in flight; queued ones are not made
	}
	for f, le := range t.libs {
		le.users = nil
		t.detach(f, le)
	}
	t.closing.Wait()
}

// applyDuty writes the duty plan into the control block of every process
// that loaded the injection library, when it changed.
func (t *attacher) applyDuty(p DutyPlan) {
	d := cupti.Duty{
		Mode:   cupti.DutyTime,
		On:     time.Duration(float64(p.Period) * p.OnShare).Round(time.Millisecond),
		Period: p.Period,
	}
	if p.OnShare >= 1 {
		d = cupti.Duty{Mode: cupti.DutyAlways}
	}
	if p.Escalate {
		d.EscalateUntilNs = uint64(p.EscalatedUntil)
	}
	// Without it the library keeps NCCL's profiler mask at 0: NCCL then
	// calls no plugin, whose records this agent would only count.
	d.NCCLPlugin = t.a.cfg.NCCLPlugin
	if t.a.control.paused {
		d = cupti.Duty{Mode: cupti.DutyOff} // control.go: paused
	}
	now := time.Now()
	for _, pe := range t.procs {
		fresh := now.Sub(pe.dutyAt) < dutyRefresh
		if pe.inject == nil || (pe.dutyValid && pe.lastDuty == d && fresh) {
			continue
		}
		if t.injectAttaching(pe) {
			continue // written once its attachment exists (next plan)
		}
		if err := t.writeDuty(pe, d); err != nil {
			t.a.counters.add("duty_write_errors", 1)
			t.a.log.Debug("write duty cycle", "pid", pe.proc.PID, "err", err)
			continue
		}
		pe.lastDuty, pe.dutyValid, pe.dutyAt = d, true, now
		t.a.counters.add("duty_writes", 1)
	}
}

// dutyRefresh is how often an unchanged duty configuration is written
// again: the library stops collecting when its configuration outlives its
// lease (SLOWRANK_LEASE_MS, 60 s), so that a hung agent cannot leave
// collection on.
const dutyRefresh = 10 * time.Second

func (t *attacher) writeDuty(pe *procEntry, d cupti.Duty) error {
	if err := t.controlAddr(pe); err != nil {
		return err
	}
	mem, err := os.OpenFile(t.procPath(pe.proc.PID, "mem"), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer mem.Close()
	gen, err := cupti.WriteDuty(mem, int64(pe.ctlAddr), pe.ctlGen, d)
	if err != nil {
		pe.ctlAddr = 0 // look it up again next time
		return err
	}
	pe.ctlGen = gen
	return nil
}

func (t *attacher) refreshView() {
	view := make([]ProcessView, 0, len(t.procs))
	for _, pe := range t.procs {
		pv := ProcessView{PID: pe.proc.PID, Rank: pe.rank, Job: pe.job, Injected: pe.inject != nil}
		if pe.cupti.read {
			pv.CUPTI = pe.cupti.lastBlock.Status.State.String()
			if active, _ := pe.cupti.track.decision(); active {
				pv.CUPTI = fmt.Sprintf("yielded to another CUPTI client (pid %d, thread %d)", pe.proc.PID, pe.cupti.track.foreignTID)
			}
		}
		for f := range pe.libs {
			if le := t.libs[f]; le != nil {
				pv.Libraries = append(pv.Libraries, filepath.Base(le.path))
			}
		}
		sort.Strings(pv.Libraries)
		view = append(view, pv)
	}
	sort.Slice(view, func(i, j int) bool { return view[i].PID < view[j].PID })
	t.mu.Lock()
	t.view = view
	t.mu.Unlock()
}

func (t *attacher) processes() []ProcessView {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]ProcessView(nil), t.view...)
}

func bpfKind(k LibraryKind) (bpf.LibKind, bool) {
	switch k {
	case KindNCCL:
		return bpf.LibNCCL, true
	case KindCUDART:
		return bpf.LibCUDART, true
	case KindCUDA:
		return bpf.LibCUDA, true
	case KindTorchCPU, KindTorchCUDA:
		return bpf.LibTorch, true
	case KindCUPTIInject:
		return bpf.LibCUPTI, true
	case KindCUPTIRuntime:
		return bpf.LibCUPTIRuntime, true
	}
	return 0, false
}

// userHZ is the unit of the start times in /proc/PID/stat (USER_HZ, fixed
// at 100 by the kernel's ABI).
const userHZ = 100

// midRun tells whether a process that started at startTicks ran for more
// than two seconds before the agent: long enough to have created its NCCL
// communicators unseen (importing torch alone takes longer), as after an
// agent restart during training.
func (a *Agent) midRun(startTicks uint64) bool {
	return a.startTicks > 0 && startTicks+2*userHZ < a.startTicks
}

// selfStartTicks is the agent's own start time in clock ticks after boot,
// 0 when /proc does not say.
func selfStartTicks() uint64 {
	self, err := procfs.Self()
	if err != nil {
		return 0
	}
	st, err := self.Stat()
	if err != nil {
		return 0
	}
	return st.Starttime
}
