package pipeline

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/slowrank/slowrank/correlate"
	"github.com/slowrank/slowrank/detector"
)

// Sink receives the pipeline's results, from the pipeline's owner
// goroutine (detector.Sink says in which order).
type Sink = detector.Sink

// Duty is the part of the agent's duty-cycle controller that the pipeline
// informs: which ranks' steps had device records, which windows look slow,
// which ranks are gone.
type Duty interface {
	ObserveStep(st detector.Step)
	Suspect(now, from, to int64) bool
	Forget(rank int)
}

// Config is what a Pipeline is built from.
type Config struct {
	Log        *slog.Logger
	Correlator *correlate.Correlator
	Detector   *detector.Detector
	Sinks      []Sink
	// Duty, when set, is told about steps, suspicious windows and exits.
	Duty Duty
	// Evidence, when set, gives the GPU evidence of a rank over a window.
	Evidence func(job string, rank int, start, end int64) *detector.GPUEvidence
	// Dump, when set, receives every record fed (the agent's Config.Dump).
	Dump func(any)
	// Count, when set, adds to one of the agent's counters.
	Count func(name string, n int64)
}

// Pipeline owns the correlator and the detector (see the package doc).
// Only its owner goroutine touches them; the status snapshot is the one
// thing shared, under mu.
type Pipeline struct {
	log      *slog.Logger
	corr     *correlate.Correlator
	det      *detector.Detector
	duty     Duty
	sinks    []Sink
	evidence func(job string, rank int, start, end int64) *detector.GPUEvidence
	dump     func(any)
	countFn  func(name string, n int64)
	// verdicts returned by the detector and not yet handed to the sinks.
	verdicts []detector.Verdict
	// alerts are the active (job, rank, phase) alerts, to log transitions.
	alerts map[alertKey]bool
	// swap routes steps while a detector change settles (swap.go).
	swap detectorSwap
	// retired sums the correlator's statistics of forgotten processes.
	retired correlate.RankStats
	// reorder holds the inputs of processes on the NCCL plugin path until
	// the plugin's records of the same time have come (reorder.go).
	reorder *pluginReorder

	mu     sync.Mutex
	status status
}

type alertKey struct {
	job   string
	rank  int
	phase string
}

// New returns a pipeline over cfg's correlator and detector, which it owns
// from now on.
func New(cfg Config) *Pipeline {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Pipeline{
		log: log, corr: cfg.Correlator, det: cfg.Detector, duty: cfg.Duty, sinks: cfg.Sinks,
		evidence: cfg.Evidence, dump: cfg.Dump, countFn: cfg.Count,
		alerts:  map[alertKey]bool{},
		reorder: newPluginReorder(cfg.Count),
		status:  newStatus(),
	}
}

// Feed takes one record from the reader goroutine's queue: it goes to the
// correlator now, or waits while its process's plugin records may still
// come.
func (p *Pipeline) Feed(in Input) {
	if !p.reorder.hold(in, p.feed) {
		p.feed(in)
	}
}

// SetRank hands the correlator a rank's identity (the agent found the
// process, or its GPU): before any of the process's records, which BPF
// emits only after the agent tracks it.
func (p *Pipeline) SetRank(info correlate.RankInfo) { p.handle(info) }

// Forget tells the pipeline that a process exited and its in-flight records
// have had time to arrive: what it held is fed, its statistics are kept in
// the totals, and the correlator and the duty controller drop it.
func (p *Pipeline) Forget(pid uint32, rank int) {
	if p.dump != nil {
		p.dump(forget{pid: pid, rank: rank})
	}
	p.reorder.forget(pid, p.feed)
	for _, st := range p.corr.Stats() {
		if st.PID == pid {
			p.retired.Add(st)
		}
	}
	p.corr.Forget(pid)
	if p.duty != nil {
		p.duty.Forget(rank)
	}
}

// feed hands one record to the correlator.
func (p *Pipeline) feed(in Input) {
	switch in.kind {
	case inputHost:
		if p.dump != nil {
			p.dump(in.host)
		}
		p.corr.AddHostCall(in.host)
	case inputDevice:
		if p.dump != nil {
			p.dump(in.dev)
		}
		p.corr.AddDevice(in.dev)
	default:
		p.handle(in.other)
	}
}

func (p *Pipeline) handle(in any) {
	if p.dump != nil {
		p.dump(in)
	}
	switch v := in.(type) {
	case correlate.HostCall:
		p.corr.AddHostCall(v)
	case correlate.CommInit:
		p.corr.AddCommInit(v)
	case correlate.CommDestroy:
		p.corr.AddCommDestroy(v)
	case correlate.DeviceInterval:
		p.corr.AddDevice(v)
	case correlate.CollKernel:
		p.corr.AddCollKernel(v)
	case correlate.Coverage:
		p.corr.AddCoverage(v)
	case correlate.Drop:
		p.corr.AddDrop(v)
	case correlate.RankInfo:
		p.corr.SetRank(v)
	case PluginPath:
		p.reorder.start(v.PID)
	default:
		p.log.Error("pipeline: unknown input", "type", fmt.Sprintf("%T", in))
	}
}

func (p *Pipeline) count(name string) {
	if p.countFn != nil {
		p.countFn(name, 1)
	}
}

// Tick advances event time to now (CLOCK_MONOTONIC ns): the correlator
// releases finished steps, the detector judges them and settles windows
// whose lateness allowance has passed.
func (p *Pipeline) Tick(now int64) {
	p.reorder.release(now, p.feed)
	p.corr.Advance(now)
	steps, topos := p.corr.Drain()
	p.deliver(steps, topos)
	p.verdicts = append(p.verdicts, p.advance(now)...)
	p.settle(now)
}

// Flush drains everything and settles the last windows (on stop).
func (p *Pipeline) Flush(now int64) {
	p.reorder.flush(p.feed)
	steps, topos := p.corr.Flush()
	p.deliver(steps, topos)
	p.verdicts = append(p.verdicts, p.flushDetectors()...)
	p.settle(now)
}

func (p *Pipeline) deliver(steps []detector.Step, topos []detector.Topology) {
	for _, t := range topos {
		if err := p.addTopology(t); err != nil {
			p.count("topologies_rejected")
			p.log.Warn("topology rejected", "job", t.Job, "err", err)
			continue
		}
		p.count("topology_versions")
		for _, s := range p.sinks {
			s.Topology(t)
		}
	}
	for _, st := range steps {
		vs, err := p.addStep(st)
		if err != nil {
			p.count("steps_rejected")
			p.log.Warn("step rejected", "job", st.Job, "rank", st.Rank, "step", st.Step, "err", err)
			continue
		}
		p.verdicts = append(p.verdicts, vs...)
		win, _ := p.windowOf(st.Job, st.EndNS)
		for _, s := range p.sinks {
			s.Step(st, win)
		}
		if p.duty != nil {
			if _, ok := st.Phases[detector.PhaseStep]; ok {
				p.duty.ObserveStep(st)
			}
		}
		p.noteStep(st)
	}
}

// settle hands every window settled since the last call to the sinks with
// its verdicts, and escalates device collection on suspicion.
func (p *Pipeline) settle(now int64) {
	windows := p.takeSettled()
	if len(windows) == 0 {
		return
	}
	verdicts := p.verdicts
	p.verdicts = nil
	if p.evidence != nil {
		for i := range verdicts {
			v := &verdicts[i]
			v.GPU = p.evidence(v.Job, v.Rank, v.WindowStartNS, v.WindowEndNS)
		}
	}
	byWin := map[detector.SettledWindow][]detector.Verdict{}
	for _, v := range verdicts {
		k := detector.SettledWindow{Job: v.Job, Index: v.Window, StartNS: v.WindowStartNS, EndNS: v.WindowEndNS}
		byWin[k] = append(byWin[k], v)
	}
	suspicious := false
	var from, to int64 // span of the suspicious windows
	for _, w := range windows {
		vs := byWin[w]
		for _, s := range p.sinks {
			s.Settled(w, vs)
		}
		for _, v := range vs {
			if suspect(v) {
				if !suspicious || w.StartNS < from {
					from = w.StartNS
				}
				to = max(to, w.EndNS)
				suspicious = true
			}
		}
	}
	p.logAlerts(verdicts)
	if suspicious && p.duty != nil {
		p.duty.Suspect(now, from, to)
	}
	p.noteSettled(windows, verdicts)
}

// suspect says whether a verdict asks for device records: a slow-looking
// window, or one whose exposure is unknown, since the device records' GPU
// idle time is what can tell.
func suspect(v detector.Verdict) bool {
	unknown := v.Exposure != nil && v.Exposure.Evidence == detector.EvidenceNone
	return v.State == detector.StateCandidate || v.State == detector.StateStraggler || unknown
}

// logAlerts logs each alert when it is raised and when it ends.
func (p *Pipeline) logAlerts(vs []detector.Verdict) {
	for _, v := range vs {
		k := alertKey{v.Job, v.Rank, v.Phase}
		switch {
		case v.AlertActive && !p.alerts[k]:
			p.alerts[k] = true
			p.log.Warn("STRAGGLER", "job", v.Job, "rank", v.Rank, "phase", v.Phase, "hint", v.Hint,
				"deviation", fmt.Sprintf("%+.1f%%", v.Deviation*100), "reference_rank", v.ReferenceRank, "reason", v.Reason)
		case v.State == detector.StateRecovered && p.alerts[k]:
			delete(p.alerts, k)
			p.log.Info("recovered", "job", v.Job, "rank", v.Rank, "phase", v.Phase)
		}
	}
}
