package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/slowrank/slowrank/detector"
)

// runErr runs the CLI with args ($DIR is a temporary directory) and returns
// the error message main would print and the exit code.
func runErr(t *testing.T, env map[string]string, args ...string) (string, int) {
	t.Helper()
	dir := t.TempDir()
	for k, v := range env {
		t.Setenv(k, strings.ReplaceAll(v, "$DIR", dir))
	}
	full := []string{"slowrank"}
	for _, a := range args {
		full = append(full, strings.ReplaceAll(a, "$DIR", dir))
	}
	err := newApp().Run(full)
	var ec cli.ExitCoder
	switch {
	case err == nil:
		return "", 0
	case errors.As(err, &ec):
		return err.Error(), ec.ExitCode()
	default:
		return err.Error(), 1
	}
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestInvalidInputExitsTwo: invalid flags, files and configuration give one
// line that says what is wrong and where, and exit code 2. None of these
// cases gets as far as touching the kernel.
func TestInvalidInputExitsTwo(t *testing.T) {
	dir := t.TempDir()
	cfg := func(name, content string) string { return writeFile(t, dir, name, content) }
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want []string // substrings of the message
	}{
		{"unknown flag", []string{"agent", "--no-such-flag"}, nil, []string{"agent", "-no-such-flag"}},
		{"bad duration", []string{"agent", "--window", "5x"}, nil, []string{"window", "5x"}},
		{"bad env value", []string{"agent"}, map[string]string{"SLOWRANK_THRESHOLD": "high"}, []string{"SLOWRANK_THRESHOLD", "high"}},
		{"threshold out of range", []string{"agent", "--threshold", "-1"}, nil, []string{"threshold"}},
		{"overhead budget", []string{"agent", "--overhead-budget", "2"}, nil, []string{"--overhead-budget", "(0, 1)"}},
		{"negative uprobe cost", []string{"agent", "--uprobe-cost", "-1us"}, nil, []string{"--uprobe-cost", "[0, 1ms]"}},
		{"bad uprobe cost from env", []string{"agent"}, map[string]string{"SLOWRANK_UPROBE_COST": "6"}, []string{"SLOWRANK_UPROBE_COST", "6"}},
		{"negative nccl plugin cost", []string{"agent", "--nccl-plugin-cost", "-1us"}, nil, []string{"--nccl-plugin-cost", "[0, 1ms]"}},
		{"nccl plugin cost above 1ms", []string{"agent", "--nccl-plugin-cost", "2ms"}, nil, []string{"--nccl-plugin-cost", "[0, 1ms]"}},
		{"unknown kernel-channel mode", []string{"agent", "--nccl-kernel-channels", "sometimes"}, nil, []string{"--nccl-kernel-channels", "auto, on or off"}},
		{"bad kernel-channel mode in the environment", []string{"agent"}, map[string]string{"SLOWRANK_NCCL_KERNEL_CHANNELS": "maybe"}, []string{"--nccl-kernel-channels", "\"maybe\""}},
		{"bad nccl plugin cost from env", []string{"agent"}, map[string]string{"SLOWRANK_NCCL_PLUGIN_COST": "1"}, []string{"SLOWRANK_NCCL_PLUGIN_COST", "1"}},
		{"bad nccl plugin cost in config", []string{"agent", "--config", cfg("plugincost.yaml", "agent:\n  nccl-plugin-cost: -1us\n")}, nil, []string{"--nccl-plugin-cost", "[0, 1ms]"}},
		{"bad regexp", []string{"agent", "--match", "(["}, nil, []string{"--match"}},
		{"bad memory size", []string{"agent", "--max-memory", "lots"}, nil, []string{"--max-memory", "lots"}},
		{"memory too small", []string{"agent", "--max-memory", "8MiB"}, nil, []string{"--max-memory", "too small"}},
		{"negative max procs", []string{"agent", "--max-procs", "-1"}, nil, []string{"--max-procs"}},
		{"ring buffer not a power of two", []string{"agent", "--ringbuf-size", "5000"}, nil, []string{"--ringbuf-size", "power of two"}},
		{"missing input file", []string{"replay", "--input", "/does/not/exist"}, nil, []string{"/does/not/exist"}},
		{"missing config file", []string{"agent", "--config", "/does/not/exist.yaml"}, nil, []string{"--config /does/not/exist.yaml", "no such file"}},
		{"config is a directory", []string{"replay", "--config", dir}, nil, []string{"--config " + dir, "directory"}},
		{"config unknown key", []string{"agent", "--config", cfg("unknown.yaml", "window: 5s\nwindw: 2s\n")}, nil,
			[]string{"unknown.yaml", "line 2", "windw", "did you mean window"}},
		{"config unknown key in section", []string{"replay", "--config", cfg("section.yaml", "agent:\n  facts: /tmp/f\n  bogus: 1\n")}, nil,
			[]string{"section.yaml", "line 3", "agent.bogus"}},
		{"config bad value", []string{"replay", "--config", cfg("value.yaml", "replay:\n  threshold: lots\n")}, nil,
			[]string{"value.yaml", "line 2", "threshold", "lots"}},
		{"config bad YAML", []string{"replay", "--config", cfg("broken.yaml", "window: 5s\n  floor: [1ms\n")}, nil,
			[]string{"broken.yaml", "line", "invalid YAML"}},
		{"config bad JSON", []string{"replay", "--config", cfg("broken.json", "{\"window\": \"5s\",\n \"floor\": }\n")}, nil,
			[]string{"broken.json", "line 2"}},
		{"config not a mapping", []string{"replay", "--config", cfg("list.yaml", "- window\n")}, nil, []string{"list.yaml", "line 1", "mapping"}},
		{"config duplicate key", []string{"replay", "--config", cfg("dup.yaml", "window: 5s\nwindow: 6s\n")}, nil, []string{"dup.yaml", "line 2", "duplicate"}},
		{"config list for a single flag", []string{"replay", "--config", cfg("list1.yaml", "window: [5s, 6s]\n")}, nil, []string{"list1.yaml", "line 1", "window", "one value"}},
		{"config empty list", []string{"agent", "--config", cfg("empty.yaml", "agent:\n  pid: []\n")}, nil, []string{"empty.yaml", "line 2", "agent.pid", "empty list"}},
		{"config nested value", []string{"replay", "--config", cfg("nested.yaml", "window:\n  a: 1\n")}, nil, []string{"nested.yaml", "line 2", "window"}},
		{"config from env", []string{"replay"}, map[string]string{"SLOWRANK_CONFIG": cfg("env.yaml", "consecutive: many\n")}, []string{"env.yaml", "line 1", "consecutive"}},
		{"config validated values", []string{"replay", "--config", cfg("invalid.yaml", "threshold: -3\n"), "--input", "$DIR/x"}, nil, []string{"threshold"}},
		// A threshold is a fraction: 5 is not 5 %. Every command that runs
		// the detector, from the flag, the environment and the file.
		{"threshold 5 read as 500 %", []string{"replay", "--threshold", "5", "--input", "$DIR/x"}, nil, []string{"--threshold 5", "(0, 1)", "SLOWRANK_THRESHOLD"}},
		{"threshold 1", []string{"agent", "--threshold", "1"}, nil, []string{"--threshold 1", "(0, 1)"}},
		{"threshold 0", []string{"aggregate", "--threshold", "0", "--listen", "127.0.0.1:0", "--duration", "100ms"}, nil, []string{"--threshold 0", "(0, 1)"}},
		{"threshold from the environment", []string{"agent"}, map[string]string{"SLOWRANK_THRESHOLD": "5"}, []string{"--threshold 5", "SLOWRANK_THRESHOLD"}},
		{"threshold from the file", []string{"replay", "--config", cfg("threshold.yaml", "replay:\n  threshold: 5\n"), "--input", "$DIR/x"}, nil, []string{"--threshold 5", "--config"}},
		{"phase threshold above 1", []string{"replay", "--phase-threshold", "host=2", "--input", "$DIR/x"}, nil, []string{"--phase-threshold host=2", "(0, 1)"}},
		{"phase threshold from the environment", []string{"aggregate", "--listen", "127.0.0.1:0", "--duration", "100ms"}, map[string]string{"SLOWRANK_PHASE_THRESHOLD": "compute=10"}, []string{"--phase-threshold compute=10", "SLOWRANK_PHASE_THRESHOLD"}},
		{"control set threshold 5", []string{"control", "set", "--threshold", "5", "--socket", "$DIR/none.sock"}, nil, []string{"--threshold 5", "(0, 1)"}},
		{"control set phase threshold 5", []string{"control", "set", "--phase-threshold", "host=5", "--socket", "$DIR/none.sock"}, nil, []string{"--phase-threshold host=5", "(0, 1)"}},
		// Phases are names of DESIGN.md section 3.
		{"unknown phase", []string{"replay", "--phases", "gpu,foo", "--input", "$DIR/x"}, nil, []string{"--phases", `"gpu"`, "compute, host"}},
		{"unknown phase for the agent", []string{"agent", "--phases", "compute,foo"}, nil, []string{"--phases", `"foo"`}},
		{"unknown phase for the aggregator", []string{"aggregate", "--phases", "gpu", "--listen", "127.0.0.1:0", "--duration", "100ms"}, nil, []string{"--phases", `"gpu"`}},
		{"unknown phase from the environment", []string{"replay", "--input", "$DIR/x"}, map[string]string{"SLOWRANK_PHASES": "host,gpu"}, []string{"--phases", `"gpu"`, "SLOWRANK_PHASES"}},
		{"unknown phase from the file", []string{"agent", "--config", cfg("phases.yaml", "phases: compute,foo\n")}, nil, []string{"--phases", `"foo"`, "--config"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg, code := runErr(t, tc.env, tc.args...)
			if code != exitUsage {
				t.Errorf("exit %d (%q), want %d", code, msg, exitUsage)
			}
			if strings.Contains(msg, "\n") || msg == "" {
				t.Errorf("message is not one line: %q", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q lacks %q", msg, w)
				}
			}
		})
	}
}

// TestConfigPrecedence: flag > environment > file > default, for the top
// level and the command's section, YAML and JSON alike.
func TestConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	facts := simulateFacts(t, "--ranks", "4", "--duration", "20s")
	in := writeFile(t, dir, "facts.jsonl", facts)
	yamlCfg := writeFile(t, dir, "c.yaml", "window: 3s\nthreshold: 0.2\nfloor: 4ms\nreplay:\n  consecutive: 5\n  floor: 2ms\nagent:\n  pid: [1, 2]\n")
	jsonCfg := writeFile(t, dir, "c.json", `{"window": "3s", "threshold": 0.2, "replay": {"consecutive": 5, "floor": "2ms"}, "agent": {"facts": "/x"}}`)
	for _, cfgPath := range []string{yamlCfg, jsonCfg} {
		t.Run(filepath.Ext(cfgPath), func(t *testing.T) {
			t.Setenv("SLOWRANK_THRESHOLD", "0.3")
			var got replayFlags
			app := newApp()
			for _, c := range app.Commands {
				if c.Name == "replay" {
					c.Action = func(c *cli.Context) error {
						got = replayFlags{c.Duration("window").String(), c.Float64("threshold"), c.Duration("floor").String(), c.Int("consecutive"), c.Int("min-references")}
						return nil
					}
				}
			}
			if err := app.Run([]string{"slowrank", "replay", "--config", cfgPath, "--input", in, "--window", "7s"}); err != nil {
				t.Fatal(err)
			}
			// flag, env, section over top level, section, default
			want := replayFlags{"7s", 0.3, "2ms", 5, detector.DefaultConfig().MinReferences}
			if got != want {
				t.Errorf("got %+v, want %+v", got, want)
			}
		})
	}
	// The file drives a real replay.
	cfgFile := writeFile(t, dir, "r.yaml", "replay:\n  input: "+in+"\n  output: "+filepath.Join(dir, "out.jsonl")+"\n")
	if msg, code := runErr(t, nil, "replay", "--config", cfgFile); code != 0 {
		t.Fatalf("replay from a config file: exit %d: %s", code, msg)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "out.jsonl")); err != nil || !strings.Contains(string(b), `"kind":"summary"`) {
		t.Fatalf("replay output from the config file: %v %.200s", err, b)
	}
}

type replayFlags struct {
	Window      string
	Threshold   float64
	Floor       string
	Consecutive int
	MinRefs     int
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "4096": 4096, "512MiB": 512 << 20, "2G": 2 << 30, "64k": 64 << 10, "1 GiB": 1 << 30, "10MB": 10 << 20} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "lots", "-1", "1.5G", "99999999999G", "G"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) accepted", in)
		}
	}
}

// FuzzParseConfig feeds arbitrary files to the configuration parser and the
// key check against the real commands: never a panic, and every error says
// where (a line) or what (the file as a whole).
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		"window: 5s\n", "agent:\n  pid: [1, 2]\n  facts: /x\n", `{"replay": {"threshold": 0.1}}`,
		"- a\n- b\n", "a: &x 1\nb: *x\n", "window: [1, [2]]\n", "agent: 3\n", "? [a]\n: b\n",
		"window: !!binary aGVsbG8=\n", "\xff\xfe", "a: b: c\n", "agent:\n  agent:\n    window: 1s\n",
		"%YAML 1.2\n---\nwindow: 1s\n...\n", "window: 1s\n---\nfloor: 1ms\n", "", "agent:\n  pid: []\n",
	} {
		f.Add([]byte(s))
	}
	app := newApp()
	cmds := map[string]flagSpec{}
	for _, c := range app.Commands {
		if configurable[c.Name] {
			cmds[c.Name] = specOf(c)
		}
	}
	isSection := func(s string) bool { _, ok := cmds[s]; return ok }
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, err := parseConfig(data, isSection)
		if err == nil {
			err = checkEntries(entries, "agent", cmds)
		}
		if err == nil {
			for _, e := range entries {
				if e.line <= 0 || len(e.values) == 0 {
					t.Fatalf("entry without a line or value: %+v", e)
				}
			}
			return
		}
		var ce *configError
		if !errors.As(err, &ce) {
			t.Fatalf("error of type %T: %v", err, err)
		}
		if strings.Contains(err.Error(), "\n") {
			t.Fatalf("multi-line error: %q", err)
		}
	})
}

// TestListenDefaultsLoopback: no command listens beyond this host unless
// told to: every address flag defaults to empty, a Unix socket or loopback.
func TestListenDefaultsLoopback(t *testing.T) {
	n := 0
	for _, c := range newApp().Commands {
		for _, f := range c.Flags {
			sf, ok := f.(*cli.StringFlag)
			if !ok || !(strings.Contains(sf.Name, "listen") || strings.HasSuffix(sf.Name, "addr")) {
				continue
			}
			n++
			if v := sf.Value; v != "" && !strings.HasPrefix(v, "127.0.0.1:") && !strings.HasPrefix(v, "[::1]:") && !strings.HasPrefix(v, "localhost:") {
				t.Errorf("%s --%s defaults to %q, not loopback", c.Name, sf.Name, v)
			}
		}
	}
	if n == 0 {
		t.Fatal("no address flags found")
	}
}
