package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/slowrank/slowrank/agent"
	"github.com/slowrank/slowrank/agent/discover"
	"github.com/slowrank/slowrank/agent/gpu"
	"github.com/slowrank/slowrank/agent/localapi"
	"github.com/slowrank/slowrank/agent/privilege"
	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/cupti"
)

// Check statuses. Only "fail" makes doctor exit 1: it marks something the
// agent needs. "warn" costs a feature (device phases, telemetry export);
// "info" is context.
const (
	checkOK   = "ok"
	checkWarn = "warn"
	checkFail = "fail"
	checkInfo = "info"
)

// checkResult is one line of doctor's report (and one object of --json).
type checkResult struct {
	Check  string `json:"check"`
	Status string `json:"status"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"`
	// Items are details (one per training process).
	Items []string `json:"items,omitempty"`
}

func doctorCommand() *cli.Command {
	return &cli.Command{
		Name:      "doctor",
		Usage:     "check what works on this host for the agent, and how to fix what does not",
		UsageText: "slowrank doctor [--json] [--otlp-endpoint URL] [--lib PATH]",
		Description: "Checks the kernel (version, BTF, uprobes, tracefs, BPF ring buffers, uprobe\n" +
			"ref_ctr_offset), this process's capabilities, NVML and the GPUs, the CUPTI injection\n" +
			"library and the CUDA/CUPTI versions, the training processes (environment has RANK)\n" +
			"and whether they loaded the library (or name, in CUDA_INJECTION64_PATH, a file missing\n" +
			"in their filesystem), the OTLP endpoint, and a running agent (per process\n" +
			"mapping libnccl, the NCCL capture path it took and whether libnccl's collective uprobes\n" +
			"are detached). One line per check with a fix. Exit code 0 when everything the agent\n" +
			"needs is there, 1 otherwise. Run it as the agent runs (root) for meaningful answers.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print the checks as a JSON array", EnvVars: []string{"SLOWRANK_JSON"}},
			&cli.StringFlag{Name: "otlp-endpoint", Usage: "OTLP endpoint to test (default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT)"},
			&cli.StringFlag{Name: "lib", Usage: "the injection library libslowrank_cupti.so (default: next to the binary, bin/, /opt/slowrank/lib)", EnvVars: []string{"SLOWRANK_CUPTI_LIB_PATH"}},
			&cli.StringFlag{Name: "env-key", Value: discover.DefaultEnvKey, Usage: "training processes are those whose environment has this variable", EnvVars: []string{"SLOWRANK_ENV_KEY"}},
			&cli.StringFlag{Name: "socket", Value: localapi.DefaultSocket, Usage: "a running agent's Unix socket", EnvVars: []string{"SLOWRANK_STATUS_SOCKET"}},
		},
		Action: func(c *cli.Context) error {
			checks := runDoctor(c.Context, doctorOptions{
				otlp: c.String("otlp-endpoint"), lib: c.String("lib"), envKey: c.String("env-key"), socket: c.String("socket"),
			})
			if c.Bool("json") {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				enc.SetEscapeHTML(false)
				if err := enc.Encode(checks); err != nil {
					return err
				}
			} else {
				var b bytes.Buffer
				writeDoctor(&b, checks)
				if err := writeOut(os.Stdout, &b); err != nil {
					return err
				}
			}
			if doctorFailed(checks) {
				return cli.Exit("", 1)
			}
			return nil
		},
	}
}

type doctorOptions struct {
	otlp, lib, envKey, socket string
}

func doctorFailed(checks []checkResult) bool {
	for _, c := range checks {
		if c.Status == checkFail {
			return true
		}
	}
	return false
}

// runDoctor runs every check. Each is independent: one failing does not
// stop the others.
func runDoctor(ctx context.Context, o doctorOptions) []checkResult {
	kernel, kerr := privilege.KernelRelease()
	var kv privilege.KernelVersion
	if kerr == nil {
		kv, kerr = privilege.ParseKernelVersion(kernel)
	}
	out := []checkResult{
		checkKernel(kernel, kv, kerr),
		checkBTF(),
		checkUprobes(),
		checkTracefs(),
		checkCapabilities(),
		checkBPF(),
		checkRefCtr(),
		checkUprobeMulti(),
		checkNVML(),
	}
	libPath, lib := checkInjectionLibrary(o.lib)
	procs, plugins := checkProcesses(o.envKey, libPath)
	ag, rep := checkAgent(ctx, o.socket)
	ag.Items = ncclAgentItems(rep, plugins, o.socket)
	out = append(out, lib, checkCUDA(), procs, checkOTLP(ctx, o.otlp), ag)
	return out
}

// writeDoctor prints one line per check, a fix line under each that is not
// ok, and a verdict.
func writeDoctor(w *bytes.Buffer, checks []checkResult) {
	host, _ := os.Hostname()
	fmt.Fprintf(w, "slowrank doctor %s on %s\n", version, host)
	counts := map[string]int{}
	for _, c := range checks {
		counts[c.Status]++
		label := map[string]string{checkOK: " ok ", checkWarn: "WARN", checkFail: "FAIL", checkInfo: "info"}[c.Status]
		fmt.Fprintf(w, "[%s] %-10s %s\n", label, c.Check, c.Detail)
		for _, it := range c.Items {
			fmt.Fprintf(w, "                  %s\n", it)
		}
		if c.Fix != "" {
			fmt.Fprintf(w, "                  fix: %s\n", c.Fix)
		}
	}
	verdict := "this host can run the agent"
	if counts[checkFail] > 0 {
		verdict = "the agent cannot run here until the failures are fixed"
	} else if counts[checkWarn] > 0 {
		verdict = "the agent can run here; warnings cost features"
	}
	fmt.Fprintf(w, "%d ok, %d warnings, %d failures: %s\n", counts[checkOK], counts[checkWarn], counts[checkFail], verdict)
}

func checkKernel(release string, v privilege.KernelVersion, err error) checkResult {
	r := checkResult{Check: "kernel"}
	switch {
	case runtime.GOARCH != "amd64":
		r.Status, r.Detail = checkFail, fmt.Sprintf("Linux %s on %s: the probes read arguments per the x86-64 ABI", release, runtime.GOARCH)
		r.Fix = "run the agent on x86-64 hosts"
	case err != nil:
		r.Status, r.Detail = checkFail, err.Error()
	case !v.AtLeast(5, 8):
		r.Status, r.Detail = checkFail, fmt.Sprintf("Linux %s: BPF ring buffers need 5.8+", release)
		r.Fix = "upgrade the kernel to 5.8 or newer (5.15+ recommended)"
	default:
		r.Status, r.Detail = checkOK, fmt.Sprintf("Linux %s x86_64 (5.8+ needed)", release)
	}
	return r
}

func checkBTF() checkResult {
	r := checkResult{Check: "btf"}
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err == nil {
		r.Status, r.Detail = checkOK, "/sys/kernel/btf/vmlinux present"
	} else {
		// slowrank's programs are uprobes reading user memory: no CO-RE.
		r.Status, r.Detail = checkInfo, "no /sys/kernel/btf/vmlinux: not needed by slowrank's uprobes, expected by most other eBPF tools"
		r.Fix = "build the kernel with CONFIG_DEBUG_INFO_BTF=y if other eBPF tools need it"
	}
	return r
}

const (
	uprobePMU       = "/sys/bus/event_source/devices/uprobe/type"
	tracefsUprobes  = "/sys/kernel/tracing/uprobe_events"
	debugfsUprobes  = "/sys/kernel/debug/tracing/uprobe_events"
	procSelfMounts  = "/proc/self/mounts"
	procSelfStatus  = "/proc/self/status"
	nvidiaVersion   = "/proc/driver/nvidia/version"
	nvidiaGPUsDir   = "/proc/driver/nvidia/gpus"
	injectionLibDir = "/opt/slowrank/lib"
)

func checkUprobes() checkResult {
	r := checkResult{Check: "uprobes"}
	var via []string
	if _, err := os.Stat(uprobePMU); err == nil {
		via = append(via, "perf uprobe PMU")
	}
	for _, p := range []string{tracefsUprobes, debugfsUprobes} {
		if _, err := os.Stat(p); err == nil {
			via = append(via, p)
			break
		}
	}
	if len(via) == 0 {
		r.Status, r.Detail = checkFail, "no uprobe support: neither the perf uprobe PMU nor tracefs uprobe_events"
		r.Fix = "use a kernel built with CONFIG_UPROBES=y and CONFIG_UPROBE_EVENTS=y"
		return r
	}
	r.Status, r.Detail = checkOK, "via "+strings.Join(via, " and ")
	return r
}

// parseMounts returns the mount points of each file system type in
// /proc/self/mounts.
func parseMounts(data []byte) map[string][]string {
	out := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 {
			continue
		}
		// Spaces in mount points are written as \040.
		out[f[2]] = append(out[f[2]], strings.ReplaceAll(f[1], `\040`, " "))
	}
	return out
}

func checkTracefs() checkResult {
	r := checkResult{Check: "tracefs"}
	data, err := os.ReadFile(procSelfMounts)
	if err != nil {
		r.Status, r.Detail = checkWarn, fmt.Sprintf("cannot read mounts: %v", err)
		return r
	}
	m := parseMounts(data)
	if pts := m["tracefs"]; len(pts) > 0 {
		r.Status, r.Detail = checkOK, "mounted at "+strings.Join(pts, ", ")
		return r
	}
	_, pmuErr := os.Stat(uprobePMU)
	if pmuErr == nil {
		r.Status, r.Detail = checkInfo, "not mounted: not needed, uprobes attach through the perf uprobe PMU"
		r.Fix = "mount -t tracefs nodev /sys/kernel/tracing (only for tracefs-based tools)"
		return r
	}
	r.Status, r.Detail = checkFail, "not mounted, and no perf uprobe PMU to attach without it"
	r.Fix = "mount -t tracefs nodev /sys/kernel/tracing (Kubernetes: mount /sys/kernel/tracing or /sys/kernel/debug into the agent)"
	return r
}

func capList(reqs []privilege.CapRequirement) string {
	names := make([]string, len(reqs))
	for i, r := range reqs {
		names[i] = r.Cap.String()
	}
	return strings.Join(names, ", ")
}

// checkCapabilities compares this process's effective set with what the
// agent uses on this kernel (privilege.CapRequirements; whether uprobes need
// CAP_SYS_ADMIN is probed, and assumed when it cannot be).
func checkCapabilities() checkResult {
	r := checkResult{Check: "caps"}
	data, err := os.ReadFile(procSelfStatus)
	var eff privilege.CapSet
	if err == nil {
		eff, err = privilege.ParseCapEff(data)
	}
	if err != nil {
		r.Status, r.Detail = checkWarn, fmt.Sprintf("cannot read this process's capabilities: %v", err)
		return r
	}
	needAdmin, perr := privilege.UprobesNeedSysAdmin()
	if perr != nil {
		needAdmin = true
	}
	reqs := privilege.CapRequirements(needAdmin, true)
	var used privilege.CapSet
	for _, q := range reqs {
		used |= privilege.Caps(append([]privilege.Capability{q.Cap}, q.Also...)...)
	}
	have := eff & used
	required, optional := privilege.MissingCapabilities(eff, reqs)
	admin := ""
	if needAdmin {
		admin = "; this kernel wants CAP_SYS_ADMIN for uprobes"
	}
	switch {
	case len(required) > 0:
		r.Status = checkFail
		r.Detail = fmt.Sprintf("this process lacks %s (needed to %s)", capList(required), required[0].Why)
		r.Fix = "run the agent (and doctor) as root, or with the unit's capabilities (deploy/systemd/slowrank-agent.service)"
	case len(optional) > 0:
		r.Status = checkWarn
		r.Detail = fmt.Sprintf("has what the agent requires, lacks %s (to %s)", capList(optional), optional[0].Why)
		r.Fix = "grant them too (deploy/systemd/slowrank-agent.service lists the set)"
	default:
		r.Status = checkOK
		r.Detail = fmt.Sprintf("the agent's set is effective: %s%s", have, admin)
	}
	return r
}

func checkBPF() checkResult {
	r := checkResult{Check: "bpf"}
	err := bpf.CheckSupport()
	switch {
	case err == nil:
		r.Status, r.Detail = checkOK, "uprobe programs, ring buffers, LRU hash and per-CPU maps, probe_read_user: supported"
	case errors.Is(err, bpf.ErrPermission):
		r.Status, r.Detail = checkFail, fmt.Sprintf("cannot probe BPF support: %v", err)
		r.Fix = "run as root (or with CAP_BPF and CAP_PERFMON); in a container: privileged, or a seccomp profile that allows bpf and perf_event_open"
	default:
		r.Status, r.Detail = checkFail, err.Error()
		r.Fix = "Linux 5.8+ with CONFIG_BPF_SYSCALL=y, CONFIG_BPF_EVENTS=y and CONFIG_UPROBE_EVENTS=y"
	}
	return r
}

func checkRefCtr() checkResult {
	r := checkResult{Check: "refctr"}
	if err := bpf.CheckRefCtrSupport(); err != nil {
		r.Status, r.Detail = checkWarn, fmt.Sprintf("no uprobe ref_ctr_offset: %v", err)
		r.Fix = "Linux 4.20+ with the perf uprobe PMU; without it the injection library never sees the agent and no device records flow (host phases still work)"
		return r
	}
	r.Status, r.Detail = checkOK, "uprobe ref_ctr_offset supported (the injection library's attach semaphore)"
	return r
}

func checkUprobeMulti() checkResult {
	r := checkResult{Check: "uprobe_multi"}
	if err := bpf.CheckUprobeMultiSupport(); err != nil {
		r.Status, r.Detail = checkWarn, fmt.Sprintf("no uprobe_multi links: %v", err)
		r.Fix = "Linux 6.6+; without it the agent uses one perf-event uprobe per function, which the kernel detaches one at a time (about 0.1 s each: an agent stop or a library detach takes seconds)"
		return r
	}
	r.Status, r.Detail = checkOK, "uprobe_multi links supported (uprobes detach in well under a second)"
	return r
}

// parseNvidiaVersion extracts the driver version from
// /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX x86_64 Kernel
// Module  580.95.05  ...").
func parseNvidiaVersion(data []byte) string {
	line, _, _ := bytes.Cut(data, []byte("\n"))
	for _, w := range strings.Fields(string(line)) {
		if isVersion(w) {
			return w
		}
	}
	return ""
}

// isVersion reports whether w is N.N or N.N.N...
func isVersion(w string) bool {
	parts := strings.Split(w, ".")
	if len(parts) < 2 {
		return false
	}
	for _, p := range parts {
		if p == "" || strings.Trim(p, "0123456789") != "" {
			return false
		}
	}
	return true
}

func checkNVML() checkResult {
	r := checkResult{Check: "nvml"}
	n, err := gpu.OpenNVML()
	if err != nil {
		r.Status = checkWarn
		r.Detail = fmt.Sprintf("NVML unavailable: %s", strings.TrimSuffix(err.Error(), ": "+gpu.ErrNVMLUnavailable.Error()))
		if errors.Is(err, gpu.ErrNVMLUnavailable) {
			r.Fix = "install the NVIDIA driver (nvidia-smi must work); on a host without GPUs this is expected and the agent still judges host phases"
		}
		return r
	}
	defer func() { _ = n.Close() }() // only read from: the doctor's verdict is made
	gpus := 0
	if ents, err := os.ReadDir(nvidiaGPUsDir); err == nil {
		gpus = len(ents)
	}
	driver := "unknown"
	if b, err := os.ReadFile(nvidiaVersion); err == nil {
		if v := parseNvidiaVersion(b); v != "" {
			driver = v
		}
	}
	procs, perr := n.GPUProcesses()
	r.Status = checkOK
	r.Detail = fmt.Sprintf("driver %s, %d GPUs, %d processes with a compute context", driver, gpus, len(procs))
	if perr != nil {
		r.Status = checkWarn
		r.Detail += fmt.Sprintf("; %v", perr)
		r.Fix = "run as root; in a container, expose every /dev/nvidia* device"
	}
	return r
}

// injectionCandidates lists where doctor looks for the library, first
// found wins: --lib, next to the binary, bin/ under the working directory,
// /opt/slowrank/lib.
func injectionCandidates(explicit string) []string {
	if explicit != "" {
		return []string{explicit}
	}
	var c []string
	if exe, err := os.Executable(); err == nil {
		c = append(c, filepath.Join(filepath.Dir(exe), discover.InjectionLibraryName))
	}
	c = append(c, filepath.Join("bin", discover.InjectionLibraryName), filepath.Join(injectionLibDir, discover.InjectionLibraryName))
	return c
}

// checkInjectionLibrary finds and inspects the library; it returns its path
// ("" when none is usable).
func checkInjectionLibrary(explicit string) (string, checkResult) {
	r := checkResult{Check: "cupti-lib"}
	cands := injectionCandidates(explicit)
	for _, p := range cands {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		abs, _ := filepath.Abs(p)
		if _, err := cupti.InspectLibrary(abs); err != nil {
			r.Status, r.Detail = checkWarn, fmt.Sprintf("%s is not a usable injection library: %v", abs, err)
			if explicit != "" {
				r.Status = checkFail
			}
			r.Fix = "rebuild it with make cupti, or install the release's libslowrank_cupti.so"
			return "", r
		}
		r.Status, r.Detail = checkOK, abs+" (emit, semaphore and control block found)"
		r.Fix = ""
		return abs, r
	}
	r.Status = checkWarn
	if explicit != "" {
		r.Status = checkFail
	}
	r.Detail = "libslowrank_cupti.so not found in " + strings.Join(cands, ", ")
	r.Fix = "build it (make cupti) or install it under /opt/slowrank/lib; without it only host phases are judged"
	return "", r
}

// cudaToolkitVersion reads version.json ("cuda": {"version": ...}) or
// version.txt ("CUDA Version 11.8.89") of a CUDA installation.
func cudaToolkitVersion(dir string) string {
	if b, err := os.ReadFile(filepath.Join(dir, "version.json")); err == nil {
		var v struct {
			CUDA struct {
				Version string `json:"version"`
			} `json:"cuda"`
		}
		if json.Unmarshal(b, &v) == nil && v.CUDA.Version != "" {
			return v.CUDA.Version
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "version.txt")); err == nil {
		return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(b)), "CUDA Version"))
	}
	return ""
}

// cuptiVersionFromName returns the version in a libcupti file name
// ("libcupti.so.2022.3.0" -> "2022.3.0", "libcupti.so.12" -> "12").
func cuptiVersionFromName(name string) string {
	_, v, ok := strings.Cut(filepath.Base(name), ".so.")
	if !ok {
		return ""
	}
	return v
}

func checkCUDA() checkResult {
	r := checkResult{Check: "cuda"}
	var parts []string
	homes := []string{os.Getenv("CUDA_HOME"), "/usr/local/cuda"}
	cuptiDirs := []string{"/usr/lib/x86_64-linux-gnu"}
	for _, h := range homes {
		if h == "" {
			continue
		}
		if v := cudaToolkitVersion(h); v != "" {
			parts = append(parts, fmt.Sprintf("CUDA toolkit %s in %s", v, h))
		}
		cuptiDirs = append([]string{filepath.Join(h, "extras/CUPTI/lib64"), filepath.Join(h, "targets/x86_64-linux/lib")}, cuptiDirs...)
	}
	seen := map[string]bool{}
	for _, d := range cuptiDirs {
		link := filepath.Join(d, "libcupti.so")
		real, err := filepath.EvalSymlinks(link)
		if err != nil || seen[real] {
			continue
		}
		seen[real] = true
		if v := cuptiVersionFromName(real); v != "" {
			parts = append(parts, fmt.Sprintf("CUPTI %s (%s)", v, real))
		} else {
			parts = append(parts, "CUPTI "+real)
		}
	}
	if len(parts) == 0 {
		r.Status, r.Detail = checkInfo, "no CUDA toolkit or libcupti on the host: the library uses the training process's own CUPTI (torch ships nvidia-cuda-cupti)"
		r.Fix = "set SLOWRANK_CUPTI_LIB in the job to a libcupti.so if the library reports 'unavailable'"
		return r
	}
	r.Status, r.Detail = checkInfo, strings.Join(parts, "; ")
	return r
}

// injectionBlocks reads the injection library's control block in a process
// and, where the library has one, its NCCL plugin status (nil when absent
// or unreadable: an older library, a torn mapping).
func injectionBlocks(pid int, lib discover.Library) (cupti.ControlBlock, *cupti.NCCLStatus, error) {
	info, err := cupti.InspectLibrary(lib.HostPath)
	if err != nil {
		return cupti.ControlBlock{}, nil, err
	}
	maps, err := discover.ReadMaps("", pid)
	if err != nil {
		return cupti.ControlBlock{}, nil, err
	}
	addr, err := cupti.ControlAddress(maps, lib.File.Inode, info)
	if err != nil {
		return cupti.ControlBlock{}, nil, err
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return cupti.ControlBlock{}, nil, err
	}
	defer func() { _ = mem.Close() }() // read only
	cb, err := cupti.ReadControl(mem, int64(addr))
	if err != nil {
		return cupti.ControlBlock{}, nil, err
	}
	var st *cupti.NCCLStatus
	if a, err := cupti.NCCLStatusAddress(maps, lib.File.Inode, info); err == nil {
		if s, err := cupti.ReadNCCLStatus(mem, int64(a)); err == nil {
			st = &s
		}
	}
	return cb, st, nil
}

// libraryState describes the library's control block: its state and the
// CUPTI version it loaded. A library NCCL loaded as its profiler plugin
// that the CUDA driver never initialised (no CUDA_INJECTION64_PATH, or a
// driver that did not honour it) stays in state init: say so, rather than
// "init", which reads as starting up.
func libraryState(cb cupti.ControlBlock, st *cupti.NCCLStatus) string {
	if cb.Status.State == cupti.StateInit && st != nil && st.APIVersion != 0 {
		return "library loaded by NCCL as its profiler plugin only (CUDA never called InitializeInjection: no device collection)"
	}
	s := "library " + cb.Status.State.String()
	if cb.Status.State == cupti.StateYielded {
		s = "library yielded to another CUPTI client (torch.profiler/Kineto, nsys) in this process"
	}
	if cb.Status.Flags&cupti.StatusWaiting != 0 {
		s += ", waiting for the agent's decision about other CUPTI clients"
	}
	if n := cb.Status.Yields; n > 0 {
		s += fmt.Sprintf(", yielded %d times (%s)", n, cb.Status.YieldedTotal.Round(time.Second))
	}
	if v := cb.Status.CUPTIVersion; v != 0 {
		s += fmt.Sprintf(", CUPTI API %d", v)
	}
	return s
}

// ourPlugin says whether NCCL_PROFILER_PLUGIN names slowrank's library: a
// path or file name of libslowrank_cupti.so or libnccl-profiler-slowrank.so,
// or the name "slowrank" (NCCL then opens libnccl-profiler-slowrank.so).
func ourPlugin(v string) bool {
	base := filepath.Base(v)
	return v == "slowrank" || base == discover.InjectionLibraryName || base == "libnccl-profiler-slowrank.so"
}

// ncclCapture says which path a process's NCCL collectives take: from the
// library's NCCL status when it is mapped (st, nil otherwise), else from
// what NCCL_PROFILER_PLUGIN (plugin) makes NCCL load.
func ncclCapture(plugin string, st *cupti.NCCLStatus) string {
	switch {
	case st != nil && st.Disabled:
		return "NCCL: uprobes (plugin refused by SLOWRANK_NCCL_DISABLE)"
	case st != nil && st.APIVersion != 0:
		s := fmt.Sprintf("NCCL: profiler plugin v%d bound (%d live communicators, %d collectives", st.APIVersion, st.LiveComms, st.Colls)
		if st.Dropped > 0 {
			s += fmt.Sprintf(", %d dropped", st.Dropped)
		}
		return s + ")"
	case plugin == "":
		return "NCCL: uprobes (plugin not loaded: NCCL_PROFILER_PLUGIN unset)"
	case strings.EqualFold(plugin, "none"):
		return "NCCL: uprobes (plugin not loaded: NCCL_PROFILER_PLUGIN=none)"
	case !ourPlugin(plugin):
		return fmt.Sprintf("NCCL: uprobes (another plugin owns the slot: %s)", plugin)
	}
	return "NCCL: uprobes (plugin not loaded yet: NCCL loads it at its first communicator)"
}

// maxListed bounds the per-process lines of the report.
const maxListed = 16

// checkProcesses also returns NCCL_PROFILER_PLUGIN of each training process
// that maps libnccl, by PID (ncclAgentItems).
func checkProcesses(envKey, libPath string) (checkResult, map[int]string) {
	r := checkResult{Check: "processes"}
	plugins := map[int]string{}
	procs, stats, err := discover.Discover("", agent.Selector{EnvKey: envKey})
	var denied *discover.AccessError
	if err != nil && !errors.As(err, &denied) {
		r.Status, r.Detail = checkWarn, fmt.Sprintf("scan /proc: %v", err)
		return r, plugins
	}
	sel := fmt.Sprintf("environment has %s", envKey)
	if len(procs) == 0 {
		r.Status, r.Detail = checkInfo, fmt.Sprintf("no training process running (%s; %d processes scanned)", sel, stats.Scanned)
		if stats.Denied > 0 {
			r.Detail += "; " + deniedNote(denied)
			if os.Geteuid() != 0 {
				r.Status = checkWarn
				r.Fix = "run doctor as root to see other users' processes"
			}
		}
		return r, plugins
	}
	injectedEnv, loaded, pluginOnly := 0, 0, 0
	var missing []string // CUDA_INJECTION64_PATH values naming no file
	for i, p := range procs {
		libs, lerr := discover.ReadLibraries("", p.PID)
		var kinds []string
		var inj *discover.Library
		for j := range libs {
			kinds = append(kinds, libs[j].Kind.String())
			if libs[j].Kind == discover.KindCUPTIInject {
				inj = &libs[j]
			}
		}
		sort.Strings(kinds)
		kinds = dedupe(kinds)
		if p.Identity.Injected {
			injectedEnv++
		}
		state := "library not loaded"
		var st *cupti.NCCLStatus
		switch {
		case inj != nil:
			loaded++
			state = "library loaded"
			if cb, s, err := injectionBlocks(p.PID, *inj); err == nil {
				state, st = libraryState(cb, s), s
				if cb.Status.State == cupti.StateInit && s != nil && s.APIVersion != 0 {
					pluginOnly++ // loaded, but for NCCL's collectives only
				}
			}
		case p.Identity.Injected && injectionFileMissing(p.PID, p.Identity.InjectionPath):
			state = fmt.Sprintf("CUDA_INJECTION64_PATH=%s: no such file in the process's filesystem, CUDA cannot load it", p.Identity.InjectionPath)
			missing = append(missing, p.Identity.InjectionPath)
		case p.Identity.Injected:
			state = "CUDA_INJECTION64_PATH set, library not loaded yet"
		}
		if slices.Contains(kinds, discover.KindNCCL.String()) || inj != nil {
			state += "; " + ncclCapture(p.Identity.ProfilerPlugin, st)
		}
		if slices.Contains(kinds, discover.KindNCCL.String()) {
			plugins[p.PID] = p.Identity.ProfilerPlugin
		}
		if lerr != nil {
			state = fmt.Sprintf("maps unreadable: %v", lerr)
		}
		if i < maxListed {
			rank := "?"
			if p.Identity.Rank >= 0 {
				rank = strconv.Itoa(p.Identity.Rank)
			}
			r.Items = append(r.Items, fmt.Sprintf("pid %d rank %s job %s: %s; probed libraries: %s",
				p.PID, rank, orDash(p.Identity.JobID), state, orDash(strings.Join(kinds, ","))))
		}
	}
	if n := len(procs) - maxListed; n > 0 {
		r.Items = append(r.Items, fmt.Sprintf("... and %d more", n))
	}
	r.Detail = fmt.Sprintf("%d found (%s), %d with CUDA_INJECTION64_PATH, %d loaded libslowrank_cupti.so", len(procs), sel, injectedEnv, loaded)
	if pluginOnly > 0 {
		r.Detail += fmt.Sprintf(" (%d as NCCL's profiler plugin only)", pluginOnly)
	}
	switch {
	case loaded == len(procs) && pluginOnly == 0:
		r.Status = checkOK
	default:
		r.Status = checkWarn
		lib := libPath
		if lib == "" {
			lib = filepath.Join(injectionLibDir, discover.InjectionLibraryName)
		}
		r.Fix = fmt.Sprintf("start the job with CUDA_INJECTION64_PATH=%s for device phases (compute, comm); host phases work without it", lib)
		if len(missing) > 0 {
			slices.Sort(missing)
			r.Fix = fmt.Sprintf("%d %s CUDA_INJECTION64_PATH at a file missing in the process's filesystem (%s): mount the node's %s read-only at the directory it names, or set it to %s where that directory is mounted (in Kubernetes a hostPath volume: deploy/kubernetes/training-pod-example.yaml)",
				len(missing), plural(len(missing), "process names", "processes name"), strings.Join(slices.Compact(missing), ", "), filepath.Dir(lib), lib)
		} else if pluginOnly > 0 && injectedEnv > 0 {
			// The variable is there, yet only NCCL loaded the library: the
			// CUDA driver did not (set after CUDA initialised, or a path the
			// process cannot open).
			r.Fix = fmt.Sprintf("CUDA did not load CUDA_INJECTION64_PATH where NCCL loaded the library as its plugin: set it before CUDA initialises, to a path the process can open (%s)", lib)
		}
	}
	if stats.Denied > 0 {
		r.Detail += "; " + deniedNote(denied)
		if os.Geteuid() != 0 {
			r.Status = checkWarn
			r.Fix = "run doctor as root to see other users' processes"
		}
	}
	return r, plugins
}

// injectionFileMissing reports whether path, a process's
// CUDA_INJECTION64_PATH, names nothing in the process's own filesystem: its
// root (/proc/PID/root: a pod's mount namespace) or, for a relative path,
// its working directory. The last component is not followed (a symlink's
// absolute target would resolve in doctor's filesystem, not the process's),
// and an unreadable root (another user's process without root, or one that
// exited) is not reported as missing.
func injectionFileMissing(pid int, path string) bool {
	base := filepath.Join("/proc", strconv.Itoa(pid), "root")
	if !filepath.IsAbs(path) {
		base = filepath.Join("/proc", strconv.Itoa(pid), "cwd")
	}
	if _, err := os.Stat(base); err != nil {
		return false // exited, or not ours to look into
	}
	_, err := os.Lstat(filepath.Join(base, path))
	return errors.Is(err, fs.ErrNotExist)
}

// deniedNote says which processes' environment could not be read.
func deniedNote(denied *discover.AccessError) string {
	if denied == nil {
		return ""
	}
	pids := denied.PIDs
	more := ""
	if len(pids) > 5 {
		pids, more = pids[:5], fmt.Sprintf(" and %d more", len(denied.PIDs)-5)
	}
	why := "not this user's"
	if os.Geteuid() == 0 {
		why = "another user namespace or not dumpable; use --pid for such a trainer"
	}
	return fmt.Sprintf("environment unreadable for pid %s%s (%s)", strings.Trim(fmt.Sprint(pids), "[]"), more, why)
}

func dedupe(s []string) []string {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// otlpTarget returns host:port to dial for an OTLP endpoint as the
// exporters read it: a URL (http://host[:port][/path], default port 4318,
// or 4317 with the grpc protocol; https 443 without a port) or, for gRPC, a
// bare host:port.
func otlpTarget(endpoint, protocol string) (string, error) {
	def := "4318"
	if protocol == "grpc" {
		def = "4317"
	}
	if !strings.Contains(endpoint, "://") {
		if _, _, err := net.SplitHostPort(endpoint); err == nil {
			return endpoint, nil
		}
		if endpoint == "" || strings.ContainsAny(endpoint, "/ ") {
			return "", fmt.Errorf("OTLP endpoint %q: want a URL such as http://collector:4318", endpoint)
		}
		return net.JoinHostPort(endpoint, def), nil
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", fmt.Errorf("OTLP endpoint %q: %w", endpoint, err)
	}
	if u.Hostname() == "" {
		return "", fmt.Errorf("OTLP endpoint %q has no host", endpoint)
	}
	port := u.Port()
	if port == "" {
		switch {
		case u.Scheme == "https" && protocol != "grpc":
			port = "443"
		default:
			port = def
		}
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}

func checkOTLP(ctx context.Context, flag string) checkResult {
	r := checkResult{Check: "otlp"}
	endpoint, source := flag, "--otlp-endpoint"
	protocol := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if endpoint == "" {
			endpoint, source = os.Getenv(k), k
		}
	}
	if endpoint == "" {
		r.Status, r.Detail = checkWarn, "no OTLP endpoint set: the agent exports no OpenTelemetry (JSONL files and slowrank status still work)"
		r.Fix = "set OTEL_EXPORTER_OTLP_ENDPOINT=http://COLLECTOR:4318 for the agent (deploy/otelcol.yaml is a collector config)"
		return r
	}
	target, err := otlpTarget(endpoint, protocol)
	if err != nil {
		r.Status, r.Detail = checkFail, fmt.Sprintf("%s: %v", source, err)
		r.Fix = "set a URL such as http://127.0.0.1:4318"
		return r
	}
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	start := time.Now()
	conn, err := (&net.Dialer{}).DialContext(dctx, "tcp", target)
	if err != nil {
		r.Status, r.Detail = checkFail, fmt.Sprintf("%s (%s from %s) unreachable: %v", endpoint, target, source, err)
		r.Fix = "start the OpenTelemetry Collector there, or fix the address; a firewall may drop the port"
		return r
	}
	conn.Close()
	r.Status, r.Detail = checkOK, fmt.Sprintf("%s (%s) accepts connections (%s)", endpoint, source, time.Since(start).Round(time.Millisecond))
	return r
}

// checkAgent asks the agent at socket for its status (rep, nil when none
// answered).
func checkAgent(ctx context.Context, socket string) (checkResult, *agent.StatusReport) {
	r := checkResult{Check: "agent"}
	if socket == "" {
		r.Status, r.Detail = checkInfo, "not asked (no --socket)"
		return r, nil
	}
	// A live agent answers within 1 s even when its main goroutine is busy
	// (the handler bounds the report): 2 s tells it from one that does not
	// answer.
	e := &endpoint{where: socket, base: "http://slowrank-agent", client: newEndpointClient(socket, 2*time.Second)}
	rep, err := e.status(ctx)
	if err != nil {
		r.Status, r.Detail, r.Fix = agentUnanswered(socket, err)
		return r, nil
	}
	r.Status = checkOK
	r.Detail = fmt.Sprintf("running (version %s, up %s): %d processes, %d libraries attached, device collection %s",
		orDash(rep.Version), rep.Uptime.Round(time.Second), rep.Processes, rep.Attached, rep.DeviceState)
	if rep.Control != nil && rep.Control.Paused {
		r.Status = checkWarn
		r.Detail += "; collection PAUSED"
		r.Fix = "slowrank control resume"
	}
	return r, &rep
}

// agentUnanswered says what a failed status request to the agent's socket
// means. A socket that accepts but does not answer is a warning: an agent
// still exiting (a new agent waits for the socket meanwhile, see
// localapi.ServerConfig.Socket) or a stuck one.
func agentUnanswered(socket string, err error) (status, detail, fix string) {
	var ne net.Error
	switch {
	case errors.Is(err, os.ErrPermission) || strings.Contains(err.Error(), "permission denied"):
		return checkInfo, "cannot ask the agent at " + socket + ": permission denied (root only)", ""
	case errors.Is(err, syscall.ECONNREFUSED):
		return checkInfo, "no agent answers at " + socket + ": a stale socket, nothing listens (the agent that made it is gone; the next agent replaces it)", ""
	case errors.As(err, &ne) && ne.Timeout():
		return checkWarn, "no agent answers at " + socket + ": it accepts connections but no status came within 2 s: " +
			"an agent still exiting (a new agent waits and takes the socket once it is gone; its log says \"status socket unavailable\") or one that is stuck", "if it lasts, find the process that holds it: ss -xlp | grep " + socket
	}
	return checkInfo, "no agent answers at " + socket, ""
}

// ncclAgentItems are the agent check's lines about NCCL: for each process
// the agent tracks that maps libnccl or sends plugin records, the capture
// path the agent takes its collectives from (status column NCCL) and the
// state of its libnccl file's collective uprobes (column COLL: detached
// once every process mapping the file is on the plugin path). plugins is
// NCCL_PROFILER_PLUGIN of the training processes doctor read itself, by
// PID: a process on the uprobes whose variable names another tool's plugin
// is shown as such. These are the agent's decisions: without an agent
// (rep nil) a line says where to see them, when a process maps libnccl.
func ncclAgentItems(rep *agent.StatusReport, plugins map[int]string, socket string) []string {
	if rep == nil {
		if len(plugins) == 0 {
			return nil
		}
		ask := "pass the agent's socket with --socket"
		if socket != "" {
			ask = "doctor --socket " + socket + " once it answers"
		}
		return []string{fmt.Sprintf("NCCL capture path and libnccl collective uprobes of %d processes: the agent decides them; "+
			"see slowrank status (columns NCCL, COLL) where it runs, or %s", len(plugins), ask)}
	}
	var procs []agent.ProcessView
	for _, p := range rep.Procs {
		if p.NCCLUprobes != "" || strings.HasPrefix(p.NCCL, "plugin") {
			procs = append(procs, p)
		}
	}
	sort.Slice(procs, func(i, j int) bool { return procs[i].PID < procs[j].PID })
	var items []string
	for i, p := range procs {
		if i == maxListed {
			items = append(items, fmt.Sprintf("... and %d more", len(procs)-maxListed))
			break
		}
		path := "NCCL " + cmp.Or(p.NCCL, "uprobes")
		// A path with its reason ("uprobes (alltoall: ...)") is the
		// agent's decision about records it did get.
		if v, ok := plugins[p.PID]; ok && !strings.HasPrefix(p.NCCL, "plugin") && !strings.Contains(p.NCCL, "(") {
			switch {
			case v != "" && !strings.EqualFold(v, "none") && !ourPlugin(v):
				path += fmt.Sprintf(" (another plugin owns the slot: %s)", v)
			case ourPlugin(v):
				path += " (our plugin named, no plugin record reached the agent: --nccl-plugin off, or NCCL has not bound it yet)"
			}
		}
		coll := "libnccl collective uprobes " + p.NCCLUprobes
		switch p.NCCLUprobes {
		case "":
			coll = "libnccl not attached"
		case "detached":
			coll += " (every process mapping the file is on the plugin path)"
		case "attached":
			if strings.HasPrefix(p.NCCL, "plugin") {
				coll += " (a process mapping the file is off the plugin path, or a communicator of this one needs them)"
			}
		}
		items = append(items, fmt.Sprintf("pid %d rank %d job %s: %s; %s", p.PID, p.Rank, orDash(p.Job), path, coll))
	}
	return items
}
