package admission

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slowrank/slowrank/internal/certfile"
	"github.com/slowrank/slowrank/internal/certfile/certtest"
)

// serve starts the webhook's HTTPS server on a loopback port.
func serve(t *testing.T, certs *certfile.Reloader) (*Handler, string) {
	t.Helper()
	h := newTestHandler(t, 0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer("", h, certs.GetCertificate)
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
	ca := certtest.Write(t, dir, 1)
	certs, err := certfile.New(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), "webhook certificate", slog.New(slog.DiscardHandler))
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
	old := certtest.Write(t, dir, 1)
	certs, err := certfile.New(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), "webhook certificate", slog.New(slog.DiscardHandler))
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
	renewed := certtest.Write(t, dir, 2)
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
