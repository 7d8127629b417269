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

func TestCheckScannable(t *testing.T) {
	const pkgs = "libc6=2.36-9 busybox-static=1:1.35"
	good := map[string]string{
		osReleasePath:                    osRelease,
		dpkgStatusDir + "libc6":          "Package: libc6\nVersion: 2.36-9\nStatus: install ok installed\n",
		dpkgStatusDir + "busybox-static": "Package: busybox-static\nVersion: 1:1.35\nStatus: install ok installed\n",
	}
	for _, c := range []struct {
		name   string
		change map[string]string // path -> contents ("" removes it)
		ok     bool
	}{
		{"as built", nil, true},
		{"no os-release", map[string]string{osReleasePath: ""}, false},
		{"another OS", map[string]string{osReleasePath: "ID=alpine\n"}, false},
		{"a package without status", map[string]string{dpkgStatusDir + "libc6": ""}, false},
		{"another version", map[string]string{dpkgStatusDir + "libc6": "Package: libc6\nVersion: 2.36-8\nStatus: install ok installed\n"}, false},
		{"not installed", map[string]string{dpkgStatusDir + "libc6": "Package: libc6\nVersion: 2.36-9\nStatus: deinstall ok config-files\n"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			for path, text := range good {
				if v, ok := c.change[path]; ok {
					text = v
				}
				if text == "" {
					continue
				}
				if err := os.MkdirAll(filepath.Dir(filepath.Join(root, path)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(root, path), []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := checkScannable(root, pkgs); (err == nil) != c.ok {
				t.Errorf("checkScannable = %v, want ok %v", err, c.ok)
			}
		})
	}
}
