package discover

import (
	"bufio"
	"context"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startWatcher runs a Watcher on the host's /proc until the test ends.
func startWatcher(t *testing.T, cfg WatcherConfig) *Watcher {
	t.Helper()
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc:", err)
	}
	w, err := NewWatcher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		for range w.Events() { // drain until Run closes the channel
		}
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return w
}

// waitForEvent returns the first event about pid that ok accepts, failing after timeout.
func waitForEvent(t *testing.T, w *Watcher, pid int, timeout time.Duration, what string, ok func(Event) bool) Event {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev, open := <-w.Events():
			if !open {
				t.Fatalf("event channel closed while waiting for %s", what)
			}
			if ev.Key().PID == pid && ok(ev) {
				return ev
			}
		case <-deadline:
			t.Fatalf("no %s for pid %d within %v (stats %+v)", what, pid, timeout, w.Stats())
		}
	}
}

func isAdded(ev Event) bool  { _, ok := ev.(*ProcessAdded); return ok }
func isExited(ev Event) bool { _, ok := ev.(*ProcessExited); return ok }

func TestWatcherRealProcess(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep:", err)
	}
	cmd := exec.Command(sleep, "60")
	cmd.Env = []string{"PATH=/usr/bin:/bin", "RANK=3", "LOCAL_RANK=1", "WORLD_SIZE=4", "TORCHELASTIC_RUN_ID=j1"}
	w := startWatcher(t, WatcherConfig{Interval: 50 * time.Millisecond})
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	reaped := false
	t.Cleanup(func() {
		if !reaped {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})

	ev := waitForEvent(t, w, pid, 5*time.Second, "ProcessAdded", isAdded).(*ProcessAdded)
	p := ev.Process
	id := p.Identity
	if id.Rank != 3 || id.LocalRank != 1 || id.WorldSize != 4 || id.RunID != "j1" || id.JobID != "j1" ||
		id.JobIDSource != "TORCHELASTIC_RUN_ID" || id.GroupRank != Unknown || id.LocalWorldSize != Unknown {
		t.Errorf("identity %+v", id)
	}
	if p.SelectedBy != "env:RANK" || p.PPID != os.Getpid() || p.Comm != "sleep" || filepath.Base(p.Exe) != "sleep" ||
		strings.Join(p.Cmdline, " ") != sleep+" 60" || p.StartTime == 0 {
		t.Errorf("process %+v", p)
	}

	// Killed but not reaped yet: a zombie is reported as exited.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	ex := waitForEvent(t, w, pid, 5*time.Second, "ProcessExited", isExited).(*ProcessExited)
	if ex.ProcessKey != p.ProcessKey {
		t.Errorf("exited %+v, want %+v", ex.ProcessKey, p.ProcessKey)
	}
	_ = cmd.Wait()
	reaped = true
}

func TestWatcherExplicitPIDRealProcess(t *testing.T) {
	cmd := exec.Command("sleep", "60") // no RANK: selected only by PID
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	if err := cmd.Start(); err != nil {
		t.Skip("no sleep:", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	w := startWatcher(t, WatcherConfig{Interval: 50 * time.Millisecond, Selector: Selector{PIDs: []int{cmd.Process.Pid}}})
	ev := waitForEvent(t, w, cmd.Process.Pid, 5*time.Second, "ProcessAdded", isAdded).(*ProcessAdded)
	if ev.Process.SelectedBy != "pid" || ev.Process.Identity.Rank != Unknown {
		t.Errorf("process %+v", ev.Process)
	}
}

const dlopenLib = `
int slowrank_test_fn(void) { return 42; }
int slowrank_test_data = 0x5a5a1234;
long slowrank_test_bss[64];
`

const dlopenMain = `
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
	char line[16];
	if (!fgets(line, sizeof line, stdin)) return 1;
	void *h = dlopen(argv[1], RTLD_NOW);
	if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
	printf("%p %p %p\n", dlsym(h, "slowrank_test_fn"), dlsym(h, "slowrank_test_data"), dlsym(h, "slowrank_test_bss"));
	fflush(stdout);
	fgets(line, sizeof line, stdin);
	return 0;
}
`

func buildC(t *testing.T, dir, out, src string, args ...string) string {
	t.Helper()
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc:", err)
	}
	c := filepath.Join(dir, out+".c")
	if err := os.WriteFile(c, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, out)
	if msg, err := exec.Command(cc, append(args, "-o", bin, c)...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", out, err, msg)
	}
	return bin
}

// elfInfo returns the p_vaddr of the first PT_LOAD and the st_value of the named symbols.
func elfInfo(t *testing.T, path string, names ...string) (uint64, map[string]uint64) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	first := uint64(0)
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			first = p.Vaddr
			break
		}
	}
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	vals := make(map[string]uint64)
	for _, s := range syms {
		for _, n := range names {
			if s.Name == n {
				vals[n] = s.Value
			}
		}
	}
	return first, vals
}

func TestWatcherSeesDlopenWithinOneSecond(t *testing.T) {
	dir := t.TempDir()
	lib := buildC(t, dir, "libnccl.so.2", dlopenLib, "-shared", "-fPIC")
	prog := buildC(t, dir, "dlopener", dlopenMain, "-ldl")

	w := startWatcher(t, WatcherConfig{}) // default Interval, 500 ms
	cmd := exec.Command(prog, lib)
	cmd.Env = []string{"RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500"}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid

	added := waitForEvent(t, w, pid, 5*time.Second, "ProcessAdded", isAdded).(*ProcessAdded)
	if got := added.Process.Identity.JobID; got != "127.0.0.1:29500" {
		t.Errorf("job id %q", got)
	}

	// Let it dlopen "libnccl.so.2" now and time from when dlopen has returned.
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	loaded := time.Now()
	ev := waitForEvent(t, w, pid, 3*time.Second, "LibraryMapped", func(ev Event) bool {
		m, ok := ev.(*LibraryMapped)
		return ok && m.Library.Kind == KindNCCL
	}).(*LibraryMapped)
	d := time.Since(loaded)
	t.Logf("LibraryMapped %v after dlopen returned", d)
	if d > time.Second {
		t.Errorf("LibraryMapped %v after dlopen, want within 1s", d)
	}
	l := ev.Library
	if ev.ProcessKey != added.Process.ProcessKey || l.Path != lib || l.Deleted {
		t.Errorf("event %+v", ev)
	}

	// The key is the file's (dev, inode) as stat sees it, through every path the agent may use.
	paths := []string{lib, l.HostPath}
	if os.Geteuid() == 0 { // map_files needs CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE)
		paths = append(paths, l.MapFilesPath)
	}
	for _, p := range paths {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Errorf("stat %s: %v", p, err)
			continue
		}
		if (FileID{Dev: st.Dev, Inode: st.Ino}) != l.File {
			t.Errorf("stat %s: %d:%d, library %v", p, st.Dev, st.Ino, l.File)
		}
	}

	// Runtime addresses computed from the load base match dlsym, for text, data and bss.
	names := []string{"slowrank_test_fn", "slowrank_test_data", "slowrank_test_bss"}
	first, vals := elfInfo(t, lib, names...)
	fields := strings.Fields(line)
	for i, n := range names {
		want, err := strconv.ParseUint(strings.TrimPrefix(fields[i], "0x"), 16, 64)
		if err != nil {
			t.Fatalf("parse %q: %v", line, err)
		}
		if got := l.RuntimeAddr(vals[n], first); got != want {
			t.Errorf("%s: RuntimeAddr %#x, dlsym %#x", n, got, want)
		}
	}
	// ...so /proc/PID/mem reads the variable.
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = mem.Close() }() // read only
	var buf [4]byte
	if _, err := mem.ReadAt(buf[:], int64(l.RuntimeAddr(vals["slowrank_test_data"], first))); err != nil {
		t.Fatal(err)
	}
	if got := binary.LittleEndian.Uint32(buf[:]); got != 0x5a5a1234 {
		t.Errorf("slowrank_test_data = %#x", got)
	}

	_ = stdin.Close() // the program exits
	waitForEvent(t, w, pid, 5*time.Second, "ProcessExited", isExited)
}

// BenchmarkPollHost measures one steady-state poll of this host's /proc with the default
// selector: listing PIDs plus stat and maps of the tracked processes.
func BenchmarkPollHost(b *testing.B) {
	w, err := NewWatcher(WatcherConfig{QueueSize: 1 << 16})
	if err != nil {
		b.Fatal(err)
	}
	for range 4 {
		if err := w.pollOnce(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := w.pollOnce(); err != nil {
			b.Fatal(err)
		}
		for len(w.events) > 0 {
			<-w.events
		}
	}
	b.ReportMetric(float64(len(w.seen)+len(w.tracked)), "procs")
}

func TestWatcherRealExec(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh:", err)
	}
	w := startWatcher(t, WatcherConfig{Interval: 20 * time.Millisecond, Recheck: 100 * time.Millisecond})
	start := func(env ...string) (*exec.Cmd, func()) {
		cmd := exec.Command(sh, "-c", "read x; exec env RANK=5 sleep 60")
		cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, env...)
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd, func() { _, _ = stdin.Write([]byte("\n")) }
	}

	// A tracked shell execs the trainer: the old image exits, the new one is added.
	cmd, release := start("RANK=1")
	pid := cmd.Process.Pid
	ev := waitForEvent(t, w, pid, 5*time.Second, "ProcessAdded", isAdded).(*ProcessAdded)
	if ev.Process.Identity.Rank != 1 || ev.Process.Comm != "sh" {
		t.Errorf("before exec: %+v", ev.Process)
	}
	release()
	waitForEvent(t, w, pid, 5*time.Second, "ProcessExited", isExited)
	ev = waitForEvent(t, w, pid, 5*time.Second, "ProcessAdded", isAdded).(*ProcessAdded)
	if ev.Process.Identity.Rank != 5 || ev.Process.Comm != "sleep" {
		t.Errorf("after exec: %+v", ev.Process)
	}

	// A rejected shell (no RANK) execs with RANK, long after it was first seen.
	cmd, release = start()
	time.Sleep(300 * time.Millisecond)
	release()
	ev = waitForEvent(t, w, cmd.Process.Pid, 5*time.Second, "ProcessAdded", isAdded).(*ProcessAdded)
	if ev.Process.Identity.Rank != 5 || ev.Process.Comm != "sleep" {
		t.Errorf("after exec: %+v", ev.Process)
	}
}
