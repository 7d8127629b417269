package otel

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/slowrank/slowrank/detector"
)

func TestJSONLWriterCreatesMode0640(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "facts.jsonl")
	w, err := NewJSONLWriter(path)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Go(func() {
			for i := 0; i < 250; i++ {
				if err := w.Write(stepFact("j", g, int64(i), 0)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v, want 0640", fi.Mode().Perm())
	}
	if n := checkJSONL(t, path); n != 1000 || w.Written() != 1000 || w.Lost() != 0 {
		t.Fatalf("%d lines, written %d, lost %d", n, w.Written(), w.Lost())
	}
	if err := w.Write(1); !errors.Is(err, ErrClosed) || w.Lost() != 1 {
		t.Fatalf("write after close: %v lost %d", err, w.Lost())
	}
}

// checkJSONL asserts that every line of path is a JSON object, returns the count.
func checkJSONL(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %d not JSON: %q", n+1, sc.Text())
		}
		n++
	}
	return n
}

func TestJSONLWriterRefusesSymlinks(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "victim")
	if err := os.WriteFile(target, []byte("precious\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "verdicts.jsonl")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, err := NewJSONLWriter(link); !errors.Is(err, ErrSymlink) {
		t.Fatalf("symlink: err = %v, want ErrSymlink", err)
	}
	dangling := filepath.Join(dir, "dangling.jsonl")
	if err := os.Symlink(filepath.Join(dir, "nowhere"), dangling); err != nil {
		t.Fatal(err)
	}
	if _, err := NewJSONLWriter(dangling); !errors.Is(err, ErrSymlink) {
		t.Fatalf("dangling symlink: err = %v, want ErrSymlink", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "nowhere")); !os.IsNotExist(err) {
		t.Fatal("a file was created through the dangling symlink")
	}
	if b, _ := os.ReadFile(target); string(b) != "precious\n" {
		t.Fatalf("target changed: %q", b)
	}
}

func TestJSONLWriterRefusesForeignAndLinkedFiles(t *testing.T) {
	dir := t.TempDir()
	own := filepath.Join(dir, "own.jsonl")
	if err := os.WriteFile(own, []byte("old\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	w, err := NewJSONLWriter(own)
	if err != nil {
		t.Fatalf("own existing file: %v", err)
	}
	_ = w.Close()
	if b, _ := os.ReadFile(own); len(b) != 0 {
		t.Fatalf("existing file not truncated: %q", b)
	}
	if err := os.Link(own, filepath.Join(dir, "hard")); err != nil {
		t.Fatal(err)
	}
	if _, err := NewJSONLWriter(own); !errors.Is(err, ErrUnsafeFile) {
		t.Fatalf("hard-linked: err = %v", err)
	}
	if os.Geteuid() == 0 {
		foreign := filepath.Join(dir, "foreign.jsonl")
		if err := os.WriteFile(foreign, nil, 0o666); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(foreign, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if _, err := NewJSONLWriter(foreign); !errors.Is(err, ErrUnsafeFile) {
			t.Fatalf("foreign-owned: err = %v", err)
		}
	}
}

// /dev/full fails every write with ENOSPC: nothing blocks, the lines stay
// for retries and Close counts them as lost.
func TestJSONLWriterDevFull(t *testing.T) {
	w, err := NewJSONLWriter("/dev/full")
	if err != nil {
		t.Skipf("/dev/full: %v", err)
	}
	for i := 0; i < 10; i++ {
		if err := w.Write(map[string]int{"i": i}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Flush = %v, want ENOSPC", err)
	}
	if w.Lost() != 0 {
		t.Fatalf("lines lost before Close: %d", w.Lost())
	}
	if err := w.Close(); err == nil || w.Lost() != 10 {
		t.Fatalf("Close = %v, lost %d; want an error and 10 lost", err, w.Lost())
	}
}

// On a tiny tmpfs: disk full cuts the file back to whole lines, keeps the
// lines, drops (and counts) only what exceeds the buffer, and writes the
// rest once space is back.
func TestJSONLWriterDiskFullTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	dir := filepath.Join(t.TempDir(), "tiny")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, 112<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "verdicts.jsonl")
	w, err := NewJSONLWriter(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	w.maxBuf = 96 << 10
	v := detector.Verdict{Kind: detector.KindVerdict, Job: "j1", State: "straggler", Reason: strings.Repeat("x", 100)}
	// ~300 bytes a line: 40 lines fit the free 16k, 200 do not.
	for i := 0; i < 200; i++ {
		v.Window = int64(i)
		if err := w.Write(v); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Flush = %v, want ENOSPC", err)
	}
	if n := checkJSONL(t, path); n != 0 {
		t.Fatalf("file not cut back to whole lines: %d lines", n)
	}
	// The buffer (96k) overflows while the disk is full: counted.
	var full int
	for i := 200; i < 600; i++ {
		v.Window = int64(i)
		if err := w.Write(v); errors.Is(err, ErrBufferFull) {
			full++
		}
	}
	if full == 0 || w.Lost() != int64(full) {
		t.Fatalf("buffer-full drops %d, Lost %d", full, w.Lost())
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatalf("Flush after freeing space: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	n := checkJSONL(t, path)
	if int64(n) != 600-w.Lost() || int64(n) != w.Written() {
		t.Fatalf("%d lines in file, written %d, lost %d", n, w.Written(), w.Lost())
	}
	t.Logf("tmpfs: %d lines written, %d lost while full", n, w.Lost())
}

func TestJSONLWriterStdout(t *testing.T) {
	w, err := NewJSONLWriter("-")
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stdout.Stat(); err != nil {
		t.Fatalf("stdout closed by Close: %v", err)
	}
}
