package testutil

import (
	"bytes"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// LockedBuffer collects a process's output; it is safe for concurrent use.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Tail is the last n bytes of s, marked "..." when cut.
func Tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// Proc is a helper process (a server, an agent in a network namespace)
// started by StartProc.
type Proc struct {
	Name string
	Out  *LockedBuffer // stdout and stderr
	Done chan struct{} // closed once it has exited
	Err  error         // how it exited; read after Done

	cmd   *exec.Cmd
	grace time.Duration // how long Stop waits after SIGTERM before SIGKILL
}

// StartProc starts argv with env added to the test's environment, its
// stdout and stderr going to Out and SIGKILL sent to it should the test
// binary die. Cleanup stops it (Stop with grace) and, when the test failed,
// logs the last logTail bytes of its output.
func StartProc(t testing.TB, name string, grace time.Duration, logTail int, env []string, argv ...string) *Proc {
	t.Helper()
	p := &Proc{Name: name, Out: &LockedBuffer{}, Done: make(chan struct{}), cmd: exec.Command(argv[0], argv[1:]...), grace: grace}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.Out, p.Out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.Err = p.cmd.Wait()
		close(p.Done)
	}()
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", name, Tail(p.Out.String(), logTail))
		}
	})
	return p
}

// Stop sends SIGTERM, then SIGKILL when the process has not exited within
// the grace period, and waits for it.
func (p *Proc) Stop() {
	select {
	case <-p.Done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.Done:
	case <-time.After(p.grace):
		_ = p.cmd.Process.Kill()
		<-p.Done
	}
}

// StartCmd starts cmd, reaps it in the background and kills it when the
// test ends. The channel gets cmd.Wait's result once it exits.
func StartCmd(t testing.TB, cmd *exec.Cmd) <-chan error {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	return done
}
