package export

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

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

// A value that cannot be marshalled (a NaN in a fact) is a lost line like
// any other: callers drop Write's error, the count must show it.
func TestJSONLWriterCountsUnmarshallableLineLost(t *testing.T) {
	path := filepath.Join(t.TempDir(), "facts.jsonl")
	w, err := NewJSONLWriter(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(map[string]float64{"v": math.NaN()}); err == nil {
		t.Fatal("a NaN marshalled")
	}
	if err := w.Write(1); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if w.Lost() != 1 || w.Written() != 1 {
		t.Fatalf("lost %d, written %d; want 1 and 1", w.Lost(), w.Written())
	}
}

// checkJSONL asserts that every line of path is a JSON object, returns the count.
func checkJSONL(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
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
// /dev/full as an output path is refused (ErrNotRegular); the writer's
// handling of ENOSPC is tested on it as an already open file.
func TestJSONLWriterDevFull(t *testing.T) {
	f, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		t.Skipf("/dev/full: %v", err)
	}
	w := newJSONLWriter("/dev/full", f, fileID{}, false)
	defer func() { _ = f.Close() }() // /dev/full: nothing ever reached it
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

func TestJSONLWriterRefusesNonRegularFiles(t *testing.T) {
	dir, err := os.MkdirTemp("", "jl") // short: a socket path is limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o666); err != nil {
		t.Fatal(err)
	}
	readFifo := filepath.Join(dir, "read-fifo")
	if err := syscall.Mkfifo(readFifo, 0o666); err != nil {
		t.Fatal(err)
	}
	reader, err := os.OpenFile(readFifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reader.Close() }() // the read end, open only so that the FIFO has a reader
	sock := filepath.Join(dir, "sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sub := filepath.Join(dir, "dir")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, path string }{
		{"FIFO without a reader", fifo},
		{"FIFO with a reader", readFifo},
		{"Unix socket", sock},
		{"directory", sub},
		{"character device", "/dev/null"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, open := range []struct {
				name string
				fn   func(string) error
			}{
				{"NewJSONLWriter", func(p string) error {
					w, err := NewJSONLWriter(p)
					if err == nil {
						_ = w.Close() // opened where it must not: the nil error fails the test
					}
					return err
				}},
				{"CreateOutput", func(p string) error {
					f, err := CreateOutput(p)
					if err == nil {
						_ = f.Close() // opened where it must not: the nil error fails the test
					}
					return err
				}},
			} {
				done := make(chan error, 1)
				go func() { done <- open.fn(tc.path) }()
				select {
				case err := <-done:
					if !errors.Is(err, ErrNotRegular) || !strings.Contains(err.Error(), tc.path) {
						t.Errorf("%s: err = %v, want ErrNotRegular naming the path", open.name, err)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("%s blocked on %s", open.name, tc.path) // the open stays stuck: the test binary ends
				}
			}
		})
	}
}

// copyFile copies src to dst (mode 0600), as logrotate's copy does.
func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o600)
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(b))
}

func TestJSONLWriterFollowsRotation(t *testing.T) {
	for _, tc := range []struct {
		name   string
		rotate func(w *JSONLWriter, path string) error
	}{
		{"Reopen after rename (SIGHUP)", func(w *JSONLWriter, path string) error {
			if err := os.Rename(path, path+".1"); err != nil {
				return err
			}
			return w.Reopen()
		}},
		{"inode change seen by the writer", func(w *JSONLWriter, path string) error {
			if err := os.Rename(path, path+".1"); err != nil {
				return err
			}
			deadline := time.Now().Add(5 * time.Second)
			for w.Reopened() == 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			return nil
		}},
		{"removed file", func(w *JSONLWriter, path string) error {
			if err := copyFile(path, path+".1"); err != nil {
				return err
			}
			if err := os.Remove(path); err != nil {
				return err
			}
			deadline := time.Now().Add(5 * time.Second)
			for w.Reopened() == 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "facts.jsonl")
			w, err := NewJSONLWriter(path)
			if err != nil {
				t.Fatal(err)
			}
			w.ioMu.Lock()
			w.checkEvery = 20 * time.Millisecond
			w.ioMu.Unlock()
			if err := w.Write(1); err != nil {
				t.Fatal(err)
			}
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			if err := tc.rotate(w, path); err != nil {
				t.Fatal(err)
			}
			if err := w.Write(2); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			if w.Reopened() != 1 {
				t.Errorf("reopened %d times, want 1", w.Reopened())
			}
			if got := readLines(t, path+".1"); len(got) != 1 || got[0] != "1" {
				t.Errorf("rotated file %q, want [1]", got)
			}
			if got := readLines(t, path); len(got) != 1 || got[0] != "2" {
				t.Errorf("new file %q, want [2]", got)
			}
		})
	}
}

// logrotate's copytruncate copies the file and truncates it in place: the
// writer keeps its descriptor. Every line must land at the file's new end,
// never at the old offset behind a run of NULs.
func TestJSONLWriterAfterCopytruncateWritesNoNULs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "verdicts.jsonl")
	w, err := NewJSONLWriter(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		w.Write(i)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := copyFile(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	w.Write("after")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "\"after\"\n" {
		t.Errorf("file after copytruncate holds %q (%d NULs), want only the new line", got, bytes.Count(got, []byte{0}))
	}
	if w.Reopened() != 0 {
		t.Errorf("reopened %d times: same inode, nothing to reopen", w.Reopened())
	}
}

// A reopen appends to a file that is already there (logrotate's create)
// and keeps the open file when the path became unsafe.
func TestJSONLWriterReopenAppendsAndRefusesUnsafe(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "v.jsonl")
	w, err := NewJSONLWriter(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := w.Close(); err != nil {
			t.Error(err)
		}
	}()
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := w.Reopen(); err != nil {
		t.Fatal(err)
	}
	w.Write(1)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := readLines(t, path); strings.Join(got, ",") != "0,1" {
		t.Errorf("after reopen %q, want [0 1]", got)
	}
	if err := os.Rename(path, path+".2"); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := w.Reopen(); !errors.Is(err, ErrNotRegular) {
		t.Errorf("reopen onto a FIFO: %v, want ErrNotRegular", err)
	}
	w.Write(2)
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := readLines(t, path+".2"); strings.Join(got, ",") != "0,1,2" {
		t.Errorf("kept file %q, want [0 1 2]", got)
	}
}
