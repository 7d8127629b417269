package agent

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/procfs"

	"github.com/slowrank/slowrank/agent/attach"
	"github.com/slowrank/slowrank/agent/capture"
	"github.com/slowrank/slowrank/agent/discover"
	"github.com/slowrank/slowrank/agent/duty"
	"github.com/slowrank/slowrank/agent/pipeline"
	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/correlate"
	"github.com/slowrank/slowrank/cupti"
)

// attacher turns discovery events into training processes (a rank, a BPF
// filter entry and duty-cycle writes into the injection library's control
// block each) and into uses of their libraries, which the attach manager
// (agent/attach) attaches once per library file. Only the agent's main
// goroutine calls it. What it uses of the agent is in its fields, given by
// newAttacher.
type attacher struct {
	log   *slog.Logger
	count func(name string, n int64) // the agent's counters
	// probes is the BPF side: the filter of tracked processes (Track,
	// Untrack) and, through probeSet, the attachments.
	probes *bpf.Probes
	// conv is the converter: it forgets an exited process's state and
	// says which processes are on the NCCL plugin path; tids translates
	// the injection library's thread ids (shared with conv).
	conv *capture.Converter
	tids *capture.TIDMap
	// pipe is told of each rank found and forgotten.
	pipe *pipeline.Pipeline
	// gpu is NVML's evidence of the ranks' GPUs; nil without NVML.
	gpu gpuSource
	// drain hands the pipeline what the reader queued and runs pending
	// control, before an exited process is forgotten.
	drain func()
	// What the agent's Config says of the processes (Config.ProcRoot,
	// HostName, Job, Epoch, ForgetDelay, ProbeTorch, NCCLPlugin).
	procRoot, host, job    string
	epoch                  int
	forgetDelay            time.Duration
	probeTorch, ncclPlugin bool
	// startTicks is the agent's start in clock ticks after boot (as
	// ProcessKey.StartTime), 0 when unknown: processes older than the
	// agent may have begun their collective sequence unseen (midRun).
	startTicks uint64
	// paused is runtime control's pause of collection (control.go): new
	// processes are not tracked and the duty cycle written is off.
	paused bool

	libs  *attach.Manager[discover.FileID, discover.ProcessKey]
	procs map[discover.ProcessKey]*procEntry
	// forgets are exited processes whose records may still be in flight.
	forgets  []pendingForget
	nextRank int

	mu   sync.Mutex // guards view, read by Status from other goroutines
	view []ProcessView
}

type procEntry struct {
	proc discover.Process
	rank int
	job  string
	libs map[discover.FileID]discover.LibraryKind // the files it maps
	// mem is the process's memory, opened once when it was found: reads
	// and writes of its control block go through it and never reach an
	// image an exec brought (procmem.go).
	mem *procMem
	// injection library state (duty cycle writes)
	inject    *discover.Library
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
	// "uprobes" (agent/capture).
	NCCL string `json:"nccl,omitempty"`
	// NCCLUprobes says, for a process mapping libnccl, whether that file's
	// collective uprobes are "attached" or "detached" (every process
	// mapping it is on the plugin path, agent/attach/collectives.go).
	NCCLUprobes string `json:"nccl_collective_uprobes,omitempty"`
}

// newAttacher returns the attacher of the agent a is being built into,
// with what it uses of it; a's probes, converter, pipeline and NVML
// evidence are set.
func newAttacher(a *Agent) *attacher {
	t := &attacher{
		log: a.log, count: a.counters.add, probes: a.probes, conv: a.conv, tids: a.tids, pipe: a.pipe, gpu: a.gpu,
		drain: a.drainInput, procRoot: a.cfg.ProcRoot, host: a.cfg.HostName, job: a.cfg.Job, epoch: a.cfg.Epoch,
		forgetDelay: a.cfg.ForgetDelay, probeTorch: a.cfg.ProbeTorch, ncclPlugin: a.cfg.NCCLPlugin,
		startTicks: selfStartTicks(),
		procs:      map[discover.ProcessKey]*procEntry{},
	}
	t.libs = attach.New[discover.FileID, discover.ProcessKey](attach.Config[discover.FileID]{
		Probes: probeSet{a.probes}, Sink: attachSink{t}, Deliver: a.ctl, Log: a.log,
	})
	return t
}

func (t *attacher) handle(ev discover.Event) {
	switch e := ev.(type) {
	case *discover.ProcessAdded:
		t.added(e.Process)
	case *discover.LibraryMapped:
		t.mapped(e.ProcessKey, e.Library)
	case *discover.LibraryUnmapped:
		t.unmapped(e.ProcessKey, e.Library.File)
	case *discover.ProcessExited:
		t.exited(e.ProcessKey)
	}
	t.refreshView()
}

func (t *attacher) added(p discover.Process) {
	if _, ok := t.procs[p.ProcessKey]; ok {
		return
	}
	rank := p.Identity.Rank
	if rank < 0 && strings.HasPrefix(p.SelectedBy, "env:") {
		// Selected by an environment marker but without a rank (a launcher
		// such as torchrun itself): not a rank, nothing to judge.
		t.count("processes_without_rank", 1)
		return
	}
	if rank < 0 {
		rank = 1_000_000 + t.nextRank // no rank in the environment: a stable synthetic one
		t.nextRank++
	}
	job := t.job
	if job == "" {
		job = p.Identity.JobID
	}
	if job == "" {
		job = "default"
	}
	if parent := t.rankParent(p, rank, job); parent != nil {
		t.count("processes_rank_workers", 1)
		t.log.Info("process started by a rank with the rank's own identity (a compile or data-loader worker): not a rank",
			"pid", p.PID, "parent", parent.proc.PID, "rank", rank, "job", job)
		return
	}
	pe := &procEntry{proc: p, rank: rank, job: job, libs: map[discover.FileID]discover.LibraryKind{}, mem: t.openImageMem(p)}
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
		Host: t.host, Job: job, Epoch: t.epoch,
		MidRun:    t.midRun(p.StartTime),
		Placement: p.Identity.Placement(t.host),
	}
	t.placeGPU(pe)
	t.pipe.SetRank(pe.info)
	if t.paused {
		// Collection is paused: tracked on resume (control.go).
	} else if err := t.probes.Track(uint32(p.PID), uint32(rank)); err != nil {
		t.count("track_errors", 1)
		t.log.Warn("track process", "pid", p.PID, "err", err)
	}
	t.log.Info("training process found", "pid", p.PID, "rank", rank, "job", job, "selected_by", p.SelectedBy)
}

// rankParent returns the tracked process that started p when it is the
// same rank of the same job and already maps a probed library: p inherited
// the rank's environment (torch.compile's compile workers, data-loader
// workers, anything forked after import torch) and is not another copy of
// the rank; tracked as one, it would be a silent rank-0 peer of the real
// one. A launcher that got RANK and started the trainer (a shell wrapper)
// maps no probed library, so its child is still the rank.
func (t *attacher) rankParent(p discover.Process, rank int, job string) *procEntry {
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

func (t *attacher) mapped(k discover.ProcessKey, lib discover.Library) {
	pe := t.procs[k]
	if pe == nil {
		return
	}
	pe.libs[lib.File] = lib.Kind
	if lib.Kind == discover.KindCUPTIInject {
		l := lib
		pe.inject, pe.dutyValid, pe.ctlAddr = &l, false, 0
	}
	// Torch's libraries without --probe-torch are followed (status lists
	// them) but not attached.
	kind, ok := bpfKind(lib.Kind)
	probe := ok && (kind != bpf.LibTorch || t.probeTorch)
	// A deleted file is reached only through its mapping: its path opens
	// another file or none, which the check refuses.
	t.libs.Use(k, attach.Library[discover.FileID]{File: lib.File, Name: lib.Path, MapFiles: lib.MapFilesPath, Open: lib.HostPath, PID: k.PID, Owner: pe.proc.Owner.QuotaKey(), Kind: uint8(lib.Kind)}, probe)
}

// injectAttaching: pe's injection library is still with the attach worker.
func (t *attacher) injectAttaching(pe *procEntry) bool {
	return t.libs.Attaching(pe.inject.File)
}

func (t *attacher) unmapped(k discover.ProcessKey, f discover.FileID) {
	if pe := t.procs[k]; pe != nil {
		delete(pe.libs, f)
		if pe.inject != nil && pe.inject.File == f {
			pe.inject = nil
		}
	}
	t.libs.Release(k, f)
}

func (t *attacher) exited(k discover.ProcessKey) {
	pe := t.procs[k]
	if pe == nil {
		return
	}
	delete(t.procs, k)
	pe.mem.Close()
	if err := t.probes.Untrack(uint32(k.PID)); err != nil {
		t.count("untrack_errors", 1)
	}
	for f := range pe.libs {
		t.libs.Release(k, f)
	}
	t.forgets = append(t.forgets, pendingForget{at: monotonicNow() + int64(t.forgetDelay), pid: uint32(k.PID), rank: pe.rank})
	t.log.Info("training process exited", "pid", k.PID, "rank", pe.rank)
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
		t.drain()
		t.pipe.Forget(f.pid, f.rank)
		t.conv.Forget(f.pid)
	}
	t.forgets = kept
	t.libs.RetryFailed(now)
	t.libs.DetachIdle(now)
}

// tendPlugin tells the attach manager which processes report their NCCL
// collectives through the profiler plugin, so that it closes the collective
// uprobes of a libnccl file all of whose users do (agent/attach).
func (t *attacher) tendPlugin(now int64) {
	if !t.ncclPlugin {
		return
	}
	ready := t.conv.PluginReady(now)
	for k := range t.procs {
		t.libs.SetPlugin(k, ready[uint32(k.PID)])
	}
	t.refreshView()
}

// detachAll closes every attachment (on stop) and waits for the closes.
func (t *attacher) detachAll() {
	t.libs.Close() // closes the attachment in flight; queued ones are not made
	for _, pe := range t.procs {
		pe.mem.Close()
	}
}

// applyDuty writes the duty plan into the control block of every process
// that loaded the injection library, when it changed.
func (t *attacher) applyDuty(p duty.Plan) {
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
	d.NCCLPlugin = t.ncclPlugin
	d.NCCLNoKernelChannels = !p.KernelChannels
	if t.paused {
		d = cupti.Duty{Mode: cupti.DutyOff} // control.go: paused
	}
	now := time.Now()
	for _, pe := range t.procs {
		fresh := now.Sub(pe.dutyAt) < dutyRefresh
		if pe.inject == nil || pe.mem.isGone() || (pe.dutyValid && pe.lastDuty == d && fresh) {
			continue
		}
		if t.injectAttaching(pe) {
			continue // written once its attachment exists (next plan)
		}
		if err := t.writeDuty(pe, d); err != nil {
			t.count("duty_write_errors", 1)
			t.log.Debug("write duty cycle", "pid", pe.proc.PID, "err", err)
			continue
		}
		pe.lastDuty, pe.dutyValid, pe.dutyAt = d, true, now
		t.count("duty_writes", 1)
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
	gen, err := cupti.WriteDuty(pe.mem, int64(pe.ctlAddr), pe.ctlGen, d)
	if err != nil {
		t.memRefused(pe, err)
		pe.ctlAddr = 0 // look it up again next time
		return err
	}
	pe.ctlGen = gen
	return nil
}

// canCollect tells whether the process may collect device records when
// the plan says so: it loaded the injection library, and the library, as
// last read, neither lacks CUPTI, was refused or disabled, nor yields to
// another CUPTI client (not yet read: it may).
func (pe *procEntry) canCollect() bool {
	if pe.inject == nil {
		return false
	}
	if !pe.cupti.read {
		return true
	}
	if active, _ := pe.cupti.track.decision(); active {
		return false
	}
	switch pe.cupti.lastBlock.Status.State {
	case cupti.StateUnavailable, cupti.StateRefused, cupti.StateDisabled, cupti.StateYielded:
		return false
	}
	return true
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
		for f, kind := range pe.libs {
			if name, ok := t.libs.Name(f); ok {
				pv.Libraries = append(pv.Libraries, filepath.Base(name))
			}
			if kind == discover.KindNCCL && t.libs.Attached(f) {
				pv.NCCLUprobes = "attached"
				if t.libs.CollectivesDetached(f) {
					pv.NCCLUprobes = "detached"
				}
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

// placeGPU puts the GPU that NVML last showed pe's process on into
// pe.info and reports whether that changed it. A process that NVML no
// longer lists (it is exiting, or a read failed) keeps its last GPU: no
// topology version for a flap. Main goroutine only.
func (t *attacher) placeGPU(pe *procEntry) bool {
	if t.gpu == nil {
		return false
	}
	rg, ok := t.gpu.Placement(pe.proc.PID)
	if !ok || rg == pe.info.Placement.GPU {
		return false
	}
	pe.info.Placement.GPU = rg
	return true
}

// userHZ is the unit of the start times in /proc/PID/stat (USER_HZ, fixed
// at 100 by the kernel's ABI).
const userHZ = 100

// midRun tells whether a process that started at startTicks ran for more
// than two seconds before the agent: long enough to have created its NCCL
// communicators unseen (importing torch alone takes longer), as after an
// agent restart during training.
func (t *attacher) midRun(startTicks uint64) bool {
	return t.startTicks > 0 && startTicks+2*userHZ < t.startTicks
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
