package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/slowrank/slowrank/agent"
	"github.com/slowrank/slowrank/agent/discover"
	"github.com/slowrank/slowrank/agent/privilege"
	"github.com/slowrank/slowrank/cupti"
)

func TestMissingCaps(t *testing.T) {
	set := func(cs ...privilege.Capability) privilege.CapSet { return privilege.Caps(cs...) }
	minimal := set(privilege.CapBPF, privilege.CapPerfmon, privilege.CapSysPtrace, privilege.CapDACReadSearch, privilege.CapDACOverride, privilege.CapCheckpointRestore)
	tests := []struct {
		name               string
		eff                privilege.CapSet
		needAdmin          bool
		required, optional string
	}{
		{"root", privilege.CapSet(0x1ffffffffff), true, "", ""},
		{"minimal on a kernel without the sys_admin rule", minimal, false, "", ""},
		{"minimal where uprobes need sys_admin", minimal, true, "CAP_SYS_ADMIN", ""},
		{"sys_admin covers bpf and perfmon", set(privilege.CapSysAdmin, privilege.CapSysPtrace, privilege.CapDACReadSearch, privilege.CapDACOverride), true, "", ""},
		{"no ptrace", minimal &^ set(privilege.CapSysPtrace), false, "CAP_SYS_PTRACE", ""},
		{"no dac: optional features", set(privilege.CapBPF, privilege.CapPerfmon, privilege.CapSysPtrace, privilege.CapCheckpointRestore), false, "", "CAP_DAC_READ_SEARCH, CAP_DAC_OVERRIDE"},
		{"nothing", 0, false, "CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH, CAP_CHECKPOINT_RESTORE, CAP_DAC_OVERRIDE"},
		{"this container (no CAP_SYS_RESOURCE)", privilege.CapSet(0x1fffeffffff), true, "", ""},
	}
	for _, tt := range tests {
		req, opt := privilege.MissingCapabilities(tt.eff, privilege.CapRequirements(tt.needAdmin, true))
		if got := capList(req); got != tt.required {
			t.Errorf("%s: required missing %q, want %q", tt.name, got, tt.required)
		}
		if got := capList(opt); got != tt.optional {
			t.Errorf("%s: optional missing %q, want %q", tt.name, got, tt.optional)
		}
	}
}

func TestParseMounts(t *testing.T) {
	data := "sysfs /sys sysfs rw 0 0\ntracefs /sys/kernel/tracing tracefs rw 0 0\ndebugfs /sys/kernel/debug debugfs rw 0 0\n" +
		"tracefs /sys/kernel/debug/tracing tracefs rw 0 0\nbpf /sys/fs/bpf bpf rw 0 0\nx /mnt/a\\040b ext4 rw 0 0\nshort\n"
	m := parseMounts([]byte(data))
	if got := strings.Join(m["tracefs"], ","); got != "/sys/kernel/tracing,/sys/kernel/debug/tracing" {
		t.Errorf("tracefs %q", got)
	}
	if got := m["ext4"]; len(got) != 1 || got[0] != "/mnt/a b" {
		t.Errorf("ext4 %q", got)
	}
}

func TestParseNvidiaVersion(t *testing.T) {
	tests := map[string]string{
		"NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Thu Sep 25 19:59:44 UTC 2025\nGCC version:  gcc 12\n": "580.95.05",
		"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build\n":                             "570.86.15",
		"garbage\n": "",
	}
	for in, want := range tests {
		if got := parseNvidiaVersion([]byte(in)); got != want {
			t.Errorf("parseNvidiaVersion(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestOTLPTarget(t *testing.T) {
	tests := []struct {
		endpoint, protocol, want string
		err                      bool
	}{
		{"http://127.0.0.1:4318", "", "127.0.0.1:4318", false},
		{"http://collector", "", "collector:4318", false},
		{"http://collector", "grpc", "collector:4317", false},
		{"https://otlp.example.com/v1", "", "otlp.example.com:443", false},
		{"http://[::1]:4317/", "grpc", "[::1]:4317", false},
		{"collector:4317", "grpc", "collector:4317", false},
		{"collector", "grpc", "collector:4317", false},
		{"http://", "", "", true},
		{"not a url/x", "", "", true},
	}
	for _, tt := range tests {
		got, err := otlpTarget(tt.endpoint, tt.protocol)
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("otlpTarget(%q, %q) = %q, %v; want %q, err %v", tt.endpoint, tt.protocol, got, err, tt.want, tt.err)
		}
	}
}

func TestCUPTIVersionFromName(t *testing.T) {
	for in, want := range map[string]string{
		"/usr/lib/x86_64-linux-gnu/libcupti.so.2022.3.0": "2022.3.0",
		"libcupti.so.12":  "12",
		"libcupti.so":     "",
		"libcupti-abc.so": "",
	} {
		if got := cuptiVersionFromName(in); got != want {
			t.Errorf("cuptiVersionFromName(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestDoctorJSON runs the whole doctor on this host: whatever the host
// has, the output is a JSON array with every check, each with a known
// status, and the exit code follows the failures.
func TestDoctorJSON(t *testing.T) {
	out, code := captureRun(t, "doctor", "--json", "--otlp-endpoint", "http://127.0.0.1:1", "--socket", t.TempDir()+"/none.sock")
	var checks []checkResult
	if err := json.Unmarshal([]byte(out), &checks); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, out)
	}
	want := []string{"kernel", "btf", "uprobes", "tracefs", "caps", "bpf", "refctr", "uprobe_multi", "nvml", "cupti-lib", "cuda", "processes", "otlp", "agent"}
	if len(checks) != len(want) {
		t.Fatalf("%d checks, want %d: %+v", len(checks), len(want), checks)
	}
	failed := false
	for i, c := range checks {
		if c.Check != want[i] {
			t.Errorf("check %d is %q, want %q", i, c.Check, want[i])
		}
		switch c.Status {
		case checkOK, checkInfo:
		case checkWarn, checkFail:
			if c.Fix == "" && c.Check != "processes" {
				t.Errorf("%s: %s without a fix", c.Check, c.Status)
			}
			failed = failed || c.Status == checkFail
		default:
			t.Errorf("%s: unknown status %q", c.Check, c.Status)
		}
		if c.Detail == "" {
			t.Errorf("%s: no detail", c.Check)
		}
	}
	// Port 1 on loopback refuses: the configured endpoint fails.
	otlp := checks[slices.Index(want, "otlp")]
	if otlp.Status != checkFail || !failed || code != 1 {
		t.Errorf("otlp %+v, exit %d", otlp, code)
	}
}

func TestDoctorText(t *testing.T) {
	out, _ := captureRun(t, "doctor", "--socket", t.TempDir()+"/none.sock")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if !strings.HasPrefix(lines[0], "slowrank doctor ") || !strings.Contains(lines[len(lines)-1], "failures") {
		t.Fatalf("doctor output:\n%s", out)
	}
	for _, name := range []string{"kernel", "caps", "bpf", "nvml", "otlp"} {
		if !strings.Contains(out, "] "+name) {
			t.Errorf("no %s line:\n%s", name, out)
		}
	}
}

func TestNCCLCaptureSaysWhichPathAProcessIsOn(t *testing.T) {
	bound := &cupti.NCCLStatus{APIVersion: 5, LiveComms: 2, Colls: 1200}
	tests := []struct {
		name   string
		plugin string // NCCL_PROFILER_PLUGIN
		st     *cupti.NCCLStatus
		want   string
	}{
		{"the bound plugin names its version", "/opt/slowrank/lib/libslowrank_cupti.so", bound,
			"NCCL: profiler plugin v5 bound (2 live communicators, 1200 collectives)"},
		{"drops of the plugin are shown", "slowrank", &cupti.NCCLStatus{APIVersion: 4, LiveComms: 1, Colls: 9, Dropped: 3},
			"NCCL: profiler plugin v4 bound (1 live communicators, 9 collectives, 3 dropped)"},
		{"a refused plugin leaves the uprobes", "libslowrank_cupti.so", &cupti.NCCLStatus{APIVersion: 5, Disabled: true},
			"NCCL: uprobes (plugin refused by SLOWRANK_NCCL_DISABLE)"},
		{"no variable: no plugin", "", nil, "NCCL: uprobes (plugin not loaded: NCCL_PROFILER_PLUGIN unset)"},
		{"none disables it", "none", nil, "NCCL: uprobes (plugin not loaded: NCCL_PROFILER_PLUGIN=none)"},
		{"another tool's plugin owns the slot", "/usr/lib/libnccl-profiler-inspector.so", nil,
			"NCCL: uprobes (another plugin owns the slot: /usr/lib/libnccl-profiler-inspector.so)"},
		{"another plugin by name owns the slot", "inspector", nil, "NCCL: uprobes (another plugin owns the slot: inspector)"},
		{"ours named, no communicator yet", "/opt/slowrank/lib/libnccl-profiler-slowrank.so", nil,
			"NCCL: uprobes (plugin not loaded yet: NCCL loads it at its first communicator)"},
		{"ours mapped by CUDA only, NCCL never bound it", "slowrank", &cupti.NCCLStatus{},
			"NCCL: uprobes (plugin not loaded yet: NCCL loads it at its first communicator)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ncclCapture(tt.plugin, tt.st); got != tt.want {
				t.Errorf("ncclCapture(%q) = %q, want %q", tt.plugin, got, tt.want)
			}
		})
	}
}

func TestLibraryStateOfAPluginOnlyProcessSaysSo(t *testing.T) {
	initBlock := cupti.ControlBlock{}
	tests := []struct {
		name string
		cb   cupti.ControlBlock
		st   *cupti.NCCLStatus
		want string
	}{
		{"loaded by NCCL only: no device collection", initBlock, &cupti.NCCLStatus{APIVersion: 5},
			"library loaded by NCCL as its profiler plugin only (CUDA never called InitializeInjection: no device collection)"},
		{"init without the plugin is the library's own state", initBlock, &cupti.NCCLStatus{}, "library init"},
		{"an older library without the status block", initBlock, nil, "library init"},
		{"CUDA initialised it too: its CUPTI state", cupti.ControlBlock{Status: cupti.Status{State: cupti.StateOn, CUPTIVersion: 24}},
			&cupti.NCCLStatus{APIVersion: 5}, "library on, CUPTI API 24"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := libraryState(tt.cb, tt.st); got != tt.want {
				t.Errorf("libraryState = %q, want %q", got, tt.want)
			}
		})
	}
}

// The agent's NCCL decisions per process (its status columns NCCL and
// COLL) are lines under doctor's agent check; without an agent, one line
// says where to see them.
func TestDoctorShowsTheAgentsNCCLCapturePath(t *testing.T) {
	const job = "ft-2949-1944304736853"
	f, sock := startFake(t)
	f.procs = []agent.ProcessView{
		{PID: 4243, Rank: 1, Job: job, Libraries: []string{"libnccl.so.2"}, NCCL: "uprobes", NCCLUprobes: "attached"},
		{PID: 4242, Rank: 0, Job: job, Libraries: []string{"libnccl.so.2"}, NCCL: "plugin v5", NCCLUprobes: "detached"},
		{PID: 4250, Rank: 0, Job: "gloo-job", Libraries: []string{"libtorch_cpu.so"}, NCCL: "uprobes"}, // no libnccl: not listed
	}
	want := []string{
		"pid 4242 rank 0 job " + job + ": NCCL plugin v5; libnccl collective uprobes detached (every process mapping the file is on the plugin path)",
		"pid 4243 rank 1 job " + job + ": NCCL uprobes; libnccl collective uprobes attached",
	}

	out, _ := captureRun(t, "doctor", "--json", "--socket", sock)
	var checks []checkResult
	if err := json.Unmarshal([]byte(out), &checks); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, out)
	}
	i := slices.IndexFunc(checks, func(c checkResult) bool { return c.Check == "agent" })
	if i < 0 || checks[i].Status != checkOK || !slices.Equal(checks[i].Items, want) {
		t.Fatalf("agent check %+v, want items %q", checks, want)
	}

	// Text: the agent's line, then one indented line per process.
	out, _ = captureRun(t, "doctor", "--socket", sock)
	lines := strings.Split(out, "\n")
	at := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "[ ok ] agent ") })
	if at < 0 || at+2 >= len(lines) || lines[at+1] != "                  "+want[0] || lines[at+2] != "                  "+want[1] {
		t.Fatalf("doctor text lacks the NCCL lines under the agent:\n%s", out)
	}

	// A process on the uprobes whose NCCL_PROFILER_PLUGIN names another
	// tool's plugin, or ours without records, says so (doctor read the
	// variable itself).
	rep := &agent.StatusReport{Status: agent.Status{Procs: f.procs}}
	got := ncclAgentItems(rep, map[int]string{4243: "/usr/lib/libnccl-profiler-inspector.so"}, sock)
	if w := "pid 4243 rank 1 job " + job + ": NCCL uprobes (another plugin owns the slot: /usr/lib/libnccl-profiler-inspector.so); libnccl collective uprobes attached"; len(got) != 2 || got[1] != w {
		t.Errorf("foreign plugin: %q, want %q second", got, w)
	}
	got = ncclAgentItems(rep, map[int]string{4243: "slowrank", 4242: "slowrank"}, sock)
	if w := "pid 4243 rank 1 job " + job + ": NCCL uprobes (our plugin named, no plugin record reached the agent: --nccl-plugin off, or NCCL has not bound it yet); libnccl collective uprobes attached"; len(got) != 2 || got[1] != w || got[0] != want[0] {
		t.Errorf("our plugin without records: %q, want %q, %q", got, want[0], w)
	}
	// Kept on the uprobes by a collective the plugin reports per peer:
	// records came, the agent's reason stands.
	rep.Procs = []agent.ProcessView{{PID: 9, Rank: 2, Job: "moe", NCCL: "uprobes (alltoall: plugin reports it per peer)", NCCLUprobes: "attached"}}
	if got, w := ncclAgentItems(rep, map[int]string{9: "slowrank"}, sock),
		"pid 9 rank 2 job moe: NCCL uprobes (alltoall: plugin reports it per peer); libnccl collective uprobes attached"; len(got) != 1 || got[0] != w {
		t.Errorf("kept on the uprobes: %q, want %q", got, w)
	}
	rep.Procs = []agent.ProcessView{{PID: 7, Rank: 3, NCCL: "plugin v4"}, {PID: 8, Rank: 0, Job: "j", NCCL: "plugin v6", NCCLUprobes: "attached"}}
	if got := ncclAgentItems(rep, nil, sock); !slices.Equal(got, []string{"pid 7 rank 3 job -: NCCL plugin v4; libnccl not attached",
		"pid 8 rank 0 job j: NCCL plugin v6; libnccl collective uprobes attached (a process mapping the file is off the plugin path, or a communicator of this one needs them)"}) {
		t.Errorf("plugin processes without an attached libnccl, and with its collective uprobes attached: %q", got)
	}
	var many []agent.ProcessView
	for pid := 100; pid < 100+maxListed+3; pid++ {
		many = append(many, agent.ProcessView{PID: pid, NCCL: "uprobes", NCCLUprobes: "attached"})
	}
	rep.Procs = many
	if got := ncclAgentItems(rep, nil, sock); len(got) != maxListed+1 || got[maxListed] != "... and 3 more" {
		t.Errorf("%d processes: %d lines, last %q", len(many), len(got), got[len(got)-1])
	}

	// No agent: where to see it, only when a training process maps libnccl.
	if got := ncclAgentItems(nil, nil, sock); got != nil {
		t.Errorf("no agent, no NCCL process: %q, want no line", got)
	}
	got = ncclAgentItems(nil, map[int]string{1: "", 2: "slowrank"}, "/run/slowrank/agent.sock")
	if w := "NCCL capture path and libnccl collective uprobes of 2 processes: the agent decides them; see slowrank status (columns NCCL, COLL) where it runs, or doctor --socket /run/slowrank/agent.sock once it answers"; !slices.Equal(got, []string{w}) {
		t.Errorf("no agent: %q, want %q", got, w)
	}
}

// The NCCL lines are new lines only: every other line of the report stays
// as it was.
func TestDoctorNCCLLinesAddLinesOnly(t *testing.T) {
	checks := []checkResult{
		{Check: "processes", Status: checkWarn, Detail: "4 found", Items: []string{"pid 1 rank 0 job j: library not loaded"}, Fix: "start the job with ..."},
		{Check: "agent", Status: checkOK, Detail: "running (version v, up 3s)"},
	}
	var before, after bytes.Buffer
	writeDoctor(&before, checks)
	checks[1].Items = []string{"pid 1 rank 0 job j: NCCL plugin v5; libnccl collective uprobes detached"}
	writeDoctor(&after, checks)
	var kept []string
	for _, l := range strings.SplitAfter(after.String(), "\n") {
		if !strings.Contains(l, "NCCL plugin v5") {
			kept = append(kept, l)
		}
	}
	if got := strings.Join(kept, ""); got != before.String() {
		t.Errorf("without the NCCL lines:\n%s\nwant:\n%s", got, before.String())
	}
	if !strings.Contains(after.String(), "[ ok ] agent      running (version v, up 3s)\n                  pid 1 rank 0 job j: NCCL plugin v5") {
		t.Errorf("report:\n%s", after.String())
	}
}

// TestCheckAgentSocket: what the agent check says for each state of the
// socket: an answering agent, none, a stale socket, and a socket that
// accepts and never answers (an agent still exiting, or stuck).
func TestCheckAgentSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "sr")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	_, live := startFake(t)

	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()

	silent := filepath.Join(dir, "silent.sock")
	sl, err := net.Listen("unix", silent) // accepts into its backlog, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer sl.Close()

	for _, tt := range []struct {
		name, socket, status, want string
	}{
		{"answering agent", live, checkOK, "running (version test"},
		{"no socket", filepath.Join(dir, "none.sock"), checkInfo, "no agent answers at"},
		{"stale socket", stale, checkInfo, "a stale socket, nothing listens"},
		{"socket that never answers", silent, checkWarn, "accepts connections but no status came within 2 s"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, _ := checkAgent(t.Context(), tt.socket)
			if r.Status != tt.status || !strings.Contains(r.Detail, tt.want) {
				t.Errorf("checkAgent(%s) = %s %q, want %s containing %q", tt.name, r.Status, r.Detail, tt.status, tt.want)
			}
		})
	}
}

// TestDoctorReportsAMissingInjectionLibraryFile: a training process whose
// CUDA_INJECTION64_PATH names no file in its filesystem (a pod without the
// hostPath mount, or the quick start's wrong path) is named with that
// path, and the fix says what to mount; one whose file is there only waits
// for CUDA. Real processes, selected by an environment key of their own.
func TestDoctorReportsAMissingInjectionLibraryFile(t *testing.T) {
	dir := t.TempDir()
	present := filepath.Join(dir, "lib", discover.InjectionLibraryName)
	if err := os.MkdirAll(filepath.Dir(present), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(present, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, discover.InjectionLibraryName) // the directory lacks it
	key := fmt.Sprintf("SLOWRANK_DOCTOR_TEST_%d", os.Getpid())
	start := func(t *testing.T, rank int, lib string) int {
		cmd := exec.Command("sleep", "60")
		cmd.Env = []string{key + "=1", "RANK=" + strconv.Itoa(rank), "CUDA_INJECTION64_PATH=" + lib}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); _ = cmd.Wait() }) // reaps the killed child: Wait reports the kill
		return cmd.Process.Pid
	}
	for _, tc := range []struct {
		name     string
		lib      string
		item     string // the process's line, after "pid N rank R job -: "
		warn     bool
		fixNames string
	}{
		{"file missing", missing, "CUDA_INJECTION64_PATH=" + missing + ": no such file in the process's filesystem", true, missing},
		{"file there, not loaded yet", present, "CUDA_INJECTION64_PATH set, library not loaded yet", true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pid := start(t, 0, tc.lib)
			r, _ := checkProcesses(key, present)
			var item string
			for _, it := range r.Items {
				if strings.HasPrefix(it, fmt.Sprintf("pid %d ", pid)) {
					item = it
				}
			}
			if !strings.Contains(item, tc.item) {
				t.Fatalf("items %q: want pid %d with %q", r.Items, pid, tc.item)
			}
			if (r.Status == checkWarn) != tc.warn {
				t.Errorf("status %s", r.Status)
			}
			if tc.fixNames != "" && (!strings.Contains(r.Fix, tc.fixNames) || !strings.Contains(r.Fix, "mount the node's "+filepath.Dir(present))) {
				t.Errorf("fix %q does not name %s and what to mount", r.Fix, tc.fixNames)
			}
			if tc.fixNames == "" && strings.Contains(r.Fix, "missing") {
				t.Errorf("fix %q reports a missing file", r.Fix)
			}
		})
	}
}
