package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/slowrank/slowrank/agent"
	"github.com/slowrank/slowrank/detector"
)

// viewWidth is the widest line the live view writes: it fits an 80-column
// terminal without wrapping.
const viewWidth = 79

// viewJobWidth is the most of a job id a job line shows; longer ids keep
// their head and tail (where launchers put what tells runs apart).
const viewJobWidth = 48

// viewAlertJobWidth is the most of a job id an alert line shows when the
// view holds several jobs.
const viewAlertJobWidth = 20

// viewFormat lays out the column header and every rank row: at most 78
// columns with the longest hint. SLOWER is the verdict's deviation: how much
// slower than its reference rank the rank is, in percent.
const viewFormat = "%4v %6v %7v %7v %7v %6v %7v  %-9v %v"

var viewColumns = fmt.Sprintf(viewFormat, "RANK", "STEP#", "STEP", "COMPUTE", "HOST", "SYNCWT", "SLOWER", "STATE", "HINT")

// renderView writes the live per-rank table: 80 columns, plain text (no
// cursor control beyond an optional clear), so it works over SSH, in tmux and
// in a log file. Ranks are grouped by job under a "job" line (in the order
// the status lists them, by job and rank), so that two jobs on one host are
// told apart. It returns the write's error.
func renderView(w io.Writer, st agent.Status, clear bool) error {
	var b strings.Builder
	if clear {
		b.WriteString("\x1b[H\x1b[2J")
	}
	// Processes are the training processes watched; libs the library files
	// (libnccl, libcudart, ...) their uprobes are attached to, shared by
	// every process that maps them.
	fmt.Fprintf(&b, "slowrank  up %-8s procs %-3d libs %-3d events %-9d lost %d\n",
		st.Uptime.Round(1e9), st.Processes, st.Attached, st.Events, st.Lost)
	fmt.Fprintf(&b, "windows %-6d facts %-8d verdicts %-6d device %-8s duty %3.0f%%\n",
		st.Windows, st.Facts, st.Verdicts, deviceWord(st.DeviceState), st.DutyShare*100)
	b.WriteString(viewColumns + "\n")
	jobs, rows := groupByJob(st.Ranks)
	for _, job := range jobs {
		b.WriteString(jobLine(job, rows[job]) + "\n")
		for _, r := range rows[job] {
			b.WriteString(clip(viewRow(r), viewWidth) + "\n")
		}
	}
	if len(st.Ranks) == 0 {
		b.WriteString("  (no steps yet: waiting for training processes and their first steps)\n")
	} else if note := computeNote(st); note != "" {
		b.WriteString(clip(note, viewWidth) + "\n")
	}
	seen := map[string]bool{}
	for _, job := range jobs {
		seen[job] = true
	}
	for _, v := range st.Alerts {
		seen[v.Job] = true
	}
	several := len(seen) > 1
	for _, v := range st.Alerts {
		b.WriteString(alertLine(v, several) + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// computeNote says why COMPUTE is "-" in every row when no device records
// come: no process loaded the injection library, or device collection is
// off. HINT names a GPU or a host-only stall only with COMPUTE measured.
func computeNote(st agent.Status) string {
	for _, r := range st.Ranks {
		if _, ok := r.Step.Phases[detector.PhaseCompute]; ok {
			return ""
		}
	}
	switch {
	case st.DeviceState == "no-lib":
		return "  COMPUTE -, no HINT: no device records, the injection library is not loaded"
	case strings.HasPrefix(st.DeviceState, "off"):
		return "  COMPUTE -, no HINT: no device records, device collection is off"
	}
	return ""
}

// deviceWord is the device collection state without its explanation
// ("off: ... profiler plugin only ..." is "off"): the header line keeps its
// 80 columns; slowrank status shows the whole.
func deviceWord(state string) string {
	w, _, _ := strings.Cut(state, ":")
	return w
}

// groupByJob splits rows by job, jobs in the order of their first row,
// rows in their given order.
func groupByJob(ranks []agent.RankView) ([]string, map[string][]agent.RankView) {
	var jobs []string
	rows := map[string][]agent.RankView{}
	for _, r := range ranks {
		if _, ok := rows[r.Job]; !ok {
			jobs = append(jobs, r.Job)
		}
		rows[r.Job] = append(rows[r.Job], r)
	}
	return jobs, rows
}

// jobLine heads a job's rows: its id and how many of its ranks are shown
// and hold an alert.
func jobLine(job string, rows []agent.RankView) string {
	alerts := 0
	for _, r := range rows {
		if r.Verdict != nil && r.Verdict.AlertActive {
			alerts++
		}
	}
	line := fmt.Sprintf("job %s  %d %s", shortJob(job, viewJobWidth), len(rows), plural(len(rows), "rank", "ranks"))
	if alerts > 0 {
		line += fmt.Sprintf(", %d %s", alerts, plural(alerts, "STRAGGLER", "STRAGGLERS"))
	}
	return clip(line, viewWidth)
}

// alertLine is one active alert; it names the job when the view holds more
// than one.
func alertLine(v detector.Verdict, withJob bool) string {
	line := fmt.Sprintf("! rank %d %s %s: %s", v.Rank, v.Phase, v.State, v.Reason)
	if withJob {
		line = fmt.Sprintf("! %s rank %d %s %s: %s", shortJob(v.Job, viewAlertJobWidth), v.Rank, v.Phase, v.State, v.Reason)
	}
	return clip(line, viewWidth)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// shortJob makes a job id safe and at most n columns wide: anything but
// printable ASCII becomes '?', so that an id from a process environment
// can neither move the cursor nor break the width; a longer id keeps its
// head and tail around "..."; an empty id reads "(none)".
func shortJob(job string, n int) string {
	if job == "" {
		return "(none)"
	}
	rs := []rune(job)
	for i, r := range rs {
		if r < 0x20 || r > 0x7e {
			rs[i] = '?'
		}
	}
	if len(rs) <= n || n <= 3 {
		if len(rs) > n {
			rs = rs[:n]
		}
		return string(rs)
	}
	head := (n - 3 + 1) / 2
	tail := n - 3 - head
	return string(rs[:head]) + "..." + string(rs[len(rs)-tail:])
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
			dev = fmt.Sprintf("%+.1f%%", v.Deviation*100)
		}
		if v.AlertActive {
			state = "STRAGGLER"
		}
	}
	return strings.TrimRight(fmt.Sprintf(viewFormat,
		r.Rank, r.Step.Step, ms(detector.PhaseStep), ms(detector.PhaseCompute), ms(detector.PhaseHost),
		ms(detector.PhaseSyncWait), dev, state, hint), " ")
}
