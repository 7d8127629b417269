package admission

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeCert writes a self-signed certificate for 127.0.0.1 with the given
// serial to dir/tls.crt and dir/tls.key, as a Secret's volume holds them.
func writeCert(t *testing.T, dir string, serial int64) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial),
		Subject:               pkix.Name{CommonName: "sr-webhook.slowrank.svc"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	// Written beside and renamed, as the kubelet swaps a Secret's files.
	for name, block := range map[string]*pem.Block{"tls.crt": {Type: "CERTIFICATE", Bytes: der}, "tls.key": {Type: "EC PRIVATE KEY", Bytes: kder}} {
		tmp := filepath.Join(dir, "."+name)
		if err := os.WriteFile(tmp, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// serve starts the webhook's HTTPS server on a loopback port.
func serve(t *testing.T, certs *CertReloader) (*Handler, string) {
	t.Helper()
	h := newTestHandler(t, 0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer("", h, certs)
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	return h, "https://" + ln.Addr().String()
}

// client trusts only ca and opens a new connection per request, so that
// each request sees the certificate served at that moment.
func client(ca *x509.Certificate) *http.Client {
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
}

func TestServeHTTPS(t *testing.T) {
	dir := t.TempDir()
	ca := writeCert(t, dir, 1)
	certs, err := NewCertReloader(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	h, url := serve(t, certs)
	resp, err := client(ca).Post(url+MutatePath, "application/json", strings.NewReader(reviewOf("e2e", bare)))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var rv review
	if err := json.Unmarshal(body, &rv); err != nil || rv.Response == nil {
		t.Fatalf("answer %s: %v", body, err)
	}
	var ops []Op
	if err := json.Unmarshal(rv.Response.Patch, &ops); err != nil {
		t.Fatalf("patch %s: %v", rv.Response.Patch, err)
	}
	if !rv.Response.Allowed || rv.Response.UID != "e2e" || rv.Response.PatchType != "JSONPatch" || len(ops) != 3 {
		t.Errorf("answer %+v, ops %+v", rv.Response, ops)
	}
	if st := h.Stats(); st.Patched != 1 {
		t.Errorf("stats %+v", st)
	}
	hr, err := client(ca).Get(url + HealthPath)
	if err != nil || hr.StatusCode != http.StatusOK {
		t.Fatalf("health: %v %v", hr, err)
	}
	hr.Body.Close()
}

// TestServeReloadsRenewedCertificate: cert-manager renews the Secret; the
// next handshake presents the new certificate without a restart.
func TestServeReloadsRenewedCertificate(t *testing.T) {
	dir := t.TempDir()
	old := writeCert(t, dir, 1)
	certs, err := NewCertReloader(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	_, url := serve(t, certs)
	served := func(ca *x509.Certificate) error {
		r, err := client(ca).Get(url + HealthPath)
		if err == nil {
			r.Body.Close()
		}
		return err
	}
	if err := served(old); err != nil {
		t.Fatal(err)
	}
	renewed := writeCert(t, dir, 2)
	deadline := time.Now().Add(5 * time.Second)
	for served(renewed) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the renewed certificate is not served after 5 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if served(old) == nil {
		t.Error("the old certificate is still served")
	}
}

// TestReloadKeepsCertificateOnBadPair: a half-written renewal does not take
// the webhook's certificate away.
func TestReloadKeepsCertificateOnBadPair(t *testing.T) {
	dir := t.TempDir()
	writeCert(t, dir, 1)
	certs, err := NewCertReloader(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	before, _ := certs.GetCertificate(nil)
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := certs.Reload(); err == nil {
		t.Fatal("a bad pair reloaded")
	}
	if after, _ := certs.GetCertificate(nil); after != before || certs.Failures() != 1 {
		t.Errorf("certificate replaced (%v) or failure not counted (%d)", after != before, certs.Failures())
	}
	if _, err := NewCertReloader(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), nil); err == nil {
		t.Error("NewCertReloader accepted a bad pair")
	}
}
