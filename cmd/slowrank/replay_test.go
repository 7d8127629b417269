package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/slowrank/slowrank/detector"
)

var update = flag.Bool("update", false, "rewrite golden files")

// run runs the CLI with args and returns stdout and the exit code.
func run(t *testing.T, stdin string, args ...string) (string, int) {
	t.Helper()
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	inFile := filepath.Join(dir, "in")
	if err := os.WriteFile(inFile, []byte(stdin), 0o600); err != nil {
		t.Fatal(err)
	}
	full := []string{"slowrank"}
	for _, a := range args {
		a = strings.ReplaceAll(a, "$OUT", out)
		a = strings.ReplaceAll(a, "$IN", inFile)
		full = append(full, a)
	}
	err := newApp().Run(full)
	code := 0
	var ec cli.ExitCoder
	switch {
	case errors.As(err, &ec):
		code = ec.ExitCode()
	case err != nil:
		code = 1
	}
	b, _ := os.ReadFile(out)
	return string(b), code
}

func simulateFacts(t *testing.T, args ...string) string {
	t.Helper()
	out, code := run(t, "", append([]string{"simulate", "--output", "$OUT"}, args...)...)
	if code != 0 {
		t.Fatalf("simulate exit %d", code)
	}
	return out
}

func TestReplayGolden(t *testing.T) {
	facts := simulateFacts(t, "--ranks", "8", "--duration", "60s", "--dp-groups", "2",
		"--slow", "rank=3,phase=compute,from=20s,factor=1.15",
		"--slow", "rank=6,phase=host,from=10s,to=40s,add=15ms",
		"--gap", "from=45s,to=52s,ranks=1")
	got, code := run(t, facts, "replay", "--input", "$IN", "--output", "$OUT")
	if code != 0 {
		t.Fatalf("replay exit %d", code)
	}
	golden := filepath.Join("testdata", "replay.golden.jsonl")
	if *update {
		if err := os.WriteFile(filepath.Join("testdata", "replay.facts.jsonl"), []byte(facts), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if got != string(want) {
		t.Fatalf("replay output differs from %s (run with -update after checking the change)", golden)
	}
	for _, s := range []string{`"rank":3,"state":"straggler","phase":"compute","hint":"gpu_stream_stall"`,
		`"rank":6,"state":"recovered","phase":"host"`, `"stragglers":[3]`} {
		if !strings.Contains(got, s) {
			t.Errorf("output lacks %s", s)
		}
	}
}

func TestReplayIsDeterministicAndOrderFree(t *testing.T) {
	facts := simulateFacts(t, "--ranks", "6", "--duration", "40s", "--slow", "rank=2,phase=compute,from=5s,factor=1.2")
	a, _ := run(t, facts, "replay", "--input", "$IN", "--output", "$OUT")
	b, _ := run(t, facts, "replay", "--input", "$IN", "--output", "$OUT")
	lines := strings.Split(strings.TrimSpace(facts), "\n")
	for i, j := 0, len(lines)-1; i < j; i, j = i+1, j-1 {
		lines[i], lines[j] = lines[j], lines[i]
	}
	c, _ := run(t, strings.Join(lines, "\n"), "replay", "--input", "$IN", "--output", "$OUT")
	if a != b || a != c || !strings.Contains(a, `"state":"straggler"`) {
		t.Fatalf("replays differ or found nothing:\n%s\n---\n%s", a, c)
	}
}

func TestReplayInvalidInput(t *testing.T) {
	good := `{"kind":"step","job":"j","rank":0,"step":1,"end_ns":1,"phases":{"compute":1}}`
	input := good + "\n" + `{"kind":"step","job":"j","rank":0` + "\n" + `{"kind":"future-kind"}` + "\n"
	if _, code := run(t, input, "replay", "--input", "$IN", "--output", "$OUT"); code != exitUsage {
		t.Errorf("malformed line: exit %d, want %d", code, exitUsage)
	}
	var buf bytes.Buffer
	_, err := replay(strings.NewReader(input), &buf, detector.DefaultConfig(), false)
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("error %v does not name line 2", err)
	}
	out, code := run(t, input, "replay", "--skip-invalid", "--input", "$IN", "--output", "$OUT")
	if code != 0 || !strings.Contains(out, `"invalid_lines":1`) || !strings.Contains(out, `"unknown_kinds":1`) {
		t.Errorf("skip-invalid: exit %d, output %s", code, out)
	}
}

func TestBadFlagsExitTwo(t *testing.T) {
	for _, args := range [][]string{
		{"replay", "--input", "/does/not/exist"},
		{"replay", "--threshold", "-1", "--input", "$IN"},
		{"replay", "--no-such-flag"},
		{"replay", "--phase-threshold", "host", "--input", "$IN"},
		{"replay", "--phase-threshold", "host=x", "--input", "$IN"},
		{"replay", "--phase-threshold", "host=0.1,host=0.2", "--input", "$IN"},
		{"replay", "--phase-threshold", "disk=0.1", "--input", "$IN"},
		{"replay", "--phase-threshold", "host=0", "--input", "$IN"},
		{"replay", "--exposure", "maybe", "--input", "$IN"},
		{"simulate", "--slow", "rank=3,phase=disk,from=1s,factor=2", "--output", "$OUT"},
		{"simulate", "--ranks", "0", "--output", "$OUT"},
	} {
		if _, code := run(t, "", args...); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
		}
	}
}

func TestPhaseThresholdFlag(t *testing.T) {
	got, err := parsePhaseThresholds(" host=0.15, compute = 0.05 ,")
	if err != nil || len(got) != 2 || got["host"] != 0.15 || got["compute"] != 0.05 {
		t.Fatalf("parsePhaseThresholds = %v, %v", got, err)
	}
	if got, err := parsePhaseThresholds(""); err != nil || got != nil {
		t.Fatalf("empty: %v, %v; want nil, nil", got, err)
	}
}

func TestCreateOutputRefusesSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "victim")
	if err := os.WriteFile(target, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "out.jsonl")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, _, err := createOutput(link); err == nil {
		t.Fatal("created output through a symlink")
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Fatal("symlink target was modified")
	}
}

// TestReplayOutputs: /dev/null (a character device) is an output, as is
// a new file; a symlink to /dev/null and a FIFO are still refused.
func TestReplayOutputs(t *testing.T) {
	facts := simulateFacts(t, "--ranks", "4", "--duration", "10s")
	dir := t.TempDir()
	link := filepath.Join(dir, "null-link")
	if err := os.Symlink("/dev/null", link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		output string
		want   int
	}{
		{"/dev/null", 0},
		{filepath.Join(dir, "verdicts.jsonl"), 0},
		{link, exitUsage},
		{fifo, exitUsage},
	} {
		t.Run(filepath.Base(tc.output), func(t *testing.T) {
			if _, code := run(t, facts, "replay", "--input", "$IN", "-o", tc.output); code != tc.want {
				t.Errorf("replay -o %s: exit %d, want %d", tc.output, code, tc.want)
			}
		})
	}
	if fi, err := os.Stat("/dev/null"); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		t.Errorf("/dev/null is no longer a character device: %v, %v", fi, err)
	}
}

// An input without newlines (/dev/zero) must end in a usage error, not grow.
func TestReplayRefusesAnEndlessLine(t *testing.T) {
	if _, code := run(t, "", "replay", "--input", "/dev/zero", "--output", "$OUT"); code != exitUsage {
		t.Errorf("replay --input /dev/zero: exit %d, want %d", code, exitUsage)
	}
}

func TestReplaySkipsALongLine(t *testing.T) {
	good := `{"kind":"step","job":"j","rank":0,"step":1,"end_ns":1,"phases":{"compute":1}}`
	for _, tc := range []struct {
		name  string
		input string
	}{
		{"long line with its newline", strings.Repeat(" ", maxFactLine+1) + "\n" + good + "\n"},
		{"long line ending exactly at a buffer boundary", strings.Repeat(" ", maxFactLine+1<<16-1) + "\n" + good + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			facts, err := readFacts(strings.NewReader(tc.input), true)
			if err != nil || facts.invalid != 1 || len(facts.steps) != 1 {
				t.Fatalf("err %v, facts %+v; want 1 invalid line and the good one", err, facts)
			}
			if _, err := readFacts(strings.NewReader(tc.input), false); !errors.Is(err, errLineTooLong) {
				t.Errorf("without --skip-invalid: err %v, want %v", err, errLineTooLong)
			}
		})
	}
}

// A window under the shortest duty period would switch device collection
// off in every trainer (the library reads a period under 100 ms as off).
func TestWindowUnderTheMinimumIsAUsageError(t *testing.T) {
	for _, tc := range []struct {
		window string
		code   int
	}{
		{"0s", exitUsage}, {"1ms", exitUsage}, {"99ms", exitUsage}, {"-5s", exitUsage}, {"100ms", 0},
	} {
		for _, cmd := range [][]string{
			{"replay", "--input", "$IN", "--output", "$OUT"},
			{"agent", "--status-socket", "", "--duration", "1ns"},
			{"aggregate", "--listen", "127.0.0.1:0"},
		} {
			if tc.code == 0 && cmd[0] != "replay" {
				continue // would start them
			}
			args := append(slices.Clone(cmd), "--window", tc.window)
			if _, code := run(t, "", args...); code != tc.code {
				t.Errorf("%v: exit %d, want %d", args, code, tc.code)
			}
		}
	}
}

func TestBadSelectionPolicyIsAUsageError(t *testing.T) {
	for _, args := range [][]string{
		{"--allow-uid", "no-such-user-slowrank"},
		{"--allow-uid", "-1"},
		{"--allow-cgroup", "kubepods.slice"},
		{"--owner-quota", "0"},
	} {
		full := append([]string{"agent", "--status-socket", "", "--duration", "1ns"}, args...)
		if _, code := run(t, "", full...); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
		}
	}
}
