package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// chartDir is the shipped chart.
const chartDir = "../helm/slowrank"

func TestPackageChartIsReproducible(t *testing.T) {
	ch, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	version := appVersion(t, ch)
	a, b := t.TempDir(), t.TempDir()
	pa, err := packageChart(chartDir, a, version, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	// Helm stamps entries with the clock: a second later, the same bytes.
	time.Sleep(1100 * time.Millisecond)
	pb, err := packageChart(chartDir, b, version, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	x, _ := os.ReadFile(pa)
	y, _ := os.ReadFile(pb)
	if !bytes.Equal(x, y) {
		t.Errorf("%s and %s differ", pa, pb)
	}
	if filepath.Base(pa) != "slowrank-"+version+".tgz" {
		t.Errorf("packaged as %s", filepath.Base(pa))
	}
	if _, err := packageChart(chartDir, a, version+"-other", time.Unix(0, 0)); err == nil {
		t.Error("packaged the chart as a version its Chart.yaml does not name")
	}
}

func TestLintChart(t *testing.T) {
	if err := lintChart(chartDir, "slowrank"); err != nil {
		t.Errorf("the shipped chart: %v", err)
	}
	broken := t.TempDir()
	for _, f := range []string{"Chart.yaml", "values.yaml"} {
		b, err := os.ReadFile(filepath.Join(chartDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(broken, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(broken, "templates"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(broken, "templates", "bad.yaml"), []byte("kind: {{ .Values.nope.deeper }}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := lintChart(broken, "slowrank"); err == nil {
		t.Error("a template that fails to render passed lint")
	}
}

// appVersion is Chart.yaml's appVersion.
func appVersion(t *testing.T, chart []byte) string {
	t.Helper()
	for _, l := range bytes.Split(chart, []byte("\n")) {
		if v, ok := bytes.CutPrefix(l, []byte("appVersion:")); ok {
			return string(bytes.Trim(bytes.TrimSpace(v), `"`))
		}
	}
	t.Fatal("no appVersion in Chart.yaml")
	return ""
}
