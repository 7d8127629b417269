package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/slowrank/slowrank/bpf"
)

// RepoRoot returns the repository root (two levels above this source).
func RepoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test source")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// RequireRoot skips t unless it runs as root, saying "needs root " + why.
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root " + why)
	}
}

// RequireAgentSupport skips t when the kernel lacks what the agent needs
// (bpf.CheckSupport).
func RequireAgentSupport(t testing.TB) {
	t.Helper()
	if err := bpf.CheckSupport(); err != nil {
		t.Skipf("kernel lacks what the agent needs: %v", err)
	}
}

// RequireAgent skips t unless it runs as root (RequireRoot with why) on a
// kernel that supports the agent (RequireAgentSupport).
func RequireAgent(t testing.TB, why string) {
	t.Helper()
	RequireRoot(t, why)
	RequireAgentSupport(t)
}

// ToolsBin returns the directory holding the named binaries that
// test/e2e/build-tools.sh (`make e2e-tools`) builds: $SLOWRANK_TOOLS_BIN, or
// .cache/tools/bin. A missing one skips t, or fails it when
// $SLOWRANK_E2E_REQUIRED is set (`make test` builds them).
func ToolsBin(t testing.TB, names ...string) string {
	t.Helper()
	dir := os.Getenv("SLOWRANK_TOOLS_BIN")
	if dir == "" {
		dir = filepath.Join(RepoRoot(t), ".cache", "tools", "bin")
	}
	for _, name := range names {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode()&0o111 == 0 {
			msg := fmt.Sprintf("%s not found in %s: run test/e2e/build-tools.sh first (about 5 minutes on 2 cores)", name, dir)
			if os.Getenv("SLOWRANK_E2E_REQUIRED") != "" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	return dir
}
