package bpf

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// swapLab is the scene of the path-swap attack: two copies of the fakes (A,
// the file a selected process maps, and B, the file the attacker wants the
// breakpoints in), a child mapping each, and a path that a racing rename
// points at one or the other.
type swapLab struct {
	libA, libB string // the two libnccl.so.2 files
	idA, idB   FileID
	childA     *child // maps libA
	childB     *child // maps libB
	path       string // renamed between A and B
	tmp        string
}

func newSwapLab(t *testing.T) *swapLab {
	t.Helper()
	src := fakeLibs(t)
	dir := t.TempDir()
	l := &swapLab{path: filepath.Join(dir, "swap", "libnccl.so.2"), tmp: filepath.Join(dir, "swap", ".tmp")}
	for _, sub := range []string{"a", "b"} {
		if out, err := exec.Command("cp", "-a", src, filepath.Join(dir, sub)).CombinedOutput(); err != nil {
			t.Fatalf("copy fakes: %v: %s", err, out)
		}
	}
	if err := os.Mkdir(filepath.Dir(l.path), 0o755); err != nil {
		t.Fatal(err)
	}
	l.libA, l.libB = filepath.Join(dir, "a", "libnccl.so.2"), filepath.Join(dir, "b", "libnccl.so.2")
	l.idA, l.idB = statID(t, l.libA), statID(t, l.libB)
	l.childA, l.childB = startChild(t, filepath.Join(dir, "a")), startChild(t, filepath.Join(dir, "b"))
	l.point(t, l.libA)
	return l
}

// point renames a new hard link of lib onto the path, as an attacker's
// rename(2) would: atomically, the path is always one of the two.
func (l *swapLab) point(tb testing.TB, lib string) {
	if err := os.Link(lib, l.tmp); err != nil {
		tb.Errorf("link: %v", err)
		return
	}
	if err := os.Rename(l.tmp, l.path); err != nil {
		tb.Errorf("rename: %v", err)
	}
}

func statID(tb testing.TB, path string) FileID {
	tb.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		tb.Fatal(err)
	}
	return FileID{Dev: st.Dev, Inode: st.Ino}
}

// breakpoints counts the functions of a whose first byte in pid's copy of
// file id is a breakpoint (0xcc): the kernel writes one into every process
// that maps the inode a uprobe was made on, and only there.
func breakpoints(t *testing.T, a *Attachment, pid int, id FileID) int {
	t.Helper()
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = mem.Close() }() // read only
	n, seen := 0, 0
	for _, r := range a.Results {
		if r.Status != StatusAttached {
			continue
		}
		addr, ok := addrOfOffset(maps, id, r.Offset)
		if !ok {
			t.Fatalf("pid %d does not map offset %#x of %v", pid, r.Offset, id)
		}
		var b [1]byte
		if _, err := mem.ReadAt(b[:], int64(addr)); err != nil {
			t.Fatalf("read pid %d at %#x: %v", pid, addr, err)
		}
		seen++
		if b[0] == 0xcc {
			n++
		}
	}
	if seen == 0 {
		t.Fatal("no attached function to look at")
	}
	return n
}

// addrOfOffset finds the address at which a maps content maps file offset
// off of file id.
func addrOfOffset(maps []byte, id FileID, off uint64) (uint64, bool) {
	sc := bufio.NewScanner(strings.NewReader(string(maps)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 {
			continue
		}
		if ino, _ := strconv.ParseUint(f[4], 10, 64); ino != id.Inode {
			continue
		}
		lo, hi, _ := strings.Cut(f[0], "-")
		start, _ := strconv.ParseUint(lo, 16, 64)
		end, _ := strconv.ParseUint(hi, 16, 64)
		moff, _ := strconv.ParseUint(f[2], 16, 64)
		if off >= moff && off < moff+end-start {
			return start + off - moff, true
		}
	}
	return 0, false
}

// mapFilesOf returns /proc/PID/map_files/<start>-<end> of pid's lowest
// mapping of file id, as the agent builds it from the maps read that found
// the library.
func mapFilesOf(tb testing.TB, pid int, id FileID) string {
	tb.Helper()
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		if ino, _ := strconv.ParseUint(f[4], 10, 64); ino == id.Inode {
			return fmt.Sprintf("/proc/%d/map_files/%s", pid, f[0])
		}
	}
	tb.Fatalf("pid %d does not map %v", pid, id)
	return ""
}

// refuseMapFiles is the map_files opener of an agent without
// CAP_SYS_ADMIN.
func refuseMapFiles(string) (*os.File, error) { return nil, syscall.EPERM }

// The ways the attach reaches the file a selected process maps, as the swap
// tests take them: through the mapping (map_files; a rename onto the path
// changes nothing), through the path checked against the mapping (an agent
// without the map_files entry, or with map_files refused: a file renamed
// onto the path is refused and counted).
var swapModes = []struct {
	name     string
	mapFiles bool // the source names A's mapping
	refuse   bool // opening map_files fails (EPERM)
}{
	{"map_files", true, false},
	{"path", false, false},
	{"map_files_refused", true, true},
}

// viaPath: the mode opens the path (checked), not the mapping.
func viaPath(mapFiles, refuse bool) bool { return !mapFiles || refuse }

func (l *swapLab) source(t *testing.T, mapFiles bool) LibSource {
	src := LibSource{Path: l.path, Want: l.idA}
	if mapFiles {
		src.MapFiles = mapFilesOf(t, l.childA.pid, l.idA)
	}
	return src
}

// The attack of issue 34: the path is renamed onto another file after the
// agent opened the library, between the symbol read and the attach. The
// uprobes land in the mapped file A (breakpoints in the process mapping A,
// none in the process mapping B), because the attach goes through the open
// descriptor, not the path. A re-attach through the mapping lands in A
// whatever the path names; through the path, while it names B, it is
// refused and counted.
func TestAttachSwapAfterOpenLandsInMappedFile(t *testing.T) {
	requireBPF(t)
	for _, mode := range swapModes {
		t.Run(mode.name, func(t *testing.T) {
			p, err := Load(Options{RingBufferSize: 1 << 20})
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			defer closeOK(t, p)
			if mode.refuse {
				p.openMapFiles = refuseMapFiles
			}
			l := newSwapLab(t)
			testHookOpened = func(string) { l.point(t, l.libB) }
			t.Cleanup(func() { testHookOpened = nil })

			a, err := p.AttachLibrary(l.source(t, mode.mapFiles), LibNCCL)
			if err != nil {
				t.Fatalf("AttachLibrary: %v", err)
			}
			defer closeOK(t, a)
			if got := statID(t, l.path); got != l.idB {
				t.Fatalf("the hook did not swap: path is %v", got)
			}
			if a.File != l.idA {
				t.Errorf("attachment File = %v, want A %v", a.File, l.idA)
			}
			l.wantOnlyA(t, a, "after the attach")
			st := statsOf(t, p)
			if byPath := viaPath(mode.mapFiles, mode.refuse); st.OpenedPath != b2u(byPath) || st.OpenedMapFiles != b2u(!byPath) {
				t.Errorf("opened through the path %d, through map_files %d; want path %v", st.OpenedPath, st.OpenedMapFiles, byPath)
			}

			// A re-attach while the path names B: through the mapping it
			// lands in A, through the path it is refused and counted.
			testHookOpened = nil
			if _, err := a.DetachClass(ClassCollective); err != nil {
				t.Fatal(err)
			}
			before := statsOf(t, p).FilesRefused
			n, err := a.ReattachClass(ClassCollective, l.source(t, mode.mapFiles))
			if !viaPath(mode.mapFiles, mode.refuse) {
				if err != nil || n != fakeNCCLColls {
					t.Fatalf("ReattachClass through A's mapping, the path naming B: %d, %v", n, err)
				}
				l.wantOnlyA(t, a, "after the re-attach through the mapping")
				return
			}
			if !errors.Is(err, ErrFileChanged) || n != 0 {
				t.Fatalf("ReattachClass through B: %d, %v; want ErrFileChanged", n, err)
			}
			if got := statsOf(t, p).FilesRefused - before; got != 1 {
				t.Errorf("FilesRefused grew by %d, want 1", got)
			}
			if got := a.Detached(ClassCollective); got != fakeNCCLColls {
				t.Errorf("after the refusal %d collectives parked, want %d", got, fakeNCCLColls)
			}
			l.point(t, l.libA)
			testHookOpened = func(string) { l.point(t, l.libB) }
			if n, err := a.ReattachClass(ClassCollective, l.source(t, mode.mapFiles)); err != nil || n != fakeNCCLColls {
				t.Fatalf("ReattachClass through A: %d, %v", n, err)
			}
			l.wantOnlyA(t, a, "after the re-attach")
		})
	}
}

// wantOnlyA: every attached function of a has its breakpoint in the
// process mapping A, none in the process mapping B.
func (l *swapLab) wantOnlyA(t *testing.T, a *Attachment, when string) {
	t.Helper()
	if n := breakpoints(t, a, l.childB.pid, l.idB); n != 0 {
		t.Errorf("%s: %d breakpoints in the process mapping the substitute B", when, n)
	}
	if n := breakpoints(t, a, l.childA.pid, l.idA); n != a.Attached() {
		t.Errorf("%s: %d breakpoints in the process mapping A, want %d", when, n, a.Attached())
	}
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// A process renames B and A onto the path as fast as it can while the agent
// attaches through it, expecting A: each attach lands in A or, through the
// path, is refused and counted; the process mapping B never gets a
// breakpoint. Through the mapping every attach lands in A.
func TestAttachRacingSwapNeverLandsElsewhere(t *testing.T) {
	requireBPF(t)
	for _, mode := range swapModes {
		t.Run(mode.name, func(t *testing.T) {
			p, err := Load(Options{RingBufferSize: 1 << 20})
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			defer closeOK(t, p)
			if mode.refuse {
				p.openMapFiles = refuseMapFiles
			}
			l := newSwapLab(t)
			src := l.source(t, mode.mapFiles)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var swaps atomic.Int64
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					l.point(t, []string{l.libB, l.libA}[i%2])
					swaps.Add(1)
				}
			}()
			defer func() { close(stop); wg.Wait() }()

			byPath := viaPath(mode.mapFiles, mode.refuse)
			enough := func(landed, refused int) bool { return landed > 0 && (refused > 0 || !byPath) }
			landed, refused := 0, 0
			deadline := time.Now().Add(20 * time.Second)
			for i := 0; i < 40 && time.Now().Before(deadline) || !enough(landed, refused) && time.Now().Before(deadline); i++ {
				a, err := p.AttachLibrary(src, LibNCCL)
				if errors.Is(err, ErrFileChanged) {
					refused++
					continue
				}
				if err != nil {
					t.Fatalf("attach %d: %v", i, err)
				}
				landed++
				if a.File != l.idA {
					t.Errorf("attach %d: File %v, want A %v", i, a.File, l.idA)
				}
				if n := breakpoints(t, a, l.childB.pid, l.idB); n != 0 {
					t.Fatalf("attach %d: %d breakpoints in the process mapping B", i, n)
				}
				if n := breakpoints(t, a, l.childA.pid, l.idA); n != a.Attached() {
					t.Errorf("attach %d: %d breakpoints in the process mapping A, want %d", i, n, a.Attached())
				}
				if err := a.Close(); err != nil {
					t.Fatal(err)
				}
			}
			st := statsOf(t, p)
			t.Logf("%d attaches landed in A, %d refused, %d renames", landed, refused, swaps.Load())
			if !enough(landed, refused) {
				t.Errorf("the race did not show the outcomes expected: %d landed, %d refused", landed, refused)
			}
			if !byPath && refused != 0 {
				t.Errorf("%d attaches through the mapping refused", refused)
			}
			if st.FilesRefused != uint64(refused) {
				t.Errorf("FilesRefused = %d, want %d", st.FilesRefused, refused)
			}
		})
	}
}

func statsOf(t *testing.T, p *Probes) Stats {
	t.Helper()
	st, err := p.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return st
}
