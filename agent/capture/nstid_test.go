package capture

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

	"github.com/slowrank/slowrank/agent/pipeline"
	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/correlate"
	"github.com/slowrank/slowrank/cupti"
)

func TestParseNSpid(t *testing.T) {
	status := func(nspid string) string {
		return "Name:\tpython\nTgid:\t4242\nNgid:\t0\nPid:\t4243\nPPid:\t1\n" + nspid + "NSsid:\t1\nThreads:\t3\n"
	}
	tests := []struct {
		name         string
		in           string
		outer, inner uint32
		levels       int
		err          error
	}{
		{"host namespace: one id", status("NSpid:\t4243\n"), 4243, 4243, 1, nil},
		{"one namespace below: host id first, own last", status("NSpid:\t4243\t7\n"), 4243, 7, 2, nil},
		{"nested twice", status("NSpid:\t4243\t90\t7\n"), 4243, 7, 3, nil},
		{"spaces instead of tabs", "NSpid:  12 3", 12, 3, 2, nil},
		{"last line without newline", "Pid:\t9\nNSpid:\t9\t1", 9, 1, 2, nil},
		{"no NSpid line (kernel before 4.1)", "Name:\tx\nPid:\t9\n", 0, 0, 0, errNoNSpid},
		{"empty file", "", 0, 0, 0, errNoNSpid},
		{"NSpid line without ids", status("NSpid:\n"), 0, 0, 0, errBadNSpid},
		{"id that is no number", status("NSpid:\t12\tx\n"), 0, 0, 0, errBadNSpid},
		{"id 0", status("NSpid:\t12\t0\n"), 0, 0, 0, errBadNSpid},
		{"id beyond 32 bits", status("NSpid:\t4294967296\n"), 0, 0, 0, errBadNSpid},
		{"negative id", status("NSpid:\t-3\n"), 0, 0, 0, errBadNSpid},
		{"more levels than the kernel nests", "NSpid:" + strings.Repeat(" 5", maxNSLevels+1), 0, 0, 0, errBadNSpid},
		{"a line that only starts alike is not it", "NSpidx:\t5\n", 0, 0, 0, errNoNSpid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			outer, inner, levels, err := parseNSpid([]byte(tt.in))
			if !errors.Is(err, tt.err) {
				t.Fatalf("err %v, want %v", err, tt.err)
			}
			if outer != tt.outer || inner != tt.inner || levels != tt.levels {
				t.Fatalf("got (%d, %d, %d), want (%d, %d, %d)", outer, inner, levels, tt.outer, tt.inner, tt.levels)
			}
		})
	}
}

// FuzzParseNSpid: the status parser never panics, and whatever it accepts
// is consistent (ids are never 0, levels within the kernel's).
func FuzzParseNSpid(f *testing.F) {
	for _, s := range []string{"NSpid:\t4243\t7\n", "Name:\tx\nNSpid:\t1\n", "NSpid:\n", "NSpid: 1 2 3 4", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		outer, inner, levels, err := parseNSpid(b)
		if err != nil {
			if outer != 0 || inner != 0 || levels != 0 {
				t.Fatalf("error %v with ids (%d, %d, %d)", err, outer, inner, levels)
			}
			return
		}
		if outer == 0 || inner == 0 || levels < 1 || levels > maxNSLevels || (levels == 1 && outer != inner) {
			t.Fatalf("accepted %q as (%d, %d, %d)", b, outer, inner, levels)
		}
	})
}

// procTree writes a proc fixture: pid's own status and one task per
// thread, each with its NSpid ids (host first).
func procTree(t *testing.T, root string, pid uint32, threads map[uint32][]uint32) {
	t.Helper()
	line := func(ids []uint32) string {
		s := make([]string, len(ids))
		for i, v := range ids {
			s[i] = strconv.Itoa(int(v))
		}
		return "Name:\tpy\nNSpid:\t" + strings.Join(s, "\t") + "\nThreads:\t1\n"
	}
	dir := filepath.Join(root, strconv.Itoa(int(pid)))
	os.RemoveAll(filepath.Join(dir, "task"))
	for host, ids := range threads {
		td := filepath.Join(dir, "task", strconv.Itoa(int(host)))
		if err := os.MkdirAll(td, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(td, "status"), []byte(line(ids)), 0o644); err != nil {
			t.Fatal(err)
		}
		if host == pid {
			if err := os.WriteFile(filepath.Join(dir, "status"), []byte(line(ids)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestTIDMapTranslatesNamespacedThreads(t *testing.T) {
	root := t.TempDir()
	procTree(t, root, 500, map[uint32][]uint32{500: {500, 1}, 501: {501, 2}})
	procTree(t, root, 600, map[uint32][]uint32{600: {600}, 601: {601}}) // the host's namespace
	m := NewTIDMap(root)
	now := time.Unix(1000, 0)
	m.now = func() time.Time { return now }
	scans := 0
	readDir := m.readDir
	m.readDir = func(name string) ([]os.DirEntry, error) { scans++; return readDir(name) }

	for _, tt := range []struct {
		pid, tid, want uint32
	}{
		{500, 1, 500}, {500, 2, 501}, {600, 601, 601}, {600, 77, 77}, {500, 0, 0},
	} {
		if got, err := m.Host(tt.pid, tt.tid); err != nil || got != tt.want {
			t.Errorf("host(%d, %d) = %d, %v; want %d", tt.pid, tt.tid, got, err, tt.want)
		}
	}
	if scans != 1 {
		t.Errorf("%d scans, want 1 (the host's namespace needs none, hits none)", scans)
	}

	// A thread started after the scan: a miss scans again, but not more
	// often than nsRescanEvery.
	procTree(t, root, 500, map[uint32][]uint32{500: {500, 1}, 501: {501, 2}, 502: {502, 3}})
	if _, err := m.Host(500, 3); !errors.Is(err, errTIDUnknown) {
		t.Fatalf("within the rescan interval: err %v, want errTIDUnknown", err)
	}
	now = now.Add(nsRescanEvery)
	if got, err := m.Host(500, 3); err != nil || got != 502 {
		t.Fatalf("after the interval: %d, %v; want 502", got, err)
	}
	if _, err := m.Host(500, 9); !errors.Is(err, errTIDUnknown) {
		t.Fatalf("a thread that is none of the process's: err %v", err)
	}
	if scans != 2 {
		t.Errorf("%d scans, want 2", scans)
	}

	// An exited process is forgotten: its pid, reused, is read afresh.
	m.forget(500)
	procTree(t, root, 500, map[uint32][]uint32{500: {500}})
	if got, err := m.Host(500, 1); err != nil || got != 1 {
		t.Fatalf("reused pid in the host's namespace: %d, %v", got, err)
	}
	if _, err := m.Host(999, 1); err == nil {
		t.Fatal("a process without status: no error")
	}
}

func TestTIDMapBoundsThreads(t *testing.T) {
	root := t.TempDir()
	threads := map[uint32][]uint32{700: {700, 1}}
	for i := uint32(1); i <= maxNSThreads+10; i++ {
		threads[700+i] = []uint32{700 + i, 1 + i}
	}
	procTree(t, root, 700, threads)
	m := NewTIDMap(root)
	if _, err := m.Host(700, 1); err != nil && !errors.Is(err, errTIDUnknown) {
		t.Fatal(err)
	}
	if n := len(m.procs[700].host); n != maxNSThreads {
		t.Fatalf("%d threads remembered, want the bound %d", n, maxNSThreads)
	}
}

// TestTIDMapOnARealNamespace: a process started by `unshare --pid --fork`
// is thread 1 of its namespace; the map finds its host id.
func TestTIDMapOnARealNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("unshare --pid needs root")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("no unshare (util-linux)")
	}
	cmd := exec.Command(unshare, "--pid", "--fork", "--kill-child", "sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); _ = cmd.Wait() }() // reaps the killed child: Wait reports the kill
	var child uint32
	for i := 0; i < 100 && child == 0; i++ {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
		if f := strings.Fields(string(b)); len(f) > 0 {
			v, _ := strconv.Atoi(f[0])
			child = uint32(v)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if child == 0 {
		t.Fatal("unshare started no child")
	}
	m := NewTIDMap("")
	if got, err := m.Host(child, 1); err != nil || got != child {
		t.Fatalf("host(%d, 1) = %d, %v; want %d", child, got, err, child)
	}
	self := uint32(os.Getpid())
	if got, err := m.Host(self, self); err != nil || got != self {
		t.Fatalf("the agent's own namespace: host(%d, %d) = %d, %v", self, self, got, err)
	}
}

// TestPluginRecordsOfANamespacedProcessMatchTheUprobes: the plugin's records
// carry the thread ids of the process's PID namespace, the uprobes the
// host's; translated at decode, the switch's cut counts each call once and
// the HostCalls carry the host's ids, as the uprobes' do.
func TestPluginRecordsOfANamespacedProcessMatchTheUprobes(t *testing.T) {
	root := t.TempDir()
	procTree(t, root, pidNCCL, map[uint32][]uint32{pidNCCL: {pidNCCL, 1}, 4201: {4201, 2}, 4202: {4202, 3}})
	c := newConverter(newCounters(), true)
	c.tids = NewTIDMap(root)
	var calls []correlate.HostCall
	count := func(in []pipeline.Input) { calls = append(calls, hostCalls(in)...) }
	// The uprobes see calls on host threads 4201 and 4202.
	count(uprobeColl(c, 4201, t0+100, t0+110))
	count(uprobeColl(c, 4202, t0+150, t0+160))
	// The first plugin batch repeats both (namespace threads 2 and 3) and
	// has a new call of thread 2 and one of a thread gone before the scan.
	data, err := cupti.EncodeBatch(&cupti.Batch{Header: cupti.Header{Seq: 1},
		NCCLComms: []cupti.NCCLComm{pluginComm5(3)},
		NCCLColls: []cupti.NCCLColl{pluginColl(2, t0+102), pluginColl(3, t0+152), pluginColl(2, t0+302), pluginColl(9, t0+305)},
	})
	if err != nil {
		t.Fatal(err)
	}
	count(c.Convert(&bpf.BatchEvent{Header: bpf.Header{Type: bpf.EventBatch, PID: pidNCCL, StartNs: uint64(emitAt), EndNs: uint64(emitAt)}, Data: data}, nil))
	if len(calls) != 4 {
		t.Fatalf("%d host calls, want 4 (2 by the uprobes, 2 new by the plugin): %+v", len(calls), calls)
	}
	if tid := calls[2].TID; tid != 4201 {
		t.Errorf("plugin call of namespace thread 2 carries thread %d, want the host's 4201", tid)
	}
	for key, want := range map[string]int64{
		"nccl_plugin_records_superseded": 2, "nccl_plugin_colls": 2, "nccl_plugin_tids_unmapped": 1,
	} {
		if got := c.counters.get(key); got != want {
			t.Errorf("%s = %d, want %d", key, got, want)
		}
	}
}
