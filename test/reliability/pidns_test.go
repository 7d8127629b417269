package reliability

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestDeviceRecordsFlowFromAPIDNamespace runs a training process in its own
// PID namespace (a Kubernetes pod without hostPID) with the injection
// library and the fake libcupti, in front of the real agent with device
// collection pinned on. The library publishes its control thread's id as
// its namespace numbers it; the agent's uprobes on libcupti see host
// thread ids. The agent must map one onto the other: the library's own
// CUPTI calls are its own, it never yields to itself, and device records
// flow as they do in the host namespace.
func TestDeviceRecordsFlowFromAPIDNamespace(t *testing.T) {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("no unshare (util-linux) to make a PID namespace")
	}
	tl := needTools(t)
	if tl.cuptiLib == "" {
		t.Skipf("injection library not built: %v", tl.cuptiErr)
	}
	bin := plainFakeCUPTI(t)
	dir := t.TempDir()
	ag := startCollectingAgent(t, tl, dir)
	outPath := filepath.Join(dir, "injectee.out")
	f, err := os.Create(outPath)
	if err != nil {
		t.Fatal(err)
	}
	// Long enough for a loaded machine; stopped once records flowed.
	const runMS = 20000
	cmd := exec.Command(unshare, "--pid", "--fork", "--mount-proc", "--kill-child",
		tl.injectee, filepath.Join(bin, "libslowrank_cupti.so"), fmt.Sprint(runMS), "launch")
	cmd.Env = append(cleanEnv(), markOf(t)+"=1", "RANK=0", "WORLD_SIZE=1", "SLOWRANK_CUPTI_QUIET=1",
		"SLOWRANK_CUPTI_LIB="+filepath.Join(bin, "libcupti.so"))
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); _ = cmd.Wait() }) // reaps the killed child: Wait reports the kill
	flowing := false
	deadline := time.Now().Add(runMS * time.Millisecond)
	var st statusReport
	for time.Now().Before(deadline) && !flowing {
		time.Sleep(100 * time.Millisecond)
		if st, err = ag.status(); err == nil {
			flowing = st.Counters["device_records"] > 0
		}
	}
	if flowing {
		time.Sleep(time.Second) // a yield, if any, would follow the library's first calls
		cmd.Process.Kill()      // --kill-child: the injectee goes with unshare
	}
	_ = cmd.Wait() // killed above when the library ran: its status is the kill
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	text, _ := os.ReadFile(outPath)
	lines := readInjectee(t, string(text))
	if len(lines) == 0 {
		t.Fatalf("injectee reported nothing:\n%s", text)
	}
	last := lines[len(lines)-1]
	// A fresh namespace numbers its threads from 1: the library's control
	// thread id is not the host's (else this test tests nothing).
	if last.CtlTID == 0 || last.CtlTID > 64 {
		t.Fatalf("control thread id %d: not a fresh PID namespace's", last.CtlTID)
	}
	st, _ = ag.status()
	t.Logf("injectee last: %+v; agent: device_records %d, cupti_own_calls %d, cupti_foreign_calls %d, cupti_yields %d",
		last, st.Counters["device_records"], st.Counters["cupti_own_calls"], st.Counters["cupti_foreign_calls"], st.Counters["cupti_yields"])
	if st.Counters["cupti_yields"] != 0 || last.Yields != 0 {
		t.Errorf("the library yielded to its own CUPTI calls: agent cupti_yields %d, library yields %d",
			st.Counters["cupti_yields"], last.Yields)
	}
	if st.Counters["cupti_foreign_calls"] != 0 {
		t.Errorf("the agent took %d of the library's own CUPTI calls for another client's", st.Counters["cupti_foreign_calls"])
	}
	if last.State != stateOn {
		t.Errorf("library state %d at the end, want %d (collecting)", last.State, stateOn)
	}
	if !flowing || last.Records == 0 {
		t.Errorf("no device records from the namespaced process: agent %d, library %d", st.Counters["device_records"], last.Records)
	}
	if !ag.alive() {
		t.Fatal("agent died")
	}
}

// stateOn is SLOWRANK_STATE_ON (slowrank_abi.h): attached, collecting.
const stateOn = 2

// plainFakeCUPTI returns the folder of the unsanitized injection library
// and fake libcupti (make cupti-stress-plain), building them when missing.
func plainFakeCUPTI(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(repoRoot, "bin", "cupti-test", "plain")
	if !fileExists(filepath.Join(bin, "test_stress")) {
		cmd := exec.Command("make", "-s", "cupti-stress-plain")
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Skipf("cannot build the fake libcupti (make cupti-stress-plain): %v\n%s", err, out)
		}
	}
	return bin
}
