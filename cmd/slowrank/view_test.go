package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slowrank/slowrank/agent"
	"github.com/slowrank/slowrank/detector"
)

// viewStatus is a status with two jobs on one host that share rank numbers,
// one of them with a long id, and ranks in every state the view shows.
func viewStatus() agent.Status {
	const long = "torchelastic-run-2f9c1e7a-llama3-70b-pretrain-stage2-attempt-0003"
	since := int64(3)
	strag := detector.Verdict{Kind: "verdict", Job: long, Window: 7, Rank: 1, State: detector.StateStraggler,
		Phase: "compute", Hint: detector.HintGPUStreamStall, ValueMS: 1234.5, ReferenceMS: 1002.3, ReferenceRank: 0,
		Deviation: 0.2317, AlertActive: true, SinceWindow: &since, Reason: "compute 23.2 % above rank 0 for 3 windows"}
	uncert := detector.Verdict{Kind: "verdict", Job: long, Window: 7, Rank: 2, State: detector.StateUncertain,
		Phase: "host", Reason: "no steps in window while 2 peers measured host"}
	cand := detector.Verdict{Kind: "verdict", Job: "10.0.0.7:29500", Window: 7, Rank: 1, State: detector.StateCandidate,
		Phase: "host", Hint: detector.HintHostOnlyStall, Deviation: 0.081}
	step := func(job string, r int, n int64, ph map[string]float64) detector.Step {
		return detector.Step{Job: job, Rank: r, Step: n, Phases: ph}
	}
	return agent.Status{
		Uptime: 95 * time.Second, Processes: 5, Attached: 5, Events: 1234567, Windows: 40, Facts: 9100, Verdicts: 31,
		DeviceState: "duty", DutyShare: 0.04,
		Ranks: []agent.RankView{
			{Job: "10.0.0.7:29500", Rank: 0, Step: step("10.0.0.7:29500", 0, 880, map[string]float64{"step": 52, "host": 20.1, "sync_wait": 31})},
			{Job: "10.0.0.7:29500", Rank: 1, Step: step("10.0.0.7:29500", 1, 880, map[string]float64{"step": 52, "host": 21.8, "sync_wait": 29.9}), Verdict: &cand},
			{Job: long, Rank: 0, Step: step(long, 0, 123456, map[string]float64{"step": 1210.4, "compute": 1002.3, "host": 40.2, "sync_wait": 150})},
			{Job: long, Rank: 1, Step: step(long, 1, 123456, map[string]float64{"step": 1450.9, "compute": 1234.5, "host": 41, "sync_wait": 12.5}), Verdict: &strag},
			{Job: long, Rank: 2, Step: step(long, 2, 123401, map[string]float64{"step": 1211}), Verdict: &uncert},
		},
		Alerts: []detector.Verdict{strag},
	}
}

func TestRenderViewGolden(t *testing.T) {
	var b bytes.Buffer
	if err := renderView(&b, viewStatus(), false); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	checkWidth(t, got, 80)
	golden := filepath.Join("testdata", "view.golden.txt")
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if got != string(want) {
		t.Fatalf("view differs from %s (run with -update after checking the change):\n%s", golden, got)
	}
}

func TestRenderViewJobs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		st      agent.Status
		want    []string // lines, in order
		notWant []string
	}{
		{
			name: "two jobs with the same ranks are told apart",
			st:   viewStatus(),
			want: []string{"\njob 10.0.0.7:29500  2 ranks\n   0    880 ", "\n   1    880 ",
				"\njob torchelastic-run-2f9c1e...in-stage2-attempt-0003  3 ranks, 1 STRAGGLER\n   0 123456 ",
				"\n   1 123456 ", "\n   2 123401 ", "\n! torchelas...mpt-0003 rank 1 compute straggler: "},
		},
		{
			name:    "one job: the alert line does not repeat it",
			st:      agent.Status{Ranks: viewStatus().Ranks[2:], Alerts: viewStatus().Alerts},
			want:    []string{"\njob torchelastic", "\n! rank 1 compute straggler: "},
			notWant: []string{"10.0.0.7"},
		},
		{
			name: "hostile and empty job ids",
			st: agent.Status{Ranks: []agent.RankView{
				{Job: "evil\x1b[2Jjob\n", Rank: 0},
				{Job: "", Rank: 0},
			}},
			want:    []string{"\njob evil?[2Jjob?  1 rank\n", "\njob (none)  1 rank\n"},
			notWant: []string{"\x1b"},
		},
		{
			name: "no ranks yet",
			st:   agent.Status{},
			want: []string{viewColumns + "\n  (no steps yet"},
		},
		{
			// The demo: 4 processes whose uprobes share 3 library files,
			// host phases only.
			name: "without the injection library one line says why COMPUTE is empty",
			st: agent.Status{Processes: 4, Attached: 3, DeviceState: "no-lib", Ranks: []agent.RankView{
				{Job: "j", Rank: 0, Step: detector.Step{Step: 5, Phases: map[string]float64{"step": 52, "host": 23, "sync_wait": 29}}},
				{Job: "j", Rank: 1, Step: detector.Step{Step: 5, Phases: map[string]float64{"step": 52, "host": 35, "sync_wait": 17}},
					Verdict: &detector.Verdict{State: detector.StateCandidate, Phase: "host", Deviation: 0.609}},
			}},
			want: []string{"procs 4   libs 3 ", "SLOWER", "\n   1      5    52.0       -    35.0   17.0  +60.9%  candidate\n",
				"  COMPUTE -, no HINT: no device records, the injection library is not loaded\n"},
			notWant: []string{"DEV%", "attached"},
		},
		{
			name: "device collection off",
			st: agent.Status{DeviceState: "off: libslowrank_cupti.so runs as NCCL's profiler plugin only (CUDA did not load it)",
				Ranks: []agent.RankView{{Job: "j", Rank: 0, Step: detector.Step{Phases: map[string]float64{"host": 1}}}}},
			want: []string{" device off ", "\n  COMPUTE -, no HINT: no device records, device collection is off\n"},
		},
		{
			name:    "with device records no note",
			st:      agent.Status{DeviceState: "duty", Ranks: viewStatus().Ranks},
			notWant: []string{"COMPUTE -"},
		},
		{
			name:    "duty cycle before its first device records: no note",
			st:      agent.Status{DeviceState: "duty", Ranks: viewStatus().Ranks[:2]},
			notWant: []string{"COMPUTE -"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := renderView(&b, tc.st, false); err != nil {
				t.Fatal(err)
			}
			out := b.String()
			checkWidth(t, out, 80)
			rest := out
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("missing (or out of order) %q in:\n%s", w, out)
				}
				rest = rest[i+len(w):]
			}
			for _, w := range tc.notWant {
				if strings.Contains(out, w) {
					t.Fatalf("unexpected %q in:\n%s", w, out)
				}
			}
		})
	}
}

func TestShortJob(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"j1", 20, "j1"},
		{"", 20, "(none)"},
		{"abcdefghijklmnopqrstuvwxyz", 26, "abcdefghijklmnopqrstuvwxyz"},
		{"abcdefghijklmnopqrstuvwxyz", 11, "abcd...wxyz"},
		{"abcdefghijklmnopqrstuvwxyz", 10, "abcd...xyz"},
		{"abcdefghij", 3, "abc"},
		{"jöb-\t1", 20, "j?b-?1"},
	} {
		if got := shortJob(tc.in, tc.n); got != tc.want || len(got) > max(tc.n, len("(none)")) {
			t.Errorf("shortJob(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

// The widest row the view can hold (a long hint, a straggler, wide values)
// still fits.
func TestViewRowWidth(t *testing.T) {
	v := detector.Verdict{State: detector.StateCandidate, Hint: detector.HintGPUStreamStall, Deviation: 1.234, AlertActive: true}
	r := agent.RankView{Rank: 9999, Step: detector.Step{Step: 999999, Phases: map[string]float64{
		"step": 99999.9, "compute": 99999.9, "host": 99999.9, "sync_wait": 9999.9}}, Verdict: &v}
	row := viewRow(r)
	if len(row) > viewWidth || !strings.HasSuffix(row, "STRAGGLER gpu_stream_stall") {
		t.Fatalf("%d columns: %q", len(row), row)
	}
	if hdr := viewColumns; strings.Index(hdr, "HINT") != strings.Index(row, "gpu_stream_stall") {
		t.Fatalf("columns out of line:\n%s\n%s", hdr, row)
	}
}
