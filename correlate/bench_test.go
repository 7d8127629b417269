package correlate

import (
	"runtime"
	"testing"
	"time"
)

// workload generates steps of nRanks ranks on one communicator: per rank
// and step 4 collectives, 2 synchronisations and k device records
// (compute, attention, communication, copies), with device collection
// toggled on and off every 50 steps.
type workload struct {
	c      *Correlator
	nRanks int
	k      int
	step   int64
	host   []HostCall
	dev    []DeviceInterval
	corr   uint32
}

func newWorkload(nRanks, k int) *workload {
	w := &workload{nRanks: nRanks, k: k}
	ranks := make([]int, nRanks)
	for i := range ranks {
		ranks[i] = i
	}
	w.c = newTest(Config{KernelName: func(_, id uint32) string { return kernelNames[id%uint32(len(kernelNames))] }}, ranks...)
	for r := range nRanks {
		w.c.AddCommInit(CommInit{PID: pid(r), Comm: uint64(0x40 + r), NRanks: nRanks, Rank: r, UniqueIDHash: 0x77})
	}
	return w
}

var kernelNames = []string{"ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nn", "flash_fwd_kernel", "vectorized_elementwise_kernel", "layer_norm_kernel"}

const stepLen = 20 * ms

// next generates one step for every rank; it returns the number of
// intervals.
func (w *workload) next() int {
	base := w.step * stepLen
	w.host, w.dev = w.host[:0], w.dev[:0]
	on := (w.step/50)%2 == 0
	for r := range w.nRanks {
		p := pid(r)
		comm := uint64(0x40 + r)
		skew := int64(r) * 7 * us
		for i, cnt := range []uint64{1 << 20, 1 << 20, 1 << 19, 1} {
			st := base + int64(2+3*i)*ms + skew
			w.host = append(w.host, HostCall{PID: p, Kind: HostCollective, Op: "allreduce", Count: cnt, Datatype: 7, Comm: comm, StartNS: st, EndNS: st + 8*us})
		}
		w.host = append(w.host, HostCall{PID: p, Kind: HostSyncWait, Op: "cudaStreamSynchronize", StartNS: base + 14*ms, EndNS: base + 15*ms})
		w.host = append(w.host, HostCall{PID: p, Kind: HostSyncWait, Op: "cudaStreamSynchronize", StartNS: base + 17*ms, EndNS: base + stepLen})
		if !on || w.k == 0 {
			continue
		}
		span := (stepLen - 2*ms) / int64(w.k)
		for i := range w.k {
			st := base + ms + int64(i)*span
			d := DeviceInterval{PID: p, Kind: DeviceKernel, StartNS: st, EndNS: st + span*3/4, NameID: uint32(i % 16),
				Grid: [3]uint32{uint32(i % 7), 1, 1}, Block: [3]uint32{256, 1, 1}}
			switch i % 8 {
			case 0:
				d.Class = ClassComm
				d.EndNS = st + 2*span
			case 1:
				d.Class = ClassAttention
			case 2:
				d.Kind = DeviceMemcpy
			default:
				d.Class = ClassGEMM
			}
			w.corr++
			d.Corr = w.corr
			w.dev = append(w.dev, d)
		}
	}
	if w.step%50 == 0 {
		for r := range w.nRanks {
			w.c.AddCoverage(Coverage{PID: pid(r), StartNS: base, EndNS: base + 50*stepLen})
		}
	}
	w.step++
	return len(w.host) + len(w.dev)
}

func (w *workload) feed() {
	for i := range w.host {
		w.c.AddHostCall(w.host[i])
	}
	for i := range w.dev {
		w.c.AddDevice(w.dev[i])
	}
}

func BenchmarkCorrelate(b *testing.B) {
	for _, k := range []int{0, 40} {
		name := "host-only"
		if k > 0 {
			name = "host+device"
		}
		b.Run(name, func(b *testing.B) {
			w := newWorkload(8, k)
			b.ReportAllocs()
			b.ResetTimer()
			n := 0
			start := time.Now()
			for n < b.N {
				w.next()
				w.feed()
				n += len(w.host) + len(w.dev)
				if w.step%16 == 0 {
					w.c.Drain()
				}
			}
			el := time.Since(start).Seconds()
			b.ReportMetric(float64(n)/el, "intervals/s")
			b.ReportMetric(float64(w.step)*8/el, "rank-steps/s")
		})
	}
}

// The heap does not grow over 1,000,000 steps.
func TestMemoryBounded(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("long; run without -short and without -race")
	}
	w := newWorkload(2, 8)
	var emitted int
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	var h0 uint64
	const total = 1_000_000
	for w.step < total {
		w.next()
		w.feed()
		if w.step%64 == 0 {
			steps, _ := w.c.Drain()
			emitted += len(steps)
		}
		if w.step == 100_000 {
			h0 = heap()
		}
	}
	h1 := heap()
	steps, _ := w.c.Flush()
	emitted += len(steps)
	if emitted < 2*(total-10) {
		t.Fatalf("emitted %d steps for %d rank-steps; stats %+v", emitted, 2*total, w.c.Stats())
	}
	t.Logf("heap after 100k steps %d B, after 1M steps %d B", h0, h1)
	if h1 > h0+256<<10 {
		t.Fatalf("heap grew from %d to %d bytes", h0, h1)
	}
	for _, st := range w.c.Stats() {
		if st.Late+st.Duplicate+st.Evicted+st.InvalidSteps+st.ArrivalTimeout != 0 {
			t.Fatalf("stats %+v", st)
		}
	}
}

// Worst case: a communicator whose calls never repeat (dynamic shapes)
// keeps the detector searching on every call.
func BenchmarkUnlockedCalls(b *testing.B) {
	c := newTest(Config{}, 0)
	b.ReportAllocs()
	for i := range b.N {
		t := int64(i) * 10 * us
		c.AddHostCall(HostCall{PID: pid(0), Kind: HostCollective, Op: "alltoall", Count: uint64(i % 3000), Comm: 9, StartNS: t, EndNS: t + us})
		if i%4096 == 0 {
			c.Drain()
		}
	}
}
