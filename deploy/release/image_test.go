package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// writePackageTar writes a tar as dpkg-deb --fsys-tarfile does ("./"
// names, directories first), with the given owner and time.
func writePackageTar(t *testing.T, path string, uid int, mtime time.Time, entries ...tar.Header) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		// A regular file's contents are its name.
		h.Uid, h.Gid, h.ModTime = uid, uid, mtime
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(h.Name))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.WriteString(tw, h.Name); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// inputs writes a binary, a library and two packages under dir, each with
// the given file time, owner and permission bits (what a build machine
// leaves on its files), and returns the spec.
func inputs(t *testing.T, dir string, mtime time.Time, uid int, perm os.FileMode) imageSpec {
	t.Helper()
	bin, lib := filepath.Join(dir, "slowrank"), filepath.Join(dir, "lib.so")
	for _, f := range []string{bin, lib} {
		if err := os.WriteFile(f, []byte("contents of "+filepath.Base(f)), perm); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(f, perm); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(f, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	libc, bb := filepath.Join(dir, "libc6.tar"), filepath.Join(dir, "busybox.tar")
	writePackageTar(t, libc, uid, mtime,
		tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755},
		tar.Header{Typeflag: tar.TypeDir, Name: "./lib/", Mode: 0o755},
		tar.Header{Typeflag: tar.TypeDir, Name: "./lib/x86_64-linux-gnu/", Mode: 0o755},
		tar.Header{Typeflag: tar.TypeReg, Name: "./lib/x86_64-linux-gnu/libc.so.6", Mode: 0o755},
		tar.Header{Typeflag: tar.TypeDir, Name: "./lib64/", Mode: 0o755},
		tar.Header{Typeflag: tar.TypeSymlink, Name: "./lib64/ld-linux-x86-64.so.2", Linkname: "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", Mode: 0o777},
		tar.Header{Typeflag: tar.TypeDir, Name: "./usr/share/doc/libc6/", Mode: 0o755},
	)
	writePackageTar(t, bb, uid, mtime,
		tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755},
		tar.Header{Typeflag: tar.TypeDir, Name: "./bin/", Mode: 0o755},
		tar.Header{Typeflag: tar.TypeReg, Name: "./bin/busybox", Mode: 0o755},
		tar.Header{Typeflag: tar.TypeDir, Name: "./usr/share/doc/libc6/", Mode: 0o755},
	)
	for path, stanza := range map[string]string{
		filepath.Join(dir, "libc6.control"):   "Package: libc6\nVersion: 2.36\nDescription: GNU C Library\n glibc\n",
		filepath.Join(dir, "busybox.control"): "Package: busybox-static\nVersion: 1:1.35\n",
	} {
		if err := os.WriteFile(path, []byte(stanza), perm); err != nil {
			t.Fatal(err)
		}
	}
	return imageSpec{version: "1.2.3", binary: bin, library: lib, epoch: time.Unix(0, 0).UTC(),
		packages: []debPackage{{"libc6=2.36", libc}, {"busybox-static=1:1.35", bb}}}
}

func digestOf(t *testing.T, s imageSpec) v1.Hash {
	t.Helper()
	img, err := buildImage(s)
	if err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestImageDigestDependsOnContentsOnly(t *testing.T) {
	base := digestOf(t, inputs(t, t.TempDir(), time.Unix(1700000000, 0), 0, 0o755))
	other := digestOf(t, inputs(t, t.TempDir(), time.Unix(1800000000, 5), 1000, 0o700))
	if base != other {
		t.Errorf("same contents with other file times, owners and modes: digest %s, then %s", base, other)
	}
	s := inputs(t, t.TempDir(), time.Unix(1700000000, 0), 0, 0o755)
	if err := os.WriteFile(s.library, []byte("another library"), 0o644); err != nil {
		t.Fatal(err)
	}
	if d := digestOf(t, s); d == base {
		t.Errorf("another library gave the same digest %s", d)
	}
	s = inputs(t, t.TempDir(), time.Unix(1700000000, 0), 0, 0o755)
	s.version = "1.2.4"
	if d := digestOf(t, s); d == base {
		t.Errorf("another version gave the same digest %s", d)
	}
}

func TestImageLayoutRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s := inputs(t, dir, time.Unix(1700000000, 0), 0, 0o700)
	img, err := buildImage(s)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "layout")
	if err := writeLayout(out, img, s.version); err != nil {
		t.Fatal(err)
	}
	got, ref, err := loadLayout(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkConfig(got, ref, s.version); err != nil {
		t.Error(err)
	}
	if err := checkConfig(got, ref, "9.9.9"); err == nil {
		t.Error("checkConfig accepted another version")
	}
	want, _ := img.Digest()
	if d, _ := got.Digest(); d != want {
		t.Errorf("layout image digest %s, built %s", d, want)
	}

	// The flattened file system: what the chart relies on, with fixed
	// owners, modes and times.
	tr := tar.NewReader(mutate.Extract(got))
	entries, contents := map[string]*tar.Header{}, map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		entries[strings.TrimSuffix(h.Name, "/")] = h
		if strings.HasPrefix(h.Name, dpkgStatusDir) || h.Name == osReleasePath {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			contents[h.Name] = string(b)
		}
	}
	// What scanners read: the OS and each package, installed.
	if !strings.Contains(contents[osReleasePath], "ID=debian\n") || !strings.Contains(contents[osReleasePath], `VERSION_ID="12"`) {
		t.Errorf("os-release %q", contents[osReleasePath])
	}
	if got, want := contents[dpkgStatusDir+"libc6"], "Package: libc6\nVersion: 2.36\nDescription: GNU C Library\n glibc\nStatus: install ok installed\n"; got != want {
		t.Errorf("dpkg status of libc6 %q, want %q", got, want)
	}
	if got := contents[dpkgStatusDir+"busybox-static"]; !strings.HasPrefix(got, "Package: busybox-static\nVersion: 1:1.35\n") {
		t.Errorf("dpkg status of busybox-static %q", got)
	}
	for _, c := range []struct {
		name     string
		typ      byte
		mode     int64
		linkname string
	}{
		{binaryPath, tar.TypeReg, 0o755, ""},
		{libraryPath, tar.TypeReg, 0o644, ""},
		{"opt/slowrank/lib", tar.TypeDir, 0o755, ""},
		{"bin/busybox", tar.TypeReg, 0o755, ""},
		{osReleasePath, tar.TypeReg, 0o644, ""},
		{dpkgStatusDir + "libc6", tar.TypeReg, 0o644, ""},
		{"bin/sh", tar.TypeSymlink, 0o777, "busybox"},
		{"bin/mv", tar.TypeSymlink, 0o777, "busybox"},
		{"lib/x86_64-linux-gnu/libc.so.6", tar.TypeReg, 0o755, ""},
		{"lib64/ld-linux-x86-64.so.2", tar.TypeSymlink, 0o777, "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"},
	} {
		h, ok := entries[c.name]
		if !ok {
			t.Errorf("image lacks /%s", c.name)
			continue
		}
		if h.Typeflag != c.typ || h.Mode != c.mode || h.Linkname != c.linkname || h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(s.epoch) {
			t.Errorf("/%s: type %q mode %o link %q owner %d:%d time %v, want %q %o %q 0:0 %v",
				c.name, h.Typeflag, h.Mode, h.Linkname, h.Uid, h.Gid, h.ModTime, c.typ, c.mode, c.linkname, s.epoch)
		}
	}
}

func TestBaseFilesRefusesConflicts(t *testing.T) {
	dir := t.TempDir()
	s := inputs(t, dir, time.Unix(0, 0), 0, 0o755)
	for name, pkgs := range map[string][]debPackage{
		"a file in two packages":      {s.packages[0], s.packages[0]},
		"no busybox":                  {s.packages[0]},
		"a stanza of another version": {{"libc6=2.37", s.packages[0].fsysTar}, s.packages[1]},
		"no stanza":                   {{"libc6=2.36", filepath.Join(dir, "elsewhere.tar")}, s.packages[1]},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := baseFiles(pkgs); err == nil {
				t.Error("accepted")
			}
		})
	}
}

func TestLayerTarRefusesBadNames(t *testing.T) {
	for _, name := range []string{"", "/abs", "../up", "a/../b", "a//b"} {
		if _, err := layerTar([]file{{name: name, typ: tar.TypeReg, mode: 0o644}}, time.Unix(0, 0)); err == nil {
			t.Errorf("layerTar accepted %q", name)
		}
	}
	if _, err := layerTar([]file{
		{name: "a", typ: tar.TypeReg, mode: 0o644},
		{name: "a/b", typ: tar.TypeReg, mode: 0o644},
	}, time.Unix(0, 0)); err == nil {
		t.Error("layerTar accepted a file under a regular file")
	}
	b, err := layerTar([]file{{name: "z", typ: tar.TypeReg}, {name: "a/b", typ: tar.TypeReg}}, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(b))
	for h, err := tr.Next(); err == nil; h, err = tr.Next() {
		names = append(names, h.Name)
	}
	if want := []string{"a/", "a/b", "z"}; !slices.Equal(names, want) {
		t.Errorf("entries %q, want %q (sorted, parents added)", names, want)
	}
}

func TestCheckConfigRefuses(t *testing.T) {
	img, err := buildImage(inputs(t, t.TempDir(), time.Unix(0, 0), 0, 0o755))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkConfig(img, "1.2.3", "1.2.3"); err != nil {
		t.Fatalf("the built image: %v", err)
	}
	for name, change := range map[string]func(*v1.ConfigFile){
		"another rootfs type": func(c *v1.ConfigFile) { c.RootFS.Type = "" },
		"another entrypoint":  func(c *v1.ConfigFile) { c.Config.Entrypoint = []string{"/bin/sh"} },
		"another command":     func(c *v1.ConfigFile) { c.Config.Cmd = nil },
		"another user":        func(c *v1.ConfigFile) { c.Config.User = "65532" },
		"no PATH":             func(c *v1.ConfigFile) { c.Config.Env = nil },
		"another platform":    func(c *v1.ConfigFile) { c.Architecture = "arm64" },
	} {
		t.Run(name, func(t *testing.T) {
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			cf = cf.DeepCopy()
			change(cf)
			bad, err := mutate.ConfigFile(img, cf)
			if err != nil {
				t.Fatal(err)
			}
			if err := checkConfig(bad, "1.2.3", "1.2.3"); err == nil {
				t.Error("accepted")
			}
		})
	}
}
