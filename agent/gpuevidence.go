package agent

import (
	"context"
	"sync"
	"time"

	"github.com/slowrank/slowrank/agent/identity"
	"github.com/slowrank/slowrank/detector"
)

// gpuHistory bounds the samples kept per GPU (10 minutes at one a second).
const gpuHistory = 600

// gpuEvidence samples NVML on its own goroutine and keeps a bounded history
// per GPU, so that a verdict can carry what its rank's GPU did during the
// window (clocks, power, temperature, throttle reasons, ECC and PCIe errors).
// It is evidence next to a verdict, never a root-cause claim.
type gpuEvidence struct {
	nv *NVML

	mu     sync.Mutex
	hist   map[int][]GPUSample // by GPU index, oldest first
	pidGPU map[int]int         // PID -> GPU index it trains on
	// placed is the GPU of each PID that NVML tells apart (rankGPU):
	// what the topology names, where pidGPU's evidence may still guess.
	placed map[int]detector.RankGPU
}

func newGPUEvidence(nv *NVML) *gpuEvidence {
	return &gpuEvidence{nv: nv, hist: map[int][]GPUSample{}, pidGPU: map[int]int{}, placed: map[int]detector.RankGPU{}}
}

// run samples every period until ctx ends; errors are counted, not fatal.
func (g *gpuEvidence) run(ctx context.Context, every time.Duration, c *counters) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		samples, err := g.nv.Sample(monotonicNow())
		if err != nil {
			c.add("nvml_errors", 1)
			continue
		}
		procs, err := g.nv.GPUProcesses()
		if err != nil {
			c.add("nvml_errors", 1)
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
		c.add("nvml_samples", 1)
	}
}

// forPID summarises the samples of pid's GPU in [start, end).
func (g *gpuEvidence) forPID(pid int, start, end int64) *detector.GPUEvidence {
	g.mu.Lock()
	defer g.mu.Unlock()
	idx, ok := g.pidGPU[pid]
	if !ok {
		return nil
	}
	return summariseGPU(g.hist[idx], start, end)
}

// placement returns the GPU that NVML last showed pid training on.
func (g *gpuEvidence) placement(pid int) (detector.RankGPU, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	rg, ok := g.placed[pid]
	return rg, ok
}

// placeGPU puts the GPU that NVML last showed pe's process on into
// pe.info and reports whether that changed it. A process that NVML no
// longer lists (it is exiting, or a read failed) keeps its last GPU: no
// topology version for a flap. Main goroutine only.
func (a *Agent) placeGPU(pe *procEntry) bool {
	if a.gpu == nil {
		return false
	}
	rg, ok := a.gpu.placement(pe.proc.PID)
	if !ok || rg == pe.info.Placement.GPU {
		return false
	}
	pe.info.Placement.GPU = rg
	return true
}

// refreshPlacements sends again the identity of each rank whose GPU NVML
// found (or moved: the context that holds most memory changed) since: a
// process creates its CUDA context after discovery found it, so its first
// RankInfo rarely has one. Main goroutine only.
func (a *Agent) refreshPlacements() {
	for _, pe := range a.att.procs {
		if a.placeGPU(pe) {
			a.log.Debug("rank's GPU found", "pid", pe.proc.PID, "rank", pe.rank, "gpu", pe.info.Placement.GPU.Index, "uuid", pe.info.Placement.GPU.UUID)
			a.pipe.SetRank(pe.info)
		}
	}
}

// summariseGPU is the pure part: extremes over the window, OR of the throttle
// reasons, increases of the cumulative error counters (from the last sample
// before the window when there is one).
func summariseGPU(h []GPUSample, start, end int64) *detector.GPUEvidence {
	var ev *detector.GPUEvidence
	var base *GPUSample
	var reasons uint64
	var last GPUSample
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
func rankGPU(gs []GPUProcess) (detector.RankGPU, bool) {
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
