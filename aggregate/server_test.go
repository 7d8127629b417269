package aggregate

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/internal/certfile/certtest"
	"github.com/slowrank/slowrank/otel/forward"
	"github.com/slowrank/slowrank/otel/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type testServer struct {
	agg  *Aggregator
	srv  *Server
	cap  *capture
	addr string
	stop func()
}

func startServer(t *testing.T, cfg ServerConfig) *testServer {
	t.Helper()
	return startServerWith(t, Config{}, cfg)
}

// startServerWith starts an aggregator with acfg (its detector, sinks and
// stats period set here) behind a server with cfg.
func startServerWith(t *testing.T, acfg Config, cfg ServerConfig) *testServer {
	t.Helper()
	c := &capture{}
	acfg.Detector, acfg.Sinks, acfg.StatsEvery = testDetector(), []Sink{c}, -1
	agg, err := New(acfg)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	srv, err := NewServer(cfg, agg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agg.Run(ctx) }()
	ts := &testServer{agg: agg, srv: srv, cap: c, addr: srv.Addr().String()}
	var stopped bool
	ts.stop = func() {
		if stopped {
			return
		}
		stopped = true
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		if err := srv.Shutdown(sctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}
	t.Cleanup(ts.stop)
	return ts
}

// waitFacts waits until the aggregator has judged n step facts.
func (ts *testServer) waitFacts(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for ts.agg.Stats().Facts < n {
		if time.Now().After(deadline) {
			t.Fatalf("aggregator judged %d facts, want %d (server %+v)", ts.agg.Stats().Facts, n, ts.srv.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func forwardSteps(t *testing.T, cfg forward.Config, n int) *forward.Forwarder {
	t.Helper()
	cfg.HostName = "hostA"
	cfg.FlushInterval = 20 * time.Millisecond
	f, err := forward.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close(context.Background()) })
	now := MonoNow()
	f.Topology(detector.Topology{Kind: detector.KindTopology, Job: "j", Version: 1,
		Ranks: []detector.RankInfo{{Rank: 0}, {Rank: 1, LocalRank: 1}}})
	for i := range n {
		f.Step(detector.Step{Kind: detector.KindStep, Job: "j", Rank: i % 2, Step: int64(i / 2), StartNS: now - 2e6, EndNS: now - 1e6,
			Phases: map[string]float64{detector.PhaseHost: 1 + float64(i%2)}}, 0)
	}
	return f
}

func TestForwarderToServer(t *testing.T) {
	for _, scheme := range []string{"", "grpc://", "http://"} {
		t.Run("scheme="+scheme, func(t *testing.T) {
			ts := startServer(t, ServerConfig{})
			f := forwardSteps(t, forward.Config{Endpoint: scheme + ts.addr}, 20)
			ts.waitFacts(t, 20)
			deadline := time.Now().Add(5 * time.Second)
			for f.Stats().Sent < 21 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond) // the response is on its way
			}
			if st := f.Stats(); st.Sent != 21 || st.Failures != 0 {
				t.Errorf("forwarder %+v", st)
			}
			c := ts.cap
			c.mu.Lock()
			defer c.mu.Unlock()
			if len(c.steps) != 20 || c.steps[0].Host != "hostA" || c.steps[1].Phases[detector.PhaseHost] != 2 {
				t.Fatalf("steps %+v", c.steps)
			}
			// Rebased onto this process's clock: within the last seconds.
			if age := MonoNow() - c.steps[0].EndNS; age < 1e6 || age > int64(5*time.Second) {
				t.Errorf("rebased end is %v ago", time.Duration(age))
			}
		})
	}
}

func TestServerRequiresToken(t *testing.T) {
	ts := startServer(t, ServerConfig{Token: "s3cret"})
	// No token, OTLP/HTTP: 401 before the body is read.
	resp, err := http.Post("http://"+ts.addr+"/v1/logs", "application/x-protobuf", strings.NewReader("junk"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("HTTP without token: %d", resp.StatusCode)
	}
	// Wrong token, OTLP/gRPC: UNAUTHENTICATED, which the forwarder does
	// not retry.
	conn, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = plogotlp.NewGRPCClient(conn).Export(context.Background(), plogotlp.NewExportRequest())
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("gRPC without token: %v", err)
	}
	bad := forwardSteps(t, forward.Config{Endpoint: ts.addr, Token: "wrong"}, 2)
	deadline := time.Now().Add(5 * time.Second)
	for bad.Stats().Dropped[forward.DropRejected] < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if st := bad.Stats(); st.Dropped[forward.DropRejected] != 3 || st.Sent != 0 {
		t.Fatalf("forwarder with a wrong token: %+v", st)
	}
	good := forwardSteps(t, forward.Config{Endpoint: ts.addr, Token: "s3cret"}, 4)
	ts.waitFacts(t, 4)
	if got := ts.srv.Stats().Unauthorized; got < 3 {
		t.Errorf("unauthorized requests counted: %d", got)
	}
	_ = good
}

// selfSigned writes a certificate for 127.0.0.1 and its key.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "slowrank-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

func TestServerTLS(t *testing.T) {
	cert, key, pool := selfSigned(t)
	for _, scheme := range []string{"grpcs://", "https://"} {
		t.Run(scheme, func(t *testing.T) {
			ts := startServer(t, ServerConfig{TLSCertFile: cert, TLSKeyFile: key, Token: "tok"})
			forwardSteps(t, forward.Config{Endpoint: scheme + ts.addr, RootCAs: pool, Token: "tok"}, 6)
			ts.waitFacts(t, 6)
			// Plaintext to a TLS port fails.
			if resp, err := http.Post("http://"+ts.addr+"/v1/logs", "application/x-protobuf", nil); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					t.Fatal("plaintext request accepted by a TLS server")
				}
			}
		})
	}
	// An untrusted certificate is refused by the forwarder.
	ts := startServer(t, ServerConfig{TLSCertFile: cert, TLSKeyFile: key})
	f := forwardSteps(t, forward.Config{Endpoint: "grpcs://" + ts.addr, MaxBackoff: 50 * time.Millisecond}, 2)
	// Poll: under load the first batch and handshake take longer than a
	// fixed sleep.
	for deadline := time.Now().Add(5 * time.Second); f.Stats().Failures == 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if st := f.Stats(); st.Sent != 0 || st.Failures == 0 {
		t.Fatalf("forwarder trusted an unknown certificate: %+v", st)
	}
}

func postLogs(t *testing.T, addr string, body []byte, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/logs", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func TestServerHTTPLimitsAndPartialSuccess(t *testing.T) {
	ts := startServer(t, ServerConfig{MaxRequestBytes: 64 << 10})
	// Too large, declared.
	resp, _ := postLogs(t, ts.addr, make([]byte, 70<<10), nil)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized body: %d", resp.StatusCode)
	}
	// Too large once decompressed (a small gzip bomb).
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	if _, err := zw.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	resp, _ = postLogs(t, ts.addr, zb.Bytes(), map[string]string{"Content-Encoding": "gzip"})
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("gzip bomb: %d", resp.StatusCode)
	}
	// Garbage.
	resp, _ = postLogs(t, ts.addr, []byte("\xff\xff\xff"), nil)
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("garbage: %d", resp.StatusCode)
	}
	// Wrong type.
	resp, _ = postLogs(t, ts.addr, nil, map[string]string{"Content-Type": "text/plain"})
	if resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Fatalf("text/plain: %d", resp.StatusCode)
	}
	// One good and one bad record, gzip: partial success names the reason.
	good, bad := sampleStep(), sampleStep()
	bad.Rank = -1
	ld := wire.EncodeLogs("h1", nil, []detector.Step{good, bad}, nil)
	body, _ := plogotlp.NewExportRequestFromLogs(ld).MarshalProto()
	zb.Reset()
	zw = gzip.NewWriter(&zb)
	if _, err := zw.Write(body); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	resp, out := postLogs(t, ts.addr, zb.Bytes(), map[string]string{"Content-Encoding": "gzip"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("good request: %d %s", resp.StatusCode, out)
	}
	r := plogotlp.NewExportResponse()
	if err := r.UnmarshalProto(out); err != nil {
		t.Fatal(err)
	}
	if r.PartialSuccess().RejectedLogRecords() != 1 || !strings.Contains(r.PartialSuccess().ErrorMessage(), "slowrank.rank") {
		t.Fatalf("partial success %d %q", r.PartialSuccess().RejectedLogRecords(), r.PartialSuccess().ErrorMessage())
	}
	// OTLP/JSON works too.
	js, _ := plogotlp.NewExportRequestFromLogs(wire.EncodeLogs("h1", nil, []detector.Step{good}, nil)).MarshalJSON()
	resp, out = postLogs(t, ts.addr, js, map[string]string{"Content-Type": "application/json"})
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(out), "{") {
		t.Fatalf("json: %d %s", resp.StatusCode, out)
	}
	ts.waitFacts(t, 2)
	// Other paths and methods.
	if resp, err := http.Get("http://" + ts.addr + "/v1/logs"); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if resp, err := http.Get("http://" + ts.addr + "/"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET /: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	st := ts.srv.Stats()
	if st.TooLarge != 2 || st.BadRequests < 3 || st.Rejected != 1 {
		t.Errorf("server stats %+v", st)
	}
}

func TestServerGRPCMessageLimit(t *testing.T) {
	ts := startServer(t, ServerConfig{MaxRequestBytes: 16 << 10})
	conn, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	steps := make([]detector.Step, 200)
	for i := range steps {
		steps[i] = sampleStep()
		steps[i].Step = int64(i)
	}
	_, err = plogotlp.NewGRPCClient(conn).Export(context.Background(),
		plogotlp.NewExportRequestFromLogs(wire.EncodeLogs("h1", nil, steps, nil)))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversized gRPC message: %v", err)
	}
}

func TestServerBindsLoopbackByDefault(t *testing.T) {
	host, _, err := net.SplitHostPort(DefaultListen)
	if err != nil || !net.ParseIP(host).IsLoopback() {
		t.Fatalf("default listen %q is not loopback", DefaultListen)
	}
}

// TestServerServesRenewedCertificate: cert-manager renews the aggregator's
// Secret; the next handshake presents the new certificate, without a
// restart (its agents would otherwise fail when the old one expires).
func TestServerServesRenewedCertificate(t *testing.T) {
	dir := t.TempDir()
	old := certtest.Write(t, dir, 1)
	ts := startServer(t, ServerConfig{TLSCertFile: filepath.Join(dir, "tls.crt"), TLSKeyFile: filepath.Join(dir, "tls.key")})
	handshake := func(ca *x509.Certificate) error {
		pool := x509.NewCertPool()
		pool.AddCert(ca)
		c, err := tls.Dial("tcp", ts.addr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
		if err != nil {
			return err
		}
		return c.Close()
	}
	if err := handshake(old); err != nil {
		t.Fatal(err)
	}
	renewed := certtest.Write(t, dir, 2)
	for deadline := time.Now().Add(5 * time.Second); handshake(renewed) != nil; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the renewed certificate is not served after 5 s")
		}
	}
	if handshake(old) == nil {
		t.Error("the old certificate is still served")
	}
}
