package correlate

import (
	"math"
	"slices"
	"strings"

	"github.com/slowrank/slowrank/correlate/stepdet"
	"github.com/slowrank/slowrank/detector"
)

// Correlator turns the host and device intervals of the training processes
// of one host into step and topology facts. It is not safe for concurrent
// use: one goroutine feeds it and drains it.
type Correlator struct {
	cfg Config
	par stepdet.Params

	procs      map[uint32]*proc
	order      []*proc // procs by pid, for deterministic settling
	orderDirty bool

	groups    map[uint32]*commGroup // by number
	byUID     map[uint64]*commGroup
	nextGroup uint32

	jobs map[string]*jobState

	kernelRings int // the procComms' kernel key rings (devarrival.go)

	now int64 // event time: the latest host time seen or advanced to

	steps []detector.Step
	topos []detector.Topology

	retired map[rankKey]*RankStats

	sc scratch
}

type rankKey struct {
	job  string
	rank int
	pid  uint32 // only for processes without RankInfo
}

func keyOf(st *RankStats) rankKey {
	if st.Rank < 0 {
		return rankKey{st.Job, st.Rank, st.PID}
	}
	return rankKey{job: st.Job, rank: st.Rank}
}

type scratch struct {
	sync, blocked, collWait, compute, comm, attn, moe []span
	lags                                              []int64
}

// New returns a Correlator with cfg's zero fields set to their defaults.
func New(cfg Config) *Correlator {
	cfg = cfg.withDefaults()
	return &Correlator{
		cfg: cfg,
		par: stepdet.Params{
			Repeats:     cfg.Repeats,
			MaxPeriod:   cfg.MaxPeriod,
			Confirm:     cfg.ConfirmCycles,
			Promote:     cfg.PromoteCycles,
			NoSyncMin:   cfg.NoSyncMinCalls,
			ConfirmSpan: int64(cfg.ConfirmSpan),
		},
		procs:   make(map[uint32]*proc),
		groups:  make(map[uint32]*commGroup),
		byUID:   make(map[uint64]*commGroup),
		jobs:    make(map[string]*jobState),
		retired: make(map[rankKey]*RankStats),
	}
}

// proc is the state of one training process (one rank).
type proc struct {
	pid     uint32
	info    RankInfo
	hasInfo bool

	comms    map[uint64]*procComm
	commList []*procComm // creation order
	syncPC   *procComm   // fallback clock on synchronisations

	clock       *procComm
	clockSerial uint32
	clockIdle   int  // boundaries of other locked comms while the clock is unlocked
	switched    bool // the clock changed and no step has been closed since
	idxOffset   int64
	// align: the first step under the clock takes its index from a peer's
	// step that ends at the same time (alignToPeers), since the call count
	// of the clock's communicator depends on what the recording saw. It is
	// armed again (idxOffset back to alignOff) when that step is withdrawn
	// before any step of the clock was confirmed; when the peer's step it
	// took its index from was tentative (anchor) and is withdrawn first,
	// the steps take p's own count instead (unanchor).
	align          bool
	alignOff       int64
	anchor         alignAnchor
	clockConfirmed bool
	ends           [endsN]stepEnd // latest closed steps, by index % endsN
	markerMode     bool

	sawSync, sawCollWait bool
	everColl             bool   // a collective was seen
	feedsKernels         bool   // a CollKernel came (devarrival.go)
	lastKernel           int64  // the latest start of its CollKernels
	syncCalls            uint64 // synchronisations seen

	openStart    int64
	haveOpen     bool
	lastEnd      int64 // end of the latest closed step
	lastIdx      int64 // index of the latest closed step
	emitEnd      int64 // end of the latest settled step
	emitIdx      int64
	pending      []*pendingStep
	free         []*pendingStep
	consumed     int64 // device records ending at or before this are settled
	hostConsumed int64 // host records ending at or before this are settled
	host, dev    recBuf
	cov          spanSet
	hostHoles    spanSet
	devHoles     spanSet
	dd           dedup
	names        map[uint32]uint64
	lastHost     int64
	maxDevEnd    int64
	retired      stepdet.Counts // of the detectors p no longer holds

	recent [recentN]recentComm

	stats RankStats
}

// endsN is how many closed steps a process remembers for alignToPeers: a
// peer's lock reports its first steps at once, as many as the cycles seen.
const endsN = 64

type stepEnd struct{ idx, end int64 }

// alignAnchor is a first alignment to a peer's tentative step (alignToPeers),
// kept while the aligned process's clock is not confirmed: withdrawn with
// its lock, the step no longer numbers p's steps (unanchor).
type alignAnchor struct {
	ok         bool
	pid        uint32 // the peer
	clock, gen uint32 // the peer's clock serial and lock of its step
	idx        int64  // the peer's step's index
	serial     uint32 // p's clock serial at the alignment
	at         int64  // the index p's step took from it
	own        int64  // the index p's step had without a peer
}

// syncFallbackMin is how many synchronisations a process without any
// collective must make before they become its step clock.
const syncFallbackMin = 64

// procComm is one communicator handle of one process.
type procComm struct {
	p         *proc
	handle    uint64
	grp       *commGroup
	seq       uint64           // collective calls since creation
	det       stepdet.Detector // stepdet.NewNone before the first collective
	splits    int
	sync      bool // the synchronisation fallback pseudo communicator
	regular   bool // a cycle has been confirmed on it: it carries per-step traffic
	created   bool // its creation (AddCommInit) was seen, at createdAt
	createdAt int64
	// kern pairs the plugin's kernel records with their calls
	// (devarrival.go); kernSeq is the latest call (seq) whose kernel came.
	kern    kernelKeys
	kernSeq uint64
}

func (pc *procComm) nranks() int {
	if pc.grp == nil {
		return 0
	}
	return pc.grp.nranks
}

func (c *Correlator) proc(pid uint32) *proc {
	if p := c.procs[pid]; p != nil {
		return p
	}
	p := &proc{
		pid:     pid,
		comms:   make(map[uint64]*procComm),
		lastIdx: -1,
		emitIdx: -1,
		host:    recBuf{limit: c.cfg.MaxHostRecords},
		dev:     recBuf{limit: c.cfg.MaxDeviceRecords},
		lastEnd: math.MinInt64,
		emitEnd: math.MinInt64,
	}
	p.consumed, p.hostConsumed = math.MinInt64, math.MinInt64
	p.stats.Rank = -1
	c.procs[pid] = p
	c.orderDirty = true
	return p
}

// SetRank records the identity of a process. Call it before the process's
// first events where possible: steps are only emitted for known ranks, and
// the default c10d group of a job is chosen by the job known at that time.
func (c *Correlator) SetRank(info RankInfo) {
	p := c.proc(info.PID)
	if p.hasInfo && p.info.Job != info.Job {
		c.markChanged(p.info.Job)
	}
	if info.WorldSize < 0 || info.WorldSize > MaxRanks {
		info.WorldSize = 0
		p.stats.ImplausibleSizes++
	}
	if info.Host == "" {
		info.Host = c.cfg.Host
	}
	p.info, p.hasInfo = info, true
	p.stats.Job, p.stats.Rank = info.Job, info.Rank
	c.markChanged(info.Job)
}

// Advance moves event time to nowNS (CLOCK_MONOTONIC), so that steps are
// settled after their allowances even when no new records arrive.
func (c *Correlator) Advance(nowNS int64) {
	if nowNS > c.now {
		c.now = nowNS
	}
}

// AddHostCall adds one host interval. Calls of one process must come in
// the order of their end (the order of the BPF ring buffer); small
// inversions are tolerated for the phases, but collective sequence numbers
// follow arrival order.
func (c *Correlator) AddHostCall(h HostCall) {
	p := c.proc(h.PID)
	p.stats.HostCalls++
	if h.StartNS > h.EndNS {
		h.StartNS = h.EndNS
	}
	c.Advance(h.EndNS)
	late := h.EndNS <= p.hostConsumed
	if late {
		p.stats.Late++
	} else if h.EndNS < p.lastHost {
		p.stats.Reordered++
	}
	if h.EndNS > p.lastHost {
		p.lastHost = h.EndNS
	}
	switch h.Kind {
	case HostCollective:
		c.collective(p, &h, late)
	case HostCollWait:
		p.sawCollWait = true
		if !late {
			c.hostRec(p, rec{start: h.StartNS, end: h.EndNS, kind: rCollWait})
		}
		if h.Op != "" {
			c.collective(p, &h, late)
		} else {
			call := h.stepCall()
			for _, pc := range p.commList {
				pc.det.Wait(call)
			}
		}
	case HostSyncWait:
		p.sawSync = true
		if !late {
			c.hostRec(p, rec{start: h.StartNS, end: h.EndNS, kind: rSync})
		}
		c.sync(p, &h)
	case HostMarker:
		c.marker(p, &h)
	}
}

func (c *Correlator) hostRec(p *proc, r rec) {
	if _, ev := p.host.insert(r); ev {
		p.stats.Evicted++
	}
}

// urgent reports whether p's buffers of steps and records are half full,
// so that a first lock must not be held back any longer (ConfirmSpan).
func (c *Correlator) urgent(p *proc) bool {
	return len(p.pending) >= c.cfg.MaxPending/2 || p.host.len() >= c.cfg.MaxHostRecords/2 ||
		p.dev.len() >= c.cfg.MaxDeviceRecords/2
}

func (c *Correlator) collective(p *proc, h *HostCall, late bool) {
	p.everColl = true
	pc := c.procComm(p, h.Comm)
	pc.seq++
	if g := pc.grp; g != nil {
		f := h.Op.flags()
		if g.ops|f != g.ops {
			g.ops |= f
			c.markGroupDirty(g)
		}
		// A plugin call of a communicator whose kernels come is noted
		// with one member too: their time goes into the step's
		// DeviceCollMS (devarrival.go).
		if g.live >= 2 || h.HasNCCLSeq && pc.kern != nil {
			key := callKey(h)
			if s, ok := g.names.seqOf(key); key != 0 && ok && s != pc.seq {
				// A peer noted this call under another ordinal: one of the
				// captures counted a call the other did not (before the
				// plugin named the calls). p's calls take the peer's.
				pc.seq = s
				p.stats.ArrivalRealigned++
			}
			if !g.noteStart(pc, pc.seq, h.StartNS, key) {
				p.stats.ArrivalMisaligned++
			}
			if !late {
				c.hostRec(p, rec{start: h.StartNS, end: h.EndNS, kind: rColl, aux: pc.seq, ref: g.num})
			}
		}
	}
	if h.HasNCCLSeq {
		c.keyCall(pc, h.Op, h.NCCLSeq, pc.seq)
	}
	call := h.stepCall()
	if pc.det.Yield(call) {
		c.onEvents(p, pc)
		p.retired.Add(pc.det.Status().Counts)
		pc.det = c.newDetector(pc, h)
	}
	pc.det.Collective(call, c.urgent(p))
	c.onEvents(p, pc)
}

// newDetector chooses the step detection of a communicator at collective
// h. Collectives without sizes (torch c10d) make a degenerate token
// sequence: their timing finds the steps (burst.go) until a call with a
// size shows that the tokens can. NCCL calls always carry sizes.
func (c *Correlator) newDetector(pc *procComm, h *HostCall) stepdet.Detector {
	if h.Count == 0 {
		return stepdet.NewBurst(c.par)
	}
	// Seen from its creation, the first call is token 0.
	return stepdet.NewSeq(c.par, pc.created && pc.seq == 1, pc.createdAt)
}

func (c *Correlator) sync(p *proc, h *HostCall) {
	call := h.stepCall()
	for _, pc := range p.commList {
		pc.det.Sync(call, c.urgent(p))
		c.onEvents(p, pc)
	}
	p.syncCalls++
	if p.clock != nil && !p.clock.sync {
		return // collectives drive the steps
	}
	// Until a communicator is the clock, the synchronisations may be: a
	// collective seen does not stop them (the transformers Trainer's
	// logging all-gather every 500 iterations; model copies to the GPU
	// before DDP's first broadcast make no steps: see stepdet's seqDet.boundary).
	if p.syncPC == nil {
		p.syncPC = &procComm{p: p, sync: true, det: stepdet.NewSyncClock(c.par, &p.everColl)}
	}
	p.syncPC.det.Sync(call, c.urgent(p))
	if p.syncCalls < syncFallbackMin {
		p.syncPC.det.Status().Take() // too early to tell that no collective will come
		return
	}
	c.onEvents(p, p.syncPC)
}

func (c *Correlator) marker(p *proc, h *HostCall) {
	if !p.markerMode {
		c.dropTentative(p)
		p.markerMode = true
		p.haveOpen = false
		p.clock = nil
		p.clockSerial++
	}
	t := h.EndNS
	if p.haveOpen && t > p.openStart {
		idx := p.lastIdx + 1
		if h.Count > 0 {
			idx = int64(h.Count)
		}
		if idx > p.lastIdx {
			c.closeStep(p, p.openStart, t, idx, 0, false)
		}
	}
	p.open(t)
}

func (p *proc) open(t int64) {
	p.openStart, p.haveOpen = max(t, p.lastEnd), true
}

func (c *Correlator) procComm(p *proc, handle uint64) *procComm {
	if pc := p.comms[handle]; pc != nil {
		return pc
	}
	pc := &procComm{p: p, handle: handle, det: stepdet.NewNone()}
	if handle == 0 {
		// c10d calls without a known group: one default group per job.
		c.join(c.group(defaultUID(p.info.Job), 0, true), pc)
	}
	p.comms[handle] = pc
	p.commList = append(p.commList, pc)
	return pc
}

// AddCommInit records a communicator creation.
func (c *Correlator) AddCommInit(ci CommInit) {
	p := c.proc(ci.PID)
	if ci.NRanks < 0 || ci.NRanks > MaxRanks {
		ci.NRanks = 0
		p.stats.ImplausibleSizes++
	}
	uid := ci.UniqueIDHash
	if uid == 0 && ci.Parent != 0 {
		if parent := p.comms[ci.Parent]; parent != nil {
			parent.splits++
			if parent.grp != nil && !parent.grp.pseudo {
				uid = mix64(parent.grp.uid ^ mix64(uint64(parent.splits)<<32^uint64(uint32(int32(ci.Color)))))
			}
		}
	}
	if ci.Comm == 0 {
		return // a split that gave this rank no communicator
	}
	if old := p.comms[ci.Comm]; old != nil {
		c.retireComm(p, old)
	}
	pc := &procComm{p: p, handle: ci.Comm, det: stepdet.NewNone(), created: true, createdAt: ci.AtNS}
	if uid != 0 {
		c.join(c.group(uid, ci.NRanks, false), pc)
	}
	p.comms[ci.Comm] = pc
	p.commList = append(p.commList, pc)
	c.markChanged(p.info.Job)
}

// AddCommDestroy records ncclCommDestroy/ncclCommAbort.
func (c *Correlator) AddCommDestroy(cd CommDestroy) {
	p := c.procs[cd.PID]
	if p == nil {
		return
	}
	if pc := p.comms[cd.Comm]; pc != nil {
		// Its cycle lasted until its end, as at a process's exit: a
		// tentative lock that held its cycles is confirmed, not dropped
		// (torch's destroy_process_group at the end of training).
		pc.det.Finish(true)
		c.onEvents(p, pc)
		c.retireComm(p, pc)
	}
}

func (c *Correlator) retireComm(p *proc, pc *procComm) {
	delete(p.comms, pc.handle)
	c.kernelRings -= len(pc.kern)
	if i := slices.Index(p.commList, pc); i >= 0 {
		p.commList = slices.Delete(p.commList, i, i+1)
	}
	p.retired.Add(pc.det.Status().Counts)
	if p.clock == pc {
		c.dropTentative(p)
		p.clock = nil
		p.haveOpen = false
	}
	c.leave(pc)
	c.markChanged(p.info.Job)
}

// AddDevice adds one device interval. Records may come late and out of
// order: they are placed by their end time while their step is not
// settled (Config.DeviceReorder after its end); later ones count as late.
func (c *Correlator) AddDevice(d DeviceInterval) {
	p := c.proc(d.PID)
	p.stats.DeviceRecords++
	if d.EndNS < d.StartNS {
		p.stats.Unassigned++
		return
	}
	if p.dd.seen(d.Corr, d.StartNS) {
		p.stats.Duplicate++
		return
	}
	if d.EndNS <= p.consumed {
		p.stats.Late++
		return
	}
	r := rec{start: d.StartNS, end: d.EndNS}
	switch {
	case d.Kind != DeviceKernel || d.Class == ClassCopy:
		r.kind = rCopy
	case d.Class == ClassComm:
		r.kind = rComm
	default:
		switch d.Class {
		case ClassAttention:
			r.kind = rAttn
		case ClassMoE:
			r.kind = rMoE
		default:
			r.kind = rKernel
		}
		r.aux = c.kernelHash(p, &d)
	}
	if r.end > p.maxDevEnd {
		p.maxDevEnd = r.end
	}
	reordered, evicted := p.dev.insert(r)
	if reordered {
		p.stats.Reordered++
	}
	if evicted {
		p.stats.Evicted++
	}
}

// AddCoverage records that device collection of a process was on.
func (c *Correlator) AddCoverage(cv Coverage) {
	c.proc(cv.PID).cov.add(cv.StartNS, cv.EndNS)
}

// AddDrop records capture losses. Steps that overlap a host loss are not
// emitted; steps that overlap a device loss are emitted with gpu:false.
func (c *Correlator) AddDrop(d Drop) {
	if d.ToNS < d.FromNS {
		d.ToNS = d.FromNS
	}
	apply := func(p *proc) {
		p.stats.DroppedHost += d.Host
		p.stats.DroppedDevice += d.Device
		if d.Host > 0 {
			p.hostHoles.add(d.FromNS, max(d.ToNS, 1))
		}
		if d.Device > 0 {
			p.devHoles.add(d.FromNS, max(d.ToNS, 1))
		}
	}
	if d.PID != 0 {
		apply(c.proc(d.PID))
		return
	}
	for _, p := range c.procs {
		apply(p)
	}
}

// Forget settles and emits what a process left (call it after its last
// records were added) and drops its state. Its counters stay in Stats.
func (c *Correlator) Forget(pid uint32) {
	p := c.procs[pid]
	if p == nil {
		return
	}
	c.finish(p, true)
	c.dropTentative(p)
	c.measureDue(p, true)
	c.emitReady(p, true)
	for _, pc := range slices.Clone(p.commList) {
		c.retireComm(p, pc)
	}
	st := c.statsOf(p)
	k := keyOf(&st)
	if r := c.retired[k]; r != nil {
		r.Add(st)
		r.PID = st.PID
	} else if len(c.retired) < 4096 {
		c.retired[k] = &st
	}
	delete(c.procs, pid)
	c.orderDirty = true
	c.markChanged(p.info.Job)
	if len(c.jobs) > maxJobs {
		c.pruneJobs()
	}
}

// finish ends the step detection of p's sequences: a tentative lock that
// held its cycles is confirmed (a cycle that lasted until the end is no
// init-time burst) and, when the process ended (exited), a burst complete
// by count is reported.
func (c *Correlator) finish(p *proc, exited bool) {
	for _, pc := range p.commList {
		pc.det.Finish(exited)
		c.onEvents(p, pc)
	}
	if p.syncPC != nil && p.syncCalls >= syncFallbackMin {
		p.syncPC.det.Finish(exited)
		c.onEvents(p, p.syncPC)
	}
}

// maxJobs bounds the remembered jobs; jobs without live processes are
// forgotten beyond it (their topology version would restart at 1).
const maxJobs = 256

func (c *Correlator) pruneJobs() {
	live := make(map[string]bool)
	for _, p := range c.procs {
		live[p.info.Job] = true
	}
	for name := range c.jobs {
		if !live[name] {
			delete(c.jobs, name)
		}
	}
}

func (c *Correlator) sortedJobs() []*jobState {
	js := make([]*jobState, 0, len(c.jobs))
	for _, j := range c.jobs {
		js = append(js, j)
	}
	slices.SortFunc(js, func(a, b *jobState) int { return strings.Compare(a.name, b.name) })
	return js
}

// Drain settles the steps whose allowances have passed and returns the
// facts produced since the last call. Topology facts come first in their
// slice and precede (in version) the steps that refer to them; write them
// out first.
func (c *Correlator) Drain() ([]detector.Step, []detector.Topology) {
	c.pump(false)
	for _, j := range c.sortedJobs() {
		if j.version > 0 {
			c.refreshTopology(j)
		}
	}
	steps, topos := c.steps, c.topos
	c.steps, c.topos = nil, nil
	return steps, topos
}

// Flush settles everything (tentative steps are dropped, pending ones are
// emitted without further waiting) and returns the remaining facts.
func (c *Correlator) Flush() ([]detector.Step, []detector.Topology) {
	c.refreshOrder()
	for _, p := range c.order {
		c.finish(p, false)
		c.dropTentative(p)
	}
	c.pump(true)
	for _, j := range c.sortedJobs() {
		c.refreshTopology(j)
	}
	steps, topos := c.steps, c.topos
	c.steps, c.topos = nil, nil
	return steps, topos
}

// Stats returns the counters per rank (the live process's and those of
// forgotten processes of the same job and rank added up), sorted by job
// and rank. PID is the latest process of the rank.
func (c *Correlator) Stats() []RankStats {
	m := make(map[rankKey]*RankStats, len(c.procs)+len(c.retired))
	for k, r := range c.retired {
		v := *r
		m[k] = &v
	}
	for _, p := range c.procs {
		st := c.statsOf(p)
		if r := m[keyOf(&st)]; r != nil {
			r.Add(st)
			r.PID = st.PID
		} else {
			m[keyOf(&st)] = &st
		}
	}
	out := make([]RankStats, 0, len(m))
	for _, r := range m {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b RankStats) int {
		if a.Job != b.Job {
			return strings.Compare(a.Job, b.Job)
		}
		if a.Rank != b.Rank {
			return a.Rank - b.Rank
		}
		return int(a.PID) - int(b.PID)
	})
	return out
}

func (c *Correlator) statsOf(p *proc) RankStats {
	st := p.stats
	st.PID = p.pid
	if p.hasInfo {
		st.Job, st.Rank = p.info.Job, p.info.Rank
	}
	n := p.retired
	for _, pc := range p.commList {
		n.Add(pc.det.Status().Counts)
	}
	st.IrregularCalls += n.Irregular
	st.Relocks += n.Relocks
	st.InitCalls += n.InitCalls
	return st
}

// Add adds o's counters to r (PID and identity stay r's).
func (r *RankStats) Add(o RankStats) {
	r.HostCalls += o.HostCalls
	r.DeviceRecords += o.DeviceRecords
	r.Steps += o.Steps
	r.Late += o.Late
	r.Duplicate += o.Duplicate
	r.Reordered += o.Reordered
	r.DroppedHost += o.DroppedHost
	r.DroppedDevice += o.DroppedDevice
	r.IrregularCalls += o.IrregularCalls
	r.Retracted += o.Retracted
	r.BurstSteps += o.BurstSteps
	r.Relocks += o.Relocks
	r.InitCalls += o.InitCalls
	r.Unassigned += o.Unassigned
	r.Evicted += o.Evicted
	r.InvalidSteps += o.InvalidSteps
	r.DegradedSteps += o.DegradedSteps
	r.NoRankSteps += o.NoRankSteps
	r.ArrivalTimeout += o.ArrivalTimeout
	r.KernelRecords += o.KernelRecords
	r.KernelsUnmatched += o.KernelsUnmatched
	r.DeviceArrivalTimeout += o.DeviceArrivalTimeout
	r.ArrivalMisaligned += o.ArrivalMisaligned
	r.ArrivalRealigned += o.ArrivalRealigned
	r.ImplausibleSizes += o.ImplausibleSizes
}

func (c *Correlator) refreshOrder() {
	if !c.orderDirty {
		return
	}
	c.order = c.order[:0]
	for _, p := range c.procs {
		c.order = append(c.order, p)
	}
	slices.SortFunc(c.order, func(a, b *proc) int { return int(a.pid) - int(b.pid) })
	c.orderDirty = false
}
