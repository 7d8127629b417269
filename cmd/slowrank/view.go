package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/slowrank/slowrank/agent"
	"github.com/slowrank/slowrank/detector"
)

// renderView writes the live per-rank table: 80 columns, plain text (no
// cursor control beyond an optional clear), so it works over SSH, in tmux and
// in a log file.
func renderView(w io.Writer, st agent.Status, clear bool) {
	var b strings.Builder
	if clear {
		b.WriteString("\x1b[H\x1b[2J")
	}
	fmt.Fprintf(&b, "slowrank  up %-8s procs %-3d attached %-3d events %-9d lost %d\n",
		st.Uptime.Round(1e9), st.Processes, st.Attached, st.Events, st.Lost)
	fmt.Fprintf(&b, "windows %-6d facts %-8d verdicts %-6d device %-8s duty %3.0f%%\n",
		st.Windows, st.Facts, st.Verdicts, st.DeviceState, st.DutyShare*100)
	b.WriteString("RANK  STEP#     STEP   COMPUTE     HOST  SYNCWT  DEV%  STATE      HINT\n")
	for _, r := range st.Ranks {
		b.WriteString(viewRow(r))
		b.WriteByte('\n')
	}
	if len(st.Ranks) == 0 {
		b.WriteString("  (no steps yet: waiting for training processes and their first steps)\n")
	}
	for _, v := range st.Alerts {
		line := fmt.Sprintf("! rank %d %s %s: %s", v.Rank, v.Phase, v.State, v.Reason)
		if len(line) > 79 {
			line = line[:76] + "..."
		}
		b.WriteString(line + "\n")
	}
	io.WriteString(w, b.String())
}

func viewRow(r agent.RankView) string {
	ms := func(p string) string {
		v, ok := r.Step.Phases[p]
		if !ok {
			return "-"
		}
		return fmt.Sprintf("%.1f", v)
	}
	state, hint, dev := "ok", "", "-"
	if v := r.Verdict; v != nil {
		state, hint = v.State, v.Hint
		if v.State != detector.StateUncertain {
			dev = fmt.Sprintf("%+.1f", v.Deviation*100)
		}
		if v.AlertActive {
			state = "STRAGGLER"
		}
	}
	return fmt.Sprintf("%4d %6d %8s %9s %8s %7s %5s  %-10s %s",
		r.Rank, r.Step.Step, ms(detector.PhaseStep), ms(detector.PhaseCompute), ms(detector.PhaseHost),
		ms(detector.PhaseSyncWait), dev, state, hint)
}
