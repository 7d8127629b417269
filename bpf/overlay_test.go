package bpf

import (
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

// mountOverlay mounts an overlayfs whose lower layer is a copy of dir and
// returns its merged directory, unmounted in cleanup; it skips the test
// where the kernel has no overlayfs or the mount is not allowed.
func mountOverlay(t *testing.T, dir string) string {
	t.Helper()
	base := t.TempDir()
	lower, upper, work, merged := filepath.Join(base, "lower"), filepath.Join(base, "upper"), filepath.Join(base, "work"), filepath.Join(base, "merged")
	if out, err := exec.Command("cp", "-a", dir, lower).CombinedOutput(); err != nil {
		t.Fatalf("copy fakes: %v: %s", err, out)
	}
	for _, d := range []string{upper, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)
	if err := syscall.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Skipf("overlayfs unavailable (a container's root is one; this test makes its own): mount: %v", err)
	}
	t.Cleanup(func() {
		// The child mapping the fakes is stopped by an earlier cleanup
		// (LIFO); a lazy unmount still lets the temporary directory go.
		if err := syscall.Unmount(merged, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount overlay: %v", err)
		}
	})
	return merged
}

// mappedID reads pid's mapping of the file whose path ends in name: its
// identity as maps shows it and its map_files entry, from one maps read.
func mappedID(t *testing.T, pid int, name string) (FileID, string) {
	t.Helper()
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.HasSuffix(f[5], "/"+name) {
			continue
		}
		maj, min, _ := strings.Cut(f[3], ":")
		ma, _ := strconv.ParseUint(maj, 16, 32)
		mi, _ := strconv.ParseUint(min, 16, 32)
		ino, _ := strconv.ParseUint(f[4], 10, 64)
		// unix.Mkdev's encoding, as the agent's maps parser builds it.
		dev := ma&0xfff<<8 | ma&^0xfff<<32 | mi&0xff | mi&^0xff<<12
		return FileID{Dev: dev, Inode: ino}, fmt.Sprintf("/proc/%d/map_files/%s", pid, f[0])
	}
	t.Fatalf("pid %d maps no %s", pid, name)
	return FileID{}, ""
}

// A library in an overlayfs (a container's root) mapped by a process is
// attached through its mapping, and its uprobes fire in that process.
// Before Linux 6.8, maps shows such a file with the underlying layer's
// device and inode, which fstat of the overlay path does not report: an
// attach that compared them refused every library of a container. Through
// map_files nothing is compared, on any kernel.
func TestAttachThroughOverlayMapping(t *testing.T) {
	requireBPF(t)
	merged := mountOverlay(t, fakeLibs(t))
	p, err := Load(Options{RingBufferSize: 1 << 20})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	defer closeOK(t, p)
	r, err := p.NewReader()
	if err != nil {
		t.Fatal(err)
	}
	col := collect(r)
	c := startChild(t, merged)
	want, mapFiles := mappedID(t, c.pid, "libnccl.so.2")
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(merged, "libnccl.so.2"), &st); err != nil {
		t.Fatal(err)
	}
	t.Logf("maps shows %v, fstat of the overlay path %v (they differ before Linux 6.8)", want, FileID{Dev: st.Dev, Inode: st.Ino})

	// As the agent names it: the path in the process's root, the
	// mapping's identity and its map_files entry.
	src := LibSource{MapFiles: mapFiles, Path: fmt.Sprintf("/proc/%d/root%s", c.pid, filepath.Join(merged, "libnccl.so.2")), Want: want}
	a, err := p.AttachLibrary(src, LibNCCL)
	if err != nil {
		t.Fatalf("AttachLibrary: %v", err)
	}
	defer closeOK(t, a)
	if got := statsOf(t, p); got.OpenedMapFiles != 1 || got.OpenedPath != 0 {
		t.Errorf("opened through map_files %d, through the path %d; want 1, 0", got.OpenedMapFiles, got.OpenedPath)
	}
	if n := breakpoints(t, a, c.pid, want); n != a.Attached() || n == 0 {
		t.Errorf("%d breakpoints in the process mapping the overlay file, want %d", n, a.Attached())
	}
	if err := p.Track(uint32(c.pid), 1); err != nil {
		t.Fatal(err)
	}
	c.send("run")
	for c.line() != "done" {
	}
	evs := col.waitFor(c.pid, 10*time.Second, func(e []Event) bool { return len(e) >= nAllReduce })
	colls := 0
	for _, e := range evs {
		if e.Base().Probe.Class() == ClassCollective {
			colls++
		}
	}
	if colls < nAllReduce {
		t.Errorf("%d collective events from the process (of %d), want at least %d", colls, len(evs), nAllReduce)
	}
}
