package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeRoot writes an extracted image's binary and library under a new root
// with the given modes and contents, and the released copies beside it.
func fakeRoot(t *testing.T, binMode, libMode os.FileMode, libInImage []byte) (root, bin, lib string) {
	t.Helper()
	dir := t.TempDir()
	root = filepath.Join(dir, "rootfs")
	bin, lib = filepath.Join(dir, "slowrank"), filepath.Join(dir, "lib.so")
	self, err := os.ReadFile("/proc/self/exe") // an x86-64 ELF file, but not a shared object
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		{bin, []byte("binary"), 0o755},
		{lib, self, 0o644},
		{filepath.Join(root, binaryPath), []byte("binary"), binMode},
		{filepath.Join(root, libraryPath), libInImage, libMode},
	} {
		if err := os.MkdirAll(filepath.Dir(f.path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f.path, f.data, f.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(f.path, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	return root, bin, lib
}

func TestCheckFilesRefuses(t *testing.T) {
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name             string
		binMode, libMode os.FileMode
		lib              []byte
		want             []string // the error names one of them
	}{
		{"a library training pods cannot read", 0o755, 0o600, self, []string{"mode"}},
		{"a binary that is not executable", 0o644, 0o644, self, []string{"mode"}},
		{"another library than the released one", 0o755, 0o644, []byte("other"), []string{"differs"}},
		// The test binary: an executable, or (PIE) a shared object without the entry point.
		{"a library that is no injection library", 0o755, 0o644, self, []string{"shared object", "InitializeInjection"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			root, bin, lib := fakeRoot(t, c.binMode, c.libMode, c.lib)
			err := checkFiles(root, bin, lib)
			if err == nil || !slices.ContainsFunc(c.want, func(w string) bool { return strings.Contains(err.Error(), w) }) {
				t.Errorf("checkFiles = %v, want an error about one of %q", err, c.want)
			}
		})
	}
}
