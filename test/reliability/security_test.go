package reliability

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slowrank/slowrank/agent/privilege"
)

// keptCaps is what the agent keeps on this kernel (agent/privilege/caps.go): uprobes
// through perf need CAP_SYS_ADMIN from Linux 6.16.
var keptCaps = privilege.Caps(privilege.CapBPF, privilege.CapPerfmon, privilege.CapSysAdmin, privilege.CapSysPtrace,
	privilege.CapDACReadSearch, privilege.CapDACOverride, privilege.CapCheckpointRestore)

// setprivCaps runs a command with exactly the capabilities caps (bounding,
// permitted and effective sets: root gets its bounding set at exec).
func setprivCaps(caps privilege.CapSet) []string {
	var names []string
	for _, c := range caps.List() {
		names = append(names, "+"+strings.ToLower(strings.TrimPrefix(c.String(), "CAP_")))
	}
	return []string{"setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all," + strings.Join(names, ","), "--"}
}

func needSetpriv(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv (util-linux) not installed")
	}
	need, err := privilege.UprobesNeedSysAdmin()
	if err != nil {
		t.Skipf("cannot probe the kernel: %v", err)
	}
	if !need {
		t.Skip("this kernel creates uprobes without CAP_SYS_ADMIN: the expected sets differ")
	}
}

// procCaps returns the effective, permitted and bounding sets of every
// thread of pid.
func procCaps(t *testing.T, pid int) (eff, prm, bnd []privilege.CapSet) {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, task.Name()))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(l, ":")
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				continue
			}
			switch k {
			case "CapEff":
				eff = append(eff, privilege.CapSet(n))
			case "CapPrm":
				prm = append(prm, privilege.CapSet(n))
			case "CapBnd":
				bnd = append(bnd, privilege.CapSet(n))
			}
		}
	}
	return eff, prm, bnd
}

// TestCapabilitiesRefused: without a required capability the agent refuses
// to start, naming the capability and what it is for, in one line.
func TestCapabilitiesRefused(t *testing.T) {
	tl := needTools(t)
	needSetpriv(t)
	t.Parallel()
	for _, missing := range []privilege.Capability{privilege.CapBPF, privilege.CapPerfmon, privilege.CapSysAdmin, privilege.CapSysPtrace} {
		caps := keptCaps &^ privilege.Caps(missing)
		if missing == privilege.CapBPF || missing == privilege.CapPerfmon {
			caps &^= privilege.Caps(privilege.CapSysAdmin) // it would stand in for them
		}
		argv := append(setprivCaps(caps), tl.slowrank, "agent", "--env-key", markOf(t), "--status-socket", "", "--state-dir", "", "--duration", "2s")
		out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
		msg := strings.TrimSpace(string(out))
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("without %s: %v, want exit 1\n%s", missing, err, out)
			continue
		}
		if strings.Count(msg, "\n") != 0 || !strings.HasPrefix(msg, "slowrank: missing capability "+missing.String()+": needed to ") {
			t.Errorf("without %s: message %q", missing, msg)
		}
		t.Logf("without %s: %s", missing, msg)
	}
}

// TestCapabilitiesDropped: started as root with every capability, the agent
// keeps exactly what it needs, in every thread and in its bounding set.
func TestCapabilitiesDropped(t *testing.T) {
	tl := needTools(t)
	needSetpriv(t)
	t.Parallel()
	dir := t.TempDir()
	ag := startAgent(t, tl, dir)
	ag.waitSocket()
	eff, prm, bnd := procCaps(t, ag.pid())
	for i := range eff {
		if eff[i] != keptCaps || prm[i] != keptCaps || bnd[i] != keptCaps {
			t.Errorf("thread %d: effective %s, permitted %s, bounding %s; want %s", i, eff[i], prm[i], bnd[i], keptCaps)
			break
		}
	}
	if !strings.Contains(ag.log(), "capabilities limited to what the agent needs") {
		t.Error("the agent did not log the drop")
	}
	ag.stop()
	t.Logf("%d threads hold exactly %s", len(eff), keptCaps)
}

// TestCapabilitiesMinimalSetWorks: with exactly the documented set (as a
// systemd unit with CapabilityBoundingSet= would give), the agent watches a
// job running as another user (nobody).
func TestCapabilitiesMinimalSetWorks(t *testing.T) {
	tl := needTools(t)
	needSetpriv(t)
	t.Parallel()
	dir := t.TempDir()
	// The ranks (nobody) write their truth here: outside t.TempDir (0700).
	truthDir, err := os.MkdirTemp("", "slowrank-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(truthDir) })
	if err := os.Chmod(truthDir, 0o777); err != nil {
		t.Fatal(err)
	}
	facts := filepath.Join(dir, "facts.jsonl")
	ag := startAgentWith(t, tl, dir, setprivCaps(keptCaps), nil, "--facts", facts)
	ag.waitSocket()
	nobody := []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"}
	tr := startTrainer(t, tl, truthDir, nobody, nil, "--ranks", "2", "--steps", "600", "--step-ms", "5", "--gpu-ms", "5", "--sleep-before-start", "4000")
	st := ag.waitStatus("steps of the other user's ranks", 30*time.Second, func(st statusReport) bool { return st.Facts >= 2*100 })
	tr.wait(t, 60*time.Second)
	eff, _, _ := procCaps(t, ag.pid())
	c := ag.stop()
	if eff[0] != keptCaps {
		t.Errorf("effective %s, want %s", eff[0], keptCaps)
	}
	if c["attach_errors"] != 0 || c["discovery_denied"] > 1 { // pid 1 may be unreadable in a container
		t.Errorf("attach errors %d, discovery denied %d", c["attach_errors"], c["discovery_denied"])
	}
	t.Logf("with only %s: %d facts from ranks running as nobody", keptCaps, st.Facts)
}
