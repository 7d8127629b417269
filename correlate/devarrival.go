package correlate

import (
	"math"
	"slices"
	"time"

	"github.com/slowrank/slowrank/internal/stats"
)

// Device arrival: on the NCCL profiler plugin's path each collective call
// carries NCCL's sequence number (HostCall.NCCLSeq), and the plugin's
// kernel record of it (CollKernel) names it by (comm, op, NCCL seq). The
// pair is joined per communicator of a process (kernelKeys), whichever
// comes first, and the kernel's GPU start and end go into the group's
// arrival ring beside the members' host starts (commGroup.noteKernel). A
// step then settles its collectives against the other local members'
// kernels (deviceArrival): whose GPU reached each collective last. The
// host order says who enqueued last, which on an asynchronous job is not
// who the others waited for: a rank whose GPU is slow enqueues as early as
// the rest and starts its kernels last.
//
// Across hosts no clock is compared: a collective ends at about the same
// time on every rank, so the rank that started it last spent the least
// time in it. The step's summed kernel time (Step.DeviceCollMS) carries
// that to the detector, which compares it across the ranks of a step
// (detector/device.go).

// kernelKeySlots is how many calls of one op per communicator of a process
// wait for their kernel records (or kernels for their calls), by NCCL
// sequence number: the records come within a batch interval of the call,
// the calls are held for the plugin's reorder (~0.4 s), and only calls
// 1024 of the same op apart share a slot. A hashed table of all ops lost
// 11 % of the kernels on the H200 to collisions with the calls in flight.
const kernelKeySlots = 1024

// maxKeyedOps bounds the ops one communicator keys (NCCL has a dozen);
// maxKernelRings bounds the rings of all processes (40 KiB each): beyond
// them kernels are unmatched, and counted.
const (
	maxKeyedOps    = 16
	maxKernelRings = 256
)

type kernelKeys map[Op]*[kernelKeySlots]kernelSlot

// kernelSlot holds a call waiting for its kernel (seq != 0: the call's
// sequence number on its procComm) or a kernel waiting for its call
// (seq == 0; start and end).
type kernelSlot struct {
	nseq       uint64
	seq        uint64
	start, end int64
	used       bool
}

// slot is the slot of NCCL's call (op, nseq), nil when pc has no ring for
// op and make is false. Rings are made once the process sent a kernel
// record (make), so that processes that never do (collection off, the
// uprobes' path) cost nothing; the first kernels come before their calls,
// which the plugin's reorder holds 400 ms.
func (c *Correlator) slot(pc *procComm, op Op, nseq uint64, make bool) *kernelSlot {
	ring := pc.kern[op]
	if ring == nil {
		if !make || len(pc.kern) >= maxKeyedOps || c.kernelRings >= maxKernelRings {
			return nil
		}
		if pc.kern == nil {
			pc.kern = kernelKeys{}
		}
		ring = new([kernelKeySlots]kernelSlot)
		pc.kern[op] = ring
		c.kernelRings++
	}
	return &ring[nseq%kernelKeySlots]
}

// keyCall notes that pc's call seq is NCCL's (op, nseq), and joins the
// kernel record of it if that came first.
func (c *Correlator) keyCall(pc *procComm, op Op, nseq, seq uint64) {
	sl := c.slot(pc, op, nseq, pc.p.feedsKernels)
	if sl == nil {
		return
	}
	if sl.used && sl.seq == 0 && sl.nseq == nseq {
		c.noteKernel(pc, seq, sl.start, sl.end)
		*sl = kernelSlot{}
		return
	}
	if sl.used && sl.seq == 0 {
		pc.p.stats.KernelsUnmatched++ // a kernel whose call never came
	}
	*sl = kernelSlot{nseq: nseq, seq: seq, used: true}
}

// AddCollKernel adds the plugin's kernel record of one collective call.
// It may come before or after the call's HostCall.
func (c *Correlator) AddCollKernel(k CollKernel) {
	p := c.proc(k.PID)
	p.stats.KernelRecords++
	p.feedsKernels = true
	p.lastKernel = max(p.lastKernel, k.StartNS)
	pc := p.comms[k.Comm]
	if pc == nil || k.EndNS != 0 && k.EndNS < k.StartNS {
		p.stats.KernelsUnmatched++
		return
	}
	sl := c.slot(pc, k.Op, k.NCCLSeq, true)
	if sl == nil {
		p.stats.KernelsUnmatched++
		return
	}
	if sl.used && sl.seq != 0 && sl.nseq == k.NCCLSeq {
		c.noteKernel(pc, sl.seq, k.StartNS, k.EndNS)
		*sl = kernelSlot{}
		return
	}
	if sl.used && sl.seq == 0 {
		p.stats.KernelsUnmatched++
	}
	*sl = kernelSlot{nseq: k.NCCLSeq, start: k.StartNS, end: k.EndNS, used: true}
}

func (c *Correlator) noteKernel(pc *procComm, seq uint64, start, end int64) {
	pc.kernSeq = max(pc.kernSeq, seq)
	if g := pc.grp; g == nil || !g.noteKernel(pc, seq, start, end) {
		pc.p.stats.KernelsUnmatched++
	}
}

// noteKernel notes the GPU start and end of pc's call seq in the arrival
// ring; false when the call's row has left it.
func (g *commGroup) noteKernel(pc *procComm, seq uint64, start, end int64) bool {
	w := int(seq % arrivalSlots)
	mi := slices.Index(g.members, pc)
	if g.width == 0 || g.seqs[w] != seq || mi < 0 || mi >= g.width {
		return false
	}
	if g.devStarts == nil {
		// Made at the group's first kernel: most groups never see one.
		g.devStarts, g.devEnds = make([]int64, len(g.starts)), make([]int64, len(g.starts))
		for i := range g.devStarts {
			g.devStarts[i], g.devEnds[i] = absent, absent
		}
	}
	if end == 0 {
		end = absent
	}
	g.devStarts[w*g.width+mi], g.devEnds[w*g.width+mi] = start, end
	return true
}

// devRow is the members' kernel starts and ends of the calls with sequence
// number seq, nil when it left the ring.
func (g *commGroup) devRow(seq uint64) (starts, ends []int64) {
	if g.devStarts == nil || g.row(seq) == nil {
		return nil, nil
	}
	w := int(seq % arrivalSlots)
	return g.devStarts[w*g.width : (w+1)*g.width], g.devEnds[w*g.width : (w+1)*g.width]
}

// kernelsReady reports whether the kernel records of the step's collectives
// have come from p and from every other local member that is collecting
// and keys its kernels (a member without a key ring, past maxKernelRings,
// is not waited for): a communicator's kernels run in order on its stream,
// so a later call's kernel says that an earlier one will not come. expected
// says whether any of them sent a kernel record that started in the step:
// an on-phase without kernel channels (the agent measuring them apart, or
// off) sends none, and is waited for only kernelGrace.
func (c *Correlator) kernelsReady(p *proc, s *pendingStep) (ready, expected bool) {
	if !p.feedsKernels || !p.cov.contains(s.start, s.end) {
		return true, false
	}
	ready = true
	for _, cr := range s.colls {
		g := c.groups[cr.grp]
		if g == nil {
			continue
		}
		for _, m := range g.members {
			if m == nil || m.kern == nil || m.p != p && !m.p.cov.contains(s.start, s.end) {
				continue
			}
			expected = expected || m.p.lastKernel >= s.start
			if m.kernSeq < cr.seq {
				ready = false
			}
		}
	}
	return ready, expected
}

// kernelGrace is how long after a covered step's end its kernels are
// waited for when none of its processes sent one that started in it: a
// peer's batch comes up to a flush interval (100 ms) after the others'.
const kernelGrace = int64(300 * time.Millisecond)

// deviceArrival gathers the step's device arrival evidence against the
// other local members, like arrivalStage with kernel starts for host
// starts: the lag behind the first kernel start (median over the step's
// collectives) and, per collective, whether this rank's kernel started
// last. Starts closer than DeviceArrivalTie are a tie, decided by the
// kernels' durations (the last to arrive waits least). It also sums the
// step's kernel time when every collective of the step was timed.
func (c *Correlator) deviceArrival(p *proc, s *pendingStep) {
	lags := c.sc.lags[:0]
	var sum int64
	whole := len(s.colls) > 0
	for _, cr := range s.colls {
		g := c.groups[cr.grp]
		if g == nil {
			whole = false
			continue
		}
		starts, ends := g.devRow(cr.seq)
		self := g.memberIndex(p)
		if starts == nil || self < 0 || self >= len(starts) || starts[self] == absent {
			whole = false
			continue
		}
		if ends[self] == absent {
			whole = false
		} else {
			sum += ends[self] - starts[self]
		}
		lag, last, ok := c.kernelOrder(g, starts, ends, self)
		if !ok {
			continue
		}
		lags = append(lags, lag)
		switch last {
		case orderLast:
			s.devVotes++
			s.devLastVotes++
		case orderNotLast:
			s.devVotes++
		}
	}
	c.sc.lags = lags
	if len(lags) > 0 {
		s.devLagMS, s.hasDevLag = stats.MedianIntFloat(lags)/1e6, true
	}
	if whole {
		s.collDevMS, s.hasCollDev = float64(sum)/1e6, true
	}
}

type kernelRank uint8

const (
	orderUndecided kernelRank = iota
	orderLast
	orderNotLast
)

// kernelOrder places member self's kernel among the other members' of one
// collective: its lag behind the first start, and whether it started last.
// ok is false when no other member's kernel is known.
func (c *Correlator) kernelOrder(g *commGroup, starts, ends []int64, self int) (lag int64, last kernelRank, ok bool) {
	tie := int64(c.cfg.DeviceArrivalTie)
	mine := starts[self]
	lo, hi, n := g.span(starts)
	if n < 2 {
		return 0, orderUndecided, false
	}
	if hi-mine >= tie {
		return mine - lo, orderNotLast, true
	}
	tied := 0
	for i, v := range starts {
		if v != absent && g.members[i] != nil && hi-v < tie {
			tied++
		}
	}
	if tied == 1 {
		return mine - lo, orderLast, true
	}
	best, bestDur := -1, int64(math.MaxInt64)
	for i, v := range starts {
		if v == absent || g.members[i] == nil || hi-v >= tie {
			continue
		}
		if ends[i] == absent {
			return mine - lo, orderUndecided, true
		}
		switch d := ends[i] - v; {
		case d < bestDur:
			best, bestDur = i, d
		case d == bestDur:
			best = -1
		}
	}
	switch best {
	case self:
		return mine - lo, orderLast, true
	case -1:
		return mine - lo, orderUndecided, true
	}
	return mine - lo, orderNotLast, true
}

// deviceFields returns the step's DeviceLastArrival, DeviceArrivalLagMS
// and DeviceCollMS.
func deviceFields(s *pendingStep) (last *bool, lag, coll *float64) {
	if s.devVotes > 0 {
		v := 2*s.devLastVotes > s.devVotes
		last = &v
	}
	if s.hasDevLag {
		v := s.devLagMS
		lag = &v
	}
	if s.hasCollDev {
		v := s.collDevMS
		coll = &v
	}
	return last, lag, coll
}
