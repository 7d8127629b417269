package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"time"
)

// file is one entry of a layer. name is relative to the root, without a
// leading slash ("usr/local/bin/slowrank").
type file struct {
	name     string
	typ      byte // tar.TypeReg, tar.TypeDir, tar.TypeSymlink or tar.TypeLink
	mode     int64
	linkname string
	data     []byte
}

// layerTar writes files as one tar stream in name order, owned by root, every
// time mtime and the parents of each entry present as directories (0755
// unless listed): nothing of the build machine (file times, owners, umask,
// directory order) reaches the layer, so that its digest depends on the
// files' contents alone.
func layerTar(files []file, mtime time.Time) ([]byte, error) {
	byName := make(map[string]file, len(files))
	for _, f := range files {
		if f.name == "" || path.Clean(f.name) != f.name || strings.HasPrefix(f.name, "/") || strings.HasPrefix(f.name, "../") {
			return nil, fmt.Errorf("layer entry %q: not a clean relative path", f.name)
		}
		if _, dup := byName[f.name]; dup {
			return nil, fmt.Errorf("layer entry %q: given twice", f.name)
		}
		byName[f.name] = f
	}
	for _, f := range files {
		for dir := path.Dir(f.name); dir != "."; dir = path.Dir(dir) {
			if p, ok := byName[dir]; ok {
				if p.typ != tar.TypeDir {
					return nil, fmt.Errorf("layer entry %q: parent %q is not a directory", f.name, dir)
				}
				continue
			}
			byName[dir] = file{name: dir, typ: tar.TypeDir, mode: 0o755}
		}
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	slices.Sort(names)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		f := byName[n]
		h := &tar.Header{
			Typeflag: f.typ,
			Name:     n,
			Linkname: f.linkname,
			Mode:     f.mode,
			ModTime:  mtime,
			Format:   tar.FormatPAX,
		}
		switch f.typ {
		case tar.TypeDir:
			h.Name += "/"
		case tar.TypeReg:
			h.Size = int64(len(f.data))
		case tar.TypeSymlink, tar.TypeLink:
		default:
			return nil, fmt.Errorf("layer entry %q: unsupported type %q", n, f.typ)
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("write tar header %s: %w", n, err)
		}
		if f.typ == tar.TypeReg {
			if _, err := tw.Write(f.data); err != nil {
				return nil, fmt.Errorf("write tar entry %s: %w", n, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("close tar: %w", err)
	}
	return buf.Bytes(), nil
}

// readPackageTar reads the file system tree of a Debian package (the output
// of `dpkg-deb --fsys-tarfile`) as layer entries: names without their "./",
// the package's modes, its regular files, directories and links; owners and
// times are dropped (every file of the packages we ship is root's).
func readPackageTar(r io.Reader) ([]file, error) {
	var files []file
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read package tar: %w", err)
		}
		name := strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
		if name == "" || name == "." {
			continue
		}
		f := file{name: name, typ: h.Typeflag, mode: h.Mode & 0o7777, linkname: h.Linkname}
		switch h.Typeflag {
		case tar.TypeReg:
			if f.data, err = io.ReadAll(tr); err != nil {
				return nil, fmt.Errorf("read package file %s: %w", name, err)
			}
		case tar.TypeLink:
			f.linkname = strings.TrimPrefix(h.Linkname, "./")
		case tar.TypeDir, tar.TypeSymlink:
		default:
			return nil, fmt.Errorf("package entry %s: unsupported type %q", name, h.Typeflag)
		}
		files = append(files, f)
	}
}
