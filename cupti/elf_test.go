package cupti

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// builtLibrary returns the library built by `make cupti`, or skips.
func builtLibrary(t *testing.T) string {
	t.Helper()
	p := os.Getenv("SLOWRANK_CUPTI_SO")
	if p == "" {
		p = filepath.Join("..", "bin", "libslowrank_cupti.so")
	}
	if _, err := os.Stat(p); err != nil {
		t.Skipf("%s not built (make cupti): %v", p, err)
	}
	return p
}

func TestInspectLibrary(t *testing.T) {
	path := builtLibrary(t)
	lib, err := InspectLibrary(path)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The semaphore is file-backed and starts at 0.
	if lib.SemaphoreOffset == 0 || lib.SemaphoreOffset+2 > uint64(len(data)) ||
		data[lib.SemaphoreOffset] != 0 || data[lib.SemaphoreOffset+1] != 0 {
		t.Errorf("semaphore offset %#x", lib.SemaphoreOffset)
	}
	// The control block's initial image is in the file at ControlOffset.
	c, err := ParseControl(data[lib.ControlOffset:])
	if err != nil {
		t.Fatalf("control block at %#x: %v", lib.ControlOffset, err)
	}
	if c.Duty != DefaultDuty || c.Generation != 0 {
		t.Errorf("initial control %+v", c)
	}
	if lib.EmitVaddr == 0 {
		t.Error("no emit address")
	}

	// ControlAddress picks the writable mapping of the file.
	page := lib.ControlOffset &^ 0xfff
	maps := fmt.Sprintf(
		"7f0000000000-7f0000002000 r--p 00000000 fd:01 99 %[1]s\n"+
			"7f0000010000-7f0000012000 r--p %08[2]x fd:01 99 %[1]s\n"+
			"7f0000012000-7f0000014000 rw-p %08[2]x fd:01 99 %[1]s\n"+
			"7f0000020000-7f0000030000 rw-p %08[2]x fd:01 98 /other\n",
		path, page)
	addr, err := ControlAddress([]byte(maps), 99, lib)
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(0x7f0000012000) + lib.ControlOffset - page; addr != want {
		t.Errorf("address %#x, want %#x", addr, want)
	}
	if _, err := ControlAddress([]byte(maps), 97, lib); err == nil {
		t.Error("found a mapping of another inode")
	}
}

func TestInspectNotInjectionLibrary(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Skip(err)
	}
	// The test binary is static or lacks the symbols either way.
	if _, err := InspectLibrary(exe); err == nil {
		t.Error("test binary accepted")
	} else if !errors.Is(err, ErrNotInjectionLibrary) {
		t.Logf("error (not ErrNotInjectionLibrary, fine for a static binary): %v", err)
	}
	if _, err := InspectLibrary("/nonexistent"); err == nil {
		t.Error("missing file accepted")
	}
}

// TestInspectLibraryRefusesHostileFiles: the path comes from a training
// process's maps; a FIFO must not block the agent and a huge or sparse file
// must not be read.
func TestInspectLibraryRefusesHostileFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "libslowrank_cupti.so")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.so")
	if err := os.WriteFile(big, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, maxLibraryBytes+1); err != nil { // sparse: no disk
		t.Fatal(err)
	}
	for _, path := range []string{fifo, big} {
		done := make(chan error, 1)
		go func() { _, err := InspectLibrary(path); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, ErrNotInjectionLibrary) {
				t.Errorf("%s: err %v, want ErrNotInjectionLibrary", filepath.Base(path), err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: InspectLibrary blocked", filepath.Base(path))
		}
	}
}
