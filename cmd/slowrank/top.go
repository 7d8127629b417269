package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/slowrank/slowrank/agent"
)

func topCommand() *cli.Command {
	return &cli.Command{
		Name:      "top",
		Usage:     "live per-rank table of a running agent, refreshed every second",
		UsageText: "slowrank top [--socket PATH | --addr HOST:PORT] [--interval 1s] [--count N]",
		Description: "Shows per rank the latest step time, phases, deviation, state and hint, from the\n" +
			"agent's local endpoint. Plain text in 80 columns: it works over SSH and in tmux;\n" +
			"the screen is cleared between refreshes only when stdout is a terminal (piped or\n" +
			"logged, each refresh is appended).",
		Flags: append(endpointFlags(),
			&cli.DurationFlag{Name: "interval", Value: time.Second, Usage: "refresh period", EnvVars: []string{"SLOWRANK_TOP_INTERVAL"}},
			&cli.IntFlag{Name: "count", Usage: "stop after this many refreshes (0: until interrupted)"},
		),
		Action: func(c *cli.Context) error {
			if n := c.Int("count"); n < 0 {
				return cli.Exit(fmt.Sprintf("--count must be 0 (until interrupted) or positive, got %d", n), exitUsage)
			}
			e, err := newEndpoint(c)
			if err != nil {
				return err
			}
			return watch(c.Context, e, os.Stdout, c.Duration("interval"), c.Int("count"))
		},
	}
}

// watch refreshes the live table until interrupted or count refreshes. An
// agent that does not answer is reported in place and retried.
func watch(ctx context.Context, e *endpoint, out *os.File, every time.Duration, count int) error {
	if every < 100*time.Millisecond {
		every = 100 * time.Millisecond
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	tty := isTerminal(out)
	t := time.NewTicker(every)
	defer t.Stop()
	for n := 1; ; n++ {
		if err := frame(ctx, e, out, tty); err != nil {
			return err
		}
		if count > 0 && n >= count {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// frame draws one refresh. It returns the write's error: a screen that
// cannot be written ends top.
func frame(ctx context.Context, e *endpoint, w io.Writer, clear bool) error {
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var b bytes.Buffer
	rep, err := e.status(rctx)
	if err != nil {
		if clear {
			b.WriteString("\x1b[H\x1b[2J")
		}
		fmt.Fprintf(&b, "slowrank top: %s %s\n  %v\n  retrying every refresh; Ctrl-C to quit\n",
			time.Now().Format("15:04:05"), e.where, err)
		return writeOut(w, &b)
	}
	_ = renderView(&b, rep.Status, clear) // into a buffer: cannot fail
	if line := controlLine(rep); line != "" {
		fmt.Fprintln(&b, line)
	}
	return writeOut(w, &b)
}

// controlLine says, in one line, what runtime control changed (nothing
// when collection runs with its start-up settings).
func controlLine(rep agent.StatusReport) string {
	cs := rep.Control
	if cs == nil {
		if rep.ControlError != "" {
			return "(agent busy or stopping)"
		}
		return ""
	}
	var parts []string
	if cs.Paused {
		parts = append(parts, fmt.Sprintf("COLLECTION PAUSED for %s (slowrank control resume)", time.Duration(cs.PausedFor).Round(time.Second)))
	}
	if cs.DetectorSwaps > 0 {
		d := cs.Detector
		parts = append(parts, fmt.Sprintf("detector: window %s, threshold %s, floor %s, consecutive %d",
			time.Duration(d.Window), thresholdText(d), time.Duration(d.Floor), d.Consecutive))
	}
	return clip(strings.Join(parts, "; "), 79)
}
