package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"
)

const usage = `usage: release COMMAND [flags]   (deploy/release/README.md)
  image   -o DIR -version V -binary F -library F -deb NAME=VERSION=FSYS.tar ...
  chart   -chart DIR -o DIR -version V
  verify  -layout DIR -version V -binary F -library F
  pin     -values F -manifest F ... -repo R -tag T [-digest D] [-check]
  pinned  -values F`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	err := run(ctx, os.Args[1], os.Args[2:])
	var ue usageError
	switch {
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "release %s: %v\n%s\n", os.Args[1], err, usage)
		os.Exit(2)
	case err != nil:
		fmt.Fprintf(os.Stderr, "release %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

type usageError struct{ error }

// list is a repeatable flag.
type list []string

func (l *list) String() string     { return strings.Join(*l, " ") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

// epoch is SOURCE_DATE_EPOCH (reproducible-builds.org), 0 when unset: every
// file time of the image and the chart. Not the commit time: a commit that
// pins the digest must not change it.
func epoch() (time.Time, error) {
	v := os.Getenv("SOURCE_DATE_EPOCH")
	if v == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	s, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: %w", v, err)
	}
	return time.Unix(s, 0).UTC(), nil
}

func run(ctx context.Context, name string, args []string) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var (
		out       = fs.String("o", "", "output directory")
		version   = fs.String("version", "", "release version (the chart's appVersion)")
		binary    = fs.String("binary", "", "the linux/amd64 slowrank binary")
		library   = fs.String("library", "", "libslowrank_cupti.so")
		chartDir  = fs.String("chart", "", "chart directory")
		layoutDir = fs.String("layout", "", "OCI image layout directory")
		values    = fs.String("values", "", "the chart's values.yaml")
		repo      = fs.String("repo", "", "image repository")
		tag       = fs.String("tag", "", "image tag")
		digest    = fs.String("digest", "", "image digest (default: the one values.yaml pins)")
		check     = fs.Bool("check", false, "report stale files instead of writing them")
		debs      list
		manifests list
	)
	fs.Var(&debs, "deb", "NAME=VERSION=FSYS.tar: a Debian package of the base layer (repeatable)")
	fs.Var(&manifests, "manifest", "a manifest whose image: lines name the repository (repeatable)")
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	need := func(flags ...string) error {
		for _, f := range flags {
			if fs.Lookup(f).Value.String() == "" {
				return usageError{fmt.Errorf("-%s is required", f)}
			}
		}
		return nil
	}
	t, err := epoch()
	if err != nil {
		return err
	}
	switch name {
	case "image":
		if err := need("o", "version", "binary", "library", "deb"); err != nil {
			return err
		}
		spec := imageSpec{version: *version, binary: *binary, library: *library, epoch: t}
		for _, d := range debs {
			i := strings.LastIndex(d, "=")
			if i <= 0 {
				return usageError{fmt.Errorf("-deb %q: want NAME=VERSION=FSYS.tar", d)}
			}
			spec.packages = append(spec.packages, debPackage{nameVersion: d[:i], fsysTar: d[i+1:]})
		}
		img, err := buildImage(spec)
		if err != nil {
			return err
		}
		if err := writeLayout(*out, img, *version); err != nil {
			return err
		}
		d, err := img.Digest()
		if err != nil {
			return fmt.Errorf("image digest: %w", err)
		}
		fmt.Println(d)
		return nil
	case "chart":
		if err := need("chart", "o", "version"); err != nil {
			return err
		}
		if err := lintChart(*chartDir, "slowrank"); err != nil {
			return err
		}
		p, err := packageChart(*chartDir, *out, *version, t)
		if err != nil {
			return err
		}
		fmt.Println(p)
		return nil
	case "verify":
		if err := need("layout", "version", "binary", "library"); err != nil {
			return err
		}
		return verify(ctx, *layoutDir, *version, *binary, *library)
	case "pin":
		if err := need("values", "manifest", "repo", "tag"); err != nil {
			return err
		}
		d := *digest
		if d == "" {
			b, err := os.ReadFile(*values)
			if err != nil {
				return err
			}
			if d, err = pinnedDigest(b); err != nil {
				return err
			}
		}
		return pin(d, *repo, *tag, *values, manifests, *check)
	case "pinned":
		if err := need("values"); err != nil {
			return err
		}
		b, err := os.ReadFile(*values)
		if err != nil {
			return err
		}
		d, err := pinnedDigest(b)
		if err != nil {
			return err
		}
		fmt.Println(d)
		return nil
	}
	return usageError{fmt.Errorf("unknown command %q", name)}
}

// verify checks the image of the layout: its config, its files, and that its
// binary and busybox run (in a chroot of its extracted file system).
func verify(ctx context.Context, dir, version, binary, library string) error {
	img, ref, err := loadLayout(dir)
	if err != nil {
		return err
	}
	if err := checkConfig(img, ref, version); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "slowrank-image-")
	if err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	root := tmp + "/rootfs"
	if err := extract(img, root); err != nil {
		return err
	}
	if err := checkFiles(root, binary, library); err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("image config: %w", err)
	}
	if err := checkScannable(root, cf.Config.Labels[packagesLabel]); err != nil {
		return err
	}
	if err := checkRuns(ctx, root, version); err != nil {
		return err
	}
	d, err := img.Digest()
	if err != nil {
		return fmt.Errorf("image digest: %w", err)
	}
	fmt.Printf("image %s: config, /%s, /%s, the packages scanners see and `slowrank --version` (%s) checked\n", d, binaryPath, libraryPath, version)
	return nil
}
