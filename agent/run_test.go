package agent

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/slowrank/slowrank/bpf"
)

// An agent whose process watcher cannot list the proc tree would never
// attach to anything: Run must say so and end, not spin on the watcher's
// closed channel until it is cancelled.
func TestRunFailsWhenProcessesCannotBeListed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to load BPF programs")
	}
	if err := bpf.CheckSupport(); err != nil {
		t.Skipf("kernel lacks what the agent needs: %v", err)
	}
	proc := filepath.Join(t.TempDir(), "proc")
	if err := os.Mkdir(proc, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.HostName = "noproc"
	cfg.ProcRoot = proc
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := a.Close(); err != nil {
			t.Error(err)
		}
	}()
	if err := os.Remove(proc); err != nil { // the first poll lists nothing
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := a.Run(ctx); err == nil {
		t.Fatalf("Run returned nil after %s with no proc tree to list", time.Since(start).Round(time.Millisecond))
	} else if ctx.Err() != nil {
		t.Fatalf("Run ran until cancelled: %v", err)
	} else {
		t.Logf("Run: %v (after %s)", err, time.Since(start).Round(time.Millisecond))
	}
}
