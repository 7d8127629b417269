// Command aggregate is the load generator of `slowrank aggregate`: it starts
// one aggregator (pinned to --cpus with taskset and GOMAXPROCS), simulates
// --ranks ranks on hosts of --ranks-per-host ranks that each send one step
// fact per rank per second over OTLP/gRPC (one request per host per second,
// spread over the second, plus each host's topology with the full world
// group at start and every minute, as agents do), and measures how long
// windows take to settle and how much memory the aggregator holds. Raw
// results go to --out as JSON. See README.md.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/internal/monoclock"
	"github.com/slowrank/slowrank/otel/wire"
)

type options struct {
	slowrank     string
	ranks        int
	ranksPerHost int
	duration     time.Duration
	window       time.Duration
	lateness     time.Duration
	cpus         string
	conns        int
	out          string
	listen       string
	slowRank     int
	topoEvery    time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.slowrank, "slowrank", "bin/slowrank", "slowrank binary")
	flag.IntVar(&o.ranks, "ranks", 16384, "ranks simulated")
	flag.IntVar(&o.ranksPerHost, "ranks-per-host", 8, "ranks per simulated host (one request per host per second)")
	flag.DurationVar(&o.duration, "duration", 3*time.Minute, "how long to send")
	flag.DurationVar(&o.window, "window", 5*time.Second, "aggregator --window")
	flag.DurationVar(&o.lateness, "lateness", 2*time.Second, "aggregator --lateness")
	flag.StringVar(&o.cpus, "cpus", "0,1", "CPUs the aggregator is pinned to (taskset -c); GOMAXPROCS = their count")
	flag.IntVar(&o.conns, "conns", 64, "gRPC connections the simulated hosts share")
	flag.StringVar(&o.out, "out", "bench/results/aggregate-16384.json", "raw results")
	flag.StringVar(&o.listen, "listen", "127.0.0.1:14317", "aggregator address")
	flag.IntVar(&o.slowRank, "slow-rank", 77, "rank whose host phase is 20% slower (every window has a verdict)")
	flag.DurationVar(&o.topoEvery, "topology-every", time.Minute, "how often each host re-sends its topology")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "aggbench:", err)
		os.Exit(1)
	}
}

// Result is the raw output.
type Result struct {
	Command       string         `json:"command"`
	Started       time.Time      `json:"started"`
	Machine       map[string]any `json:"machine"`
	Config        map[string]any `json:"config"`
	Samples       []Sample       `json:"samples"`
	Stats         []StatsLine    `json:"aggregator_stats"`
	Windows       []WindowSeen   `json:"windows"`
	Generator     map[string]any `json:"generator"`
	Summary       map[string]any `json:"summary"`
	AggregatorLog []string       `json:"aggregator_log_tail"`
}

// Sample is one second of the aggregator process.
type Sample struct {
	T        float64 `json:"t_s"`
	RSSMiB   float64 `json:"rss_mib"`
	CPUPct   float64 `json:"cpu_pct"` // of one core, over the last second
	FactsOut int64   `json:"facts_sent"`
}

// StatsLine is one "aggregate stats" log line, parsed.
type StatsLine struct {
	T      float64            `json:"t_s"`
	Fields map[string]float64 `json:"fields"`
}

// WindowSeen is when a window's first verdict appeared in the verdict
// file, against its deadline (end + lateness) on the shared CLOCK_MONOTONIC.
type WindowSeen struct {
	Window     int64   `json:"window"`
	Verdicts   int     `json:"verdicts_for_slow_rank"`
	State      string  `json:"slow_rank_state"`
	EndToSeenS float64 `json:"end_to_seen_s"`
	LagS       float64 `json:"deadline_to_seen_s"`
}

func run(o options) error {
	hosts := o.ranks / o.ranksPerHost
	dir, err := os.MkdirTemp("", "aggbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	vpath := filepath.Join(dir, "verdicts.jsonl")
	ncpu := len(strings.Split(o.cpus, ","))
	args := []string{"-c", o.cpus, o.slowrank, "aggregate", "--listen", o.listen, "--verdicts", vpath,
		"--window", o.window.String(), "--lateness", o.lateness.String(), "--otel", "off", "--stats-every", "5s",
		"--max-request-bytes", strconv.Itoa(16 << 20)}
	cmd := exec.Command("taskset", args...)
	cmd.Env = append(os.Environ(), "GOMAXPROCS="+strconv.Itoa(ncpu))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	res := &Result{
		Command: strings.Join(os.Args, " "), Started: time.Now().UTC(),
		Machine: machine(),
		Config: map[string]any{"ranks": o.ranks, "ranks_per_host": o.ranksPerHost, "hosts": hosts, "duration_s": o.duration.Seconds(),
			"window_s": o.window.Seconds(), "lateness_s": o.lateness.Seconds(), "aggregator_cpus": o.cpus, "gomaxprocs": ncpu,
			"generator_affinity": affinity(), "conns": o.conns, "steps_per_rank_per_s": 1, "slow_rank": o.slowRank,
			"topology_every_s": o.topoEvery.Seconds(), "aggregator_command": "GOMAXPROCS=" + strconv.Itoa(ncpu) + " taskset " + strings.Join(args, " ")},
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start aggregator: %w", err)
	}
	pid := cmd.Process.Pid
	t0 := time.Now()
	var logMu sync.Mutex
	var logTail []string
	statsCh := make(chan StatsLine, 1024)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			logMu.Lock()
			logTail = append(logTail, line)
			if len(logTail) > 200 {
				logTail = logTail[len(logTail)-200:]
			}
			logMu.Unlock()
			if strings.Contains(line, `msg="aggregate stats"`) {
				statsCh <- StatsLine{T: time.Since(t0).Seconds(), Fields: parseKV(line)}
			}
		}
		close(statsCh)
	}()
	var statsLines []StatsLine
	var statsMu sync.Mutex
	go func() {
		for s := range statsCh {
			statsMu.Lock()
			statsLines = append(statsLines, s)
			statsMu.Unlock()
		}
	}()
	time.Sleep(time.Second)

	// Connections.
	conns := make([]plogotlp.GRPCClient, o.conns)
	var raw []*grpc.ClientConn
	for i := range conns {
		c, err := grpc.NewClient(o.listen, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		raw = append(raw, c)
		conns[i] = plogotlp.NewGRPCClient(c)
	}
	defer func() {
		for _, c := range raw {
			c.Close()
		}
	}()

	var sent, sendErrs, requests atomic.Int64
	world := make([]int, o.ranks)
	for i := range world {
		world[i] = i
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.duration)
	defer cancel()
	var wg sync.WaitGroup
	workers := min(o.conns, hosts)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			worker(ctx, o, w, workers, hosts, world, conns[w%len(conns)], &sent, &sendErrs, &requests)
		}()
	}

	// Sampling: RSS and CPU of the aggregator each second; window latency
	// from the verdict file.
	windows := map[int64]*WindowSeen{}
	var winMu sync.Mutex
	pollStop, pollDone := make(chan struct{}), make(chan struct{})
	go func() { // every 50 ms: when did each window's verdicts appear?
		defer close(pollDone)
		offset := int64(0)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			winMu.Lock()
			offset = scanVerdicts(vpath, offset, o, windows)
			winMu.Unlock()
			select {
			case <-pollStop:
				return
			case <-t.C:
			}
		}
	}()
	var samples []Sample
	var lastCPU float64
	lastT := time.Now()
	tick := time.NewTicker(time.Second)
	func() {
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tick.C:
				rss, cpu := procStat(pid)
				dt := now.Sub(lastT).Seconds()
				samples = append(samples, Sample{T: time.Since(t0).Seconds(), RSSMiB: rss, CPUPct: 100 * (cpu - lastCPU) / dt, FactsOut: sent.Load()})
				lastCPU, lastT = cpu, now
			}
		}
	}()
	wg.Wait()
	// Let the last windows settle, then stop the aggregator (its final
	// flush settles the partial last window: not measured).
	time.Sleep(o.window + o.lateness + time.Second)
	close(pollStop)
	<-pollDone
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait()

	var ws []WindowSeen
	for _, w := range windows {
		ws = append(ws, *w)
	}
	sort.Slice(ws, func(a, b int) bool { return ws[a].Window < ws[b].Window })
	res.Samples, res.Windows = samples, ws
	statsMu.Lock()
	res.Stats = statsLines
	statsMu.Unlock()
	logMu.Lock()
	res.AggregatorLog = logTail
	logMu.Unlock()
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	res.Generator = map[string]any{"facts_sent": sent.Load(), "requests": requests.Load(), "send_errors": sendErrs.Load(),
		"cpu_s": float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9}
	res.Summary = summarize(res, o)
	b, err := json.MarshalIndent(res, "", " ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(o.out, append(b, '\n'), 0o644); err != nil {
		return err
	}
	s, _ := json.MarshalIndent(res.Summary, "", " ")
	fmt.Println(string(s))
	return nil
}

// worker simulates hosts w, w+workers, ...: each sends its ranks' steps
// once per second at its own phase within the second.
func worker(ctx context.Context, o options, w, workers, hosts int, world []int, c plogotlp.GRPCClient, sent, errs, requests *atomic.Int64) {
	type host struct {
		id      int
		name    string
		offset  int64 // its CLOCK_MONOTONIC origin: unrelated to ours
		phase   time.Duration
		step    int64
		topoDue time.Time
	}
	rng := rand.New(rand.NewPCG(uint64(w), 42))
	var hs []*host
	for h := w; h < hosts; h += workers {
		hs = append(hs, &host{id: h, name: fmt.Sprintf("host%05d", h), offset: rng.Int64N(1 << 50),
			phase: time.Duration(rng.Int64N(int64(time.Second)))})
	}
	sort.Slice(hs, func(a, b int) bool { return hs[a].phase < hs[b].phase })
	start := time.Now()
	for sec := 0; ; sec++ {
		for _, h := range hs {
			at := start.Add(time.Duration(sec)*time.Second + h.phase)
			if d := time.Until(at); d > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(d):
				}
			}
			if ctx.Err() != nil {
				return
			}
			hostNow := monoclock.Now() + h.offset
			var topos []detector.Topology
			if time.Now().After(h.topoDue) {
				t := detector.Topology{Kind: detector.KindTopology, Job: "bench", Version: 1,
					Groups: []detector.Group{{ID: "world", Type: "world", Ranks: world}}}
				for i := range o.ranksPerHost {
					t.Ranks = append(t.Ranks, detector.RankInfo{Rank: h.id*o.ranksPerHost + i, Host: h.name, LocalRank: i})
				}
				topos = append(topos, t)
				h.topoDue = time.Now().Add(o.topoEvery)
			}
			steps := make([]detector.Step, o.ranksPerHost)
			for i := range steps {
				r := h.id*o.ranksPerHost + i
				hostMS := 100 + 2*rng.Float64()
				if r == o.slowRank {
					hostMS *= 1.2
				}
				end := hostNow - int64(rng.Int64N(int64(300*time.Millisecond)))
				steps[i] = detector.Step{Kind: detector.KindStep, Job: "bench", Rank: r, Step: h.step, Host: h.name,
					StartNS: end - int64(time.Second), EndNS: end, GPU: true, Topo: 1,
					Phases: map[string]float64{detector.PhaseStep: 1000, detector.PhaseCompute: 850 + rng.Float64()*5,
						detector.PhaseHost: hostMS, detector.PhaseSyncWait: 40},
					Workload: &detector.Workload{FP: "fp-bench"}}
			}
			h.step++
			ld := wire.EncodeLogs(h.name, topos, steps, nil)
			wire.StampSent(ld, monoclock.Now()+h.offset)
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := c.Export(cctx, plogotlp.NewExportRequestFromLogs(ld))
			cancel()
			requests.Add(1)
			if err != nil {
				if ctx.Err() == nil {
					if n := errs.Add(1); n <= 3 { // say what failed; the count says how often
						fmt.Fprintf(os.Stderr, "aggbench: send error %d (host %s, step %d): %v\n", n, h.name, h.step-1, err)
					}
				}
				continue
			}
			sent.Add(int64(len(steps)))
		}
	}
}

// scanVerdicts reads new verdict lines from offset and notes, per window,
// when the slow rank's verdict first appeared.
func scanVerdicts(path string, offset int64, o options, windows map[int64]*WindowSeen) int64 {
	f, err := os.Open(path)
	if err != nil {
		return offset
	}
	defer func() { _ = f.Close() }() // read only
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return offset
	}
	now := monoclock.Now()
	br := bufio.NewReaderSize(f, 1<<20)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			break // a partial line stays for the next scan
		}
		offset += int64(len(line))
		var v detector.Verdict
		if json.Unmarshal(line, &v) != nil || v.Kind != detector.KindVerdict {
			continue
		}
		w := windows[v.Window]
		if w == nil {
			w = &WindowSeen{Window: v.Window, EndToSeenS: float64(now-v.WindowEndNS) / 1e9,
				LagS: float64(now-v.WindowEndNS-int64(o.lateness)) / 1e9}
			windows[v.Window] = w
		}
		if v.Rank == o.slowRank {
			w.Verdicts++
			w.State = v.State
		}
	}
	return offset
}

// procStat returns the RSS (MiB) and CPU seconds of pid.
func procStat(pid int) (float64, float64) {
	var rss, cpu float64
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "VmRSS:") {
				f := strings.Fields(l)
				kb, _ := strconv.ParseFloat(f[1], 64)
				rss = kb / 1024
			}
		}
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i > 0 {
			f := strings.Fields(s[i+2:])
			if len(f) > 13 {
				ut, _ := strconv.ParseFloat(f[11], 64)
				st, _ := strconv.ParseFloat(f[12], 64)
				cpu = (ut + st) / 100 // USER_HZ
			}
		}
	}
	return rss, cpu
}

func parseKV(line string) map[string]float64 {
	out := map[string]float64{}
	for _, f := range strings.Fields(line) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		if x, err := strconv.ParseFloat(strings.Trim(v, `"`), 64); err == nil {
			out[k] = x
		}
	}
	return out
}

// affinity is the CPU list this generator may run on (set it with taskset).
func affinity() string {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return "?"
	}
	var cpus []string
	for i := range 1024 {
		if set.IsSet(i) {
			cpus = append(cpus, strconv.Itoa(i))
		}
	}
	return strings.Join(cpus, ",")
}

func machine() map[string]any {
	m := map[string]any{"nproc": runtime.NumCPU(), "go": runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				_, v, _ := strings.Cut(l, ":")
				m["cpu"] = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m["loadavg_at_start"] = strings.TrimSpace(string(b))
	}
	return m
}

func summarize(r *Result, o options) map[string]any {
	s := map[string]any{}
	var maxRSS, firstMinMax, lastMinMax, cpuSum float64
	var n int
	for _, x := range r.Samples {
		maxRSS = max(maxRSS, x.RSSMiB)
		if x.T <= 60+1 {
			firstMinMax = max(firstMinMax, x.RSSMiB)
		}
		if x.T >= r.Samples[len(r.Samples)-1].T-60 {
			lastMinMax = max(lastMinMax, x.RSSMiB)
		}
		if x.T > 10 {
			cpuSum += x.CPUPct
			n++
		}
	}
	s["rss_max_mib"] = maxRSS
	s["rss_max_first_minute_mib"] = firstMinMax
	s["rss_max_last_minute_mib"] = lastMinMax
	if n > 0 {
		s["aggregator_cpu_pct_mean_after_10s"] = cpuSum / float64(n)
	}
	// Windows wholly after warm-up (the first two are partial).
	var lags, ends []float64
	full := 0
	for _, w := range r.Windows {
		if w.Window < 2 {
			continue
		}
		lags = append(lags, w.LagS)
		ends = append(ends, w.EndToSeenS)
		if w.Verdicts > 0 {
			full++
		}
	}
	sort.Float64s(lags)
	sort.Float64s(ends)
	if len(lags) > 0 {
		s["windows_measured"] = len(lags)
		s["windows_with_slow_rank_verdict"] = full
		s["deadline_to_verdict_visible_s_p50"] = lags[len(lags)/2]
		s["deadline_to_verdict_visible_s_max"] = lags[len(lags)-1]
		s["window_end_to_verdict_visible_s_max"] = ends[len(ends)-1]
	}
	var settleMax, lagMax, facts, refused, late, heapMax float64
	for _, st := range r.Stats {
		settleMax = max(settleMax, st.Fields["settle_max_ms"])
		lagMax = max(lagMax, st.Fields["lag_max_ms"])
		facts = max(facts, st.Fields["facts"])
		refused = max(refused, st.Fields["refused_queue"])
		late = max(late, st.Fields["late"])
		heapMax = max(heapMax, st.Fields["heap_mib"])
	}
	s["settle_compute_max_ms"] = settleMax
	s["settle_lag_max_ms"] = lagMax
	s["facts_judged"] = facts
	s["facts_refused_queue"] = refused
	s["facts_late"] = late
	s["heap_max_mib"] = heapMax
	s["facts_sent"] = r.Generator["facts_sent"]
	s["send_errors"] = r.Generator["send_errors"]
	if dur := o.duration.Seconds(); dur > 0 {
		s["facts_per_s"] = float64(r.Generator["facts_sent"].(int64)) / dur
	}
	return s
}
