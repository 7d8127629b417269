package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	repo = "ghcr.io/slowrank/slowrank"
	d1   = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	d2   = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
)

const values = `image:
  repository: ghcr.io/slowrank/slowrank
  # A comment that says digest: "x"
  tag: ""
  digest: ""
  pullPolicy: IfNotPresent

# Next.
webhook:
  digest: "keep"
`

const manifest = `# Pin it:
#   image: ghcr.io/slowrank/slowrank:0.1.0@sha256:<digest>
spec:
  initContainers:
    - name: install
      image: ghcr.io/slowrank/slowrank:0.1.0
  containers:
    - image: ghcr.io/slowrank/slowrank:0.0.9@` + d2 + `
      name: agent
    - name: other
      image: nvcr.io/nvidia/pytorch:25.01-py3
`

func write(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestPinWritesTheDigestWhereTheImageIsNamed(t *testing.T) {
	dir := t.TempDir()
	v, m := write(t, dir, "values.yaml", values), write(t, dir, "ds.yaml", manifest)
	if err := pin(d1, repo, "0.1.0", v, []string{m}, true); err == nil {
		t.Fatal("check passed before pinning")
	}
	if err := pin(d1, repo, "0.1.0", v, []string{m}, false); err != nil {
		t.Fatal(err)
	}
	wantValues := strings.Replace(values, "  digest: \"\"", "  digest: \""+d1+"\"", 1)
	if got := read(t, v); got != wantValues {
		t.Errorf("values:\n%s\nwant:\n%s", got, wantValues)
	}
	got := read(t, m)
	if n := strings.Count(got, "image: "+repo+":0.1.0@"+d1+"\n"); n != 2 {
		t.Errorf("manifest pins %d image: lines, want 2:\n%s", n, got)
	}
	for _, keep := range []string{"#   image: ghcr.io/slowrank/slowrank:0.1.0@sha256:<digest>", "image: nvcr.io/nvidia/pytorch:25.01-py3"} {
		if !strings.Contains(got, keep) {
			t.Errorf("manifest lost %q:\n%s", keep, got)
		}
	}
	if err := pin(d1, repo, "0.1.0", v, []string{m}, true); err != nil {
		t.Errorf("check after pinning: %v", err)
	}
	if err := pin(d2, repo, "0.1.0", v, []string{m}, true); err == nil {
		t.Error("check accepted another digest")
	}
	if err := pin(d1, repo, "0.2.0", v, []string{m}, true); err == nil {
		t.Error("check accepted another tag")
	}
	if d, err := pinnedDigest([]byte(read(t, v))); err != nil || d != d1 {
		t.Errorf("pinnedDigest = %q, %v; want %s", d, err, d1)
	}
}

func TestPinRefuses(t *testing.T) {
	for _, c := range []struct {
		name, values, manifest, digest string
	}{
		{"a digest that is not sha256", values, manifest, "sha256:abc"},
		{"values without an image block", "other: 1\n", manifest, d1},
		{"two digest lines", strings.Replace(values, "  pullPolicy", "  digest: \"\"\n  pullPolicy", 1), manifest, d1},
		{"the repository outside an image: line", values, manifest + "  args: [--image=" + repo + "]\n", d1},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			v, m := write(t, dir, "values.yaml", c.values), write(t, dir, "ds.yaml", c.manifest)
			if err := pin(c.digest, repo, "0.1.0", v, []string{m}, false); err == nil {
				t.Error("accepted")
			}
		})
	}
}
