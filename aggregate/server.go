package aggregate

import (
	"compress/gzip"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	_ "google.golang.org/grpc/encoding/gzip" // collectors send gzip by default
	"google.golang.org/grpc/status"
)

// DefaultListen is the receiver's default address: loopback only. Agents on
// other hosts need an explicit --listen (with TLS and a token outside a
// private network).
const DefaultListen = "127.0.0.1:4317"

// Ingester takes decoded facts (the Aggregator).
type Ingester interface {
	Offer(recvMono int64, facts []Fact) error
}

// ServerConfig configures the OTLP receiver.
type ServerConfig struct {
	// Listen is host:port (default DefaultListen). One port serves
	// OTLP/gRPC (HTTP/2, h2c without TLS) and OTLP/HTTP (/v1/logs,
	// /v1/traces; protobuf or JSON, optionally gzip).
	Listen string
	// TLSCertFile and TLSKeyFile enable TLS (both or neither).
	TLSCertFile, TLSKeyFile string
	// Token, when set, must come as "authorization: Bearer <token>" with
	// every request; it is checked before any body is read.
	Token string
	// MaxRequestBytes bounds a request body, compressed and decompressed,
	// and a gRPC message (default 4 MiB).
	MaxRequestBytes int
	// MaxConcurrent bounds the requests being read and decoded at once
	// (default 16); others wait up to 5 s, then get a retryable refusal.
	// Memory for requests is therefore about MaxConcurrent ×
	// MaxRequestBytes × a small decoding factor, whatever the clients do.
	MaxConcurrent int
	// MaxConns bounds open connections (default 4096).
	MaxConns int
	Limits   Limits
	NowMono  func() int64
	Logger   *slog.Logger
}

func (c ServerConfig) withDefaults() ServerConfig {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.MaxRequestBytes <= 0 {
		c.MaxRequestBytes = 4 << 20
	}
	if c.MaxConcurrent <= 0 {
		c.MaxConcurrent = 16
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 4096
	}
	if c.NowMono == nil {
		c.NowMono = MonoNow
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Limits = c.Limits.withDefaults()
	return c
}

// ServerStats are the receiver's counters.
type ServerStats struct {
	Requests     int64 // requests decoded
	Records      int64 // fact records accepted
	Rejected     int64 // records rejected by validation
	Ignored      int64 // records that were not slowrank facts
	Unauthorized int64 // requests without the right token
	TooLarge     int64 // requests over MaxRequestBytes
	BadRequests  int64 // undecodable bodies, wrong method/type
	Busy         int64 // refused: concurrency limit or aggregator queue full
}

// Server is the OTLP receiver in front of an Ingester.
type Server struct {
	cfg   ServerConfig
	log   *slog.Logger
	ing   Ingester
	ln    net.Listener
	http  *http.Server
	grpc  *grpc.Server
	sem   chan struct{}
	auth  []byte // "Bearer <token>", nil without a token
	tls   bool
	stats struct {
		requests, records, rejected, ignored, unauthorized, tooLarge, bad, busy atomic.Int64
	}
	serveErr chan error
	once     sync.Once
}

// NewServer listens on cfg.Listen and starts serving; Shutdown stops it.
func NewServer(cfg ServerConfig, ing Ingester) (*Server, error) {
	if cfg.MaxRequestBytes < 0 || cfg.MaxConcurrent < 0 || cfg.MaxConns < 0 {
		return nil, fmt.Errorf("aggregate server: negative limit (request bytes %d, concurrent %d, connections %d); 0 takes the default",
			cfg.MaxRequestBytes, cfg.MaxConcurrent, cfg.MaxConns)
	}
	cfg = cfg.withDefaults()
	if (cfg.TLSCertFile == "") != (cfg.TLSKeyFile == "") {
		return nil, errors.New("aggregate server: TLS needs both a certificate and a key file")
	}
	s := &Server{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "aggregate-server"),
		ing:      ing,
		sem:      make(chan struct{}, cfg.MaxConcurrent),
		serveErr: make(chan error, 1),
	}
	if cfg.Token != "" {
		s.auth = []byte("Bearer " + cfg.Token)
	}
	var tlsCfg *tls.Config
	if cfg.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("load TLS certificate: %w", err)
		}
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}
		s.tls = true
	}
	s.grpc = grpc.NewServer(grpc.MaxRecvMsgSize(cfg.MaxRequestBytes), grpc.MaxSendMsgSize(1<<20))
	plogotlp.RegisterGRPCServer(s.grpc, &logsService{s: s})
	ptraceotlp.RegisterGRPCServer(s.grpc, &tracesService{s: s})

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	ln = &limitListener{Listener: ln, sem: make(chan struct{}, cfg.MaxConns), closed: make(chan struct{})}
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
	}
	s.ln = ln
	var protos http.Protocols
	protos.SetHTTP1(true)
	if tlsCfg != nil {
		protos.SetHTTP2(true)
	} else {
		protos.SetUnencryptedHTTP2(true)
	}
	s.http = &http.Server{
		Handler:           s,
		Protocols:         &protos,
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: 8, MaxReceiveBufferPerStream: 1 << 20},
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	if tlsCfg != nil {
		s.http.TLSConfig = tlsCfg
	}
	go func() { s.serveErr <- s.http.Serve(ln) }()
	s.log.Info("OTLP receiver listening", "addr", ln.Addr().String(), "tls", s.tls, "token", s.auth != nil,
		"max_request_bytes", cfg.MaxRequestBytes)
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Shutdown stops accepting, waits for requests in flight within ctx and
// closes every connection.
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	s.once.Do(func() {
		err = s.http.Shutdown(ctx)
		if err != nil {
			_ = s.http.Close()
		}
		s.grpc.Stop()
		if e := <-s.serveErr; e != nil && !errors.Is(e, http.ErrServerClosed) && err == nil {
			err = e
		}
	})
	return err
}

// Stats returns the receiver's counters.
func (s *Server) Stats() ServerStats {
	return ServerStats{
		Requests: s.stats.requests.Load(), Records: s.stats.records.Load(), Rejected: s.stats.rejected.Load(),
		Ignored: s.stats.ignored.Load(), Unauthorized: s.stats.unauthorized.Load(), TooLarge: s.stats.tooLarge.Load(),
		BadRequests: s.stats.bad.Load(), Busy: s.stats.busy.Load(),
	}
}

func (s *Server) authorized(r *http.Request) bool {
	if s.auth == nil {
		return true
	}
	got := r.Header.Get("Authorization")
	return subtle.ConstantTimeCompare([]byte(got), s.auth) == 1
}

// acquire takes a concurrency slot, waiting at most 5 s.
func (s *Server) acquire(ctx context.Context) bool {
	select {
	case s.sem <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case s.sem <- struct{}{}:
		return true
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
}

func (s *Server) release() { <-s.sem }

// ServeHTTP routes gRPC (HTTP/2, application/grpc) to the gRPC server and
// everything else to the OTLP/HTTP handlers, after the token check and the
// concurrency limit, so that nobody makes the server read a body without
// the token.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	isGRPC := r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc")
	if !s.authorized(r) {
		s.stats.unauthorized.Add(1)
		if isGRPC {
			grpcRefuse(w, codes.Unauthenticated, "missing or wrong bearer token")
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="slowrank"`)
		http.Error(w, "missing or wrong bearer token", http.StatusUnauthorized)
		return
	}
	if !s.acquire(r.Context()) {
		s.stats.busy.Add(1)
		if isGRPC {
			grpcRefuse(w, codes.Unavailable, "aggregator busy: retry")
			return
		}
		w.Header().Set("Retry-After", "1")
		http.Error(w, "aggregator busy: retry", http.StatusServiceUnavailable)
		return
	}
	defer s.release()
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(30 * time.Second))
	if isGRPC {
		s.grpc.ServeHTTP(w, r)
		return
	}
	s.serveOTLPHTTP(w, r)
}

// grpcRefuse answers a gRPC call with a trailers-only error response.
func grpcRefuse(w http.ResponseWriter, code codes.Code, msg string) {
	w.Header().Set("Content-Type", "application/grpc")
	w.Header().Set("Grpc-Status", fmt.Sprint(int(code)))
	w.Header().Set("Grpc-Message", msg)
	w.WriteHeader(http.StatusOK)
}

func (s *Server) serveOTLPHTTP(w http.ResponseWriter, r *http.Request) {
	var signal string
	switch r.URL.Path {
	case "/v1/logs":
		signal = "logs"
	case "/v1/traces":
		signal = "traces"
	default:
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodPost {
		s.stats.bad.Add(1)
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "use POST", http.StatusMethodNotAllowed)
		return
	}
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct != "application/x-protobuf" && ct != "application/json" {
		s.stats.bad.Add(1)
		http.Error(w, "content type must be application/x-protobuf or application/json", http.StatusUnsupportedMediaType)
		return
	}
	body, err := s.readBody(w, r)
	if err != nil {
		if errors.Is(err, errTooLarge) {
			s.stats.tooLarge.Add(1)
			http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
		} else {
			s.stats.bad.Add(1)
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
		return
	}
	var d Decoded
	var resp interface {
		MarshalProto() ([]byte, error)
		MarshalJSON() ([]byte, error)
	}
	if signal == "logs" {
		req := plogotlp.NewExportRequest()
		if ct == "application/json" {
			err = req.UnmarshalJSON(body)
		} else {
			err = req.UnmarshalProto(body)
		}
		if err == nil {
			d = DecodeLogs(req.Logs(), s.cfg.Limits)
			r := plogotlp.NewExportResponse()
			if d.Rejected > 0 {
				r.PartialSuccess().SetRejectedLogRecords(int64(d.Rejected))
				r.PartialSuccess().SetErrorMessage(d.FirstErr.Error())
			}
			resp = r
		}
	} else {
		req := ptraceotlp.NewExportRequest()
		if ct == "application/json" {
			err = req.UnmarshalJSON(body)
		} else {
			err = req.UnmarshalProto(body)
		}
		if err == nil {
			d = DecodeTraces(req.Traces(), s.cfg.Limits)
			r := ptraceotlp.NewExportResponse()
			if d.Rejected > 0 {
				r.PartialSuccess().SetRejectedSpans(int64(d.Rejected))
				r.PartialSuccess().SetErrorMessage(d.FirstErr.Error())
			}
			resp = r
		}
	}
	if err != nil {
		s.stats.bad.Add(1)
		http.Error(w, "undecodable OTLP request: "+err.Error(), http.StatusBadRequest)
		return
	}
	if err := s.ingest(d); err != nil {
		w.Header().Set("Retry-After", "1")
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	var out []byte
	if ct == "application/json" {
		out, err = resp.MarshalJSON()
	} else {
		out, err = resp.MarshalProto()
	}
	if err != nil {
		http.Error(w, "encode response", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", ct)
	_, _ = w.Write(out)
}

var errTooLarge = errors.New("request body too large")

// readBody reads at most MaxRequestBytes, after gzip decompression too.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	limit := int64(s.cfg.MaxRequestBytes)
	if r.ContentLength > limit {
		return nil, fmt.Errorf("%w: %d bytes (limit %d)", errTooLarge, r.ContentLength, limit)
	}
	var src io.Reader = http.MaxBytesReader(w, r.Body, limit)
	switch enc := strings.ToLower(r.Header.Get("Content-Encoding")); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(src)
		if err != nil {
			return nil, wrapTooLarge(fmt.Errorf("gzip body: %w", err))
		}
		defer zr.Close()
		src = zr
	default:
		return nil, fmt.Errorf("unsupported content encoding %q", enc)
	}
	body, err := io.ReadAll(io.LimitReader(src, limit+1))
	if err != nil {
		return nil, wrapTooLarge(fmt.Errorf("read body: %w", err))
	}
	if int64(len(body)) > limit {
		return nil, fmt.Errorf("%w: more than %d bytes decompressed", errTooLarge, limit)
	}
	return body, nil
}

func wrapTooLarge(err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return fmt.Errorf("%w: %w", errTooLarge, err)
	}
	return err
}

// ingest counts a decoded request and hands its facts to the aggregator.
func (s *Server) ingest(d Decoded) error {
	s.stats.requests.Add(1)
	s.stats.rejected.Add(int64(d.Rejected))
	s.stats.ignored.Add(int64(d.Ignored))
	if d.Rejected > 0 {
		s.log.Debug("records rejected", "count", d.Rejected, "first", d.FirstErr)
	}
	if err := s.ing.Offer(s.cfg.NowMono(), d.Facts); err != nil {
		s.stats.busy.Add(1)
		return err
	}
	s.stats.records.Add(int64(len(d.Facts)))
	return nil
}

type logsService struct {
	plogotlp.UnimplementedGRPCServer
	s *Server
}

func (l *logsService) Export(_ context.Context, req plogotlp.ExportRequest) (plogotlp.ExportResponse, error) {
	d := DecodeLogs(req.Logs(), l.s.cfg.Limits)
	if err := l.s.ingest(d); err != nil {
		return plogotlp.NewExportResponse(), status.Error(codes.Unavailable, err.Error())
	}
	resp := plogotlp.NewExportResponse()
	if d.Rejected > 0 {
		resp.PartialSuccess().SetRejectedLogRecords(int64(d.Rejected))
		resp.PartialSuccess().SetErrorMessage(d.FirstErr.Error())
	}
	return resp, nil
}

type tracesService struct {
	ptraceotlp.UnimplementedGRPCServer
	s *Server
}

func (t *tracesService) Export(_ context.Context, req ptraceotlp.ExportRequest) (ptraceotlp.ExportResponse, error) {
	d := DecodeTraces(req.Traces(), t.s.cfg.Limits)
	if err := t.s.ingest(d); err != nil {
		return ptraceotlp.NewExportResponse(), status.Error(codes.Unavailable, err.Error())
	}
	resp := ptraceotlp.NewExportResponse()
	if d.Rejected > 0 {
		resp.PartialSuccess().SetRejectedSpans(int64(d.Rejected))
		resp.PartialSuccess().SetErrorMessage(d.FirstErr.Error())
	}
	return resp, nil
}

// limitListener bounds the open connections: Accept waits for a free slot.
type limitListener struct {
	net.Listener
	sem    chan struct{}
	closed chan struct{}
	once   sync.Once
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
