package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// BuildAgent builds the agent binary (./cmd/slowrank) into dir and returns
// its path.
func BuildAgent(t testing.TB, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "slowrank")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/slowrank")
	cmd.Dir = RepoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build slowrank: %v\n%s", err, out)
	}
	return bin
}

// BuildFakes builds the fake NCCL/CUDA libraries and the fake trainer
// (`make fakelibs`) into dir/fakelibs and returns the trainer's path.
func BuildFakes(t testing.TB, dir string) string {
	t.Helper()
	trainer, err := buildFakes(RepoRoot(t), dir)
	if err != nil {
		t.Fatal(err)
	}
	return trainer
}

func buildFakes(root, dir string) (string, error) {
	cmd := exec.Command("make", "-s", "-f", "test/fakelibs/fakelibs.mk", "fakelibs", "OUT_DIR="+dir)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build fakes: %w\n%s", err, out)
	}
	return filepath.Join(dir, "fakelibs", "faketrainer"), nil
}

// The fakes built once per test binary (SharedFakeTrainer).
var (
	sharedOnce    sync.Once
	sharedTrainer string
	sharedErr     error
)

// SharedFakeTrainer returns the fake trainer of fakes built once per test
// binary (as BuildFakes does) into a temporary directory that outlives the
// tests; a failed build fails every test that asks.
func SharedFakeTrainer(t testing.TB) string {
	t.Helper()
	root := RepoRoot(t)
	sharedOnce.Do(func() {
		dir, err := os.MkdirTemp("", "slowrank-fakes-")
		if err != nil {
			sharedErr = err
			return
		}
		sharedTrainer, sharedErr = buildFakes(root, dir)
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return sharedTrainer
}

// The injection library built once per test binary (SharedInjectionLibrary).
var (
	injOnce sync.Once
	injLib  string
	injErr  error
)

// SharedInjectionLibrary returns libslowrank_cupti.so for the test binary:
// a copy of bin/'s (make cupti) when there is one, else built by
// cupti/cupti.mk into a temporary directory that outlives the tests. The
// basename stays libslowrank_cupti.so: it is how the agent recognises the
// library in a process's maps.
func SharedInjectionLibrary(t testing.TB) string {
	t.Helper()
	root := RepoRoot(t)
	injOnce.Do(func() {
		dir, err := os.MkdirTemp("", "slowrank-cupti-")
		if err != nil {
			injErr = err
			return
		}
		if err := os.Chmod(dir, 0o755); err != nil { // past the umask: trainers running as nobody read it
			injErr = err
			return
		}
		injLib = filepath.Join(dir, "libslowrank_cupti.so")
		if b, err := os.ReadFile(filepath.Join(root, "bin", "libslowrank_cupti.so")); err == nil {
			injErr = os.WriteFile(injLib, b, 0o755)
			return
		}
		cmd := exec.Command("make", "-s", "-f", "cupti/cupti.mk", "cupti", "OUT_DIR="+dir)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			injErr = fmt.Errorf("build the injection library: %w\n%s", err, out)
		}
	})
	if injErr != nil {
		t.Fatal(injErr)
	}
	return injLib
}
