package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
)

// lintChart is `helm lint --strict`: a warning fails as an error does.
func lintChart(dir, namespace string) error {
	l := lint.All(dir, nil, namespace, false)
	var bad []string
	for _, m := range l.Messages {
		if m.Severity >= support.WarningSev {
			bad = append(bad, m.Error())
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("helm lint %s:\n  %s", dir, strings.Join(bad, "\n  "))
	}
	return nil
}

// packageChart is `helm package`: the chart at dir as outDir/NAME-VERSION.tgz,
// which it returns. Its version and appVersion must both be version (the
// image's tag is the appVersion). Helm stamps each entry with the time of
// packaging; they are set to mtime so that the archive is reproducible.
func packageChart(dir, outDir, version string, mtime time.Time) (string, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return "", fmt.Errorf("load chart: %w", err)
	}
	if ch.Metadata.Version != version || ch.Metadata.AppVersion != version {
		return "", fmt.Errorf("chart %s has version %q and appVersion %q, want both %q (deploy/helm/slowrank/Chart.yaml)",
			ch.Name(), ch.Metadata.Version, ch.Metadata.AppVersion, version)
	}
	tmp, err := os.MkdirTemp("", "slowrank-chart-")
	if err != nil {
		return "", fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	saved, err := chartutil.Save(ch, tmp)
	if err != nil {
		return "", fmt.Errorf("package chart: %w", err)
	}
	b, err := os.ReadFile(saved)
	if err != nil {
		return "", fmt.Errorf("read packaged chart: %w", err)
	}
	fixed, err := fixArchiveTimes(b, mtime)
	if err != nil {
		return "", fmt.Errorf("packaged chart: %w", err)
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return "", fmt.Errorf("output dir: %w", err)
	}
	out := filepath.Join(outDir, filepath.Base(saved))
	if err := os.WriteFile(out, fixed, 0o644); err != nil {
		return "", fmt.Errorf("write packaged chart: %w", err)
	}
	// What `helm install` will read: the archive must load as the chart did.
	if _, err := loader.Load(out); err != nil {
		return "", fmt.Errorf("load packaged chart: %w", err)
	}
	return out, nil
}

// fixArchiveTimes rewrites a gzipped tar with every entry's time set to
// mtime, keeping entries, order, contents and the gzip header's extra field
// and comment (Helm's).
func fixArchiveTimes(tgz []byte, mtime time.Time) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		return nil, fmt.Errorf("gunzip: %w", err)
	}
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	zw.Extra = zr.Extra
	zw.Comment = zr.Comment
	tr := tar.NewReader(zr)
	tw := tar.NewWriter(zw)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read tar: %w", err)
		}
		h.ModTime, h.AccessTime, h.ChangeTime = mtime, time.Time{}, time.Time{}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("write tar header %s: %w", h.Name, err)
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return nil, fmt.Errorf("copy %s: %w", h.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("close tar: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("close gzip: %w", err)
	}
	return out.Bytes(), nil
}
