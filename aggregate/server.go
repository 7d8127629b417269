package aggregate

import (
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"os"
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

	"github.com/slowrank/slowrank/internal/certfile"
	"github.com/slowrank/slowrank/otel/wire"
)

// DefaultListen is the receiver's default address: loopback only. Agents on
// other hosts need an explicit --listen (with TLS and a token outside a
// private network).
const DefaultListen = "127.0.0.1:4317"

// Ingester takes decoded facts (the Aggregator) with the identity of the
// client that sent them (see clientID), whose quotas they are charged to.
type Ingester interface {
	Offer(recvMono int64, client string, facts []wire.Fact) error
}

// ServerConfig configures the OTLP receiver.
type ServerConfig struct {
	// Listen is host:port (default DefaultListen). One port serves
	// OTLP/gRPC (HTTP/2, h2c without TLS) and OTLP/HTTP (/v1/logs,
	// /v1/traces; protobuf or JSON, optionally gzip).
	Listen string
	// TLSCertFile and TLSKeyFile enable TLS (both or neither).
	TLSCertFile, TLSKeyFile string
	// ClientCAFile, with TLS, requires every client to present a
	// certificate signed by one of these CAs, and binds the host names a
	// client may claim (slowrank.host, a topology's rank hosts) to the DNS
	// names of its certificate (its common name when it has none).
	ClientCAFile string
	// Token, when set, must come as "authorization: Bearer <token>" with
	// every request; it is checked before any body is read.
	Token string
	// MaxRequestBytes bounds a request body, compressed and decompressed,
	// and a gRPC message (default 4 MiB).
	MaxRequestBytes int
	// MaxConcurrent bounds the requests decoded at once (default 16);
	// others wait up to 5 s, then get a retryable refusal. A body is read
	// whole before it waits for a slot, so slow senders hold no slot.
	MaxConcurrent int
	// MaxMemory bounds the bytes of request bodies held at once, being
	// read or waiting for a decoding slot (default 256 MiB, at least
	// MaxRequestBytes): a body that does not fit is refused at once
	// (retryable). Decoding adds about MaxConcurrent × MaxRequestBytes ×
	// a small factor.
	MaxMemory int64
	// MaxConns bounds open connections (default 4096); MaxConnsPerSource
	// those of one source address (an IPv6 /64 counts as one; default
	// 64): a connection beyond it is closed at once. When all MaxConns are
	// open, a new connection evicts one of the source that holds the most,
	// if that holds more than the newcomer's source (see limitListener).
	MaxConns, MaxConnsPerSource int
	// MinBodyRate is the slowest a body may arrive, in bytes per second,
	// after BodyGrace (defaults 64 KiB/s and 5 s): a slower one is cut
	// (408) and its connection closed.
	MinBodyRate int
	BodyGrace   time.Duration
	Limits      wire.Limits
	NowMono     func() int64
	Logger      *slog.Logger
}

// Timeouts of a connection: the headers of a request must arrive within
// readHeaderTimeout; an idle keep-alive connection is closed after
// idleTimeout (agents send every 200 ms while they have facts).
const (
	readHeaderTimeout = 5 * time.Second
	idleTimeout       = 30 * time.Second
	slotWait          = 5 * time.Second
)

func (c ServerConfig) withDefaults() ServerConfig {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = 4 << 20
	}
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = 16
	}
	if c.MaxMemory == 0 {
		c.MaxMemory = max(256<<20, int64(c.MaxRequestBytes))
	}
	if c.MaxConns == 0 {
		c.MaxConns = 4096
	}
	if c.MaxConnsPerSource == 0 {
		c.MaxConnsPerSource = min(64, c.MaxConns)
	}
	if c.MinBodyRate == 0 {
		c.MinBodyRate = 64 << 10
	}
	if c.BodyGrace == 0 {
		c.BodyGrace = 5 * time.Second
	}
	if c.NowMono == nil {
		c.NowMono = MonoNow
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.Limits = c.Limits.WithDefaults()
	return c
}

// check refuses negative limits and a memory budget that cannot hold one
// request; 0 takes the default.
func (c ServerConfig) check() error {
	if c.MaxRequestBytes < 0 || c.MaxConcurrent < 0 || c.MaxConns < 0 || c.MaxConnsPerSource < 0 ||
		c.MaxMemory < 0 || c.MinBodyRate < 0 || c.BodyGrace < 0 {
		return fmt.Errorf("aggregate server: negative limit (request bytes %d, concurrent %d, memory %d, connections %d, per source %d, body rate %d, grace %s); 0 takes the default",
			c.MaxRequestBytes, c.MaxConcurrent, c.MaxMemory, c.MaxConns, c.MaxConnsPerSource, c.MinBodyRate, c.BodyGrace)
	}
	d := c.withDefaults()
	if d.MaxMemory < int64(d.MaxRequestBytes) {
		return fmt.Errorf("aggregate server: memory budget %d is below one request (%d bytes)", d.MaxMemory, d.MaxRequestBytes)
	}
	if d.MaxConnsPerSource > d.MaxConns {
		return fmt.Errorf("aggregate server: %d connections per source is more than %d in all", d.MaxConnsPerSource, d.MaxConns)
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return errors.New("aggregate server: TLS needs both a certificate and a key file")
	}
	if c.ClientCAFile != "" && c.TLSCertFile == "" {
		return errors.New("aggregate server: client certificates need TLS (a certificate and a key file)")
	}
	return nil
}

// ServerStats are the receiver's counters.
type ServerStats struct {
	Requests      int64 // requests decoded
	Records       int64 // fact records accepted
	Rejected      int64 // records rejected by validation
	Ignored       int64 // records that were not slowrank facts
	Unauthorized  int64 // requests without the right token
	TooLarge      int64 // requests over MaxRequestBytes
	BadRequests   int64 // undecodable bodies, wrong method/type
	Busy          int64 // refused: concurrency limit, memory budget or aggregator queue full
	SlowBodies    int64 // bodies cut for arriving below MinBodyRate
	RefusedConns  int64 // connections closed at once: their source had MaxConnsPerSource, or all were taken and no source held more
	EvictedConns  int64 // connections closed to make room, all being taken, for a source that held fewer
	Impersonation int64 // records naming a host their client certificate does not
	// CertReloadFailures counts renewed TLS certificates that failed to
	// load (the previous one is still served).
	CertReloadFailures int64
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
	mem   budget
	auth  []byte // "Bearer <token>", nil without a token
	tls   bool
	mtls  bool               // client certificates name the hosts a client may claim
	certs *certfile.Reloader // the TLS certificate, nil without TLS
	stats struct {
		requests, records, rejected, ignored, unauthorized, tooLarge, bad, busy atomic.Int64
		slow, impersonation                                                     atomic.Int64
	}
	conns    *limitListener
	serveErr chan error
	once     sync.Once
}

// NewServer listens on cfg.Listen and starts serving; Shutdown stops it.
func NewServer(cfg ServerConfig, ing Ingester) (*Server, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Server{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "aggregate-server"),
		ing:      ing,
		sem:      make(chan struct{}, cfg.MaxConcurrent),
		mem:      budget{limit: cfg.MaxMemory},
		serveErr: make(chan error, 1),
	}
	if cfg.Token != "" {
		s.auth = []byte("Bearer " + cfg.Token)
	}
	tlsCfg, certs, err := serverTLS(cfg, s.log)
	if err != nil {
		return nil, err
	}
	s.certs = certs
	s.tls, s.mtls = tlsCfg != nil, cfg.ClientCAFile != ""
	s.grpc = grpc.NewServer(grpc.MaxRecvMsgSize(cfg.MaxRequestBytes), grpc.MaxSendMsgSize(1<<20))
	plogotlp.RegisterGRPCServer(s.grpc, &logsService{s: s})
	ptraceotlp.RegisterGRPCServer(s.grpc, &tracesService{s: s})

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	s.conns = newLimitListener(ln, cfg.MaxConns, cfg.MaxConnsPerSource)
	ln = s.conns
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
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       idleTimeout,
		ConnState:         trackConnState,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		TLSConfig:         tlsCfg,
	}
	go func() { s.serveErr <- s.http.Serve(ln) }()
	s.log.Info("OTLP receiver listening", "addr", ln.Addr().String(), "tls", s.tls, "client_certs", s.mtls,
		"token", s.auth != nil, "max_request_bytes", cfg.MaxRequestBytes)
	s.warnExposure()
	return s, nil
}

// serverTLS builds the TLS configuration (nil without TLS) and the
// certificate's reloader, which follows a renewed Secret without a restart;
// with a client CA every client must present a certificate it signed.
func serverTLS(cfg ServerConfig, log *slog.Logger) (*tls.Config, *certfile.Reloader, error) {
	if cfg.TLSCertFile == "" {
		return nil, nil, nil
	}
	certs, err := certfile.New(cfg.TLSCertFile, cfg.TLSKeyFile, "aggregator certificate", log)
	if err != nil {
		return nil, nil, err
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.GetCertificate, NextProtos: []string{"h2", "http/1.1"}}
	if cfg.ClientCAFile != "" {
		pem, err := os.ReadFile(cfg.ClientCAFile)
		if err != nil {
			return nil, nil, fmt.Errorf("client CA: %w", err)
		}
		c.ClientCAs = x509.NewCertPool()
		if !c.ClientCAs.AppendCertsFromPEM(pem) {
			return nil, nil, fmt.Errorf("client CA: no PEM certificate in %s", cfg.ClientCAFile)
		}
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return c, certs, nil
}

// warnExposure warns when the receiver listens beyond loopback without TLS
// or without a token: anyone who reaches the port can then feed (or read
// the traffic of) every job.
func (s *Server) warnExposure() {
	addr, ok := s.ln.Addr().(*net.TCPAddr)
	if !ok || addr.IP.IsLoopback() {
		return
	}
	var missing []string
	if !s.tls {
		missing = append(missing, "TLS (--tls-cert, --tls-key)")
	}
	if s.auth == nil && !s.mtls {
		missing = append(missing, "a token (--token-file) or client certificates (--tls-client-ca)")
	}
	if len(missing) > 0 {
		s.log.Warn("OTLP receiver listens beyond loopback without "+strings.Join(missing, " and ")+
			": anyone who reaches it can send facts for any host and job", "addr", addr.String())
	}
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
		BadRequests: s.stats.bad.Load(), Busy: s.stats.busy.Load(), SlowBodies: s.stats.slow.Load(),
		RefusedConns: s.conns.refused.Load(), EvictedConns: s.conns.evicted.Load(), Impersonation: s.stats.impersonation.Load(),
		CertReloadFailures: s.certReloadFailures(),
	}
}

func (s *Server) certReloadFailures() int64 {
	if s.certs == nil {
		return 0
	}
	return s.certs.Failures()
}

func (s *Server) authorized(r *http.Request) bool {
	if s.auth == nil {
		return true
	}
	got := r.Header.Get("Authorization")
	return subtle.ConstantTimeCompare([]byte(got), s.auth) == 1
}

// acquire takes a decoding slot, waiting at most slotWait.
func (s *Server) acquire(ctx context.Context) bool {
	select {
	case s.sem <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(slotWait)
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

// refusal is an answer before decoding: the HTTP status, the gRPC code and
// whether the connection is closed after it. A client that sent no token,
// too much or too slowly gets no second request on its connection, so that
// idle refused connections cannot hold the connection slots.
type refusal struct {
	status int
	code   codes.Code
	msg    string
	close  bool
}

func (s *Server) refuse(w http.ResponseWriter, isGRPC bool, rf refusal) {
	if rf.close {
		// HTTP/1.1 closes after the answer; HTTP/2 sends GOAWAY and closes
		// once the connection's other streams are done.
		w.Header().Set("Connection", "close")
	}
	if isGRPC {
		grpcRefuse(w, rf.code, rf.msg)
		return
	}
	switch rf.status {
	case http.StatusUnauthorized:
		w.Header().Set("WWW-Authenticate", `Bearer realm="slowrank"`)
	case http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", "1")
	}
	http.Error(w, rf.msg, rf.status)
}

// ServeHTTP checks the token, reads the body whole (bounded in size, rate
// and memory), and only then takes a decoding slot and hands the request
// to the gRPC server or the OTLP/HTTP decoder: nobody makes the server read
// a body without the token, and a slow body holds no decoding slot.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	isGRPC := r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc")
	if !s.authorized(r) {
		s.stats.unauthorized.Add(1)
		s.refuse(w, isGRPC, refusal{http.StatusUnauthorized, codes.Unauthenticated, "missing or wrong bearer token", true})
		return
	}
	var req otlpRequest
	limit := int64(s.cfg.MaxRequestBytes)
	if isGRPC {
		// The gRPC frame: 5 bytes of header, and a compressed message may
		// be a little larger than its content.
		limit += limit/64 + 1024
	} else {
		var rf *refusal
		if req, rf = parseOTLPHTTP(r); rf != nil {
			s.stats.bad.Add(1)
			s.refuse(w, false, *rf)
			return
		}
	}
	body, done, err := s.readBody(w, r, limit)
	defer done()
	if err != nil {
		s.refuse(w, isGRPC, s.bodyRefusal(err))
		return
	}
	if !s.acquire(r.Context()) {
		s.stats.busy.Add(1)
		s.refuse(w, isGRPC, refusal{http.StatusServiceUnavailable, codes.Unavailable, "aggregator busy: retry", false})
		return
	}
	defer s.release()
	cl := client{hosts: clientHosts(r)}
	cl.id = clientID(r, cl.hosts)
	if isGRPC {
		r.Body = io.NopCloser(bytes.NewReader(body))
		s.grpc.ServeHTTP(w, r.WithContext(withClient(r.Context(), cl)))
		return
	}
	s.serveOTLPHTTP(w, req, body, cl)
}

// grpcRefuse answers a gRPC call with a trailers-only error response.
func grpcRefuse(w http.ResponseWriter, code codes.Code, msg string) {
	w.Header().Set("Content-Type", "application/grpc")
	w.Header().Set("Grpc-Status", fmt.Sprint(int(code)))
	w.Header().Set("Grpc-Message", msg)
	w.WriteHeader(http.StatusOK)
}

// otlpRequest is what the headers of an OTLP/HTTP request say.
type otlpRequest struct {
	traces bool   // /v1/traces, else /v1/logs
	ct     string // application/x-protobuf or application/json
	gzip   bool
}

// parseOTLPHTTP checks path, method and encodings before any body is read.
func parseOTLPHTTP(r *http.Request) (otlpRequest, *refusal) {
	var req otlpRequest
	switch r.URL.Path {
	case "/v1/logs":
	case "/v1/traces":
		req.traces = true
	default:
		return req, &refusal{http.StatusNotFound, codes.Unimplemented, "404 page not found", false}
	}
	if r.Method != http.MethodPost {
		return req, &refusal{http.StatusMethodNotAllowed, codes.Unimplemented, "use POST", false}
	}
	req.ct, _, _ = mime.ParseMediaType(r.Header.Get("Content-Type"))
	if req.ct != "application/x-protobuf" && req.ct != "application/json" {
		return req, &refusal{http.StatusUnsupportedMediaType, codes.InvalidArgument,
			"content type must be application/x-protobuf or application/json", true}
	}
	switch enc := strings.ToLower(r.Header.Get("Content-Encoding")); enc {
	case "", "identity":
	case "gzip":
		req.gzip = true
	default:
		return req, &refusal{http.StatusUnsupportedMediaType, codes.InvalidArgument, fmt.Sprintf("unsupported content encoding %q", enc), true}
	}
	return req, nil
}

// marshaler is an OTLP export response.
type marshaler interface {
	MarshalProto() ([]byte, error)
	MarshalJSON() ([]byte, error)
}

func (s *Server) serveOTLPHTTP(w http.ResponseWriter, req otlpRequest, body []byte, cl client) {
	if req.gzip {
		var err error
		if body, err = gunzip(body, int64(s.cfg.MaxRequestBytes)); err != nil {
			s.refuse(w, false, s.bodyRefusal(err))
			return
		}
	}
	d, resp, err := s.decodeOTLPHTTP(req, body, cl.hosts)
	if err != nil {
		s.stats.bad.Add(1)
		s.refuse(w, false, refusal{http.StatusBadRequest, codes.InvalidArgument, "undecodable OTLP request: " + err.Error(), true})
		return
	}
	if err := s.ingest(cl.id, d); err != nil {
		s.refuse(w, false, refusal{http.StatusServiceUnavailable, codes.Unavailable, err.Error(), false})
		return
	}
	var out []byte
	if req.ct == "application/json" {
		out, err = resp.MarshalJSON()
	} else {
		out, err = resp.MarshalProto()
	}
	if err != nil {
		http.Error(w, "encode response", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", req.ct)
	_, _ = w.Write(out)
}

// decodeOTLPHTTP unmarshals and decodes a logs or traces request and builds
// its response (partial success when records were rejected).
func (s *Server) decodeOTLPHTTP(req otlpRequest, body []byte, hosts []string) (wire.Decoded, marshaler, error) {
	unmarshal := func(u interface {
		UnmarshalProto([]byte) error
		UnmarshalJSON([]byte) error
	}) error {
		if req.ct == "application/json" {
			return u.UnmarshalJSON(body)
		}
		return u.UnmarshalProto(body)
	}
	if req.traces {
		r := ptraceotlp.NewExportRequest()
		if err := unmarshal(r); err != nil {
			return wire.Decoded{}, nil, err
		}
		d := s.checkHosts(wire.DecodeTraces(r.Traces(), s.cfg.Limits), hosts)
		return d, tracesResponse(d), nil
	}
	r := plogotlp.NewExportRequest()
	if err := unmarshal(r); err != nil {
		return wire.Decoded{}, nil, err
	}
	d := s.checkHosts(wire.DecodeLogs(r.Logs(), s.cfg.Limits), hosts)
	return d, logsResponse(d), nil
}

func logsResponse(d wire.Decoded) plogotlp.ExportResponse {
	r := plogotlp.NewExportResponse()
	if d.Rejected > 0 {
		r.PartialSuccess().SetRejectedLogRecords(int64(d.Rejected))
		r.PartialSuccess().SetErrorMessage(d.FirstErr.Error())
	}
	return r
}

func tracesResponse(d wire.Decoded) ptraceotlp.ExportResponse {
	r := ptraceotlp.NewExportResponse()
	if d.Rejected > 0 {
		r.PartialSuccess().SetRejectedSpans(int64(d.Rejected))
		r.PartialSuccess().SetErrorMessage(d.FirstErr.Error())
	}
	return r
}

// ingest counts a decoded request and hands its facts to the aggregator,
// charged to client.
func (s *Server) ingest(client string, d wire.Decoded) error {
	s.stats.requests.Add(1)
	s.stats.rejected.Add(int64(d.Rejected))
	s.stats.ignored.Add(int64(d.Ignored))
	if d.Rejected > 0 {
		s.log.Debug("records rejected", "count", d.Rejected, "first", d.FirstErr)
	}
	if err := s.ing.Offer(s.cfg.NowMono(), client, d.Facts); err != nil {
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

func (l *logsService) Export(ctx context.Context, req plogotlp.ExportRequest) (plogotlp.ExportResponse, error) {
	cl := clientOf(ctx)
	d := l.s.checkHosts(wire.DecodeLogs(req.Logs(), l.s.cfg.Limits), cl.hosts)
	if err := l.s.ingest(cl.id, d); err != nil {
		return plogotlp.NewExportResponse(), status.Error(codes.Unavailable, err.Error())
	}
	return logsResponse(d), nil
}

type tracesService struct {
	ptraceotlp.UnimplementedGRPCServer
	s *Server
}

func (t *tracesService) Export(ctx context.Context, req ptraceotlp.ExportRequest) (ptraceotlp.ExportResponse, error) {
	cl := clientOf(ctx)
	d := t.s.checkHosts(wire.DecodeTraces(req.Traces(), t.s.cfg.Limits), cl.hosts)
	if err := t.s.ingest(cl.id, d); err != nil {
		return ptraceotlp.NewExportResponse(), status.Error(codes.Unavailable, err.Error())
	}
	return tracesResponse(d), nil
}
