package bpf

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	fakeOnce sync.Once
	fakeDir  string
	fakeErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if fakeDir != "" {
		os.RemoveAll(fakeDir)
	}
	os.Exit(code)
}

// What the fakes of test/fakelibs export that the probe table knows; change
// with the fakes.
const (
	// ELF symbols of libnccl.so.2: 16 functions, plus ncclAllToAll (RCCL's
	// spelling), an alias of ncclAlltoAll.
	fakeNCCLSymbols = 17
	fakeNCCLFuncs   = 16 // functions attached (the alias shares an address)
	fakeNCCLColls   = 9  // the collectives among them (no ncclGather, ncclScatter)
	// libtorch_cpu.so: 14 c10d::ProcessGroupGloo collectives, c10d::Work::wait
	// and c10::ivalue::Future::wait.
	fakeTorchFuncs = 16
)

// requireBPF skips unless the test can load programs and create uprobes.
func requireBPF(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root (BPF programs and uprobes)")
	}
	if err := CheckSupport(); err != nil {
		tb.Skipf("kernel lacks BPF support: %v", err)
	}
}

// fakeLibs builds the fake libraries of test/fakelibs once per test binary
// (target fakelibs-probe: the real NCCL/CUDA/torch/CUPTI-injection symbol
// names, and probechild) and returns their directory.
func fakeLibs(tb testing.TB) string {
	tb.Helper()
	fakeOnce.Do(func() { fakeDir, fakeErr = buildFakeLibs() })
	if fakeErr != nil {
		if errors.Is(fakeErr, exec.ErrNotFound) {
			tb.Skipf("no C toolchain: %v", fakeErr)
		}
		tb.Fatalf("build fake libraries: %v", fakeErr)
	}
	return filepath.Join(fakeDir, "fakelibs")
}

func buildFakeLibs() (string, error) {
	for _, tool := range []string{"make", "gcc", "g++"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", err
		}
	}
	dir, err := os.MkdirTemp("", "slowrank-bpf-fake-")
	if err != nil {
		return "", err
	}
	// libcudart.so.13: the tests attach a CUDA 13 runtime (the default
	// build is 12, the trainer's).
	cmd := exec.Command("make", "-s", "-f", "test/fakelibs/fakelibs.mk", "fakelibs-probe",
		"OUT_DIR="+dir, "FAKELIBS_CUDART_MAJOR=13")
	cmd.Dir = ".." // the repository root
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("%s: %w\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	return dir, nil
}

// child drives test/fakelibs/probechild.c over its stdin/stdout.
type child struct {
	tb  testing.TB
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
	pid int
}

func startChild(tb testing.TB, dir string, env ...string) *child {
	tb.Helper()
	cmd := exec.Command(filepath.Join(dir, "probe", "probechild"))
	// The fakes are found through the child's DT_RUNPATH; an inherited
	// LD_LIBRARY_PATH (GPU hosts set one) would win and load the real libcuda.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LD_LIBRARY_PATH=") && !strings.HasPrefix(kv, "LD_PRELOAD=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	// Echo mode: the child's made-up handles never reach the simulated GPU.
	cmd.Env = append(cmd.Env, "SLOWRANK_FAKE_ECHO=1")
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start child: %v", err)
	}
	c := &child{tb: tb, cmd: cmd, in: in, out: bufio.NewScanner(out), pid: cmd.Process.Pid}
	tb.Cleanup(c.stop)
	if line := c.line(); !strings.HasPrefix(line, "ready ") {
		tb.Fatalf("child said %q, want ready", line)
	}
	return c
}

func (c *child) send(cmd string) {
	c.tb.Helper()
	if _, err := io.WriteString(c.in, cmd+"\n"); err != nil {
		c.tb.Fatalf("write %q to child: %v", cmd, err)
	}
}

func (c *child) line() string {
	c.tb.Helper()
	done := make(chan bool, 1)
	go func() { done <- c.out.Scan() }()
	select {
	case ok := <-done:
		if !ok {
			c.tb.Fatalf("child output ended: %v", c.out.Err())
		}
		return c.out.Text()
	case <-time.After(30 * time.Second):
		c.tb.Fatal("child did not answer in 30s")
	}
	return ""
}

// semaphore asks the child for slowrank_cupti_semaphore as its library sees it.
func (c *child) semaphore() int {
	c.tb.Helper()
	c.send("sem")
	var v int
	if _, err := fmt.Sscanf(c.line(), "sem %d", &v); err != nil {
		c.tb.Fatalf("parse sem: %v", err)
	}
	return v
}

func (c *child) stop() {
	if c.cmd.ProcessState != nil {
		return
	}
	// A child that is gone cannot read this; Wait reaps it either way, and
	// its exit status is not what a test checks.
	_, _ = io.WriteString(c.in, "quit\n")
	c.in.Close()
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		c.cmd.Process.Kill()
		<-done
	}
}

// closeOK closes c (probes, an attachment) and fails the test when Close
// reports an error: a link or a reader that did not close.
func closeOK(t testing.TB, c interface{ Close() error }) {
	t.Helper()
	if err := c.Close(); err != nil {
		t.Error(err)
	}
}

// collector reads a Reader in the background and keeps events per pid.
type collector struct {
	mu     sync.Mutex
	events []Event
	errs   []error
	done   chan struct{}
}

func collect(r *Reader) *collector {
	c := &collector{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			ev, err := r.Read()
			if errors.Is(err, ErrClosed) {
				return
			}
			c.mu.Lock()
			if err != nil {
				c.errs = append(c.errs, err)
			} else {
				c.events = append(c.events, ev)
			}
			c.mu.Unlock()
		}
	}()
	return c
}

// waitFor polls until want(events of pid) is true or the timeout passes, and
// returns the events of pid.
func (c *collector) waitFor(pid int, timeout time.Duration, want func([]Event) bool) []Event {
	deadline := time.Now().Add(timeout)
	for {
		evs := c.of(pid)
		if want(evs) || time.Now().After(deadline) {
			return evs
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (c *collector) of(pid int) []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Event
	for _, e := range c.events {
		if int(e.Base().PID) == pid {
			out = append(out, e)
		}
	}
	return out
}

// loadLibSymbols opens the library at path and reads its wanted symbols, as
// AttachLibrary does.
func loadLibSymbols(path string, w *symbolWanter) (*libSymbols, error) {
	lf, err := openLibFile(LibSource{Path: path}, openNonblock)
	if err != nil {
		return nil, err
	}
	defer lf.Close()
	return readLibSymbols(lf, w)
}
