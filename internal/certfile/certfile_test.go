package certfile_test

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/slowrank/slowrank/internal/certfile"
	"github.com/slowrank/slowrank/internal/certfile/certtest"
)

func newReloader(t *testing.T, dir string) *certfile.Reloader {
	t.Helper()
	r, err := certfile.New(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), "test certificate", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func serial(t *testing.T, c *tls.Certificate) int64 {
	t.Helper()
	if c == nil || len(c.Certificate) == 0 {
		t.Fatal("no certificate")
	}
	x, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return x.SerialNumber.Int64()
}

// TestHandshakeServesTheRenewedPair: a renewed Secret is served (as a
// server's and as a client's certificate) at the first handshake a second
// after the last check, without a Reload.
func TestHandshakeServesTheRenewedPair(t *testing.T) {
	dir := t.TempDir()
	certtest.Write(t, dir, 1)
	r := newReloader(t, dir)
	if c, _ := r.GetCertificate(nil); serial(t, c) != 1 {
		t.Fatalf("serial %d, want 1", serial(t, c))
	}
	certtest.Write(t, dir, 2)
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, _ := r.GetClientCertificate(nil)
		if serial(t, c) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the renewed pair is not served after 5 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if c, _ := r.GetCertificate(nil); serial(t, c) != 2 || r.Reloads() != 1 || r.Failures() != 0 {
		t.Errorf("serial %d, reloads %d, failures %d; want 2, 1, 0", serial(t, c), r.Reloads(), r.Failures())
	}
}

// TestBadPairKeepsThePreviousCertificate: a half-written renewal does not
// take the certificate away; it is counted, and a bad pair at start is
// an error.
func TestBadPairKeepsThePreviousCertificate(t *testing.T) {
	dir := t.TempDir()
	certtest.Write(t, dir, 1)
	r := newReloader(t, dir)
	before, _ := r.GetCertificate(nil)
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.Reload(); err == nil {
		t.Fatal("a bad pair reloaded")
	}
	if after, _ := r.GetClientCertificate(nil); after != before || r.Failures() != 1 {
		t.Errorf("certificate replaced (%v) or failure not counted (%d)", after != before, r.Failures())
	}
	if _, err := certfile.New(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), "test certificate", nil); err == nil {
		t.Error("New accepted a bad pair")
	}
}
