package agent

import (
	"math"
	"slices"
	"time"
)

// DutyConfig steers device-record collection under an overhead budget.
//
// Always-on CUPTI kernel records cost +0.8 % to +8.4 % of step time on an
// H200 (DESIGN.md section 2), so device records are sampled: collection is on
// for a share of each period, chosen so that the estimated cost stays within
// Budget, and switched fully on for Escalation when a window turns suspicious.
type DutyConfig struct {
	// Budget is the overhead the agent may add to training, as a fraction
	// of step time (0.003 = 0.3 %).
	Budget float64
	// Period is the length of one on/off cycle.
	Period time.Duration
	// MinShare and MaxShare bound the on-share outside escalations.
	MinShare, MaxShare float64
	// PriorCost is the assumed cost of full collection until measured.
	PriorCost float64
	// MinCost floors the measured cost: a noisy estimate near zero must not
	// switch collection fully on (the H200 measured 0.8 % to 8.4 %).
	MinCost float64
	// Escalation is how long collection stays fully on after a suspicion.
	Escalation time.Duration
	// MaxEscalationShare bounds the share of time spent escalated (over a
	// sliding hour) so that a flapping job cannot keep collection on.
	MaxEscalationShare float64
	// MinSamples is the number of on and off steps per rank needed before
	// the measured cost replaces the prior.
	MinSamples int
}

// DefaultDutyConfig returns a budget of 0.3 %, 10 s periods and 20 s
// escalations (Greyhound's detailed-profiling window).
func DefaultDutyConfig() DutyConfig {
	return DutyConfig{
		Budget: 0.003, Period: 10 * time.Second, MinShare: 0.02, MaxShare: 1,
		PriorCost: 0.03, MinCost: 0.015, Escalation: 20 * time.Second, MaxEscalationShare: 0.1,
		MinSamples: 20,
	}
}

// DutyPlan is what the injection library is asked to do.
type DutyPlan struct {
	OnShare  float64       // share of each period with collection on
	Period   time.Duration // length of one cycle
	Escalate bool          // collection fully on until EscalatedUntil
	// EscalatedUntil is in the caller's monotonic nanoseconds.
	EscalatedUntil int64
	// Cost is the estimated overhead of full collection, and Measured
	// whether it comes from this run's on/off steps rather than the prior.
	Cost     float64
	Measured bool
}

// Duty estimates the cost of device collection from steps with and without
// device records inside the run, and plans the duty cycle. It is pure: time
// comes in with each call. Not safe for concurrent use.
type Duty struct {
	cfg        DutyConfig
	on, off    map[int]*ringMean // per rank step times (ms)
	escUntil   int64
	escHistory []span // escalations in the last hour
}

type span struct{ from, to int64 }

// NewDuty returns a controller.
func NewDuty(cfg DutyConfig) *Duty {
	return &Duty{cfg: cfg, on: map[int]*ringMean{}, off: map[int]*ringMean{}}
}

// ObserveStep records one step of a rank with its wall time and whether the
// whole step had device collection on.
func (d *Duty) ObserveStep(rank int, stepMS float64, gpuOn bool) {
	m := d.off
	if gpuOn {
		m = d.on
	}
	r := m[rank]
	if r == nil {
		r = newRingMean(256)
		m[rank] = r
	}
	r.add(stepMS)
}

// Forget drops a rank's samples (its process exited).
func (d *Duty) Forget(rank int) {
	delete(d.on, rank)
	delete(d.off, rank)
}

// Suspect escalates collection to full for the configured time, unless
// escalations already used their share of the last hour.
func (d *Duty) Suspect(now int64) bool {
	hour := int64(time.Hour)
	kept := d.escHistory[:0]
	used := int64(0)
	for _, s := range d.escHistory {
		if s.to > now-hour {
			kept = append(kept, s)
			used += min(s.to, now) - max(s.from, now-hour)
		}
	}
	d.escHistory = kept
	if now < d.escUntil {
		return true // already escalated
	}
	if float64(used+int64(d.cfg.Escalation)) > d.cfg.MaxEscalationShare*float64(hour) {
		return false
	}
	d.escUntil = now + int64(d.cfg.Escalation)
	d.escHistory = append(d.escHistory, span{now, d.escUntil})
	return true
}

// Cost estimates the relative overhead of full collection: the median over
// ranks of mean(on)/mean(off) − 1, floored at 0, or the prior without enough
// samples.
func (d *Duty) Cost() (cost float64, measured bool) {
	var ratios []float64
	for rank, on := range d.on {
		off := d.off[rank]
		if off == nil || on.n < d.cfg.MinSamples || off.n < d.cfg.MinSamples {
			continue
		}
		if mo := off.mean(); mo > 0 {
			ratios = append(ratios, on.mean()/mo-1)
		}
	}
	if len(ratios) == 0 {
		return d.cfg.PriorCost, false
	}
	slices.Sort(ratios)
	return max(d.cfg.MinCost, ratios[len(ratios)/2]), true
}

// Plan returns the duty cycle for now.
func (d *Duty) Plan(now int64) DutyPlan {
	cost, measured := d.Cost()
	share := d.cfg.MaxShare
	if cost > 0 {
		share = d.cfg.Budget / cost
	}
	share = math.Min(d.cfg.MaxShare, math.Max(d.cfg.MinShare, share))
	p := DutyPlan{OnShare: share, Period: d.cfg.Period, Cost: cost, Measured: measured}
	if now < d.escUntil {
		p.Escalate, p.EscalatedUntil = true, d.escUntil
	}
	return p
}

// ringMean keeps the mean of the last n samples.
type ringMean struct {
	buf []float64
	i   int
	n   int
	sum float64
}

func newRingMean(n int) *ringMean { return &ringMean{buf: make([]float64, n)} }

func (r *ringMean) add(v float64) {
	if r.n == len(r.buf) {
		r.sum -= r.buf[r.i]
	} else {
		r.n++
	}
	r.buf[r.i] = v
	r.sum += v
	r.i = (r.i + 1) % len(r.buf)
}

func (r *ringMean) mean() float64 {
	if r.n == 0 {
		return 0
	}
	return r.sum / float64(r.n)
}
