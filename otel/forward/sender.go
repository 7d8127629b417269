package forward

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	grpcgzip "google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/status"
)

// permanentError marks an error that retrying cannot fix.
type permanentError struct{ err error }

func (p permanentError) Error() string { return p.err.Error() }
func (p permanentError) Unwrap() error { return p.err }

func retryable(err error) bool {
	var p permanentError
	return !errors.As(err, &p)
}

// sender is one transport to the aggregator.
type sender interface {
	// send exports req and returns the records the receiver rejected.
	send(ctx context.Context, req plogotlp.ExportRequest) (rejected int64, err error)
	// reset drops the connection after a failure: the next send dials anew.
	reset()
	close() error
}

func newSender(cfg Config) (sender, error) {
	ep := strings.TrimSpace(cfg.Endpoint)
	if ep == "" {
		return nil, fmt.Errorf("%w: empty aggregator endpoint", ErrConfig)
	}
	scheme, rest, hasScheme := strings.Cut(ep, "://")
	if !hasScheme {
		scheme, rest = "grpc", ep
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: cfg.RootCAs}
	if cfg.ClientCert != nil {
		tlsCfg.GetClientCertificate = cfg.ClientCert.GetClientCertificate
	}
	switch scheme {
	case "grpc", "grpcs":
		if _, _, err := net.SplitHostPort(rest); err != nil || strings.Contains(rest, "/") {
			return nil, fmt.Errorf("%w: aggregator endpoint %q: want host:port", ErrConfig, cfg.Endpoint)
		}
		creds := insecure.NewCredentials()
		if scheme == "grpcs" {
			creds = credentials.NewTLS(tlsCfg)
		}
		return &grpcSender{target: rest, creds: creds, token: cfg.Token, tls: scheme == "grpcs", timeout: cfg.Timeout, gzip: !cfg.NoCompression}, nil
	case "http", "https":
		u, err := url.Parse(ep)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("%w: aggregator endpoint %q: not a URL", ErrConfig, cfg.Endpoint)
		}
		if u.Path == "" || u.Path == "/" {
			u.Path = "/v1/logs"
		}
		tr := &http.Transport{TLSClientConfig: tlsCfg, MaxIdleConns: 2, IdleConnTimeout: 90 * time.Second,
			ResponseHeaderTimeout: cfg.Timeout, ForceAttemptHTTP2: true}
		return &httpSender{url: u.String(), token: cfg.Token, client: &http.Client{Transport: tr, Timeout: cfg.Timeout}, tr: tr, gzip: !cfg.NoCompression}, nil
	default:
		return nil, fmt.Errorf("%w: aggregator endpoint %q: scheme must be grpc, grpcs, http or https", ErrConfig, cfg.Endpoint)
	}
}

// grpcSender exports over OTLP/gRPC with pdata's generated client.
type grpcSender struct {
	target  string
	creds   credentials.TransportCredentials
	token   string
	tls     bool
	timeout time.Duration
	gzip    bool

	mu   sync.Mutex
	conn *grpc.ClientConn
}

type bearer struct {
	token string
	tls   bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity is false so that a token also works on a private
// plaintext network; use grpcs:// anywhere else.
func (b bearer) RequireTransportSecurity() bool { return false }

func (g *grpcSender) client() (plogotlp.GRPCClient, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conn == nil {
		opts := []grpc.DialOption{
			grpc.WithTransportCredentials(g.creds),
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
				MinConnectTimeout: g.timeout,
			}),
		}
		if g.token != "" {
			opts = append(opts, grpc.WithPerRPCCredentials(bearer{g.token, g.tls}))
		}
		conn, err := grpc.NewClient(g.target, opts...)
		if err != nil {
			return nil, permanentError{fmt.Errorf("grpc client for %s: %w", g.target, err)}
		}
		g.conn = conn
	}
	return plogotlp.NewGRPCClient(g.conn), nil
}

func (g *grpcSender) send(ctx context.Context, req plogotlp.ExportRequest) (int64, error) {
	c, err := g.client()
	if err != nil {
		return 0, err
	}
	var opts []grpc.CallOption
	if g.gzip {
		opts = append(opts, grpc.UseCompressor(grpcgzip.Name))
	}
	resp, err := c.Export(ctx, req, opts...)
	if err != nil {
		switch status.Code(err) {
		case codes.Canceled, codes.DeadlineExceeded, codes.Unavailable, codes.ResourceExhausted,
			codes.Aborted, codes.OutOfRange, codes.DataLoss, codes.Unknown, codes.Internal:
			return 0, fmt.Errorf("export logs: %w", err)
		default: // InvalidArgument, Unauthenticated, PermissionDenied, Unimplemented, ...
			return 0, permanentError{fmt.Errorf("export logs: %w", err)}
		}
	}
	return resp.PartialSuccess().RejectedLogRecords(), nil
}

func (g *grpcSender) reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conn != nil {
		_ = g.conn.Close()
		g.conn = nil
	}
}

func (g *grpcSender) close() error {
	g.reset()
	return nil
}

// httpSender exports over OTLP/HTTP with protobuf bodies.
type httpSender struct {
	url    string
	token  string
	client *http.Client
	tr     *http.Transport
	gzip   bool
}

// maxResponseBytes bounds what is read of a response.
const maxResponseBytes = 64 << 10

func (h *httpSender) send(ctx context.Context, req plogotlp.ExportRequest) (int64, error) {
	body, err := req.MarshalProto()
	if err != nil {
		return 0, permanentError{fmt.Errorf("marshal logs: %w", err)}
	}
	if h.gzip {
		if body, err = gzipBytes(body); err != nil {
			return 0, permanentError{fmt.Errorf("compress logs: %w", err)}
		}
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return 0, permanentError{fmt.Errorf("build request: %w", err)}
	}
	hr.Header.Set("Content-Type", "application/x-protobuf")
	if h.gzip {
		hr.Header.Set("Content-Encoding", "gzip")
	}
	if h.token != "" {
		hr.Header.Set("Authorization", "Bearer "+h.token)
	}
	resp, err := h.client.Do(hr)
	if err != nil {
		return 0, fmt.Errorf("post logs: %w", err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	switch {
	case resp.StatusCode == http.StatusOK:
		r := plogotlp.NewExportResponse()
		if len(data) > 0 && r.UnmarshalProto(data) == nil {
			return r.PartialSuccess().RejectedLogRecords(), nil
		}
		return 0, nil
	case resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode == http.StatusBadGateway,
		resp.StatusCode == http.StatusServiceUnavailable, resp.StatusCode == http.StatusGatewayTimeout:
		return 0, fmt.Errorf("post logs: HTTP %d: %s", resp.StatusCode, snippet(data))
	default:
		return 0, permanentError{fmt.Errorf("post logs: HTTP %d: %s", resp.StatusCode, snippet(data))}
	}
}

func gzipBytes(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func snippet(b []byte) string {
	if len(b) > 200 {
		b = b[:200]
	}
	return strconv.Quote(string(b))
}

func (h *httpSender) reset() { h.tr.CloseIdleConnections() }

func (h *httpSender) close() error {
	h.tr.CloseIdleConnections()
	return nil
}
