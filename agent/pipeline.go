package agent

import (
	"fmt"
	"log/slog"
	"sort"
	"sync"

	"github.com/slowrank/slowrank/correlate"
	"github.com/slowrank/slowrank/detector"
)

// Sink receives the agent's results. Calls come from the pipeline goroutine,
// in order: a step's Step call precedes the Settled call of its window. A
// Sink must not block for long: it owns its own bounded queue.
type Sink interface {
	Topology(detector.Topology)
	Step(s detector.Step, window int64)
	Settled(w detector.SettledWindow, verdicts []detector.Verdict)
}

// pipeline owns the correlator and the detector. Only its goroutine touches
// them; the status snapshot is the one thing shared, under mu.
type pipeline struct {
	log   *slog.Logger
	corr  *correlate.Correlator
	det   *detector.Detector
	duty  *Duty
	sinks []Sink
	// evidence, when set, gives the GPU evidence of a rank over a window.
	evidence func(job string, rank int, start, end int64) *detector.GPUEvidence
	// dump, when set, receives every capture record (Config.Dump).
	dump func(any)
	// verdicts returned by the detector and not yet handed to the sinks.
	verdicts []detector.Verdict
	// alerts are the active (job, rank, phase) alerts, to log transitions.
	alerts map[alertKey]bool
	// swap routes steps while a detector change settles (control.go).
	swap detectorSwap
	// counters are the agent's (nil in tests that build a bare pipeline).
	counters *counters
	// retired sums the correlator's statistics of forgotten processes.
	retired correlate.RankStats
	// reorder holds the inputs of processes on the NCCL plugin path until
	// the plugin's records of the same time have come (reorder.go).
	reorder *pluginReorder

	mu     sync.Mutex
	status pipelineStatus
}

type pipelineStatus struct {
	steps    map[rankKey]detector.Step
	verdicts map[rankKey]detector.Verdict // latest non-ok verdict per rank
	recent   []detector.Verdict           // last verdicts, newest last
	windows  int64
	facts    int64
	verdictN int64
}

type alertKey struct {
	job   string
	rank  int
	phase string
}

type rankKey struct {
	job  string
	rank int
}

const recentVerdicts = 64

func newPipeline(log *slog.Logger, corr *correlate.Correlator, det *detector.Detector, duty *Duty, sinks []Sink) *pipeline {
	return &pipeline{
		log: log, corr: corr, det: det, duty: duty, sinks: sinks, alerts: map[alertKey]bool{},
		reorder: newPluginReorder(nil),
		status:  pipelineStatus{steps: map[rankKey]detector.Step{}, verdicts: map[rankKey]detector.Verdict{}},
	}
}

// handleInput feeds one record from the reader goroutine, or holds it
// while its process's plugin records may still come.
func (p *pipeline) handleInput(in input) {
	if !p.reorder.hold(in, p.feed) {
		p.feed(in)
	}
}

// feed hands one record to the correlator.
func (p *pipeline) feed(in input) {
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

func (p *pipeline) handle(in any) {
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
	case correlate.Coverage:
		p.corr.AddCoverage(v)
	case correlate.Drop:
		p.corr.AddDrop(v)
	case correlate.RankInfo:
		p.corr.SetRank(v)
	case pluginPath:
		p.reorder.start(v.pid)
	case forget:
		p.reorder.forget(v.pid, p.feed)
		for _, st := range p.corr.Stats() {
			if st.PID == v.pid {
				p.retired.Add(st)
			}
		}
		p.corr.Forget(v.pid)
		if p.duty != nil {
			p.duty.Forget(v.rank)
		}
	default:
		p.log.Error("pipeline: unknown input", "type", fmt.Sprintf("%T", in))
	}
}

func (p *pipeline) count(name string) {
	if p.counters != nil {
		p.counters.add(name, 1)
	}
}

// corrTotals sums the correlator's statistics over live and forgotten
// processes.
func (p *pipeline) corrTotals() correlate.RankStats {
	t := p.retired
	for _, st := range p.corr.Stats() {
		t.Add(st)
	}
	return t
}

// pluginPath tells the pipeline that a process's collectives come from the
// NCCL plugin from now on (convert_nccl.go): its inputs are reordered.
type pluginPath struct{ pid uint32 }

// forget tells the pipeline that a process exited.
type forget struct {
	pid  uint32
	rank int
}

// tick advances event time to now (CLOCK_MONOTONIC ns): the correlator
// releases finished steps, the detector judges them and settles windows whose
// lateness allowance has passed.
func (p *pipeline) tick(now int64) {
	p.reorder.release(now, p.feed)
	p.corr.Advance(now)
	steps, topos := p.corr.Drain()
	p.deliver(steps, topos)
	p.verdicts = append(p.verdicts, p.advance(now)...)
	p.settle(now)
}

// flush drains everything and settles the last windows (on stop).
func (p *pipeline) flush(now int64) {
	p.reorder.flush(p.feed)
	steps, topos := p.corr.Flush()
	p.deliver(steps, topos)
	p.verdicts = append(p.verdicts, p.flushDetectors()...)
	p.settle(now)
}

func (p *pipeline) deliver(steps []detector.Step, topos []detector.Topology) {
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
			if ms, ok := st.Phases[detector.PhaseStep]; ok {
				p.duty.ObserveStep(st.Rank, st.EndNS, ms, st.GPU)
			}
		}
		p.mu.Lock()
		p.status.steps[rankKey{st.Job, st.Rank}] = st
		p.status.facts++
		p.mu.Unlock()
	}
}

// settle hands every window settled since the last call to the sinks with its
// verdicts, and escalates device collection on suspicion.
func (p *pipeline) settle(now int64) {
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
			// A slow-looking window whose exposure is unknown asks for device
			// records too: their GPU idle time is what can tell.
			unknown := v.Exposure != nil && v.Exposure.Evidence == detector.EvidenceNone
			if v.State == detector.StateCandidate || v.State == detector.StateStraggler || unknown {
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
	p.mu.Lock()
	defer p.mu.Unlock()
	p.status.windows += int64(len(windows))
	p.status.verdictN += int64(len(verdicts))
	for _, v := range verdicts {
		p.status.verdicts[rankKey{v.Job, v.Rank}] = v
	}
	p.status.recent = append(p.status.recent, verdicts...)
	if n := len(p.status.recent); n > recentVerdicts {
		p.status.recent = append([]detector.Verdict(nil), p.status.recent[n-recentVerdicts:]...)
	}
}

// logAlerts logs each alert when it is raised and when it ends.
func (p *pipeline) logAlerts(vs []detector.Verdict) {
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

// RankView is one row of the live view: a rank's latest step and verdict.
type RankView struct {
	Job     string
	Rank    int
	Host    string
	Step    detector.Step
	Verdict *detector.Verdict // latest non-ok verdict, if any
}

// snapshot returns the live view rows ordered by (job, rank), the last
// verdicts and counters.
func (p *pipeline) snapshot() ([]RankView, []detector.Verdict, int64, int64, int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rows := make([]RankView, 0, len(p.status.steps))
	for k, st := range p.status.steps {
		row := RankView{Job: k.job, Rank: k.rank, Host: st.Host, Step: st}
		if v, ok := p.status.verdicts[k]; ok {
			v := v
			row.Verdict = &v
		}
		rows = append(rows, row)
	}
	sort.Slice(rows, func(a, b int) bool {
		if rows[a].Job != rows[b].Job {
			return rows[a].Job < rows[b].Job
		}
		return rows[a].Rank < rows[b].Rank
	})
	return rows, append([]detector.Verdict(nil), p.status.recent...), p.status.windows, p.status.facts, p.status.verdictN
}
