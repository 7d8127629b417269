package aggregate

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
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

	"go.opentelemetry.io/collector/pdata/plog"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/otel/forward"
	"github.com/slowrank/slowrank/otel/wire"
)

// testCA signs server and client certificates for the tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	file string
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "slowrank-test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	file := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pool: pool, file: file}
}

// issue signs a leaf certificate: a server one for 127.0.0.1 when dns is
// nil, else a client one naming dns (cn as its common name).
func (ca *testCA) issue(t *testing.T, cn string, dns []string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn}, DNSNames: dns,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
	if cn == "server" {
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// writeServerPair writes a server certificate and its key as PEM files.
func (ca *testCA) writeServerPair(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	c := ca.issue(t, "server", nil)
	kb, err := x509.MarshalECPrivateKey(c.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func stepFrom(host string) plog.Logs {
	s := sampleStep()
	s.Host = host
	return wire.EncodeLogs(host, nil, []detector.Step{s}, nil)
}

func TestClientCertificateBindsTheHostItMayClaim(t *testing.T) {
	ca := newTestCA(t)
	certFile, keyFile := ca.writeServerPair(t)
	ts := startServer(t, ServerConfig{TLSCertFile: certFile, TLSKeyFile: keyFile, ClientCAFile: ca.file})
	hostA := ca.issue(t, "ignored-cn", []string{"hostA"})
	byCN := ca.issue(t, "hostC", nil)
	tests := []struct {
		name     string
		cert     tls.Certificate
		claim    string
		rejected int64
	}{
		{"own host from DNS name", hostA, "hostA", 0},
		{"own host from common name", byCN, "hostC", 0},
		{"another host", hostA, "hostB", 1},
		{"common name ignored beside DNS names", hostA, "ignored-cn", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name+"/http", func(t *testing.T) {
			client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
				TLSClientConfig: &tls.Config{RootCAs: ca.pool, Certificates: []tls.Certificate{tt.cert}}}}
			body, _ := plogotlp.NewExportRequestFromLogs(stepFrom(tt.claim)).MarshalProto()
			resp, err := client.Post("https://"+ts.addr+"/v1/logs", "application/x-protobuf", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			out, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			r := plogotlp.NewExportResponse()
			if resp.StatusCode != http.StatusOK || r.UnmarshalProto(out) != nil {
				t.Fatalf("status %d %s", resp.StatusCode, out)
			}
			if got := r.PartialSuccess().RejectedLogRecords(); got != tt.rejected {
				t.Errorf("rejected %d, want %d (%s)", got, tt.rejected, r.PartialSuccess().ErrorMessage())
			}
		})
		t.Run(tt.name+"/grpc", func(t *testing.T) {
			creds := credentials.NewTLS(&tls.Config{RootCAs: ca.pool, Certificates: []tls.Certificate{tt.cert}})
			conn, err := grpc.NewClient(ts.addr, grpc.WithTransportCredentials(creds))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			r, err := plogotlp.NewGRPCClient(conn).Export(context.Background(), plogotlp.NewExportRequestFromLogs(stepFrom(tt.claim)))
			if err != nil {
				t.Fatal(err)
			}
			if got := r.PartialSuccess().RejectedLogRecords(); got != tt.rejected {
				t.Errorf("rejected %d, want %d (%s)", got, tt.rejected, r.PartialSuccess().ErrorMessage())
			}
		})
	}
	if got := ts.srv.Stats().Impersonation; got != 4 {
		t.Errorf("impersonations counted: %d, want 4", got)
	}
	// A topology may not place ranks on another host either.
	topo := detector.Topology{Kind: detector.KindTopology, Job: "j1", Version: 2,
		Ranks: []detector.RankInfo{{Rank: 0, Host: "hostA"}, {Rank: 1, Host: "hostB"}}}
	d := ts.srv.checkHosts(wire.DecodeLogs(wire.EncodeLogs("hostA", []detector.Topology{topo}, nil, nil), wire.Limits{}), []string{"hostA"})
	if len(d.Facts) != 0 || d.Rejected != 1 || !strings.Contains(d.FirstErr.Error(), `"hostB"`) {
		t.Errorf("topology placing a rank on another host: %d facts, %d rejected (%v)", len(d.Facts), d.Rejected, d.FirstErr)
	}
	// Without a client certificate the handshake fails.
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool}}}
	if resp, err := client.Post("https://"+ts.addr+"/v1/logs", "application/x-protobuf", nil); err == nil {
		resp.Body.Close()
		t.Fatalf("request without a client certificate answered %d", resp.StatusCode)
	}
}

func TestExposedListenerWarns(t *testing.T) {
	certFile, keyFile, _ := selfSigned(t)
	tests := []struct {
		name   string
		cfg    ServerConfig
		expect string // "" when no warning is due
	}{
		{"loopback", ServerConfig{Listen: "127.0.0.1:0"}, ""},
		{"all addresses, nothing", ServerConfig{Listen: ":0"}, "without TLS (--tls-cert, --tls-key) and a token"},
		{"all addresses, token only", ServerConfig{Listen: ":0", Token: "t"}, "without TLS"},
		{"all addresses, TLS only", ServerConfig{Listen: ":0", TLSCertFile: certFile, TLSKeyFile: keyFile}, "without a token"},
		{"all addresses, TLS and token", ServerConfig{Listen: ":0", TLSCertFile: certFile, TLSKeyFile: keyFile, Token: "t"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			tt.cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			srv, err := NewServer(tt.cfg, nopIngester{})
			if err != nil {
				t.Fatal(err)
			}
			_ = srv.Shutdown(context.Background())
			warned := strings.Contains(logs.String(), "level=WARN")
			if warned != (tt.expect != "") || !strings.Contains(logs.String(), tt.expect) {
				t.Errorf("log:\n%s\nwant a warning containing %q", logs.String(), tt.expect)
			}
		})
	}
}

type nopIngester struct{}

func (nopIngester) Offer(int64, string, []wire.Fact) error { return nil }

func TestClientIDIsTheCertificateElseTheSource(t *testing.T) {
	tests := []struct {
		name, remote string
		hosts        []string
		want         string
	}{
		{"certificate, whatever the address", "10.0.0.1:4000", []string{"gpu-1", "gpu-1.dc"}, "cert:gpu-1,gpu-1.dc"},
		{"IPv4 address, any port", "10.0.0.1:4001", nil, "addr:10.0.0.1"},
		{"IPv6 /64 is one source", "[2001:db8:0:1:aaaa::7]:4000", nil, "addr:2001:db8:0:1::"},
		{"IPv4-mapped IPv6 is its IPv4", "[::ffff:10.0.0.1]:4000", nil, "addr:10.0.0.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &http.Request{RemoteAddr: tt.remote}
			if got := clientID(r, tt.hosts); got != tt.want {
				t.Errorf("clientID(%s, %v) = %q, want %q", tt.remote, tt.hosts, got, tt.want)
			}
		})
	}
}

// staticCert is a client certificate that is never renewed.
type staticCert struct{ c tls.Certificate }

func (s staticCert) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return &s.c, nil
}
func (staticCert) Failures() int64 { return 0 }

// TestForwarderPresentsItsClientCertificate: slowrank's own agent, given a
// certificate naming its host (--aggregator-cert), is admitted by an
// aggregator that requires one, over gRPC and HTTP; without it, nothing
// it sends gets in.
func TestForwarderPresentsItsClientCertificate(t *testing.T) {
	ca := newTestCA(t)
	certFile, keyFile := ca.writeServerPair(t)
	hostA := staticCert{ca.issue(t, "agent", []string{"hostA"})}
	for _, scheme := range []string{"grpcs://", "https://"} {
		t.Run(scheme, func(t *testing.T) {
			ts := startServer(t, ServerConfig{TLSCertFile: certFile, TLSKeyFile: keyFile, ClientCAFile: ca.file})
			forwardSteps(t, forward.Config{Endpoint: scheme + ts.addr, RootCAs: ca.pool, ClientCert: hostA}, 6)
			ts.waitFacts(t, 6)
			if st := ts.srv.Stats(); st.Impersonation != 0 {
				t.Errorf("stats %+v", st)
			}
			f := forwardSteps(t, forward.Config{Endpoint: scheme + ts.addr, RootCAs: ca.pool, MaxBackoff: 50 * time.Millisecond}, 2)
			for deadline := time.Now().Add(5 * time.Second); f.Stats().Failures == 0 && time.Now().Before(deadline); {
				time.Sleep(20 * time.Millisecond)
			}
			if st := f.Stats(); st.Sent != 0 || st.Failures == 0 {
				t.Fatalf("a forwarder without a certificate got in: %+v", st)
			}
		})
	}
}
