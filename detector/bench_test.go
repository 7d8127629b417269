package detector_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/slowrank/slowrank/detector"
)

// benchSteps builds steps of n ranks: perRank steps per rank, inside one window.
func benchSteps(n, perRank int, window int64) []detector.Step {
	steps := make([]detector.Step, 0, n*perRank)
	for k := 0; k < perRank; k++ {
		end := window*int64(k)/int64(perRank) + 1
		for r := 0; r < n; r++ {
			c := 100 + float64((r*7+k*3)%5)
			if r == n/2 {
				c *= 1.3
			}
			steps = append(steps, detector.Step{
				Kind: "step", Job: "bench", Rank: r, Step: int64(k), EndNS: end,
				Phases:   map[string]float64{"compute": c, "host": 20 + float64(r%5)},
				Workload: &detector.Workload{FP: "w"},
			})
		}
	}
	return steps
}

// BenchmarkIngest measures facts ingested per second on one core (steps that
// do not settle a window; settlement is measured separately).
func BenchmarkIngest(b *testing.B) {
	cfg := detector.DefaultConfig()
	cfg.Lateness = time.Hour
	window := int64(cfg.Window)
	steps := benchSteps(1024, 64, window)
	b.ReportAllocs()
	b.ResetTimer()
	var d *detector.Detector
	for i := 0; i < b.N; i++ {
		if i%len(steps) == 0 {
			b.StopTimer()
			d, _ = detector.New(cfg)
			d.SetOrigin("bench", 0)
			b.StartTimer()
		}
		if _, err := d.AddStep(steps[i%len(steps)]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "facts/s")
}

// BenchmarkSettle measures the time to settle one window of n ranks with two
// phases (compute and host) and 5 steps per rank.
func BenchmarkSettle(b *testing.B) {
	for _, n := range []int{1024, 16384} {
		b.Run(fmt.Sprintf("ranks=%d", n), func(b *testing.B) {
			cfg := detector.DefaultConfig()
			cfg.Lateness = time.Hour
			steps := benchSteps(n, 5, int64(cfg.Window))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				d, _ := detector.New(cfg)
				d.SetOrigin("bench", 0)
				for _, s := range steps {
					if _, err := d.AddStep(s); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				if vs := d.Flush(); len(vs) == 0 {
					b.Fatal("the slow rank was not reported")
				}
			}
		})
	}
}

// BenchmarkStatePerRankPhase reports the long-lived heap bytes per (rank,
// phase) once windows are settled: the bounded state the detector keeps.
func BenchmarkStatePerRankPhase(b *testing.B) {
	const n = 16384
	cfg := detector.DefaultConfig()
	cfg.Lateness = 0
	for i := 0; i < b.N; i++ {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		d, _ := detector.New(cfg)
		d.SetOrigin("bench", 0)
		for w := int64(0); w < 3; w++ {
			for _, s := range benchSteps(n, 2, int64(cfg.Window)) {
				s.EndNS += w * int64(cfg.Window)
				s.Step += w * 10
				if _, err := d.AddStep(s); err != nil {
					b.Fatal(err)
				}
			}
		}
		d.Flush()
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n*len(cfg.Phases)), "B/rank-phase")
		runtime.KeepAlive(d)
	}
}
