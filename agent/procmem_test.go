package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/slowrank/slowrank/agent/discover"
	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/cupti"
)

// execImage runs testdata/execimage.c: a process whose control block sits at
// a fixed address, and which execs an image with an identical block there.
type execImage struct {
	t    *testing.T
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  chan string
	addr uint64
}

func startExecImage(t *testing.T) *execImage {
	t.Helper()
	src, err := os.ReadFile("testdata/execimage.c")
	if err != nil {
		t.Fatal(err)
	}
	bin := buildC(t, t.TempDir(), "execimage", string(src), "-I../cupti", "-O1")
	e := &execImage{t: t, cmd: exec.Command(bin), out: make(chan string, 16)}
	e.cmd.Stderr = os.Stderr
	if e.in, err = e.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := e.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.in.Close(); e.cmd.Process.Kill(); _ = e.cmd.Wait() }) // reaps the killed child: Wait reports the kill
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			e.out <- sc.Text()
		}
		close(e.out)
	}()
	first := e.line()
	hex, ok := strings.CutPrefix(first, "first 0x")
	if !ok {
		t.Fatalf("image said %q", first)
	}
	if e.addr, err = strconv.ParseUint(hex, 16, 64); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *execImage) line() string {
	e.t.Helper()
	select {
	case l, ok := <-e.out:
		if !ok {
			e.t.Fatal("image output ended")
		}
		return l
	case <-time.After(10 * time.Second):
		e.t.Fatal("image did not answer in 10 s")
	}
	return ""
}

func (e *execImage) send(s string) {
	e.t.Helper()
	if _, err := io.WriteString(e.in, s+"\n"); err != nil {
		e.t.Fatal(err)
	}
}

// dirty asks the second image how many bytes of its blocks changed.
func (e *execImage) dirty() int {
	e.t.Helper()
	e.send("check")
	var n int
	if _, err := fmt.Sscanf(e.line(), "dirty %d", &n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// The attack of issue 34: a selected process execs another program under
// its PID while the agent writes its duty cycle, yield decision and hand-back
// into the control block at the address the first image published. The
// agent's descriptor, opened when it found the process, holds the first
// image: every write after the exec fails, is counted once, and no byte of
// the new image changes, although it has a valid block at the same address.
func TestNoWriteLandsInTheImageAnExecBrought(t *testing.T) {
	e := startExecImage(t)
	pid := e.cmd.Process.Pid
	a := &Agent{counters: newCounters(), log: slog.New(slog.DiscardHandler)}
	att := &attacher{count: a.counters.add, log: a.log, procs: map[discover.ProcessKey]*procEntry{}}
	pe := &procEntry{proc: discover.Process{ProcessKey: discover.ProcessKey{PID: pid}}, inject: &discover.Library{},
		mem: openProcMem(att.procPath(pid, "mem"))}
	defer pe.mem.Close()
	hb := e.addr + 1024
	write := func() (landed int) {
		// As if the agent looked the block up again after each failure:
		// through the descriptor it would find nothing, so keep the address.
		pe.ctlAddr = e.addr
		if att.writeDuty(pe, cupti.Duty{Mode: cupti.DutyAlways}) == nil {
			landed++
		}
		pe.cupti.lastBlock.Status.HandbackAddr = hb
		pe.cupti.track.foreign = cupti.ForeignCallbacks{RequestFn: 0x4141414141414141, CompleteFn: 0x4242424242424242, PairNs: 1}
		pe.cupti.track.foreignDirty = true
		if att.writeHandback(pe) == nil {
			landed++
		}
		pe.ctlAddr = e.addr
		if att.writeYield(pe, 0) == nil {
			landed++
		}
		return landed
	}

	if n := write(); n != 3 {
		t.Fatalf("before the exec %d of 3 writes landed", n)
	}
	cb, err := cupti.ReadControl(pe.mem, int64(e.addr))
	if err != nil || cb.Duty.Mode != cupti.DutyAlways || cb.Generation != 2 {
		t.Fatalf("the first image's block after the writes: %+v, %v", cb.Duty, err)
	}

	e.send("exec")
	var attempts, landedAfter int
	second := false
	for deadline := time.Now().Add(5 * time.Second); !second && time.Now().Before(deadline); {
		write()
		attempts++
		select {
		case l := <-e.out:
			if l != "second" {
				t.Fatalf("image said %q", l)
			}
			second = true
		default:
		}
	}
	if !second {
		t.Fatal("the image did not exec")
	}
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		landedAfter += write()
		attempts++
	}
	if landedAfter != 0 {
		t.Errorf("%d writes succeeded after the new image was up", landedAfter)
	}
	if n := e.dirty(); n != 0 {
		t.Fatalf("%d bytes of the new image's blocks changed (%d write rounds during and after the exec)", n, attempts)
	}
	if got := a.counters.get("proc_mem_image_gone"); got != 1 {
		t.Errorf("proc_mem_image_gone = %d, want 1 (once per image)", got)
	}
	if !pe.mem.isGone() {
		t.Error("the descriptor is not marked gone")
	}
	t.Logf("%d write rounds during and after the exec, none landed; counters %v", attempts, a.counters.m)

	// The check can fail: memory opened by PID now is the new image's, and
	// a write through it shows.
	fresh, err := os.OpenFile(att.procPath(pid, "mem"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fresh.Close() }() // every write through it was checked
	if err := cupti.WriteYield(fresh, int64(e.addr), cupti.Yield{Gen: 9, Active: true}); err != nil {
		t.Fatal(err)
	}
	if n := e.dirty(); n == 0 {
		t.Error("a write through a descriptor opened after the exec did not show: the check sees nothing")
	}
}

// A descriptor whose open failed, or that was closed, reads and writes
// nothing and says why.
func TestProcMemWithoutDescriptor(t *testing.T) {
	for name, m := range map[string]*procMem{
		"open failed": openProcMem("/nonexistent/mem"),
		"closed":      func() *procMem { m := openProcMem("/proc/self/mem"); m.Close(); return m }(),
		"nil":         nil,
	} {
		var b [1]byte
		if _, err := m.WriteAt(b[:], 0x1000); err == nil {
			t.Errorf("%s: WriteAt succeeded", name)
		}
		if _, err := m.ReadAt(b[:], 0x1000); err == nil {
			t.Errorf("%s: ReadAt succeeded", name)
		}
		m.Close() // a no-op here: it must not panic
	}
	if _, err := (*procMem)(nil).ReadAt(nil, 0); !errors.Is(err, errNoMem) {
		t.Errorf("nil: %v", err)
	}
}

// The injection library's symbols, from which the agent computes where it
// writes, are read from the file the process maps: another file renamed
// onto its path is refused and counted.
func TestInspectInjectionRefusesARenamedFile(t *testing.T) {
	dir := t.TempDir()
	path, other := dir+"/libslowrank_cupti.so", dir+"/other.so"
	for _, p := range []string{path, other} {
		if err := os.WriteFile(p, []byte("not an ELF file"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	a := &Agent{counters: newCounters(), log: slog.New(slog.DiscardHandler)}
	att := &attacher{count: a.counters.add, log: a.log}
	pe := &procEntry{inject: &discover.Library{HostPath: path, File: discover.FileID{Dev: st.Dev, Inode: st.Ino}}}
	if _, err := att.inspectInjection(pe); err == nil || errors.Is(err, bpf.ErrFileChanged) {
		t.Fatalf("the mapped file: %v, want an ELF error", err)
	}
	if err := os.Rename(other, path); err != nil {
		t.Fatal(err)
	}
	if _, err := att.inspectInjection(pe); !errors.Is(err, bpf.ErrFileChanged) {
		t.Fatalf("a file renamed onto the path: %v, want bpf.ErrFileChanged", err)
	}
	if got := a.counters.get("inject_files_refused"); got != 1 {
		t.Errorf("inject_files_refused = %d, want 1", got)
	}
}

// Through the mapping (map_files) the agent reads the file the process maps
// whatever its path names now, and counts how it opened it; where the
// mapping is gone it falls back to the path, checked.
func TestInspectInjectionReadsTheMapping(t *testing.T) {
	dir := t.TempDir()
	path, other := dir+"/libslowrank_cupti.so", dir+"/other.so"
	for _, p := range []string{path, other} {
		if err := os.WriteFile(p, []byte("not an ELF file"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, os.Getpagesize(), syscall.PROT_READ, syscall.MAP_SHARED)
	_ = f.Close() // mapped: the mapping outlives the descriptor
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Munmap(mem) }() // the test's own mapping, read only
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	start := uint64(uintptr(unsafe.Pointer(&mem[0])))
	mapFiles := fmt.Sprintf("/proc/self/map_files/%x-%x", start, start+uint64(os.Getpagesize()))
	if _, err := os.Stat(mapFiles); err != nil {
		t.Skipf("map_files unavailable (CAP_SYS_ADMIN): %v", err)
	}
	if err := os.Rename(other, path); err != nil {
		t.Fatal(err)
	}
	a := &Agent{counters: newCounters(), log: slog.New(slog.DiscardHandler)}
	att := &attacher{count: a.counters.add, log: a.log}
	pe := &procEntry{inject: &discover.Library{HostPath: path, MapFilesPath: mapFiles, File: discover.FileID{Dev: st.Dev, Inode: st.Ino}}}
	if _, err := att.inspectInjection(pe); err == nil || errors.Is(err, bpf.ErrFileChanged) {
		t.Fatalf("through the mapping: %v, want an ELF error of the mapped file", err)
	}
	pe.inject.MapFilesPath = fmt.Sprintf("/proc/self/map_files/%x-%x", start+1, start+2) // no such mapping
	if _, err := att.inspectInjection(pe); !errors.Is(err, bpf.ErrFileChanged) {
		t.Fatalf("mapping gone, path renamed onto: %v, want bpf.ErrFileChanged", err)
	}
	for name, want := range map[string]int64{"inject_opened_map_files": 1, "inject_opened_path": 0, "inject_files_refused": 1} {
		if got := a.counters.get(name); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
}

// The exec window of issue 34: a process found by its environment execs
// before the agent opens its memory. The descriptor, opened on the new
// image, is checked against the image discovery judged and closed unused,
// counted; a process that shows the judged image keeps it. Each case
// stands for one moment of the race, made deterministic: discovery's view
// is taken, then the process changes (or the view is made stale as a
// change would make it), then the memory is opened.
func TestOpenImageMemRefusesAnImageNobodyJudged(t *testing.T) {
	tests := []struct {
		name  string
		exec  bool                      // the process execs after discovery, before the open
		stale func(p *discover.Process) // discovery's view as another change leaves it
		keep  bool
	}{
		{name: "the judged image", keep: true},
		{name: "exec of the same executable", exec: true},
		{name: "another executable", stale: func(p *discover.Process) { p.ExeFile.Inode++ }},
		{name: "PID reused", stale: func(p *discover.Process) { p.StartTime++ }},
		{name: "exec while discovery read the environment", stale: func(p *discover.Process) { p.ExecSig[1]++ }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := startExecImage(t)
			pid := e.cmd.Process.Pid
			found, _, err := discover.Discover("/proc", discover.Selector{PIDs: []int{pid}})
			if err != nil || len(found) != 1 {
				t.Fatalf("discover the image: %v, %d processes", err, len(found))
			}
			p := found[0]
			if p.ExeFile == (discover.FileID{}) {
				t.Fatal("exe of the image not readable")
			}
			if tt.exec {
				e.send("exec")
				if l := e.line(); l != "second" {
					t.Fatalf("image said %q", l)
				}
			}
			if tt.stale != nil {
				tt.stale(&p)
			}
			a := &Agent{counters: newCounters(), log: slog.New(slog.DiscardHandler)}
			att := &attacher{count: a.counters.add, log: a.log}
			m := att.openImageMem(p)
			defer m.Close()
			_, readErr := cupti.ReadControl(m, int64(e.addr))
			if tt.keep {
				if readErr != nil || m.isGone() {
					t.Errorf("the judged image: read %v, gone %v", readErr, m.isGone())
				}
				if n := a.counters.get("proc_mem_image_changed"); n != 0 {
					t.Errorf("proc_mem_image_changed = %d, want 0", n)
				}
				return
			}
			if !errors.Is(readErr, errImageChanged) || !m.isGone() {
				t.Errorf("read %v, gone %v; want errImageChanged and gone", readErr, m.isGone())
			}
			if n := a.counters.get("proc_mem_image_changed"); n != 1 {
				t.Errorf("proc_mem_image_changed = %d, want 1", n)
			}
			if tt.exec {
				if n := e.dirty(); n != 0 {
					t.Errorf("%d bytes of the new image changed", n)
				}
			}
		})
	}
}

// buildC compiles one C file into dir/out with gcc, skipping without it.
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
