package correlate

import (
	"cmp"
	"fmt"
	"testing"

	"github.com/slowrank/slowrank/internal/stats"
)

// pluginJob lays out n iterations of "AB S" for two ranks on one host as
// the NCCL plugin path reports them: every collective call carries NCCL's
// sequence number, and its kernel (k) starts on rank r's GPU gpuLag[r]
// after the call's host start (plus tieNS on rank 1) and ends at end(k's
// starts). hostSkew[r] moves rank r's host calls. CUPTI's records of the
// kernels and coverage from 0 make every step covered.
type pluginJob struct {
	hostSkew, gpuLag [2]int64
	tieNS            int64
	// end is a collective's end on rank r given its kernels' starts.
	end func(r int, starts [2]int64) int64
}

func (j pluginJob) build(c *Correlator, n int) (host []HostCall, kernels [2][]CollKernel, cupti []DeviceInterval) {
	var b batch
	simulate(&b, []uint32{pid(0), pid(1)}, 0, repeat("AB S", n), 0, 10*ms, func(r, _ int) int64 { return j.hostSkew[r] })
	commOf(&b)
	seqs := map[uint32]map[Op]uint64{pid(0): {}, pid(1): {}}
	var calls [2][]*HostCall
	for i := range b.host {
		h := &b.host[i]
		if h.Kind != HostCollective {
			continue
		}
		h.NCCLSeq, h.HasNCCLSeq = seqs[h.PID][h.Op], true
		seqs[h.PID][h.Op]++
		calls[h.PID-pid(0)] = append(calls[h.PID-pid(0)], h)
	}
	for r := range 2 {
		c.AddCoverage(Coverage{PID: pid(r), StartNS: 0})
	}
	for k := range calls[0] {
		var starts [2]int64
		for r := range 2 {
			starts[r] = calls[r][k].StartNS + j.gpuLag[r]
		}
		starts[1] += j.tieNS
		for r := range 2 {
			h := calls[r][k]
			e := j.end(r, starts)
			kernels[r] = append(kernels[r], CollKernel{PID: h.PID, Comm: h.Comm, Op: h.Op, NCCLSeq: h.NCCLSeq, StartNS: starts[r], EndNS: e})
			cupti = append(cupti, DeviceInterval{PID: h.PID, Kind: DeviceKernel, Class: ClassComm, Name: "nccl",
				StartNS: starts[r], EndNS: e, Corr: uint32(len(cupti) + 1)})
		}
	}
	return append([]HostCall(nil), b.host...), kernels, cupti
}

// endTogether: a collective ends 100 µs after its last rank started it.
func endTogether(_ int, s [2]int64) int64 { return max(s[0], s[1]) + 100*us }

func TestDeviceArrivalOrder(t *testing.T) {
	tests := []struct {
		name          string
		job           pluginJob
		iters         int // 20 when 0
		kernelsFirst  bool
		wantLast      [2]*bool
		wantLag       [2]float64
		wantHostLast  [2]*bool
		wantShortColl int // the rank whose DeviceCollMS is the smaller
	}{{
		name: "rank 1's GPU reaches every collective 2 ms after rank 0's, though rank 0 enqueues last",
		job:  pluginJob{hostSkew: [2]int64{0, -ms}, gpuLag: [2]int64{0, 3 * ms}, end: endTogether},
		// host starts: rank 1 1 ms earlier; device starts: rank 1 2 ms later
		wantLast: [2]*bool{ptr(false), ptr(true)}, wantLag: [2]float64{0, 2},
		wantHostLast: [2]*bool{ptr(true), ptr(false)}, wantShortColl: 1,
	}, {
		// 600 collectives per rank in flight: on the H200 a hashed key table
		// lost 11 % of the kernels to collisions with the calls in flight.
		name:         "kernel records that come long before their calls are all joined",
		job:          pluginJob{hostSkew: [2]int64{0, -ms}, gpuLag: [2]int64{0, 3 * ms}, end: endTogether},
		iters:        300,
		kernelsFirst: true,
		wantLast:     [2]*bool{ptr(false), ptr(true)}, wantLag: [2]float64{0, 2},
		wantHostLast: [2]*bool{ptr(true), ptr(false)}, wantShortColl: 1,
	}, {
		name: "starts 10 µs apart are a tie, decided by who waited least",
		job: pluginJob{tieNS: 10 * us, end: func(r int, s [2]int64) int64 {
			return s[r] + map[int]int64{0: 100 * us, 1: 300 * us}[r] // rank 1 started later but waited longer
		}},
		wantLast: [2]*bool{ptr(true), ptr(false)}, wantLag: [2]float64{0, 0.010},
		// the host tie is broken by CUPTI's comm time the same way
		wantHostLast: [2]*bool{ptr(true), ptr(false)}, wantShortColl: 0,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := twoRanks(t)
			n := cmp.Or(tc.iters, 20)
			host, kernels, cupti := tc.job.build(c, n)
			feedKernels := func(from int) {
				for r := range 2 {
					for _, k := range kernels[r][from:] {
						c.AddCollKernel(k)
					}
				}
			}
			// The first kernel records come before their calls (the
			// plugin's reorder holds the calls); the rest before or after.
			for r := range 2 {
				c.AddCollKernel(kernels[r][0])
			}
			if tc.kernelsFirst {
				feedKernels(1)
			}
			b := batch{host: host, dev: cupti}
			b.feed(c)
			if !tc.kernelsFirst {
				feedKernels(1)
			}
			steps, _ := c.Flush()
			m := byRank(steps)
			for r := range 2 {
				if len(m[r]) != n {
					t.Fatalf("rank %d: %d steps", r, len(m[r]))
				}
				for _, s := range m[r] {
					if !sameBool(s.DeviceLastArrival, tc.wantLast[r]) || s.DeviceArrivalLagMS == nil || !near(*s.DeviceArrivalLagMS, tc.wantLag[r]) {
						t.Fatalf("rank %d step %d: device last %v lag %v, want %v %v", r, s.Step,
							deref(s.DeviceLastArrival), deref(s.DeviceArrivalLagMS), deref(tc.wantLast[r]), tc.wantLag[r])
					}
					if !sameBool(s.LastArrival, tc.wantHostLast[r]) {
						t.Fatalf("rank %d step %d: host last %v, want %v", r, s.Step, deref(s.LastArrival), deref(tc.wantHostLast[r]))
					}
					if s.DeviceCollMS == nil {
						t.Fatalf("rank %d step %d: no DeviceCollMS", r, s.Step)
					}
				}
			}
			for i := range m[0] {
				short, long := m[tc.wantShortColl][i], m[1-tc.wantShortColl][i]
				if *short.DeviceCollMS >= *long.DeviceCollMS {
					t.Fatalf("step %d: DeviceCollMS %.3f (rank %d) not below %.3f", short.Step, *short.DeviceCollMS, tc.wantShortColl, *long.DeviceCollMS)
				}
			}
			if st := c.Stats(); st[0].KernelsUnmatched+st[1].KernelsUnmatched != 0 {
				t.Errorf("kernels unmatched: %d, %d", st[0].KernelsUnmatched, st[1].KernelsUnmatched)
			}
		})
	}
}

// A step waits for a collecting peer's kernel records of its collectives
// (they come in the peer's own batches), within DeviceReorder; a peer that
// never sends them costs one bounded wait, counted, not the evidence of
// the steps it did time.
func TestDeviceArrivalWaitsForPeersKernels(t *testing.T) {
	for _, tc := range []struct {
		name      string
		late      bool // rank 1's later kernels come after the wait began
		wantSteps int  // rank 0's steps with device evidence
	}{
		{"a peer's kernels that come late are waited for", true, 20},
		{"a peer's kernels that never come: the wait times out", false, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := twoRanks(t)
			job := pluginJob{gpuLag: [2]int64{0, ms}, end: endTogether}
			host, kernels, cupti := job.build(c, 20)
			half := len(kernels[1]) / 2 // rank 1's first 10 iterations
			for _, k := range append(kernels[0], kernels[1][:half]...) {
				c.AddCollKernel(k)
			}
			b := batch{host: host, dev: cupti}
			b.feed(c)
			end := host[len(host)-1].EndNS
			c.Advance(end + 500*ms)
			early, _ := c.Drain()
			if n := len(byRank(early)[0]); n > 12 {
				t.Fatalf("rank 0 emitted %d steps before its peer's kernels came", n)
			}
			if tc.late {
				for _, k := range kernels[1][half:] {
					c.AddCollKernel(k)
				}
			}
			c.Advance(end + 4000*ms)
			rest, _ := c.Drain()
			m := byRank(append(early, rest...))
			n := 0
			for _, s := range m[0] {
				if s.DeviceLastArrival != nil {
					n++
					if *s.DeviceLastArrival {
						t.Errorf("step %d: rank 0 last on the device", s.Step)
					}
				}
			}
			if len(m[0]) < 19 || n < tc.wantSteps-1 || n > tc.wantSteps {
				t.Errorf("rank 0: %d steps, %d with device evidence, want %d", len(m[0]), n, tc.wantSteps)
			}
			if timeouts := c.Stats()[0].DeviceArrivalTimeout; (timeouts > 0) == tc.late {
				t.Errorf("device arrival timeouts %d", timeouts)
			}
		})
	}
}

// An on-phase without kernel channels (the agent measuring their cost
// apart, or off: agent/duty/kch.go) sends no kernel record: its steps are
// not held for them (on the H200's trial every such step waited the full
// 3 s and counted as a timeout), and keep no device evidence.
func TestOnPhaseWithoutKernelChannelsIsNotWaitedFor(t *testing.T) {
	c := twoRanks(t)
	job := pluginJob{gpuLag: [2]int64{0, ms}, end: endTogether}
	host, kernels, cupti := job.build(c, 20)
	half := len(kernels[0]) / 2 // the first 10 iterations had kernel channels on
	for r := range 2 {
		for _, k := range kernels[r][:half] {
			c.AddCollKernel(k)
		}
	}
	end := host[len(host)-1].EndNS
	for r := range 2 { // the job goes on: CUPTI's records pass the last step
		cupti = append(cupti, DeviceInterval{PID: pid(r), Kind: DeviceKernel, Class: ClassComm, Name: "nccl",
			StartNS: end + 100*ms, EndNS: end + 150*ms, Corr: uint32(len(cupti) + 1)})
	}
	b := batch{host: host, dev: cupti}
	b.feed(c)
	c.Advance(end + kernelGrace + 10*ms)
	steps, _ := c.Drain()
	m := byRank(steps)
	for r := range 2 {
		if len(m[r]) < 19 {
			t.Fatalf("rank %d: %d steps out %d ms after the last, want every one", r, len(m[r]), (kernelGrace+10*ms)/ms)
		}
		for _, s := range m[r] {
			if s.Step >= 11 && s.DeviceLastArrival != nil {
				t.Errorf("rank %d step %d has device evidence without kernels", r, s.Step)
			}
		}
	}
	if st := c.Stats(); st[0].DeviceArrivalTimeout+st[1].DeviceArrivalTimeout != 0 {
		t.Errorf("timeouts counted: %d, %d", st[0].DeviceArrivalTimeout, st[1].DeviceArrivalTimeout)
	}
}

// Kernel records that name no call the correlator knows are counted.
func TestKernelsWithoutTheirCallAreCounted(t *testing.T) {
	c := twoRanks(t)
	c.AddCollKernel(CollKernel{PID: pid(0), Comm: 0x99, Op: OpAllReduce, NCCLSeq: 1, StartNS: ms, EndNS: 2 * ms})
	c.AddCollKernel(CollKernel{PID: pid(0), Comm: 0x10, Op: OpAllReduce, NCCLSeq: 1, StartNS: 3 * ms, EndNS: 2 * ms})
	// Two kernels of one slot whose calls never came: the first is
	// pushed out by the second.
	pc := c.procs[pid(0)].comms[0x10]
	c.AddCollKernel(CollKernel{PID: pid(0), Comm: 0x10, Op: OpAllReduce, NCCLSeq: 5, StartNS: ms, EndNS: 2 * ms})
	for s := uint64(6); ; s++ {
		if c.slot(pc, OpAllReduce, s, false) == c.slot(pc, OpAllReduce, 5, false) {
			c.AddCollKernel(CollKernel{PID: pid(0), Comm: 0x10, Op: OpAllReduce, NCCLSeq: s, StartNS: ms, EndNS: 2 * ms})
			break
		}
	}
	if st := c.Stats()[0]; st.KernelRecords != 4 || st.KernelsUnmatched != 3 {
		t.Errorf("received %d, unmatched %d; want 4, 3", st.KernelRecords, st.KernelsUnmatched)
	}
}

// The key rings are made by kernel records only, and bounded over all
// processes: an agent watching many communicators without collection, or
// a process flooding kernels of made-up communicators and ops, holds at
// most maxKernelRings.
func TestKernelRingsAreBounded(t *testing.T) {
	c := twoRanks(t)
	var b batch
	simulate(&b, []uint32{pid(0), pid(1)}, 0, repeat("AB S", 20), 0, 10*ms, nil)
	commOf(&b)
	for i := range b.host {
		b.host[i].NCCLSeq, b.host[i].HasNCCLSeq = uint64(i), b.host[i].Kind == HostCollective
	}
	b.feed(c)
	if c.kernelRings != 0 {
		t.Fatalf("%d key rings without any kernel record", c.kernelRings)
	}
	for i := range 2 * maxKernelRings {
		c.AddCommInit(CommInit{PID: pid(0), Comm: uint64(0x1000 + i), NRanks: 2, Rank: 0, UniqueIDHash: uint64(0xbeef + i)})
		c.AddCollKernel(CollKernel{PID: pid(0), Comm: uint64(0x1000 + i), Op: OpAllReduce, StartNS: ms, EndNS: 2 * ms})
	}
	if c.kernelRings != maxKernelRings {
		t.Errorf("%d key rings, want the bound %d", c.kernelRings, maxKernelRings)
	}
	c.Forget(pid(0))
	if c.kernelRings != 0 {
		t.Errorf("%d key rings after the process left", c.kernelRings)
	}
}

func sameBool(a, b *bool) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

// A rank whose capture saw one call more than its peers' (the uprobes of a
// nested ncclBcast before its switch to the plugin, on the H200) numbers
// every later call one higher: its arrival rows would compare calls a step
// apart. At the first call the plugin names on both, the rank that counted
// differently takes its peer's ordinals; the row where they disagreed is
// not compared.
func TestMisalignedOrdinalsAreRealigned(t *testing.T) {
	for _, extra := range []int{0, 1} {
		t.Run(fmt.Sprintf("rank %d counted a call more", extra), func(t *testing.T) {
			c := twoRanks(t)
			job := pluginJob{hostSkew: [2]int64{0, -ms}, gpuLag: [2]int64{0, 3 * ms}, end: endTogether}
			host, kernels, cupti := job.build(c, 20)
			for i, h := range host {
				if h.PID == pid(extra) && h.Kind == HostCollective {
					dup := h // reported twice, before the switch: no NCCL name
					dup.HasNCCLSeq, dup.NCCLSeq = false, 0
					host[i].HasNCCLSeq, host[i].NCCLSeq = false, 0
					host = append(host, dup)
					break
				}
			}
			for r := range 2 {
				c.AddCollKernel(kernels[r][0]) // the first come before their calls
			}
			b := batch{host: host, dev: cupti}
			b.feed(c)
			for r := range 2 {
				for _, k := range kernels[r][1:] {
					c.AddCollKernel(k)
				}
			}
			steps, _ := c.Flush()
			for _, s := range steps {
				if s.Step < 2 {
					continue
				}
				want := s.Rank == 1
				if s.DeviceLastArrival == nil || *s.DeviceLastArrival != want || s.LastArrival == nil || *s.LastArrival == want {
					t.Fatalf("rank %d step %d: device last %v host last %v, want %v and %v", s.Rank, s.Step,
						deref(s.DeviceLastArrival), deref(s.LastArrival), want, !want)
				}
			}
			st := c.Stats()
			if n := st[0].ArrivalRealigned + st[1].ArrivalRealigned; n != 1 {
				t.Errorf("%d realignments, want 1", n)
			}
			if n := st[0].ArrivalMisaligned + st[1].ArrivalMisaligned; n > 1 {
				t.Errorf("%d rows not compared", n)
			}
		})
	}
}

// The H200's arrival run at the agent's default duty cycle (bench/gpu/
// nccl_plugin.sh part arrival, slow-duty; bench/results/nccl-arrival-s18-
// slow-duty.json): two ranks sharing the GPU, rank 1 with two more matmuls
// before each of its 8 all-reduces per step. CUPTI's kernel starts of the
// same collectives, joined by NCCL seq, put rank 1's GPU last at 97 % of
// them, 2.58 ms behind (median). The capture holds the uprobes' doubled
// ncclBcast of one rank before its switch to the plugin (fixed in the
// converter since; kept here), which put that rank's calls one ordinal
// ahead: the agent read rank 1 as 30.9 ms behind, a step off.
func TestReplayH200DeviceArrival(t *testing.T) {
	steps, c := replayDump(t, "testdata/h200-arrival-slow-duty-2ranks.dump.jsonl.gz")
	var n, last [2]int
	var lags []int64
	for _, s := range steps {
		if s.DeviceLastArrival == nil {
			continue
		}
		n[s.Rank]++
		if *s.DeviceLastArrival {
			last[s.Rank]++
		}
		if s.Rank == 1 && s.DeviceArrivalLagMS != nil {
			lags = append(lags, int64(*s.DeviceArrivalLagMS*1e6))
		}
	}
	if n[1] < 15 || float64(last[1]) < 0.9*float64(n[1]) || float64(last[0]) > 0.25*float64(n[0]) {
		t.Errorf("device last: rank 0 %d of %d steps, rank 1 %d of %d", last[0], n[0], last[1], n[1])
	}
	if len(lags) == 0 {
		t.Fatal("no device lag of rank 1")
	}
	if med := stats.MedianIntFloat(lags) / 1e6; med < 0.75*2.58 || med > 1.25*2.58 {
		t.Errorf("rank 1's median device lag %.2f ms, CUPTI's 2.58 ms", med)
	}
	var realigned uint64
	for _, st := range c.Stats() {
		realigned += st.ArrivalRealigned
	}
	if realigned == 0 {
		t.Error("the doubled broadcast was never realigned")
	}
}
