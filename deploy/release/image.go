package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's contract with the chart and the manifests: where the binary
// and the library are, what runs, as whom. verify checks each.
const (
	binaryPath  = "usr/local/bin/slowrank"
	libraryPath = "opt/slowrank/lib/libslowrank_cupti.so"
	busyboxPath = "bin/busybox"
	imageUser   = "0:0"
	imagePATH   = "PATH=/usr/local/bin:/bin"
)

var (
	entrypoint = []string{"/" + binaryPath}
	command    = []string{"agent"}
	// The init container runs `/bin/sh -c 'cp … && chmod … && mv -f …'`
	// (deploy/helm/slowrank/templates/daemonset.yaml): busybox provides them.
	busyboxApplets = []string{"sh", "cp", "chmod", "mv"}
)

// debPackage is one Debian package of the base layer: its file system tree
// (`dpkg-deb --fsys-tarfile`), the name=version it came from (a label), and
// beside the tree its control stanza (`dpkg-deb -f`, NAME.control for
// NAME.tar: fetch-debs.sh writes both).
type debPackage struct {
	nameVersion string
	fsysTar     string
}

// packagesLabel names the base layer's packages (NAME=VERSION ...).
const packagesLabel = "io.slowrank.base.debian-packages"

// controlFile is where the package's control stanza is.
func (p debPackage) controlFile() string { return strings.TrimSuffix(p.fsysTar, ".tar") + ".control" }

// What image scanners (Trivy, Grype, Syft) read to name the operating
// system and its packages, as distroless images give it: an os-release
// with Debian's ID and version (its packages are Debian 12's, so Debian's
// security tracker applies to them), and one dpkg status stanza per package
// in status.d. debs.lock must pin bookworm packages.
const (
	osReleasePath = "etc/os-release"
	dpkgStatusDir = "var/lib/dpkg/status.d/"
	osRelease     = `PRETTY_NAME="slowrank (Debian GNU/Linux 12 packages)"
NAME="Debian GNU/Linux"
VERSION_ID="12"
VERSION="12 (bookworm)"
VERSION_CODENAME=bookworm
ID=debian
HOME_URL="https://github.com/slowrank/slowrank"
`
)

// imageSpec is everything the image is made of.
type imageSpec struct {
	version  string
	binary   string // the linux/amd64 slowrank binary
	library  string // libslowrank_cupti.so
	packages []debPackage
	epoch    time.Time // every file time and the image's created time
}

// buildImage assembles the image: a base layer of the Debian packages and
// busybox's applet links, and an application layer of the binary and the
// library.
func buildImage(s imageSpec) (v1.Image, error) {
	base, err := baseFiles(s.packages)
	if err != nil {
		return nil, err
	}
	bin, err := os.ReadFile(s.binary)
	if err != nil {
		return nil, fmt.Errorf("read binary: %w", err)
	}
	lib, err := os.ReadFile(s.library)
	if err != nil {
		return nil, fmt.Errorf("read library: %w", err)
	}
	app := []file{
		{name: binaryPath, typ: tar.TypeReg, mode: 0o755, data: bin},
		{name: libraryPath, typ: tar.TypeReg, mode: 0o644, data: lib},
	}

	var pkgs []string
	for _, p := range s.packages {
		pkgs = append(pkgs, p.nameVersion)
	}
	cfg := &v1.ConfigFile{
		Architecture: "amd64",
		OS:           "linux",
		Created:      v1.Time{Time: s.epoch},
		// The only type the OCI image spec defines; runtimes refuse others.
		RootFS: v1.RootFS{Type: "layers"},
		Config: v1.Config{
			Entrypoint: entrypoint,
			Cmd:        command,
			Env:        []string{imagePATH},
			User:       imageUser,
			WorkingDir: "/",
			Labels: map[string]string{
				"org.opencontainers.image.title":       "slowrank",
				"org.opencontainers.image.description": "slowrank agent and its CUPTI injection library (/" + libraryPath + ")",
				"org.opencontainers.image.version":     s.version,
				"org.opencontainers.image.source":      "https://github.com/slowrank/slowrank",
				"org.opencontainers.image.licenses":    "GPL-2.0-only OR BSD-2-Clause",
				packagesLabel:                          strings.Join(pkgs, " "),
			},
		},
	}
	img, err := mutate.ConfigFile(mutate.MediaType(empty.Image, types.OCIManifestSchema1), cfg)
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	var adds []mutate.Addendum
	for _, l := range []struct {
		files []file
		what  string
	}{
		{base, "Debian 12 " + strings.Join(pkgs, " ") + "; busybox links " + strings.Join(busyboxApplets, " ")},
		{app, "slowrank " + s.version + ": /" + binaryPath + " /" + libraryPath},
	} {
		layer, err := newLayer(l.files, s.epoch)
		if err != nil {
			return nil, err
		}
		adds = append(adds, mutate.Addendum{Layer: layer, History: v1.History{Created: v1.Time{Time: s.epoch}, CreatedBy: l.what}})
	}
	img, err = mutate.Append(img, adds...)
	if err != nil {
		return nil, fmt.Errorf("append layers: %w", err)
	}
	return img, nil
}

// baseFiles merges the packages' trees (a directory may come from several;
// any other path from one only) and adds busybox's applet links.
func baseFiles(pkgs []debPackage) ([]file, error) {
	seen := map[string]file{}
	var files []file
	for _, p := range pkgs {
		f, err := os.Open(p.fsysTar)
		if err != nil {
			return nil, fmt.Errorf("open package %s: %w", p.nameVersion, err)
		}
		entries, err := readPackageTar(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("package %s: %w", p.nameVersion, err)
		}
		for _, e := range entries {
			if prev, ok := seen[e.name]; ok {
				if prev.typ == tar.TypeDir && e.typ == tar.TypeDir {
					continue
				}
				return nil, fmt.Errorf("package %s: %s is also in another package", p.nameVersion, e.name)
			}
			seen[e.name] = e
			files = append(files, e)
		}
	}
	meta, err := packageMetadata(pkgs)
	if err != nil {
		return nil, err
	}
	for _, m := range meta {
		if _, ok := seen[m.name]; ok {
			return nil, fmt.Errorf("/%s is already in a package", m.name)
		}
		files = append(files, m)
	}
	if bb, ok := seen[busyboxPath]; !ok || bb.typ != tar.TypeReg {
		return nil, fmt.Errorf("no /%s in the packages (busybox-static)", busyboxPath)
	}
	for _, a := range busyboxApplets {
		name := "bin/" + a
		if _, ok := seen[name]; ok {
			return nil, fmt.Errorf("/%s is already in a package", name)
		}
		files = append(files, file{name: name, typ: tar.TypeSymlink, mode: 0o777, linkname: "busybox"})
	}
	return files, nil
}

// packageMetadata is what scanners read (osRelease): the os-release and
// each package's control stanza as its dpkg status, marked installed.
func packageMetadata(pkgs []debPackage) ([]file, error) {
	files := []file{{name: osReleasePath, typ: tar.TypeReg, mode: 0o644, data: []byte(osRelease)}}
	names := map[string]bool{}
	for _, p := range pkgs {
		b, err := os.ReadFile(p.controlFile())
		if err != nil {
			return nil, fmt.Errorf("package %s: control: %w", p.nameVersion, err)
		}
		fields := controlFields(b)
		name, version := fields["Package"], fields["Version"]
		if name == "" || version == "" || strings.ContainsAny(name, "/ ") || names[name] {
			return nil, fmt.Errorf("package %s: control %s: want one Package and a Version", p.nameVersion, p.controlFile())
		}
		if want := name + "=" + version; want != p.nameVersion {
			return nil, fmt.Errorf("package %s: its control stanza is %s", p.nameVersion, want)
		}
		names[name] = true
		stanza := strings.TrimRight(string(b), "\n") + "\n"
		if fields["Status"] == "" {
			stanza += "Status: install ok installed\n"
		}
		files = append(files, file{name: dpkgStatusDir + name, typ: tar.TypeReg, mode: 0o644, data: []byte(stanza)})
	}
	return files, nil
}

// controlFields are a control stanza's single-line fields (continuation
// lines, which start with a space, are skipped).
func controlFields(b []byte) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k != "" && !strings.HasPrefix(line, " ") {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// newLayer is an OCI layer (gzip) of files.
func newLayer(files []file, mtime time.Time) (v1.Layer, error) {
	b, err := layerTar(files, mtime)
	if err != nil {
		return nil, err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	return l, nil
}

// writeLayout writes img as the only image of a new OCI image layout at dir
// (removed first), named by its version (org.opencontainers.image.ref.name,
// what `skopeo copy oci:DIR:VERSION` and `crane push DIR` read).
func writeLayout(dir string, img v1.Image, version string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove old layout: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("layout parent: %w", err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("write layout: %w", err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": version})); err != nil {
		return fmt.Errorf("write image to layout: %w", err)
	}
	return nil
}
