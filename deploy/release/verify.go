package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// loadLayout returns the one image of the OCI layout at dir and the name
// its index gives it.
func loadLayout(dir string) (v1.Image, string, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, "", fmt.Errorf("open layout: %w", err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, "", fmt.Errorf("layout index: %w", err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, "", fmt.Errorf("layout index manifest: %w", err)
	}
	if len(m.Manifests) != 1 {
		return nil, "", fmt.Errorf("layout holds %d manifests, want 1", len(m.Manifests))
	}
	d := m.Manifests[0]
	img, err := p.Image(d.Digest)
	if err != nil {
		return nil, "", fmt.Errorf("layout image %s: %w", d.Digest, err)
	}
	return img, d.Annotations["org.opencontainers.image.ref.name"], nil
}

// checkConfig fails on the first difference between img's config and what
// the chart and the manifests rely on.
func checkConfig(img v1.Image, refName, version string) error {
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("image config: %w", err)
	}
	c := cf.Config
	for _, chk := range []struct {
		what      string
		got, want any
		ok        bool
	}{
		{"layout ref name", refName, version, refName == version},
		{"rootfs type", cf.RootFS.Type, "layers", cf.RootFS.Type == "layers"},
		{"platform", cf.OS + "/" + cf.Architecture, "linux/amd64", cf.OS == "linux" && cf.Architecture == "amd64"},
		{"entrypoint", c.Entrypoint, entrypoint, slices.Equal(c.Entrypoint, entrypoint)},
		{"cmd", c.Cmd, command, slices.Equal(c.Cmd, command)},
		{"user", c.User, imageUser, c.User == imageUser},
		{"env", c.Env, imagePATH, slices.Contains(c.Env, imagePATH)},
		{"label org.opencontainers.image.version", c.Labels["org.opencontainers.image.version"], version, c.Labels["org.opencontainers.image.version"] == version},
	} {
		if !chk.ok {
			return fmt.Errorf("image %s is %v, want %v", chk.what, chk.got, chk.want)
		}
	}
	return nil
}

// extract writes img's flattened file system under root (which must not
// exist): regular files, directories and links, each name checked to stay
// under root.
func extract(img v1.Image, root string) error {
	if err := os.Mkdir(root, 0o755); err != nil {
		return fmt.Errorf("extract root: %w", err)
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read image file system: %w", err)
		}
		name := filepath.Clean(strings.TrimPrefix(h.Name, "/"))
		if !filepath.IsLocal(name) {
			return fmt.Errorf("image entry %q leaves the root", h.Name)
		}
		dst := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("extract %s: %w", name, err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(dst, os.FileMode(h.Mode)&os.ModePerm)
		case tar.TypeReg:
			err = writeFile(dst, tr, os.FileMode(h.Mode)&os.ModePerm)
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, dst)
		case tar.TypeLink:
			target := filepath.Clean(strings.TrimPrefix(h.Linkname, "/"))
			if !filepath.IsLocal(target) {
				return fmt.Errorf("image hard link %q leaves the root", h.Linkname)
			}
			err = os.Link(filepath.Join(root, target), dst)
		default:
			err = fmt.Errorf("unsupported type %q", h.Typeflag)
		}
		if err != nil {
			return fmt.Errorf("extract %s: %w", name, err)
		}
	}
}

func writeFile(dst string, r io.Reader, mode os.FileMode) error {
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// checkFiles checks the extracted image at root: the binary and the library
// are the released ones (same bytes), with the modes the chart needs, the
// checkScannable checks that a scanner finds the OS and every package of
// the label (NAME=VERSION ...) in the extracted image at root, installed.
func checkScannable(root, packages string) error {
	osr, err := os.ReadFile(filepath.Join(root, osReleasePath))
	if err != nil || !strings.Contains(string(osr), "\nID=debian\n") {
		return fmt.Errorf("image /%s does not name Debian (%v): scanners would not match its packages", osReleasePath, err)
	}
	if packages == "" {
		return errors.New("image names no base packages (label " + packagesLabel + ")")
	}
	for _, nv := range strings.Fields(packages) {
		name, version, _ := strings.Cut(nv, "=")
		b, err := os.ReadFile(filepath.Join(root, dpkgStatusDir, name))
		if err != nil {
			return fmt.Errorf("image has no dpkg status for %s: %w", nv, err)
		}
		f := controlFields(b)
		if f["Package"] != name || f["Version"] != version || f["Status"] != "install ok installed" {
			return fmt.Errorf("image's dpkg status for %s says %s %s (%s)", nv, f["Package"], f["Version"], f["Status"])
		}
	}
	return nil
}

// library an x86-64 shared object exporting the CUDA injection entry point.
func checkFiles(root, binary, library string) error {
	for _, f := range []struct {
		inImage, released string
		mode              os.FileMode
	}{
		{binaryPath, binary, 0o755},
		{libraryPath, library, 0o644},
	} {
		st, err := os.Lstat(filepath.Join(root, f.inImage))
		if err != nil {
			return fmt.Errorf("image lacks /%s: %w", f.inImage, err)
		}
		if !st.Mode().IsRegular() || st.Mode().Perm() != f.mode {
			return fmt.Errorf("image /%s has mode %v, want a regular file %v", f.inImage, st.Mode(), f.mode)
		}
		if err := sameBytes(filepath.Join(root, f.inImage), f.released); err != nil {
			return fmt.Errorf("image /%s: %w", f.inImage, err)
		}
	}
	lib, err := elf.Open(filepath.Join(root, libraryPath))
	if err != nil {
		return fmt.Errorf("image library: %w", err)
	}
	defer lib.Close()
	if lib.Type != elf.ET_DYN || lib.Machine != elf.EM_X86_64 {
		return fmt.Errorf("image library is %v %v, want an x86-64 shared object", lib.Type, lib.Machine)
	}
	syms, err := lib.DynamicSymbols()
	if err != nil {
		return fmt.Errorf("image library symbols: %w", err)
	}
	if !slices.ContainsFunc(syms, func(s elf.Symbol) bool {
		return s.Name == "InitializeInjection" && elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF
	}) {
		return errors.New("image library does not export InitializeInjection (what CUDA_INJECTION64_PATH calls)")
	}
	return nil
}

func sameBytes(a, b string) error {
	x, err := os.ReadFile(a)
	if err != nil {
		return err
	}
	y, err := os.ReadFile(b)
	if err != nil {
		return err
	}
	if !bytes.Equal(x, y) {
		return fmt.Errorf("differs from %s", b)
	}
	return nil
}

// runInImage runs argv with root as its root directory (chroot: the image's
// own dynamic loader and glibc, no daemon), with the image's PATH, and
// returns its combined output.
func runInImage(ctx context.Context, root string, argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Path = argv[0] // resolved inside the chroot, not on this machine
	cmd.Dir = "/"
	cmd.Env = []string{imagePATH}
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("run %s in the image: %w: %s", strings.Join(argv, " "), err, out)
	}
	return string(out), nil
}

// checkRuns runs, in the extracted image, `slowrank --version` (it must
// print the release version) and the init container's install command
// (the library copied, chmodded and renamed into a host directory).
func checkRuns(ctx context.Context, root, version string) error {
	if os.Geteuid() != 0 {
		return errors.New("running the image's binary needs chroot: run as root")
	}
	out, err := runInImage(ctx, root, "/"+binaryPath, "--version")
	if err != nil {
		return err
	}
	if want := "slowrank version " + version; strings.TrimSpace(out) != want {
		return fmt.Errorf("slowrank --version in the image printed %q, want %q", strings.TrimSpace(out), want)
	}
	if err := os.Mkdir(filepath.Join(root, "host-lib"), 0o755); err != nil {
		return fmt.Errorf("host-lib: %w", err)
	}
	install := "cp /" + libraryPath + " /host-lib/.new && chmod 0644 /host-lib/.new && mv -f /host-lib/.new /host-lib/libslowrank_cupti.so"
	if _, err := runInImage(ctx, root, "/bin/sh", "-c", install); err != nil {
		return err
	}
	return sameBytes(filepath.Join(root, "host-lib", "libslowrank_cupti.so"), filepath.Join(root, libraryPath))
}
