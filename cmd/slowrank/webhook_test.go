package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/slowrank/slowrank/internal/certfile/certtest"
)

func TestWebhookUsageErrors(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, _ := selfSigned(t, dir)
	base := []string{"webhook", "--listen", "127.0.0.1:0", "--duration", "100ms"}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"no certificate", nil},
		{"no key", []string{"--cert", certFile}},
		{"unreadable certificate", []string{"--cert", filepath.Join(dir, "missing"), "--key", keyFile}},
		{"key of another file", []string{"--cert", certFile, "--key", certFile}},
		{"relative library directory", []string{"--cert", certFile, "--key", keyFile, "--lib-dir", "opt/slowrank/lib"}},
		{"zero request size", []string{"--cert", certFile, "--key", keyFile, "--max-request-bytes", "0"}},
		{"negative stats interval", []string{"--cert", certFile, "--key", keyFile, "--stats-every", "-1s"}},
		{"stdout telemetry", []string{"--cert", certFile, "--key", keyFile, "--otel", "stdout"}},
		{"unknown telemetry mode", []string{"--cert", certFile, "--key", keyFile, "--otel", "sometimes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg, code := runErr(t, nil, append(append([]string(nil), base...), tc.args...)...)
			if code != exitUsage {
				t.Fatalf("exit %d (%s), want %d", code, msg, exitUsage)
			}
			if msg == "" || strings.Contains(msg, "\n") {
				t.Errorf("message %q is not one line", msg)
			}
		})
	}
}

// TestWebhookServesPatch runs `slowrank webhook` and posts the API server's
// review of a labelled pod over HTTPS, as the API server would.
func TestWebhookServesPatch(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, ca := selfSigned(t, dir)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- newApp().RunContext(ctx, []string{"slowrank", "webhook", "--listen", addr, "--cert", certFile, "--key", keyFile,
			"--lib-dir", "/var/lib/sr", "--nccl-plugin", "--otel", "off"})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("webhook: %v", err)
		}
	}()
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	cl := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	review := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1",` +
		`"kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE",` +
		`"object":{"metadata":{"name":"p","labels":{"slowrank.dev/inject":"true"}},"spec":{"containers":[{"name":"t"}]}}}}`
	var resp *http.Response
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err = cl.Post("https://"+addr+"/mutate", "application/json", strings.NewReader(review)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the webhook does not answer: %v", err)
		}
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var rv struct {
		Response struct {
			UID     string `json:"uid"`
			Allowed bool   `json:"allowed"`
			Patch   []byte `json:"patch"`
		} `json:"response"`
	}
	if err := json.Unmarshal(body, &rv); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	for _, want := range []string{`"path":"/spec/volumes"`, `"path":"/var/lib/sr"`, `"mountPath":"/var/lib/sr","readOnly":true`,
		`{"name":"CUDA_INJECTION64_PATH","value":"/var/lib/sr/libslowrank_cupti.so"}`,
		`{"name":"NCCL_PROFILER_PLUGIN","value":"/var/lib/sr/libslowrank_cupti.so"}`} {
		if !strings.Contains(string(rv.Response.Patch), want) {
			t.Errorf("patch %s lacks %s", rv.Response.Patch, want)
		}
	}
	if rv.Response.UID != "u-1" || !rv.Response.Allowed {
		t.Errorf("answer %s", body)
	}
}

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key
// into dir, as a Secret's volume holds them.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	cert = certtest.Write(t, dir, 1)
	return filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), cert
}
