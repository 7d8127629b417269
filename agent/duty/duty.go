package duty

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/internal/stats"
)

// MinPeriod is the shortest duty period: the injection library reads a
// shorter one as off (SLOWRANK_MIN_PERIOD_MS in cupti/slowrank_abi.h).
const MinPeriod = 100 * time.Millisecond

// MinWindow is the shortest detector window the agent takes: the duty
// period follows the window down to it (a window must contain covered
// steps), so a shorter window would switch device collection off.
const MinWindow = MinPeriod

// Config steers device-record collection under one overhead budget.
//
// Always-on CUPTI kernel records cost +0.8 % to +8.4 % of step time on an
// H200 (DESIGN.md section 2), so device records are sampled: collection is on
// for a share of each period and switched fully on for Escalation when a
// window turns suspicious. One ledger pays for everything the agent adds to
// training: device collection (base share and escalations, at the upper
// bound of the measured cost), uprobe traps, the NCCL operations the
// injection library reports as NCCL's profiler plugin, and the library's
// thread; the spend over Horizon stays within Budget.
type Config struct {
	// Budget is the overhead the agent may add to training, as a fraction
	// of step time (0.003 = 0.3 %).
	Budget float64
	// Period is the length of one on/off cycle.
	Period time.Duration
	// MinShare and MaxShare bound the on-share outside escalations. A
	// MinShare above 0 is a floor the budget may not pay for (pinned shares
	// use it); MaxShare below 1 leaves off steps to measure the cost against.
	MinShare, MaxShare float64
	// PriorCost is the assumed cost of full collection until measured.
	PriorCost float64
	// Escalation is how long collection stays fully on after a suspicion.
	// When the ledger cannot pay for all of it, the longest escalation it
	// can pay is granted if it lasts MinEscalation (a window) or more.
	Escalation, MinEscalation time.Duration
	// Advance is the training time whose budget the ledger may spend from
	// the start: it allows Budget × max(training, Advance), so that the
	// cost is measured and a job's first escalation is paid in its first
	// minute, and is repaid by the base share before anything else is
	// spent. From Advance of training on, the spend is within Budget ×
	// training again.
	Advance time.Duration
	// EscalationReserve is the share of Budget that the base share leaves
	// for escalations; an escalation is granted only when the ledger can
	// pay for it.
	EscalationReserve float64
	// Horizon is the ledger's sliding window.
	Horizon time.Duration
	// UprobeCost is the cost of one uprobe trap in the training process
	// (the H200 measured 1.0-1.35 us a trap in a host-bound NCCL loop in
	// session 11, 5.4-6.9 us a probed call before: 6 us is conservative).
	// It is charged where it lengthens the step: trap time that the host's
	// wait for the device in the same steps covers is not (Traps).
	UprobeCost time.Duration
	// NCCLPluginCost is the cost of one NCCL operation (a collective, or one
	// send or recv) that the injection library records as NCCL's profiler
	// plugin (Config.NCCLPlugin), in the training process. It is charged as
	// critical-path time, none of it hidden in the host's wait for the
	// device (ObservePluginOps). The H200 measured 0.27-0.46 us an operation
	// at world size 1, the upper ends of the 95 % intervals 0.29-0.49 us
	// (bench/results/nccl-plugin-cost-s17.json), against 1-2 us a uprobe
	// trap; the cost of the kernel-channel events could not be measured
	// there (a self send has none), so the default is twice the upper end.
	NCCLPluginCost time.Duration
	// LibraryCost is an allowance for the injection library's threads, as
	// a fraction of step time.
	LibraryCost float64
	// MinPairs is the number of paired on/off blocks needed before the
	// measured cost replaces the prior.
	MinPairs int
	// PairSteps is how many off steps before and after an on-block it is
	// compared with.
	PairSteps int
	// PairTolerance and PairNoise drop a pair whose off steps before and
	// after the on-block differ by more than both PairTolerance and
	// PairNoise standard errors of the difference of their medians, the
	// standard error estimated from the pair's own off steps (the job's
	// own step time moved, beyond its step-to-step jitter).
	PairTolerance float64
	PairNoise     float64
	// MinOnSteps is the number of whole steps an on-block must hold: a
	// shorter one gives no covered step (correlate marks a step gpu only
	// when collection was on for all of it) and no pair for the estimate.
	// When the share would make the blocks shorter, the period is doubled
	// (up to MaxPeriod) and the blocks grow with it at the same share.
	MinOnSteps int
	// MaxPeriod bounds that doubling.
	MaxPeriod time.Duration
	// KernelChannels is --nccl-kernel-channels: the NCCL plugin's
	// kernel-channel events measured apart and kept only while they cost
	// less than KernelChannelLimit of step time in an on-phase (auto,
	// kch.go), or on or off as the operator says. A trial decides
	// once both arms have KernelChannelPairs paired blocks, and keeps them
	// after KernelChannelMaxPairs if it cannot tell.
	KernelChannels        KernelChannelMode
	KernelChannelLimit    float64
	KernelChannelPairs    int
	KernelChannelMaxPairs int
}

// DefaultConfig returns a budget of 0.3 % over an hour, a quarter of it
// reserved for escalations, the first 10 minutes' budget (1.8 s of cost)
// spendable from the start, 10 s periods and 15 s escalations (three of the
// detector's default 5-s windows: the streak a straggler needs; Greyhound's
// detailed-profiling window is 20 s).
func DefaultConfig() Config {
	return Config{
		Budget: 0.003, Period: 10 * time.Second, MinShare: 0, MaxShare: 0.5,
		PriorCost: 0.03, Escalation: 15 * time.Second, MinEscalation: 5 * time.Second, EscalationReserve: 0.25, Advance: 10 * time.Minute,
		Horizon: time.Hour, UprobeCost: 6 * time.Microsecond, NCCLPluginCost: time.Microsecond, LibraryCost: 0.0001,
		MinPairs: 8, PairSteps: 8, PairTolerance: 0.02, PairNoise: 3,
		MinOnSteps: 4, MaxPeriod: 16 * time.Minute,
		KernelChannelLimit: 0.01, KernelChannelPairs: 8, KernelChannelMaxPairs: 24,
	}
}

// Plan is what the injection library is asked to do.
type Plan struct {
	OnShare  float64       // share of each period with collection on
	Period   time.Duration // length of one cycle
	Escalate bool          // collection fully on until EscalatedUntil
	// EscalatedUntil is in the caller's monotonic nanoseconds.
	EscalatedUntil int64
	// Cost is the estimated overhead of full collection, and Measured
	// whether it comes from this run's on/off pairs rather than the prior.
	Cost     float64
	Measured bool
	// Overhead is the cost estimate and the ledger behind the plan.
	Overhead Overhead
	// KernelChannels: the NCCL plugin's kernel-channel events may be on in
	// on-phases (kch.go).
	KernelChannels bool
}

// CostEstimate is the overhead of full device collection, as a fraction of
// step time, with its 95 % confidence interval. Until Measured it is the
// prior (Low = High = Cost).
type CostEstimate struct {
	Cost     float64 `json:"cost"`
	Low      float64 `json:"low"`
	High     float64 `json:"high"`
	Pairs    int     `json:"pairs"` // paired blocks behind the estimate
	Measured bool    `json:"measured"`
}

// PairDrops counts on/off pairs left out of the estimate, by reason.
type PairDrops struct {
	Short   int64 `json:"short"`   // too few steps on a side
	Drift   int64 `json:"drift"`   // the off steps before and after disagree
	Suspect int64 `json:"suspect"` // overlaps a suspicious window or an escalation
}

// Overhead is what the agent costs the training job: the ledger's spend over
// its horizon, as fractions of training time, against the budget.
type Overhead struct {
	Budget  float64      `json:"budget"`
	Cost    CostEstimate `json:"cost"`
	Device  float64      `json:"spent_device"`
	Uprobes float64      `json:"spent_uprobes"`
	// UprobesHidden is trap time not charged: the host waited for the
	// device longer than that in the same steps (Traps).
	UprobesHidden float64 `json:"hidden_uprobes"`
	// NCCLPlugin is the NCCL operations the profiler plugin recorded
	// (ObservePluginOps).
	NCCLPlugin float64 `json:"spent_nccl_plugin"`
	Library    float64 `json:"spent_library"`
	Total      float64 `json:"spent_total"`
	// Training is the training time in the horizon that the spend is
	// divided by.
	Training time.Duration `json:"training_ns"`
	// Allowance is what the ledger may spend over its horizon, in
	// seconds of cost: Budget × max(Training, Advance).
	Allowance          float64 `json:"allowance_s"`
	EscalationsGranted int64   `json:"escalations_granted"`
	EscalationsRefused int64   `json:"escalations_refused"`
	// Refused says why the last escalation was refused.
	Refused      string    `json:"escalation_refused_reason,omitempty"`
	PairsDropped PairDrops `json:"pairs_dropped"`
	// Calibrating: the plan runs on-blocks sized to measure the cost
	// (Ledger.calibrate) rather than the budget's base share.
	Calibrating bool `json:"calibrating,omitempty"`
	// KernelChannels is the NCCL plugin's kernel-channel trial, once a
	// plugin operation was seen or the operator decided.
	KernelChannels *KernelChannels `json:"nccl_kernel_channels,omitempty"`
}

const (
	// maxClusters bounds the paired blocks kept for the estimate.
	maxClusters = 64
	// maxOnSteps bounds the steps kept of one on-block (an escalation).
	maxOnSteps = 256
	// maxExcluded bounds the suspicious spans kept.
	maxExcluded = 64
	// stepWindow is how many recent steps (all ranks) the step time that
	// sizes the on-blocks is the median of.
	stepWindow = 16
	// trimFraction is trimmed from each end of the pair ratios: a stall of
	// the job that falls into one on-block must not read as cost.
	trimFraction = 0.1
	// minPairSide is the fewest off steps a side of a pair may have.
	minPairSide = 3
	// calibrateHalfWidth is the half-width of the cost interval up to which
	// the first Advance keeps calibrating (Ledger.calibrate): the plan is
	// priced at the interval's upper end, and the 8 blocks that make an
	// estimate leave it ±1.5-2.5 % wide at 3 % step jitter, so that an
	// escalation at the upper end could cost more than at the prior.
	calibrateHalfWidth = 0.01
	// ledgerBuckets divide the horizon.
	ledgerBuckets = 360
	// recentBuckets is the ledger's recent past (a minute at 1 h) that the
	// rate of the uprobes and the plugin is planned from.
	recentBuckets = 6
	// activeGrace is how long after the last step or trap the job counts
	// as training.
	activeGrace = int64(30 * time.Second)
)

// Ledger estimates the cost of device collection from paired on/off blocks
// inside the run, keeps the overhead ledger and plans the duty cycle. It is
// pure: time comes in with each call. Not safe for concurrent use.
//
// The estimate: per rank, each on-block (consecutive steps with device
// records) is compared with the median of up to PairSteps off steps before
// and after it, both sides required, the off step on each side of the block
// left out (partly collected); a gap between two blocks shorter than
// 2·PairSteps is shared out between them, no off step serving both. Ratio r = median(on)/mean(before, after) − 1.
// The ranks of a host share the duty phase, so their pairs of one block are
// one observation (they move together in synchronous training): the
// estimate is a trimmed mean over blocks with a Tukey–McLaughlin t-interval.
type Ledger struct {
	cfg   Config
	ranks map[int]*rankPairing
	// steps are the latest step times in ms (a ring of stepWindow).
	steps  []float64
	stepAt int
	// slack is the job's wait for the device by step, that traps hide in
	// (Traps).
	slack jobSlack
	// lastPeriod is the period of the last plan.
	lastPeriod time.Duration
	// clusters are the recent paired blocks, oldest first.
	clusters []pairCluster
	excluded []span
	drops    PairDrops

	// ledger
	buckets    []ledgerBucket
	started    bool
	last       int64 // last advance
	activity   int   // steps, trap and plugin reports since the last advance
	lastActive int64
	share      float64 // on-share in force since the last advance
	// collecting: some process can collect (SetCollecting; true until
	// told otherwise); device on-time is charged only then.
	collecting        bool
	escFrom, escUntil int64
	granted, refused  int64
	refusal           string // why the last escalation was refused
	calibrating       bool   // the last plan was a calibration plan
	est               CostEstimate
	estValid          bool
	bucketLen         int64
	kch               kchTrial // kch.go
}

type span struct{ from, to int64 }

func (s span) overlaps(from, to int64) bool { return from < s.to && s.from < to }

// pairCluster is one on-block paired across the ranks that saw it.
type pairCluster struct {
	on, whole span // the on-block; with its off steps
	sum       float64
	n         int
	arm       int8 // the kernel-channel trial's arm (kchTrial.armOf)
}

// ledgerBucket is one slice of the horizon: training seconds and spend in
// cost-seconds. Device on-time before the cost was measured is kept as
// on-seconds (priorOn) and charged at the current cost, so that a prior
// below the true cost is trued up once it is measured.
type ledgerBucket struct {
	idx                             int64
	train, device, uprobes, library float64
	plugin                          float64 // NCCL profiler plugin operations (ObservePluginOps)
	priorOn                         float64
	hidden                          float64 // trap time not charged (Traps)
}

// rankPairing pairs one rank's on-blocks with their neighbouring off steps.
type rankPairing struct {
	lastEnd int64
	off     []offStep // the last PairSteps+1 clean off steps, oldest first
	inBlock bool      // in an on-block
	pending bool      // block ended, collecting off steps after it
	// gap is the off steps since the last block ended (its partly
	// collected first one left out), taken how many of them that block's
	// after side holds: no off step counts for two blocks, whose ratios
	// would then be correlated and their interval too narrow. A gap
	// shorter than 2·PairSteps+2 is shared out between the two blocks.
	gap, taken int
	cur        pairing
}

type offStep struct {
	ms         float64
	start, end int64
}

type pairing struct {
	beforeMed float64
	before    []float64 // the off steps before, ms
	beforeN   int
	from      int64 // start of the first off step before
	on        []float64
	onFrom    int64
	onTo      int64
	after     []float64
	to        int64 // end of the last off step after
}

// New returns a controller.
func New(cfg Config) *Ledger {
	d := &Ledger{cfg: cfg, ranks: map[int]*rankPairing{}, buckets: make([]ledgerBucket, ledgerBuckets), collecting: true}
	d.bucketLen = max(int64(cfg.Horizon)/ledgerBuckets, 1)
	for i := range d.buckets {
		d.buckets[i].idx = math.MinInt64
	}
	return d
}

// Config returns the ledger's settings.
func (d *Ledger) Config() Config { return d.cfg }

// SetConfig changes the ledger's settings (runtime control); the next Plan
// uses them, what the ledger measured and spent stays.
func (d *Ledger) SetConfig(cfg Config) { d.cfg = cfg }

// ObserveStep records a rank's step fact: its end, wall time, whether the
// whole step had device collection on (its gpu flag), and the host's wait
// for the device and the device's idle time in it (Traps).
func (d *Ledger) ObserveStep(st detector.Step) {
	rank, endNS, gpuOn := st.Rank, st.EndNS, st.GPU
	stepMS := st.Phases[detector.PhaseStep]
	d.activity++
	if !(stepMS > 0) {
		return
	}
	d.steps, d.stepAt = pushRing(d.steps, d.stepAt, stepMS)
	p := d.ranks[rank]
	if p == nil {
		p = &rankPairing{}
		d.ranks[rank] = p
	}
	d.slack.observe(st, len(d.ranks))
	dur := int64(stepMS * 1e6)
	start := endNS - dur
	if endNS <= p.lastEnd {
		return // out of order or repeated
	}
	if p.lastEnd != 0 && start-p.lastEnd > max(int64(time.Second), 2*dur) {
		// A gap: the steps around it are not neighbours in time.
		if p.pending {
			d.finish(p)
		}
		p.off, p.inBlock, p.gap, p.taken = p.off[:0], false, 0, 0
	}
	p.lastEnd = endNS
	k := max(d.cfg.PairSteps, 1)
	if gpuOn {
		if p.pending {
			// The next block began: its last off step was partly
			// collected, and the two blocks share the gap's steps out.
			a := p.cur.after
			if len(a) > 0 {
				a = a[:len(a)-1]
			}
			p.taken = min((len(a)+1)/2, k)
			p.cur.after = a[:p.taken]
			d.finish(p)
		}
		if !p.inBlock {
			p.inBlock = true
			before := p.off
			if len(before) > 0 {
				before = before[:len(before)-1] // partly collected
			}
			if free := max(p.gap-1-p.taken, 0); len(before) > free {
				before = before[len(before)-free:] // the previous block's after side
			}
			if len(before) > k {
				before = before[len(before)-k:]
			}
			p.cur = pairing{onFrom: start, on: p.cur.on[:0], after: p.cur.after[:0], before: p.cur.before[:0], from: start, beforeN: len(before)}
			if len(before) > 0 {
				for _, s := range before {
					p.cur.before = append(p.cur.before, s.ms)
				}
				p.cur.beforeMed, p.cur.from = median(slices.Clone(p.cur.before)), before[0].start
			}
		}
		if len(p.cur.on) < maxOnSteps {
			p.cur.on = append(p.cur.on, stepMS)
		}
		p.cur.onTo = endNS
		return
	}
	if p.inBlock {
		// The first off step after a block was partly collected.
		p.inBlock, p.pending = false, true
		p.off, p.gap, p.taken = p.off[:0], 0, 0
		return
	}
	if p.pending {
		p.cur.after = append(p.cur.after, stepMS)
		p.cur.to = endNS
		if len(p.cur.after) > 2*k {
			// A gap long enough for both sides: the first k are this
			// block's, the last k before the next block the next one's.
			p.taken, p.cur.after = k, p.cur.after[:k]
			d.finish(p)
		}
	}
	p.gap++
	p.off = append(p.off, offStep{stepMS, start, endNS})
	if len(p.off) > k+1 {
		p.off = append(p.off[:0], p.off[1:]...)
	}
}

// finish pairs a rank's ended block with the off steps around it.
func (d *Ledger) finish(p *rankPairing) {
	p.pending = false
	c := &p.cur
	minSide := min(minPairSide, max(d.cfg.PairSteps, 1))
	if c.beforeN < minSide || len(c.after) < minSide || len(c.on) == 0 || !(c.beforeMed > 0) {
		d.drops.Short++
		return
	}
	after := median(slices.Clone(c.after))
	if !(after > 0) {
		d.drops.Short++
		return
	}
	if shift := math.Abs(after/c.beforeMed - 1); shift > d.cfg.PairTolerance && shift > d.cfg.PairNoise*shiftSE(c.before, c.after) {
		d.drops.Drift++
		return
	}
	whole := span{c.from, c.to}
	for _, s := range d.excluded {
		if s.overlaps(whole.from, whole.to) {
			d.drops.Suspect++
			return
		}
	}
	r := median(slices.Clone(c.on))/((c.beforeMed+after)/2) - 1
	on := span{c.onFrom, c.onTo}
	d.estValid = false
	for i := len(d.clusters) - 1; i >= 0; i-- {
		cl := &d.clusters[i]
		if cl.on.overlaps(on.from, on.to) {
			cl.sum += r
			cl.n++
			cl.on = span{min(cl.on.from, on.from), max(cl.on.to, on.to)}
			cl.whole = span{min(cl.whole.from, whole.from), max(cl.whole.to, whole.to)}
			return
		}
	}
	d.clusters = append(d.clusters, pairCluster{on: on, whole: whole, sum: r, n: 1, arm: d.kch.armOf(on.from, on.to)})
	if len(d.clusters) > maxClusters {
		d.clusters = append(d.clusters[:0], d.clusters[1:]...)
	}
}

// shiftSE is the standard error of the relative difference of the medians
// of before and after, from the steps' own jitter: their median absolute
// deviation from their side's median, pooled (1.4826 MAD estimates a
// normal standard deviation; a median's standard error is 1.2533 σ/√n).
// A jitter-free job gives 0: the tolerance alone decides.
func shiftSE(before, after []float64) float64 {
	dev := make([]float64, 0, len(before)+len(after))
	for _, side := range [][]float64{before, after} {
		m := median(slices.Clone(side))
		for _, v := range side {
			dev = append(dev, math.Abs(v/m-1))
		}
	}
	sigma := 1.4826 * median(dev)
	return 1.2533 * sigma * math.Sqrt(1/float64(len(before))+1/float64(len(after)))
}

// exclude keeps the job's own slowdown in [from, to) out of the estimate:
// pairs that overlap it are dropped, those already taken and those to come.
func (d *Ledger) exclude(from, to int64) {
	if to <= from {
		return
	}
	kept := d.clusters[:0]
	for _, cl := range d.clusters {
		if cl.whole.overlaps(from, to) {
			d.drops.Suspect += int64(cl.n)
			d.estValid = false
			continue
		}
		kept = append(kept, cl)
	}
	d.clusters = kept
	d.excluded = append(d.excluded, span{from, to})
	if len(d.excluded) > maxExcluded {
		d.excluded = append(d.excluded[:0], d.excluded[1:]...)
	}
}

// Forget drops a rank's state (its process exited).
func (d *Ledger) Forget(rank int) { delete(d.ranks, rank) }

// Estimate returns the cost of full collection: the trimmed mean of the
// paired blocks' ratios with its 95 % interval once MinPairs blocks are
// paired, else the prior. There is no floor: a noisy estimate near zero has
// a wide interval, and the plan uses its upper end.
func (d *Ledger) Estimate() CostEstimate {
	if d.estValid {
		return d.est
	}
	xs := make([]float64, 0, len(d.clusters))
	for _, cl := range d.clusters {
		if cl.arm == 1 && d.kch.result.State == KernelChannelsDenied {
			continue // blocks of a collection no longer in force
		}
		xs = append(xs, cl.sum/float64(cl.n))
	}
	e := CostEstimate{Cost: d.cfg.PriorCost, Low: d.cfg.PriorCost, High: d.cfg.PriorCost, Pairs: len(xs)}
	if len(xs) >= max(d.cfg.MinPairs, 2) {
		m, half := trimmedMeanCI(xs, trimFraction)
		e = CostEstimate{Cost: m, Low: m - half, High: m + half, Pairs: len(xs), Measured: true}
	}
	d.est, d.estValid = e, true
	return e
}

// chargedCost is the cost of full collection that the ledger charges and
// the plan divides by: the upper end of the interval (never below zero).
func (d *Ledger) chargedCost() float64 { return max(d.Estimate().High, 0) }

// Traps are uprobe traps of one training process since the last report.
// Critical ones delay the step whatever the host's lead: those of a
// synchronisation (its return fires after the device finished and before
// the host can queue more work). The others fire while the host runs
// ahead of the device; where the host then waits for the device at the
// step's synchronisation, a trap delays only its arrival at that wait, and
// the step keeps its length while the wait is longer than the traps' time.
// The ledger charges the critical traps, and the others beyond the host's
// lead over the device that the steps' waits show (jobSlack). On the
// H200's kernel-dense shape (82 ms steps, 30 ms of sync_wait, ~42 traps a
// step) the full charge, 0.31 % of step time, took the whole base share,
// while the traps cost 1.0-1.35 us each in a host-bound loop and the
// uprobes-only agent's cost was lost in the job's own drift
// (bench/results/gpu-budget-split-dense.json).
type Traps struct {
	Total, Critical float64
}

// ObserveTraps adds one process's uprobe traps to the ledger.
func (d *Ledger) ObserveTraps(now int64, t Traps) {
	c := d.cfg.UprobeCost.Seconds()
	hidden := d.slack.hide(max(t.Total-t.Critical, 0) * c)
	if t.Total <= 0 {
		return
	}
	d.activity++
	b := d.bucket(now)
	b.uprobes += t.Total*c - hidden
	b.hidden += hidden
}

// ObservePluginOps adds one process's NCCL operations recorded by the
// profiler plugin since the last report to the ledger, at NCCLPluginCost
// each. NCCL calls the plugin in the user's thread, at the call and at its
// launch, where a collective's uprobe traps fire too, but the plugin's
// time is charged in full: none is hidden in the host's wait for the
// device (an upper bound, as NCCLPluginCost is). A
// process on the plugin path whose libnccl collective uprobes are
// detached traps on none of its collectives; this is what it still costs.
func (d *Ledger) ObservePluginOps(now int64, ops float64) {
	if ops <= 0 {
		return
	}
	d.kch.seen = true
	d.activity++
	d.bucket(now).plugin += ops * d.cfg.NCCLPluginCost.Seconds()
}

// pushRing adds x to a ring of stepWindow values.
func pushRing(ring []float64, at int, x float64) ([]float64, int) {
	if len(ring) < stepWindow {
		return append(ring, x), at
	}
	ring[at] = x
	return ring, (at + 1) % stepWindow
}

func (d *Ledger) bucket(now int64) *ledgerBucket {
	idx := now / d.bucketLen
	b := &d.buckets[int(((idx%ledgerBuckets)+ledgerBuckets)%ledgerBuckets)]
	if b.idx != idx {
		*b = ledgerBucket{idx: idx}
	}
	return b
}

// sums adds up the ledger's last n buckets.
func (d *Ledger) sums(now int64, n int) ledgerBucket {
	var s ledgerBucket
	cur := now / d.bucketLen
	for _, b := range d.buckets {
		if b.idx > cur-int64(n) && b.idx <= cur {
			s.train += b.train
			s.device += b.device
			s.uprobes += b.uprobes
			s.plugin += b.plugin
			s.library += b.library
			s.priorOn += b.priorOn
			s.hidden += b.hidden
		}
	}
	s.device += s.priorOn * d.chargedCost()
	s.priorOn = 0
	return s
}

func (b ledgerBucket) spent() float64 { return b.device + b.uprobes + b.plugin + b.library }

// advance charges the ledger for the time since the last call, at the plan
// that was in force, while the job trains.
func (d *Ledger) advance(now int64) {
	if !d.started {
		d.started, d.last = true, now
		return
	}
	if now <= d.last {
		return
	}
	if d.activity > 0 {
		d.activity, d.lastActive = 0, now
	}
	if d.lastActive != 0 && now-d.lastActive <= activeGrace {
		dt := float64(now-d.last) / 1e9
		esc := float64(max(0, min(now, d.escUntil)-max(d.last, d.escFrom))) / 1e9
		on := esc + (dt-esc)*d.share
		if !d.collecting {
			on = 0
		}
		b := d.bucket(now)
		b.train += dt
		if d.Estimate().Measured {
			b.device += on * d.chargedCost()
		} else {
			b.priorOn += on
		}
		b.library += dt * d.cfg.LibraryCost
	}
	d.last = now
}

// recentCalls is the spend rate of the uprobes and the NCCL profiler
// plugin in the recent past: what observing the job's calls costs.
func (d *Ledger) recentCalls(now int64) float64 {
	s := d.sums(now, recentBuckets)
	if s.train <= 0 {
		return 0
	}
	return (s.uprobes + s.plugin) / s.train
}

// SetCollecting says whether some tracked process can collect device
// records from now on (procEntry.canCollect, and collection is not
// paused): the plan's on-time costs the job nothing otherwise, and is
// charged only while one can. The time up to now is charged as it was.
func (d *Ledger) SetCollecting(now int64, on bool) {
	d.advance(now)
	d.collecting = on
}

// Suspect asks for an escalation: collection fully on for Escalation. The
// suspicious window [from, to) is kept out of the cost estimate. It is
// granted only when the ledger can pay for it within its allowance over
// the horizon (Budget × max(training, Advance)); refusals are counted and
// the last one's reason kept for status.
func (d *Ledger) Suspect(now, from, to int64) bool {
	d.advance(now)
	d.exclude(from, to)
	if now < d.escUntil {
		return true // already escalated
	}
	s := d.sums(now, ledgerBuckets)
	rate := d.escalationRate(now)
	dur := d.affordable(s, rate)
	if dur < d.cfg.MinEscalation.Seconds() || dur <= 0 {
		d.refused++
		e := d.cfg.Escalation.Seconds()
		allow := d.allowance(s.train + e)
		d.refusal = fmt.Sprintf("the ledger pays for %.1f s of full collection, less than the %s an escalation needs: %s costs %.3f s at %.2f %% of step time (%s), "+
			"%.3f s are left of %.3f s (%.2f %% of %s of training and the escalation)",
			max(dur, 0), d.cfg.MinEscalation, d.cfg.Escalation, d.escalationCost(now), 100*rate, d.costSource(), max(allow-s.spent(), 0), allow, 100*d.cfg.Budget,
			time.Duration(max(s.train+e, d.cfg.Advance.Seconds())*1e9).Round(time.Second))
		return false
	}
	d.granted++
	d.escFrom, d.escUntil = now, now+int64(dur*1e9)
	d.exclude(d.escFrom, d.escUntil)
	return true
}

// escalationRate is what a second of escalation is charged, as a share of
// that second: full collection at the charged cost, the recent calls and
// the library.
func (d *Ledger) escalationRate(now int64) float64 {
	return d.chargedCost() + d.recentCalls(now) + d.cfg.LibraryCost
}

// escalationCost is what an escalation starting now would be charged, in
// seconds of cost.
func (d *Ledger) escalationCost(now int64) float64 {
	return d.cfg.Escalation.Seconds() * d.escalationRate(now)
}

// affordable is the longest escalation, up to Escalation, that the ledger
// s can pay at rate within its allowance: spent + x·rate ≤ Budget ×
// max(train + x, Advance).
func (d *Ledger) affordable(s ledgerBucket, rate float64) float64 {
	e, b, a := d.cfg.Escalation.Seconds(), d.cfg.Budget, d.cfg.Advance.Seconds()
	if rate <= 0 || s.spent()+e*rate <= d.allowance(s.train+e) {
		return e
	}
	x := (b*a - s.spent()) / rate // within the advance
	if s.train+x > a {
		x = 0
		if rate > b {
			x = (b*s.train - s.spent()) / (rate - b) // beyond it
		}
	}
	return min(x, e)
}

// allowance is what the ledger may have spent over a horizon holding train
// seconds of training, in seconds of cost.
func (d *Ledger) allowance(train float64) float64 {
	return d.cfg.Budget * max(train, d.cfg.Advance.Seconds())
}

func (d *Ledger) costSource() string {
	if e := d.Estimate(); e.Measured {
		return fmt.Sprintf("the upper end of the cost measured from %d pairs", e.Pairs)
	}
	return "the prior: the cost is not measured yet"
}

// calibrate returns the plan that measures the cost of collection fast,
// while it is not measured, the job is within its first Advance of
// training and the ledger can pay for it and still for the job's first
// escalation: on-blocks of MinOnSteps+1 steps of the recent step time,
// each followed by 2·3+2 off steps (3 after the block, 3 before the next,
// and the two partly collected ones), the period a multiple of
// MinPeriod at most the configured one (every window keeps an
// on-block). A block takes 13 steps, MinPairs (8) of them 10-21 s at
// 100-200 ms steps, and costs 5 steps of full collection: 8 cost
// 0.12-0.24 s at 3 %. It goes on while the cost interval is wider than
// ±calibrateHalfWidth, since the plan is priced at its upper end. The
// base share at 0.225 % of a 3 % cost cannot do that: on the H200's 4-rank
// job (103-ms steps, a 5 % share) its blocks needed the period doubled to
// 20 s, and no pair was measured in 5 minutes.
func (d *Ledger) calibrate(now int64, s ledgerBucket, est CostEstimate) (share float64, period time.Duration, ok bool) {
	c := d.cfg
	if est.Measured && est.High-est.Low <= 2*calibrateHalfWidth || c.MinOnSteps <= 0 || c.MinShare > 0 || len(d.steps) == 0 || !d.collecting ||
		s.train >= c.Advance.Seconds() {
		return 0, 0, false
	}
	reserve := 0.0
	if d.granted == 0 {
		reserve = d.escalationCost(now)
	}
	if s.spent()+reserve > c.Budget*c.Advance.Seconds() {
		return 0, 0, false
	}
	step := time.Duration(median(slices.Clone(d.steps)) * 1e6)
	on := time.Duration(c.MinOnSteps+1) * step
	need := on + time.Duration(2*min(minPairSide, max(c.PairSteps, 1))+2)*step
	period = (need + MinPeriod - 1) / MinPeriod * MinPeriod
	if d.calibrating && d.lastPeriod >= period && d.lastPeriod <= period*5/4 {
		period = d.lastPeriod // a step time at a multiple's edge does not move the phase
	}
	share = float64(on) / float64(period)
	if period > c.Period || share > c.MaxShare {
		return 0, 0, false
	}
	return share, period, true
}

// Plan charges the ledger up to now and returns the duty cycle: the base
// share is what the budget leaves after the uprobes, the NCCL profiler
// plugin, the library and the escalation reserve, divided by the upper end
// of the cost estimate; none while the ledger is over its allowance. In
// the first Advance of training the calibration plan replaces a smaller
// base share until the cost is measured (calibrate).
func (d *Ledger) Plan(now int64) Plan {
	d.advance(now)
	est := d.Estimate()
	ch := d.chargedCost()
	s := d.sums(now, ledgerBuckets)
	rate := d.cfg.Budget*(1-d.cfg.EscalationReserve) - d.recentCalls(now) - d.cfg.LibraryCost
	if s.spent() > d.allowance(s.train) {
		rate = 0
	}
	share := d.cfg.MaxShare
	if ch > 0 {
		share = max(rate, 0) / ch
	}
	share = max(0, d.cfg.MinShare, min(d.cfg.MaxShare, share))
	cal, period, calibrating := d.calibrate(now, s, est)
	if calibrating && cal > share {
		share = cal
	} else {
		calibrating, period = false, d.period(share)
	}
	d.share, d.calibrating, d.lastPeriod = share, calibrating, period
	p := Plan{OnShare: share, Period: period, Cost: est.Cost, Measured: est.Measured, Overhead: d.overhead(now, est, s)}
	p.KernelChannels = d.kernelChannelsAt(now, p.Period)
	if k := d.kch.result; k.State != KernelChannelsIdle {
		p.Overhead.KernelChannels = &k
	}
	if now < d.escUntil {
		p.Escalate, p.EscalatedUntil = true, d.escUntil
	}
	return p
}

// period is the configured period, doubled until an on-block at share
// holds MinOnSteps whole steps of the recent step time (plus one, for the
// steps the block's edges cut), or until MaxPeriod. Doubling rather than
// fitting keeps the periods of hosts with slightly different step times
// equal, so that their blocks still cover the same steps.
//
// Half the period in force is taken only when its blocks would hold a
// quarter more than needed, so that a share or a step time
// hovering at a doubling's edge does not move the phase back and forth.
func (d *Ledger) period(share float64) time.Duration {
	p := d.cfg.Period
	if share <= 0 || share >= 1 || len(d.steps) == 0 || d.cfg.MinOnSteps <= 0 || p <= 0 {
		d.lastPeriod = p
		return p
	}
	step := time.Duration(median(slices.Clone(d.steps)) * 1e6)
	need := time.Duration(d.cfg.MinOnSteps+1) * step
	block := func(p time.Duration) time.Duration { return time.Duration(float64(p) * share) }
	for block(p) < need && 2*p <= d.cfg.MaxPeriod {
		p *= 2
	}
	if d.lastPeriod == 2*p && 2*p <= d.cfg.MaxPeriod && block(p) < need*5/4 {
		p *= 2
	}
	d.lastPeriod = p
	return p
}

func (d *Ledger) overhead(now int64, est CostEstimate, s ledgerBucket) Overhead {
	o := Overhead{Budget: d.cfg.Budget, Cost: est, Training: time.Duration(s.train * 1e9), Allowance: d.allowance(s.train),
		EscalationsGranted: d.granted, EscalationsRefused: d.refused, Refused: d.refusal, PairsDropped: d.drops,
		Calibrating: d.calibrating}
	if s.train > 0 {
		o.Device, o.Uprobes, o.Library = s.device/s.train, s.uprobes/s.train, s.library/s.train
		o.UprobesHidden = s.hidden / s.train
		o.NCCLPlugin = s.plugin / s.train
		o.Total = s.spent() / s.train
	}
	return o
}

// trimmedMeanCI returns the mean of xs trimmed by g = floor(gamma·n) values
// at each end and the half-width of its 95 % interval (Tukey–McLaughlin:
// winsorized standard deviation, t with n−2g−1 degrees of freedom).
func trimmedMeanCI(xs []float64, gamma float64) (mean, half float64) {
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	g := int(gamma * float64(n))
	h := n - 2*g
	for _, v := range s[g : n-g] {
		mean += v
	}
	mean /= float64(h)
	if h < 2 {
		return mean, math.Inf(1)
	}
	lo, hi := s[g], s[n-g-1]
	wm := 0.0
	for _, v := range s {
		wm += min(max(v, lo), hi)
	}
	wm /= float64(n)
	ss := 0.0
	for _, v := range s {
		dv := min(max(v, lo), hi) - wm
		ss += dv * dv
	}
	sw := math.Sqrt(ss / float64(n-1))
	se := sw / (float64(h) / float64(n) * math.Sqrt(float64(n)))
	return mean, tQuantile975(h-1) * se
}

// t975 is the 97.5 % quantile of Student's t by degrees of freedom.
var t975 = [...]float64{math.Inf(1), 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
	2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
	2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}

func tQuantile975(df int) float64 {
	if df < 1 {
		return math.Inf(1)
	}
	if df < len(t975) {
		return t975[df]
	}
	// Cornish–Fisher expansion around the normal quantile.
	z, v := 1.959964, float64(df)
	return z + (z*z*z+z)/(4*v) + (5*math.Pow(z, 5)+16*z*z*z+3*z)/(96*v*v)
}

// quantile sorts xs and returns its q-quantile (the lower of the two
// values around it), 0 for no samples.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return stats.LowerQuantile(xs, q)
}

// median sorts xs and returns its median, 0 for no samples.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return stats.Median(xs)
}
