package correlate

import (
	"cmp"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/slowrank/slowrank/detector"
)

const (
	us = int64(1000)
	ms = 1000 * us
)

// batch collects hand-built records and feeds them in delivery order: host
// calls by end time, then device records (as CUPTI delivers them later).
type batch struct {
	host []HostCall
	dev  []DeviceInterval
}

func (b *batch) coll(pid uint32, comm uint64, op Op, count uint64, start, end int64) {
	b.host = append(b.host, HostCall{PID: pid, TID: pid, Kind: HostCollective, Op: op, Count: count, Datatype: 7, Comm: comm, StartNS: start, EndNS: end})
}

func (b *batch) sync(pid uint32, start, end int64) {
	b.host = append(b.host, HostCall{PID: pid, TID: pid, Kind: HostSyncWait, Op: "cudaStreamSynchronize", StartNS: start, EndNS: end})
}

func (b *batch) collWait(pid uint32, op Op, start, end int64) {
	b.host = append(b.host, HostCall{PID: pid, TID: pid, Kind: HostCollWait, Op: op, Count: 1, StartNS: start, EndNS: end})
}

func (b *batch) kernel(pid uint32, class KernelClass, name string, start, end int64) {
	b.dev = append(b.dev, DeviceInterval{PID: pid, Kind: DeviceKernel, Class: class, Name: name, StartNS: start, EndNS: end,
		Grid: [3]uint32{80, 1, 1}, Block: [3]uint32{256, 1, 1}, Corr: uint32(len(b.dev) + 1)})
}

func (b *batch) copyRec(pid uint32, start, end int64) {
	b.dev = append(b.dev, DeviceInterval{PID: pid, Kind: DeviceMemcpy, StartNS: start, EndNS: end, Corr: uint32(len(b.dev) + 1)})
}

func (b *batch) feed(c *Correlator) {
	slices.SortStableFunc(b.host, func(x, y HostCall) int { return cmp.Compare(x.EndNS, y.EndNS) })
	for _, h := range b.host {
		c.AddHostCall(h)
	}
	for _, d := range b.dev {
		c.AddDevice(d)
	}
	b.host, b.dev = b.host[:0], b.dev[:0]
}

func byRank(steps []detector.Step) map[int][]detector.Step {
	m := make(map[int][]detector.Step)
	for _, s := range steps {
		m[s.Rank] = append(m[s.Rank], s)
	}
	for _, v := range m {
		slices.SortFunc(v, func(a, b detector.Step) int { return cmp.Compare(a.Step, b.Step) })
	}
	return m
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

func checkContiguous(t *testing.T, steps []detector.Step) {
	t.Helper()
	for i := 1; i < len(steps); i++ {
		if steps[i].Step != steps[i-1].Step+1 {
			t.Fatalf("step %d follows %d", steps[i].Step, steps[i-1].Step)
		}
	}
}

// testSpan is the ConfirmSpan of tests whose synthetic iterations last
// about 10 ms: five of them (the default is for real iterations). Tests of
// init-time bursts set their own.
const testSpan = 50 * time.Millisecond

func newTest(cfg Config, ranks ...int) *Correlator {
	if cfg.ConfirmSpan == 0 {
		cfg.ConfirmSpan = testSpan
	}
	c := New(cfg)
	for _, r := range ranks {
		c.SetRank(RankInfo{PID: uint32(100 + r), Rank: r, LocalRank: r, WorldSize: len(ranks), Host: "h0", Job: "j1"})
	}
	return c
}

func pid(rank int) uint32 { return uint32(100 + rank) }

// checkSameIterations fails t when a step index is a different iteration
// on two of the ranks (iterOf: step index -> rank -> iteration).
func checkSameIterations(t *testing.T, iterOf map[int64]map[int]int) {
	t.Helper()
	apart := 0
	for _, m := range iterOf {
		it := -1
		for _, v := range m {
			if it >= 0 && v != it {
				apart++
				break
			}
			it = v
		}
	}
	if apart > 0 {
		t.Errorf("%d step indices are different iterations on different ranks", apart)
	}
}
