// Command soak runs the agent for a long time on a synthetic event stream and
// checks that its memory and goroutines do not grow (benchmark, not CI; root).
//
// The stream comes from the fake trainer (test/fakelibs): back-to-back jobs
// of --ranks ranks at a high call rate, each --job-seconds long, so that
// processes come and go (every third job under a new job id, the others as an
// elastic restart of the same job: new processes, new topology version), one
// rank slowed in every other job so that verdicts and escalations happen. The
// agent (the agent package, as `slowrank agent` runs it, with JSONL sinks on
// facts and verdicts) runs in this process; every --every it samples resident
// memory and threads (/proc/self/status), goroutines and the Go heap, live
// after the last GC and in use (the agent's own counters), and the event,
// fact and loss counters.
//
// It writes the series and a verdict to --out. "no growth" means: after the
// warm-up, the median RSS and live Go heap of the last fifth of the run exceed
// those of the first fifth by less than max(--tolerance, 1 MiB), their
// least-squares slope is below the same amount per hour, and the median
// goroutine count of the last fifth is no higher than that of the first.
//
//	make build fakelibs
//	go run ./bench/soak --duration 30m --out bench/results/soak-30min.json
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/slowrank/slowrank/agent"
	"github.com/slowrank/slowrank/otel/export"
)

type sample struct {
	T          float64 `json:"t_s"`
	RSS        int64   `json:"rss_bytes"`
	Heap       int64   `json:"heap_inuse_bytes"`
	HeapLive   int64   `json:"heap_live_bytes"`
	Goroutines int64   `json:"goroutines"`
	Threads    int64   `json:"threads"`
	Events     int64   `json:"events"`
	Facts      int64   `json:"facts"`
	Lost       int64   `json:"lost"`
	Procs      int64   `json:"processes_tracked"`
	Jobs       int     `json:"jobs_started"`
}

type result struct {
	Name       string            `json:"name"`
	Started    time.Time         `json:"started"`
	Duration   string            `json:"duration"`
	Host       map[string]string `json:"host"`
	Load       map[string]any    `json:"load"`
	WarmupS    float64           `json:"warmup_s"`
	Samples    []sample          `json:"samples"`
	Summary    map[string]any    `json:"summary"`
	Verdict    string            `json:"verdict"`
	Counters   map[string]int64  `json:"final_counters"`
	Tolerance  float64           `json:"tolerance"`
	Assessment []string          `json:"assessment"`
}

func main() {
	duration := flag.Duration("duration", 30*time.Minute, "how long to run")
	every := flag.Duration("every", 10*time.Second, "sample period")
	warmup := flag.Duration("warmup", 5*time.Minute, "samples before this are not judged")
	out := flag.String("out", "bench/results/soak-30min.json", "result file")
	trainer := flag.String("trainer", "bin/fakelibs/faketrainer", "fake trainer binary")
	ranks := flag.Int("ranks", 4, "ranks per job")
	jobSeconds := flag.Int("job-seconds", 150, "length of one job")
	stepMS := flag.Float64("step-ms", 2, "host ms per step")
	gpuMS := flag.Float64("gpu-ms", 3, "device ms per step")
	buckets := flag.Int("buckets", 8, "allreduces per step")
	tolerance := flag.Float64("tolerance", 0.10, "allowed relative growth")
	maxProcs := flag.Int("max-procs", 1, "GOMAXPROCS, as `slowrank agent --max-procs` sets it")
	flag.Parse()
	runtime.GOMAXPROCS(*maxProcs)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	dir, err := os.MkdirTemp("", "slowrank-soak-")
	if err != nil {
		fatal(err)
	}
	defer os.RemoveAll(dir)
	facts, err := export.NewJSONLWriter(filepath.Join(dir, "facts.jsonl"))
	if err != nil {
		fatal(err)
	}
	verdicts, err := export.NewJSONLWriter(filepath.Join(dir, "verdicts.jsonl"))
	if err != nil {
		fatal(err)
	}
	// The sinks write to files that would grow without bound over a long
	// soak: truncate them now and then (what log rotation does).
	cfg := agent.DefaultConfig()
	cfg.HostName = "soak"
	cfg.Selector = agent.Selector{EnvKey: "SLOWRANK_SOAK_MARK"}
	cfg.Detector.Window = 2 * time.Second
	cfg.MaxMemory = 256 << 20
	cfg.Logger = log
	cfg.Sinks = []agent.Sink{&export.JSONLSink{Facts: facts, Verdicts: verdicts}} // as `slowrank agent --facts --verdicts`
	a, err := agent.New(cfg)
	if err != nil {
		fatal(err)
	}
	defer func() {
		if err := a.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "soak: releasing the BPF objects:", err)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- a.Run(ctx) }()

	// Jobs back to back.
	jobsCtx, stopJobs := context.WithCancel(context.Background())
	var jobsMu sync.Mutex
	jobs := 0
	var jobsWG sync.WaitGroup
	jobsWG.Add(1)
	go func() {
		defer jobsWG.Done()
		id := 0
		for n := 0; jobsCtx.Err() == nil; n++ {
			if n%3 == 0 {
				id++
			}
			args := []string{"--ranks", strconv.Itoa(*ranks), "--duration", strconv.Itoa(*jobSeconds),
				"--step-ms", fmt.Sprint(*stepMS), "--gpu-ms", fmt.Sprint(*gpuMS), "--buckets", strconv.Itoa(*buckets)}
			if n%2 == 1 {
				args = append(args, "--slow-rank", strconv.Itoa(n%*ranks), "--slow-from-step", "2000", "--slow-host-ms", "3")
			}
			cmd := exec.CommandContext(jobsCtx, *trainer, args...)
			cmd.Env = append(os.Environ(), "SLOWRANK_SOAK_MARK=1", fmt.Sprintf("SLOWRANK_FAKE_JOB=soak-%d", id),
				fmt.Sprintf("TORCHELASTIC_RUN_ID=soak-%d", id))
			jobsMu.Lock()
			jobs++
			jobsMu.Unlock()
			if b, err := cmd.CombinedOutput(); err != nil && jobsCtx.Err() == nil {
				fmt.Fprintf(os.Stderr, "job %d: %v\n%s\n", n, err, tail(string(b), 400))
				time.Sleep(time.Second)
			}
		}
	}()

	res := result{
		Name: "soak", Started: time.Now().UTC(), Duration: duration.String(), WarmupS: warmup.Seconds(), Tolerance: *tolerance,
		Host: map[string]string{"cpus": strconv.Itoa(runtime.NumCPU()), "go": runtime.Version(), "kernel": kernel()},
		Load: map[string]any{"ranks": *ranks, "job_seconds": *jobSeconds, "step_ms": *stepMS, "gpu_ms": *gpuMS,
			"buckets": *buckets, "jobs": "back to back; new job id every 3rd job, elastic restart otherwise; one slowed rank every other job",
			"sinks": "JSONL facts and verdicts (truncated every sample)", "max_memory_bytes": cfg.MaxMemory},
	}
	start := time.Now()
	tk := time.NewTicker(*every)
	for now := range tk.C {
		c := a.Counters()
		jobsMu.Lock()
		s := sample{
			T: now.Sub(start).Seconds(), RSS: c["rss_bytes"], Heap: c["heap_inuse_bytes"], HeapLive: c["heap_live_bytes"], Goroutines: c["goroutines"],
			Threads: c["threads"], Events: c["events"], Lost: c["ringbuf_lost"] + c["events_lost_queue"],
			Facts: facts.Written(), Procs: c["processes_tracked"], Jobs: jobs,
		}
		jobsMu.Unlock()
		res.Samples = append(res.Samples, s)
		fmt.Fprintf(os.Stderr, "%6.0fs rss %6.1f MiB heap live %5.1f in use %5.1f MiB goroutines %3d threads %2d events %9d facts %7d lost %d procs %d jobs %d\n",
			s.T, mib(s.RSS), mib(s.HeapLive), mib(s.Heap), s.Goroutines, s.Threads, s.Events, s.Facts, s.Lost, s.Procs, s.Jobs)
		truncate(filepath.Join(dir, "facts.jsonl"))
		truncate(filepath.Join(dir, "verdicts.jsonl"))
		if now.Sub(start) >= *duration {
			break
		}
		if len(res.Samples)%6 == 0 {
			judge(&res) // keep a partial result on disk
			write(*out, res)
		}
	}
	tk.Stop()
	stopJobs()
	jobsWG.Wait()
	cancel()
	if err := <-runDone; err != nil {
		fmt.Fprintln(os.Stderr, "soak: the agent ended with", err)
	}
	res.Counters = a.Counters()
	for _, w := range []*export.JSONLWriter{facts, verdicts} {
		if err := w.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "soak: closing an output:", err)
		}
	}
	judge(&res)
	write(*out, res)
	fmt.Fprintln(os.Stderr, "verdict:", res.Verdict)
	for _, l := range res.Assessment {
		fmt.Fprintln(os.Stderr, " ", l)
	}
}

// judge computes the summary and the verdict from the samples after warm-up.
func judge(r *result) {
	var xs []sample
	for _, s := range r.Samples {
		if s.T >= r.WarmupS {
			xs = append(xs, s)
		}
	}
	r.Assessment = nil
	if len(xs) < 10 {
		r.Verdict = "too short"
		return
	}
	fifth := len(xs) / 5
	first, last := xs[:fifth], xs[len(xs)-fifth:]
	med := func(ss []sample, f func(sample) float64) float64 {
		v := make([]float64, len(ss))
		for i, s := range ss {
			v[i] = f(s)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	maxOf := func(ss []sample, f func(sample) float64) float64 {
		m := math.Inf(-1)
		for _, s := range ss {
			m = math.Max(m, f(s))
		}
		return m
	}
	rss := func(s sample) float64 { return float64(s.RSS) }
	heap := func(s sample) float64 { return float64(s.HeapLive) }
	gor := func(s sample) float64 { return float64(s.Goroutines) }
	ok := true
	sum := map[string]any{"samples_judged": len(xs)}
	for _, m := range []struct {
		name string
		f    func(sample) float64
	}{{"rss", rss}, {"heap_live", heap}} {
		a, b := med(first, m.f), med(last, m.f)
		slope := slopePerHour(xs, m.f)
		growth := b/a - 1
		perHour := slope / a
		sum[m.name+"_first_fifth_median_mib"] = round(a / (1 << 20))
		sum[m.name+"_last_fifth_median_mib"] = round(b / (1 << 20))
		sum[m.name+"_max_mib"] = round(maxOf(xs, m.f) / (1 << 20))
		sum[m.name+"_growth"] = round(growth)
		sum[m.name+"_slope_per_hour_relative"] = round(perHour)
		line := fmt.Sprintf("%s: first fifth %.1f MiB, last fifth %.1f MiB (%+.1f%%), trend %+.2f MiB/h (%+.1f%%/h)", m.name, a/(1<<20), b/(1<<20), 100*growth, slope/(1<<20), 100*perHour)
		// Growth: beyond the tolerance and beyond 1 MiB (the Go heap of an
		// idle agent moves by about a MiB between GC cycles).
		allowed := math.Max(r.Tolerance*a, 1<<20)
		if b-a > allowed || slope > allowed {
			ok = false
			line += "  GROWTH"
		}
		r.Assessment = append(r.Assessment, line)
	}
	g0, g1 := med(first, gor), med(last, gor)
	sum["goroutines_first_fifth_median"], sum["goroutines_last_fifth_median"], sum["goroutines_max"] = g0, g1, maxOf(xs, gor)
	line := fmt.Sprintf("goroutines: first fifth %.0f, last fifth %.0f, max %.0f", g0, g1, maxOf(xs, gor))
	if g1 > g0 {
		ok = false
		line += "  GROWTH"
	}
	r.Assessment = append(r.Assessment, line)
	ev := float64(xs[len(xs)-1].Events-xs[0].Events) / (xs[len(xs)-1].T - xs[0].T)
	sum["events_per_s"] = round(ev)
	sum["lost"] = xs[len(xs)-1].Lost
	sum["facts"] = xs[len(xs)-1].Facts
	r.Assessment = append(r.Assessment, fmt.Sprintf("stream: %.0f events/s, %d lost, %d jobs", ev, xs[len(xs)-1].Lost, xs[len(xs)-1].Jobs))
	r.Summary = sum
	r.Verdict = "no growth"
	if !ok {
		r.Verdict = "growth"
	}
}

// slopePerHour is the least-squares slope of f over time, per hour.
func slopePerHour(xs []sample, f func(sample) float64) float64 {
	var sx, sy, sxx, sxy float64
	n := float64(len(xs))
	for _, s := range xs {
		x, y := s.T/3600, f(s)
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}

func round(v float64) float64 { return math.Round(v*1000) / 1000 }
func mib(v int64) float64     { return float64(v) / (1 << 20) }

func truncate(path string) {
	// The writer appends at its own offset: truncating under it leaves a
	// sparse file, which is fine for a soak (the bytes are not kept).
	if err := os.Truncate(path, 0); err != nil {
		fmt.Fprintln(os.Stderr, "soak: truncate:", err) // the file grows: the soak goes on
	}
}

func write(path string, r result) {
	b, err := json.MarshalIndent(r, "", " ")
	if err != nil {
		fatal(err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		fatal(err)
	}
}

func kernel() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "soak:", err)
	os.Exit(1)
}
