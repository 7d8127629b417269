package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/slowrank/slowrank/detector/sim"
)

func simulateCommand() *cli.Command {
	d := sim.Default()
	return &cli.Command{
		Name:  "simulate",
		Usage: "write a synthetic stream of step facts (to learn the semantics, test and demo)",
		UsageText: "slowrank simulate [--ranks 8] [--duration 60s] [--step 200ms] [--jitter 0.02]\n" +
			"   [--slow rank=3,phase=compute,from=20s,factor=1.15] [--gap from=30s,to=40s[,ranks=1+2]] [--output F]",
		Description: "Models a synchronous data-parallel job: every rank's step ends together, a slow\n" +
			"rank makes the others wait in synchronisation. --slow injects a slowdown\n" +
			"(rank, phase compute|host, from, optional to, factor and/or add=DURATION).",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "job", Value: d.Job, Usage: "job id"},
			&cli.StringFlag{Name: "host", Value: d.Host, Usage: "host name in facts"},
			&cli.IntFlag{Name: "ranks", Value: d.Ranks, Usage: "number of ranks"},
			&cli.DurationFlag{Name: "duration", Value: d.Duration, Usage: "event time covered"},
			&cli.DurationFlag{Name: "step", Value: d.Step, Usage: "nominal step time"},
			&cli.Float64Flag{Name: "host-share", Value: d.HostShare, Usage: "share of a step in host work"},
			&cli.Float64Flag{Name: "comm-ms", Value: d.CommMS, Usage: "exposed communication per step, ms"},
			&cli.Float64Flag{Name: "jitter", Value: d.Jitter, Usage: "relative standard deviation per phase"},
			&cli.StringSliceFlag{Name: "slow", Usage: "inject a slowdown: rank=R,phase=P,from=D[,to=D][,factor=F][,add=D]"},
			&cli.StringSliceFlag{Name: "gap", Usage: "silence: from=D,to=D[,ranks=R+R]"},
			&cli.IntFlag{Name: "variety", Value: d.Variety, Usage: "distinct workload fingerprints (0: no fingerprints)"},
			&cli.Int64Flag{Name: "tokens", Usage: "tokens per step (0: none)"},
			&cli.Float64Flag{Name: "missing-gpu", Usage: "probability that a step has no device timing"},
			&cli.IntFlag{Name: "dp-groups", Usage: "emit a topology with this many data-parallel groups"},
			&cli.Uint64Flag{Name: "seed", Value: d.Seed, Usage: "random seed"},
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "-", Usage: "facts file, '-' for stdout"},
		},
		Action: func(c *cli.Context) error {
			cfg, err := simConfig(c)
			if err != nil {
				return cli.Exit(err.Error(), exitUsage)
			}
			if err := cfg.Validate(); err != nil {
				return cli.Exit(strings.ReplaceAll(err.Error(), "\n", "; "), exitUsage)
			}
			out, closeOut, err := createOutput(c.String("output"))
			if err != nil {
				return cli.Exit(err.Error(), exitUsage)
			}
			w := bufio.NewWriterSize(out, 1<<16)
			enc := json.NewEncoder(w)
			if err := sim.Generate(cfg, func(v any) error { return enc.Encode(v) }); err != nil {
				return err
			}
			if err := w.Flush(); err != nil {
				return err
			}
			return closeOut()
		},
	}
}

func simConfig(c *cli.Context) (sim.Config, error) {
	cfg := sim.Default()
	cfg.Job, cfg.Host, cfg.Ranks = c.String("job"), c.String("host"), c.Int("ranks")
	cfg.Duration, cfg.Step = c.Duration("duration"), c.Duration("step")
	cfg.HostShare, cfg.CommMS, cfg.Jitter = c.Float64("host-share"), c.Float64("comm-ms"), c.Float64("jitter")
	cfg.Variety, cfg.Tokens, cfg.MissingGPU = c.Int("variety"), c.Int64("tokens"), c.Float64("missing-gpu")
	cfg.DPGroups, cfg.Seed = c.Int("dp-groups"), c.Uint64("seed")
	for _, s := range c.StringSlice("slow") {
		sd, err := parseSlowdown(s)
		if err != nil {
			return cfg, fmt.Errorf("--slow %q: %w", s, err)
		}
		cfg.Slowdowns = append(cfg.Slowdowns, sd)
	}
	for _, s := range c.StringSlice("gap") {
		g, err := parseGap(s)
		if err != nil {
			return cfg, fmt.Errorf("--gap %q: %w", s, err)
		}
		cfg.Gaps = append(cfg.Gaps, g)
	}
	return cfg, nil
}

// keyValues parses "k=v,k=v" allowing only the given keys.
func keyValues(s string, allowed ...string) (map[string]string, error) {
	kv := map[string]string{}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, fmt.Errorf("%q is not key=value", part)
		}
		known := false
		for _, a := range allowed {
			known = known || a == k
		}
		if !known {
			return nil, fmt.Errorf("unknown key %q (want %s)", k, strings.Join(allowed, ", "))
		}
		kv[k] = v
	}
	return kv, nil
}

func parseSlowdown(s string) (sim.Slowdown, error) {
	var sd sim.Slowdown
	kv, err := keyValues(s, "rank", "phase", "from", "to", "factor", "add")
	if err != nil {
		return sd, err
	}
	if sd.Rank, err = strconv.Atoi(kv["rank"]); err != nil {
		return sd, fmt.Errorf("rank: %w", err)
	}
	sd.Phase = kv["phase"]
	if sd.From, err = optDuration(kv["from"]); err != nil {
		return sd, fmt.Errorf("from: %w", err)
	}
	if sd.To, err = optDuration(kv["to"]); err != nil {
		return sd, fmt.Errorf("to: %w", err)
	}
	if f := kv["factor"]; f != "" {
		if sd.Factor, err = strconv.ParseFloat(f, 64); err != nil {
			return sd, fmt.Errorf("factor: %w", err)
		}
	}
	add, err := optDuration(kv["add"])
	if err != nil {
		return sd, fmt.Errorf("add: %w", err)
	}
	sd.AddMS = float64(add) / 1e6
	if sd.Factor == 0 && sd.AddMS == 0 {
		return sd, fmt.Errorf("give factor=F and/or add=DURATION")
	}
	return sd, nil
}

func parseGap(s string) (sim.Gap, error) {
	var g sim.Gap
	kv, err := keyValues(s, "from", "to", "ranks")
	if err != nil {
		return g, err
	}
	if g.From, err = optDuration(kv["from"]); err != nil {
		return g, fmt.Errorf("from: %w", err)
	}
	if g.To, err = optDuration(kv["to"]); err != nil {
		return g, fmt.Errorf("to: %w", err)
	}
	if g.To <= g.From {
		return g, fmt.Errorf("to (%s) must be after from (%s)", g.To, g.From)
	}
	if rs := kv["ranks"]; rs != "" {
		for _, r := range strings.Split(rs, "+") {
			n, err := strconv.Atoi(r)
			if err != nil {
				return g, fmt.Errorf("ranks: %w", err)
			}
			g.Ranks = append(g.Ranks, n)
		}
	}
	return g, nil
}

func optDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	return time.ParseDuration(s)
}
