package localapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// DefaultSocket is where the agent's local control endpoint listens.
const DefaultSocket = "/run/slowrank/agent.sock"

// Backend is what the endpoint needs of the agent it serves, and all it
// knows of it: a report to answer GET /status with, and the application of
// a POST /control request. R is the request type (the body decodes into it
// strictly: unknown fields are refused) and C the control state the agent
// answers with; the endpoint encodes both as JSON without looking inside.
// agent.LocalAPI adapts an agent to it.
type Backend[R, C any] interface {
	// Report returns the body of GET /status. It waits for the agent at
	// most until ctx is done and then still returns, saying in the report
	// what it could not get. Called from any goroutine.
	Report(ctx context.Context) any
	// Control applies req and returns the resulting state. A request the
	// agent refuses is an error that wraps ErrBadRequest (answered 400) or
	// ErrConflict (409, with the returned state); ctx's error when the
	// agent does not answer in time (503); any other error is a 500.
	Control(ctx context.Context, req R) (C, error)
}

// Outcomes of Backend.Control that are the client's to fix.
var (
	// ErrBadRequest: the request is invalid.
	ErrBadRequest = errors.New("bad control request")
	// ErrConflict: the request is valid but the agent's state refuses it
	// now (a change still settling, a feature that is off).
	ErrConflict = errors.New("control request conflicts with the agent's state")
)

// Refused marks err, a refusal of Backend.Control, as kind (ErrBadRequest
// or ErrConflict) for errors.Is; its message stays err's own, which is what
// the client reads.
func Refused(err, kind error) error { return &refusal{err: err, kind: kind} }

type refusal struct{ err, kind error }

func (r *refusal) Error() string   { return r.err.Error() }
func (r *refusal) Unwrap() []error { return []error{r.err, r.kind} }

// ServerConfig configures the local endpoint.
type ServerConfig struct {
	// Socket is the Unix socket path ("" for none). Its directory is
	// created 0750 when missing and must not be writable by others; the
	// socket is created 0600 (bound in a private directory, then renamed
	// into place). A stale socket (nothing listens: the kernel refuses the
	// connection) is replaced. A socket that another listener holds (an
	// agent still running, or one still exiting) is not: the server serves
	// its TCP address at once and tries the socket again every
	// RetryInterval, taking it once the holder is gone. Anything that is
	// not a socket is an error.
	Socket string
	// RetryInterval is how often the socket is tried again while another
	// listener holds it, and how often the server checks that the path is
	// still its own socket (default 1 s).
	RetryInterval time.Duration
	// Addr is an optional TCP address (host:port). Only loopback addresses
	// are accepted unless AllowRemote. TCP serves GET /status and
	// GET /metrics only: POST /control is accepted on the Unix socket,
	// whose file mode is its access control.
	Addr        string
	AllowRemote bool
	// Metrics serves GET /metrics (see HandlerConfig.Metrics).
	Metrics http.Handler
	// Timeout bounds how long a request waits for the agent's main
	// goroutine (default 3 s).
	Timeout time.Duration
	Logger  *slog.Logger
}

// Server is the agent's local HTTP endpoint: GET /status (the Backend's
// report as JSON), GET /metrics (Prometheus text format), POST /control
// (a JSON request). Close it (a second Close does nothing more).
type Server struct {
	cfg  ServerConfig
	h    func(control bool) http.Handler
	log  *slog.Logger
	srvs []*http.Server // TCP
	lns  []net.Listener
	wg   sync.WaitGroup // serving goroutines

	// The Unix socket: sock is owned by the keeper goroutine until stop is
	// closed and it returns (keeper.Wait), then by Close.
	sock     *socketServe
	stop     chan struct{}
	stopOnce sync.Once
	keeper   sync.WaitGroup

	mu    sync.Mutex // guards addrs
	addrs []string

	retries, takeovers, lost atomic.Int64
	waiting                  atomic.Bool
}

// socketServe is the Unix socket while the server holds it.
type socketServe struct {
	hs   *http.Server
	info os.FileInfo // the socket we created, to remove only ours
}

// ErrRemoteAddress reports a non-loopback TCP address without AllowRemote.
var ErrRemoteAddress = errors.New("refusing a non-loopback status address (allow it explicitly)")

// ErrSocketInUse reports a socket path that another listener holds: a
// connection to it was not refused.
var ErrSocketInUse = errors.New("status socket in use")

// NewServer listens on the configured socket and address and serves b
// until Close. A socket that another listener holds is no error: the
// server waits for it in the background (see ServerConfig.Socket) and says
// so in its log. On error, whatever it opened is closed.
func NewServer[R, C any](b Backend[R, C], cfg ServerConfig) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 3 * time.Second
	}
	if cfg.RetryInterval <= 0 {
		cfg.RetryInterval = time.Second
	}
	s := &Server{cfg: cfg, log: cfg.Logger.With("component", "server")}
	s.h = func(control bool) http.Handler {
		return NewHandler(b, HandlerConfig{Control: control, Timeout: cfg.Timeout, Metrics: cfg.Metrics})
	}
	if cfg.Socket != "" {
		ln, info, replaced, err := listenUnix(cfg.Socket)
		switch {
		case err == nil:
			s.holdSocket(ln, info, replaced)
		case errors.Is(err, ErrSocketInUse):
			s.startWaiting(err)
		default:
			return nil, err
		}
	}
	if cfg.Addr != "" {
		ln, err := listenTCP(cfg.Addr, cfg.AllowRemote)
		if err != nil {
			_ = s.Close() // what it opened so far: the listen error is the one to return
			return nil, err
		}
		s.srvs = append(s.srvs, s.serve(ln, false))
		s.lns = append(s.lns, ln)
		s.addAddr("http://" + ln.Addr().String())
	}
	if cfg.Socket != "" {
		s.stop = make(chan struct{})
		s.keeper.Add(1)
		go s.keep()
	}
	return s, nil
}

// Addrs lists where the server listens now ("unix:PATH",
// "http://HOST:PORT"): the socket only while the server holds it.
func (s *Server) Addrs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.addrs...)
}

// Waiting reports whether the server is waiting for its socket (another
// listener holds it, or it could not be made again).
func (s *Server) Waiting() bool { return s.waiting.Load() }

// Counters are the server's self-metrics, keyed as selfmetrics.Table
// declares them: attempts at a socket that another listener held, stale
// sockets replaced, sockets found removed or replaced under the server,
// and 1 while it waits for its socket. Safe from any goroutine.
func (s *Server) Counters() map[string]int64 {
	var w int64
	if s.waiting.Load() {
		w = 1
	}
	return map[string]int64{
		"status_socket_retries":   s.retries.Load(),
		"status_socket_takeovers": s.takeovers.Load(),
		"status_socket_lost":      s.lost.Load(),
		"status_socket_waiting":   w,
	}
}

func (s *Server) addAddr(a string) {
	s.mu.Lock()
	s.addrs = append(s.addrs, a)
	s.mu.Unlock()
}

func (s *Server) dropAddr(a string) {
	s.mu.Lock()
	s.addrs = slices.DeleteFunc(s.addrs, func(x string) bool { return x == a })
	s.mu.Unlock()
}

// holdSocket serves ln, the socket now at the configured path.
func (s *Server) holdSocket(ln net.Listener, info os.FileInfo, replaced bool) {
	if replaced {
		s.takeovers.Add(1)
	}
	s.sock = &socketServe{hs: s.serve(ln, true), info: info}
	s.addAddr("unix:" + s.cfg.Socket)
}

// startWaiting logs, once per wait, why the server runs without its
// socket.
func (s *Server) startWaiting(err error) {
	s.retries.Add(1)
	if s.waiting.Swap(true) {
		return
	}
	s.log.Warn("status socket unavailable: serving without it, trying again until its owner is gone",
		"socket", s.cfg.Socket, "every", s.cfg.RetryInterval, "err", err)
}

// keep runs until stop: while the server waits for its socket it tries to
// listen every RetryInterval; while it holds it, it checks that the path
// is still its socket (an exiting agent's Close, or a person, may have
// removed it) and makes it again when not.
func (s *Server) keep() {
	defer s.keeper.Done()
	t := time.NewTicker(s.cfg.RetryInterval)
	defer t.Stop()
	since := time.Now()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		if s.sock != nil {
			fi, err := os.Lstat(s.cfg.Socket)
			if err == nil && os.SameFile(fi, s.sock.info) {
				continue
			}
			s.lost.Add(1)
			s.log.Warn("status socket removed or replaced under the agent: making it again", "socket", s.cfg.Socket)
			s.sock.hs.Close()
			s.sock = nil
			s.dropAddr("unix:" + s.cfg.Socket)
			since = time.Now()
		}
		ln, info, replaced, err := listenUnix(s.cfg.Socket)
		if err != nil {
			s.log.Debug("status socket still unavailable", "socket", s.cfg.Socket, "err", err)
			s.startWaiting(err)
			continue
		}
		s.holdSocket(ln, info, replaced)
		if s.waiting.Swap(false) {
			s.log.Info("status socket listening after waiting for it", "socket", s.cfg.Socket,
				"waited", time.Since(since).Round(time.Millisecond), "replaced_stale", replaced)
		}
	}
}

func (s *Server) serve(ln net.Listener, control bool) *http.Server {
	hs := &http.Server{
		Handler:           s.h(control),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Warn("status endpoint stopped", "addr", ln.Addr(), "err", err)
		}
	}()
	return hs
}

// Close stops trying for the socket, stops serving (in-flight requests
// get 2 s) and removes the socket file when it is still the one this
// server created.
func (s *Server) Close() error {
	if s.stop != nil {
		s.stopOnce.Do(func() { close(s.stop) })
		s.keeper.Wait()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var errs []error
	srvs := s.srvs
	if s.sock != nil {
		srvs = append([]*http.Server{s.sock.hs}, srvs...)
	}
	for _, hs := range srvs {
		if err := hs.Shutdown(ctx); err != nil {
			hs.Close()
		}
	}
	for _, ln := range s.lns {
		ln.Close() // already closed by Shutdown when it ran: ignore
	}
	s.wg.Wait()
	if s.sock != nil {
		if fi, err := os.Lstat(s.cfg.Socket); err == nil && os.SameFile(fi, s.sock.info) {
			if err := os.Remove(s.cfg.Socket); err != nil {
				errs = append(errs, fmt.Errorf("remove socket: %w", err))
			}
		}
		s.sock = nil
	}
	return errors.Join(errs...)
}

// listenUnix creates the socket at path with mode 0600 from the start: it
// binds in a fresh private directory next to it, sets the mode, then
// renames it into place (so no other user ever sees it with a wider mode).
// replaced says that it replaced a stale socket. A socket that another
// listener holds is an error wrapping ErrSocketInUse.
func listenUnix(path string) (ln net.Listener, fi os.FileInfo, replaced bool, err error) {
	if err := CheckSocketPath(path); err != nil {
		return nil, nil, false, err
	}
	dir := filepath.Dir(path)
	if err := ensurePrivateDir(dir); err != nil {
		return nil, nil, false, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, nil, false, fmt.Errorf("status socket %s exists and is not a socket: refusing to replace it", path)
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil, nil, false, fmt.Errorf("%w: %s accepts connections: another agent runs, or one is still exiting", ErrSocketInUse, path)
		}
		if !staleDial(err) {
			return nil, nil, false, fmt.Errorf("%w: %s: %w", ErrSocketInUse, path, err)
		}
		// Stale (a previous agent died): replaced by the rename below. A
		// socket gone between the Lstat and the dial (its holder unlinked
		// it as it closed) is nothing replaced: no takeover to count.
		replaced = !errors.Is(err, syscall.ENOENT)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, nil, false, fmt.Errorf("stat status socket: %w", err)
	}
	ln, fi, err = bindUnix(dir, path)
	return ln, fi, replaced && err == nil, err
}

// staleDial reports whether err, from dialling a socket, says that nothing
// listens there: the kernel refused the connection, or the socket is gone.
// Any other failure (a full backlog, a timeout) may be a live listener's,
// which is never replaced.
func staleDial(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}

// bindUnix is listenUnix's creation of the socket: bound in a fresh
// private directory in dir, chmod 0600, renamed to path.
func bindUnix(dir, path string) (net.Listener, os.FileInfo, error) {
	tmpDir, err := os.MkdirTemp(dir, ".slowrank-sock-")
	if err != nil {
		return nil, nil, fmt.Errorf("create status socket: %w", err)
	}
	defer os.RemoveAll(tmpDir)
	tmp := filepath.Join(tmpDir, "s")
	ln, err := listenIn(tmpDir, "s")
	if err != nil {
		return nil, nil, fmt.Errorf("listen on status socket: %w", err)
	}
	ln.SetUnlinkOnClose(false) // it is renamed; Server.Close removes it
	fail := func(err error) (net.Listener, os.FileInfo, error) {
		ln.Close()
		return nil, nil, err
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return fail(fmt.Errorf("chmod status socket: %w", err))
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(fmt.Errorf("place status socket: %w", err))
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return fail(fmt.Errorf("stat status socket: %w", err))
	}
	return ln, fi, nil
}

// maxSunPath is the longest socket path that fits sockaddr_un's sun_path
// (108 bytes with its terminating NUL).
const maxSunPath = 107

// listenIn listens on the socket name in dir. The private directory makes
// the path 28 bytes longer than the socket's own, so a path that fits
// sun_path in place may not fit there: then it binds through the
// directory's descriptor (/proc/self/fd/N/name), which the kernel resolves
// like the path itself, whatever its length.
func listenIn(dir, name string) (*net.UnixListener, error) {
	path := filepath.Join(dir, name)
	if len(path) <= maxSunPath {
		return net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	}
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer func() { _ = d.Close() }() // a directory, opened only to name it
	via := fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), name)
	return net.ListenUnix("unix", &net.UnixAddr{Name: via, Net: "unix"})
}

// CheckSocketPath refuses a socket path that cannot be bound or dialled:
// clients (slowrank status, doctor, a liveness probe) reach it by name.
func CheckSocketPath(path string) error {
	if len(path) > maxSunPath {
		return fmt.Errorf("status socket path %s is %d bytes; a Unix socket path holds at most %d: choose a shorter one", path, len(path), maxSunPath)
	}
	return nil
}

// ensurePrivateDir creates dir (0750) when missing and refuses a directory
// that another user could write to (they could replace the socket), or one
// that is a symbolic link.
func ensurePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("create status socket directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("stat status socket directory: %w", err)
	}
	return checkPrivateDir(dir, fi, os.Geteuid())
}

// checkPrivateDir is the pure part of ensurePrivateDir.
func checkPrivateDir(dir string, fi os.FileInfo, euid int) error {
	if !fi.IsDir() {
		return fmt.Errorf("status socket directory %s is not a directory", dir)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("status socket directory %s is writable by group or others (%s): use a private directory", dir, fi.Mode().Perm())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != euid && st.Uid != 0 {
		return fmt.Errorf("status socket directory %s belongs to uid %d, not to this process (%d) or root", dir, st.Uid, euid)
	}
	return nil
}

// listenTCP listens on addr, refusing a non-loopback address unless
// allowRemote.
func listenTCP(addr string, allowRemote bool) (net.Listener, error) {
	if err := CheckStatusAddr(addr, allowRemote); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on status address: %w", err)
	}
	if ta, ok := ln.Addr().(*net.TCPAddr); ok && !allowRemote && !ta.IP.IsLoopback() {
		ln.Close()
		return nil, fmt.Errorf("%w: %s resolved to %s", ErrRemoteAddress, addr, ta.IP)
	}
	return ln, nil
}

// CheckStatusAddr validates a TCP status address: host:port with a
// loopback host (an IP, or "localhost"), unless allowRemote. An empty host
// means every interface, hence remote.
func CheckStatusAddr(addr string, allowRemote bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("status address %q: %w", addr, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("status address %q: invalid port", addr)
	}
	if allowRemote {
		return nil
	}
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%w: %q (use 127.0.0.1:PORT, or --status-allow-remote)", ErrRemoteAddress, addr)
	}
	return nil
}

// HandlerConfig configures NewHandler.
type HandlerConfig struct {
	// Control enables POST /control (the Unix socket only).
	Control bool
	// Timeout bounds how long POST /control waits for the agent (GET
	// /status waits at most 1 s of it); default 3 s.
	Timeout time.Duration
	// Metrics serves GET /metrics: the OpenTelemetry Prometheus exporter
	// of the process' one MeterProvider, which carries the instruments of
	// selfmetrics.Table (fed by Agent.Observe) and the detector's metrics
	// (nil: 404).
	Metrics http.Handler
}

// NewHandler returns the endpoint's HTTP handler for b.
func NewHandler[R, C any](b Backend[R, C], cfg HandlerConfig) http.Handler {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 3 * time.Second
	}
	h := &handler[R, C]{b: b, cfg: cfg}
	mux := http.NewServeMux()
	mux.HandleFunc("/status", h.status)
	mux.HandleFunc("/metrics", h.metrics)
	mux.HandleFunc("/control", h.control)
	mux.HandleFunc("/{$}", h.index)
	if cfg.Control {
		// Profiles of the agent itself, for its operators: on the Unix
		// socket only (its file mode is the access control), never on TCP.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

type handler[R, C any] struct {
	b   Backend[R, C]
	cfg HandlerConfig
}

func (h *handler[R, C]) index(w http.ResponseWriter, r *http.Request) {
	if !allow(w, r, http.MethodGet) {
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, "slowrank agent\n  GET  /status   JSON status\n  GET  /metrics  Prometheus exposition (docs/metrics.md)\n")
	if h.cfg.Control {
		io.WriteString(w, "  GET  /debug/pprof/  profiles of the agent (Go pprof)\n")
		io.WriteString(w, "  POST /control  {\"action\":\"pause\"|\"resume\"|\"set\", \"window\":\"5s\", \"threshold\":0.05, \"floor\":\"1ms\", \"consecutive\":3, \"duty_budget\":0.003, \"duty_share\":0.1, \"duty_auto\":true, \"duty_period\":\"10s\"}\n")
	}
}

// allow answers 405 unless r's method is one of methods (HEAD with GET).
func allow(w http.ResponseWriter, r *http.Request, methods ...string) bool {
	for _, m := range methods {
		if r.Method == m || (m == http.MethodGet && r.Method == http.MethodHead) {
			return true
		}
	}
	w.Header().Set("Allow", strings.Join(methods, ", "))
	writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed", r.Method))
	return false
}

func (h *handler[R, C]) status(w http.ResponseWriter, r *http.Request) {
	if !allow(w, r, http.MethodGet) {
		return
	}
	// A stopping agent no longer answers: do not hold the report long.
	ctx, cancel := context.WithTimeout(r.Context(), min(h.cfg.Timeout, time.Second))
	defer cancel()
	writeJSON(w, http.StatusOK, h.b.Report(ctx))
}

func (h *handler[R, C]) metrics(w http.ResponseWriter, r *http.Request) {
	if !allow(w, r, http.MethodGet) {
		return
	}
	if h.cfg.Metrics == nil {
		writeError(w, http.StatusNotFound, "no metrics on this endpoint")
		return
	}
	h.cfg.Metrics.ServeHTTP(w, r)
}

// controlBodyMax bounds the body of POST /control.
const controlBodyMax = 64 << 10

func (h *handler[R, C]) control(w http.ResponseWriter, r *http.Request) {
	if !allow(w, r, http.MethodPost) {
		return
	}
	if !h.cfg.Control {
		writeError(w, http.StatusForbidden, "control is served on the agent's Unix socket only")
		return
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, controlBodyMax))
	dec.DisallowUnknownFields()
	var req R
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("decode control request: %v", err))
		return
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, "decode control request: one JSON object expected")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.Timeout)
	defer cancel()
	st, err := h.b.Control(ctx, req)
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, ControlResponse[C]{OK: true, Control: &st})
	case errors.Is(err, ErrBadRequest):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, ErrConflict):
		writeJSON(w, http.StatusConflict, ControlResponse[C]{Error: err.Error(), Control: &st})
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		writeError(w, http.StatusServiceUnavailable, err.Error())
	default:
		writeError(w, http.StatusInternalServerError, err.Error())
	}
}

// ControlResponse is the body of a /control answer (and of every error
// answer, with Control nil). C is the Backend's control state.
type ControlResponse[C any] struct {
	OK      bool   `json:"ok"`
	Error   string `json:"error,omitempty"`
	Control *C     `json:"control,omitempty"`
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, ControlResponse[struct{}]{Error: msg})
}

// writeJSON answers v with code. It encodes before it writes anything: a
// value the encoder refuses (a NaN) answers 500 with the reason, not code
// with an empty or cut body.
func writeJSON(w http.ResponseWriter, code int, v any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		code = http.StatusInternalServerError
		b.Reset()
		_ = json.NewEncoder(&b).Encode(ControlResponse[struct{}]{Error: "encode the answer: " + err.Error()}) // a string: cannot fail
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	w.Write(b.Bytes())
}
