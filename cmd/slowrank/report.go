package main

import (
	"bytes"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/slowrank/slowrank/detector"
)

// writeReport prints who is slow, in which phase, since when and compared
// with whom, from a replay's verdicts and summaries.
func writeReport(w *bytes.Buffer, res *replayResult, cfg detector.Config) {
	type key struct {
		job   string
		rank  int
		phase string
	}
	last := map[key]detector.Verdict{}
	counts := map[string]map[string]int{}
	for _, v := range res.verdicts {
		last[key{v.Job, v.Rank, v.Phase}] = v
		if counts[v.Job] == nil {
			counts[v.Job] = map[string]int{}
		}
		counts[v.Job][v.State]++
	}
	for _, s := range res.summaries {
		fmt.Fprintf(w, "job %q: %d windows of %s, %d facts", s.Job, s.Windows, cfg.Window, s.Facts)
		if s.Late+s.Duplicates+s.InvalidLines+s.UnknownKinds > 0 {
			fmt.Fprintf(w, " (late %d, duplicate %d, invalid %d, unknown kind %d)", s.Late, s.Duplicates, s.InvalidLines, s.UnknownKinds)
		}
		fmt.Fprintln(w)
		if len(s.Stragglers) == 0 {
			fmt.Fprintln(w, "  no straggler at the end of the stream")
		}
		var ks []key
		for k, v := range last {
			if k.job == s.Job && v.AlertActive {
				ks = append(ks, k)
			}
		}
		sort.Slice(ks, func(a, b int) bool {
			if ks[a].rank != ks[b].rank {
				return ks[a].rank < ks[b].rank
			}
			return ks[a].phase < ks[b].phase
		})
		for _, k := range ks {
			v := last[k]
			since := v.Window
			if v.SinceWindow != nil {
				since = *v.SinceWindow
			}
			fmt.Fprintf(w, "  STRAGGLER rank %d, phase %s: %s vs %s on rank %d (+%.1f%%), since window %d (t0+%s)",
				v.Rank, v.Phase, durationMS(v.ValueMS), durationMS(v.ReferenceMS), v.ReferenceRank, v.Deviation*100,
				since, time.Duration(since)*cfg.Window)
			if v.Hint != "" {
				fmt.Fprintf(w, ", hint %s", v.Hint)
			}
			fmt.Fprintf(w, "\n    compared with %d comparable ranks %s", v.ComparableCount, rankList(v.ComparableRanks))
			if v.WorkloadEvidenceDegraded {
				fmt.Fprint(w, " (workload evidence degraded)")
			}
			fmt.Fprintln(w)
		}
		if s.WorstRank != nil {
			fmt.Fprintf(w, "  worst rank: %d (%s, %s)\n", *s.WorstRank, s.WorstState, s.WorstPhase)
		}
		if c := counts[s.Job]; len(c) > 0 {
			var parts []string
			for _, st := range []string{detector.StateCandidate, detector.StateStraggler, detector.StateRecovered, detector.StateUncertain} {
				if c[st] > 0 {
					parts = append(parts, fmt.Sprintf("%s %d", st, c[st]))
				}
			}
			fmt.Fprintf(w, "  verdicts: %s\n", strings.Join(parts, ", "))
		}
	}
}

func rankList(rs []int) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprint(r)
	}
	return "[" + strings.Join(parts, " ") + "]"
}
