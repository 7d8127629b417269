package gpu

import (
	"context"
	"sync"
	"time"

	"github.com/slowrank/slowrank/agent/identity"
	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/internal/monoclock"
)

// gpuHistory bounds the samples kept per GPU (10 minutes at one a second).
const gpuHistory = 600

// Evidence samples NVML on its own goroutine (Run) and keeps a bounded
// history per GPU, so that a verdict can carry what its rank's GPU did
// during the window (clocks, power, temperature, throttle reasons, ECC and
// PCIe errors). It is evidence next to a verdict, never a root-cause claim.
// Its methods are safe from any goroutine.
type Evidence struct {
	nv *NVML

	mu     sync.Mutex
	hist   map[int][]Sample // by GPU index, oldest first
	pidGPU map[int]int      // PID -> GPU index it trains on
	// placed is the GPU of each PID that NVML tells apart (rankGPU):
	// what the topology names, where pidGPU's evidence may still guess.
	placed map[int]detector.RankGPU
}

// NewEvidence returns an Evidence that samples nv (nil: one that never
// samples, for tests).
func NewEvidence(nv *NVML) *Evidence {
	return &Evidence{nv: nv, hist: map[int][]Sample{}, pidGPU: map[int]int{}, placed: map[int]detector.RankGPU{}}
}

// Run samples every period until ctx ends. Errors are counted, not fatal:
// count receives nvml_errors and nvml_samples.
func (g *Evidence) Run(ctx context.Context, every time.Duration, count func(name string, n int64)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		samples, err := g.nv.Sample(monoclock.Now())
		if err != nil {
			count("nvml_errors", 1)
			continue
		}
		procs, err := g.nv.GPUProcesses()
		if err != nil {
			count("nvml_errors", 1)
		}
		g.mu.Lock()
		for _, s := range samples {
			h := append(g.hist[s.Index], s)
			if len(h) > gpuHistory {
				h = append(h[:0], h[len(h)-gpuHistory:]...)
			}
			g.hist[s.Index] = h
		}
		if procs != nil {
			g.pidGPU = make(map[int]int, len(procs))
			g.placed = make(map[int]detector.RankGPU, len(procs))
			for pid, gs := range procs {
				g.pidGPU[pid] = gs[0].GPUIndex
				if rg, ok := rankGPU(gs); ok {
					g.placed[pid] = rg
				}
			}
		}
		g.mu.Unlock()
		count("nvml_samples", 1)
	}
}

// ForPID summarises the samples of pid's GPU in [start, end): nil when
// NVML has not shown pid on a GPU or took no sample then.
func (g *Evidence) ForPID(pid int, start, end int64) *detector.GPUEvidence {
	g.mu.Lock()
	defer g.mu.Unlock()
	idx, ok := g.pidGPU[pid]
	if !ok {
		return nil
	}
	return summariseGPU(g.hist[idx], start, end)
}

// Placement returns the GPU that NVML last showed pid training on.
func (g *Evidence) Placement(pid int) (detector.RankGPU, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	rg, ok := g.placed[pid]
	return rg, ok
}

// Close closes NVML; call it after Run has returned.
func (g *Evidence) Close() error {
	if g.nv == nil {
		return nil
	}
	return g.nv.Close()
}

// summariseGPU is the pure part: extremes over the window, OR of the throttle
// reasons, increases of the cumulative error counters (from the last sample
// before the window when there is one).
func summariseGPU(h []Sample, start, end int64) *detector.GPUEvidence {
	var ev *detector.GPUEvidence
	var base *Sample
	var reasons uint64
	var last Sample
	for i := range h {
		s := h[i]
		if s.AtNS < start {
			base = &h[i]
			continue
		}
		if s.AtNS >= end {
			break
		}
		if ev == nil {
			ev = &detector.GPUEvidence{Index: s.Index, UUID: s.UUID, SMClockMinMHz: s.SMClockMHz}
			if base == nil {
				base = &h[i]
			}
		}
		ev.Samples++
		ev.SMClockMinMHz = min(ev.SMClockMinMHz, s.SMClockMHz)
		ev.SMClockMaxMHz = max(ev.SMClockMaxMHz, s.SMClockMHz)
		ev.SMClockLimitMHz = max(ev.SMClockLimitMHz, s.SMClockLimitMHz)
		ev.PowerMaxW = max(ev.PowerMaxW, float64(s.PowerMW)/1000)
		ev.TempMaxC = max(ev.TempMaxC, s.TempC)
		reasons |= s.ThrottleReasons
		last = s
	}
	if ev == nil {
		return nil
	}
	ev.ThrottleReasons = ThrottleReasonNames(reasons)
	if last.ECCUncorrected > base.ECCUncorrected {
		ev.ECCUncorrected = last.ECCUncorrected - base.ECCUncorrected
	}
	if last.PCIeReplays > base.PCIeReplays {
		ev.PCIeReplays = last.PCIeReplays - base.PCIeReplays
	}
	return ev
}

// rankGPU is the GPU that NVML shows a process training on: its only GPU,
// or among several (a stray context on GPU 0 is common) the one holding
// most of its memory. When NVML cannot tell them apart (equal or unknown
// memory) it is none: the local rank or CUDA_VISIBLE_DEVICES would only
// guess, as the visible devices are renumbered from 0 inside a container.
// gs is GPUProcesses' list for the process, largest memory first.
func rankGPU(gs []Process) (detector.RankGPU, bool) {
	if len(gs) == 0 {
		return detector.RankGPU{}, false
	}
	if len(gs) > 1 {
		top := gs[0].UsedMemory
		for _, g := range gs[1:] {
			if top == MemoryUnknown || g.UsedMemory == MemoryUnknown || g.UsedMemory >= top {
				return detector.RankGPU{}, false
			}
		}
	}
	g := gs[0]
	if identity.CleanName(g.UUID) == "" {
		return detector.RankGPU{}, false
	}
	return detector.RankGPU{Index: g.GPUIndex, UUID: g.UUID, PCIBusID: identity.CleanName(g.PCIBusID)}, true
}
