package localapi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakeRequest and fakeState stand for the agent's control request and
// state: the endpoint only decodes and encodes them.
type fakeRequest struct {
	Action string `json:"action"`
}

type fakeState struct {
	Paused bool `json:"paused"`
}

// fakeBackend is a Backend without an agent.
type fakeBackend struct {
	mu      sync.Mutex
	state   fakeState
	err     error
	blocked bool // Report and Control wait for ctx (a stopping agent)
}

func (f *fakeBackend) paused() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state.Paused
}

func (f *fakeBackend) Report(ctx context.Context) any {
	f.mu.Lock()
	blocked, st := f.blocked, f.state
	f.mu.Unlock()
	rep := map[string]any{"processes": 4}
	if blocked {
		<-ctx.Done()
		rep["control_error"] = ctx.Err().Error()
		return rep
	}
	rep["control"] = st
	return rep
}

func (f *fakeBackend) Control(ctx context.Context, req fakeRequest) (fakeState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.blocked {
		f.mu.Unlock()
		<-ctx.Done()
		f.mu.Lock()
		return fakeState{}, ctx.Err()
	}
	if f.err != nil {
		return f.state, f.err
	}
	switch req.Action {
	case "pause":
		f.state.Paused = true
	case "resume":
		f.state.Paused = false
	default:
		return fakeState{}, Refused(errors.New("unknown action "+req.Action), ErrBadRequest)
	}
	return f.state, nil
}

func do(t *testing.T, h http.Handler, method, path, body string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// TestHandlerRoutes: methods, paths, the index, and that profiles and
// control are served on the Unix socket's handler only.
func TestHandlerRoutes(t *testing.T) {
	f := &fakeBackend{}
	sock := NewHandler[fakeRequest, fakeState](f, HandlerConfig{Control: true})
	tcp := NewHandler[fakeRequest, fakeState](f, HandlerConfig{})
	for _, tt := range []struct {
		h            http.Handler
		method, path string
		code         int
		want         string
	}{
		{sock, "GET", "/status", 200, `"processes":4`},
		{sock, "HEAD", "/status", 200, ""},
		{sock, "POST", "/status", http.StatusMethodNotAllowed, "not allowed"},
		{sock, "GET", "/nope", http.StatusNotFound, ""},
		{sock, "GET", "/", 200, "POST /control"},
		{tcp, "GET", "/", 200, "GET  /status"},
		{sock, "GET", "/control", http.StatusMethodNotAllowed, "not allowed"},
		{tcp, "POST", "/control", http.StatusForbidden, "Unix socket only"},
		{sock, "GET", "/metrics", http.StatusNotFound, "no metrics"},
		{sock, "GET", "/debug/pprof/goroutine?debug=1", 200, "goroutine"},
		{tcp, "GET", "/debug/pprof/goroutine?debug=1", http.StatusNotFound, ""},
	} {
		code, body := do(t, tt.h, tt.method, tt.path, `{"action":"pause"}`)
		if code != tt.code || !strings.Contains(body, tt.want) {
			t.Errorf("%s %s: %d %.120s, want %d containing %q", tt.method, tt.path, code, body, tt.code, tt.want)
		}
	}
	if code, body := do(t, tcp, "GET", "/", ""); code != 200 || strings.Contains(body, "/control") || strings.Contains(body, "pprof") {
		t.Errorf("TCP index offers control or profiles: %s", body)
	}
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "m 1\n") })
	if code, body := do(t, NewHandler[fakeRequest, fakeState](f, HandlerConfig{Metrics: metrics}), "GET", "/metrics", ""); code != 200 || body != "m 1\n" {
		t.Errorf("GET /metrics: %d %q", code, body)
	}
}

// TestHandlerControlOutcomes: how the Backend's outcomes become status
// codes, and what the request decoder refuses.
func TestHandlerControlOutcomes(t *testing.T) {
	f := &fakeBackend{}
	h := NewHandler[fakeRequest, fakeState](f, HandlerConfig{Control: true, Timeout: 50 * time.Millisecond})
	for _, tt := range []struct {
		body string
		err  error
		code int
		want string
	}{
		{`{"action":"pause"}`, nil, 200, `{"ok":true,"control":{"paused":true}}`},
		{`{"action":"jump"}`, nil, 400, `{"ok":false,"error":"unknown action jump"}`},
		{`{"action":"pause","x":1}`, nil, 400, "unknown field"},
		{`{"action":"pause"}{"action":"resume"}`, nil, 400, "one JSON object"},
		{`not json`, nil, 400, "decode control request"},
		{`{"action":"pause","x":"` + strings.Repeat("a", controlBodyMax) + `"}`, nil, 400, "decode"},
		{`{"action":"resume"}`, Refused(errors.New("still settling"), ErrConflict), http.StatusConflict, `{"ok":false,"error":"still settling","control":{"paused":true}}`},
		{`{"action":"resume"}`, errors.New("broken"), http.StatusInternalServerError, `"error":"broken"`},
	} {
		f.mu.Lock()
		f.err = tt.err
		f.mu.Unlock()
		code, body := do(t, h, "POST", "/control", tt.body)
		if code != tt.code || !strings.Contains(body, tt.want) {
			t.Errorf("%.60s (err %v): %d %s, want %d containing %q", tt.body, tt.err, code, body, tt.code, tt.want)
		}
		if tt.code != 200 && !strings.HasPrefix(body, `{"ok":false,"error":`) {
			t.Errorf("%.60s: error body %s", tt.body, body)
		}
	}
	// A stopping agent: control fails fast with 503, status still answers
	// within a second.
	f.mu.Lock()
	f.err, f.blocked = nil, true
	f.mu.Unlock()
	if code, body := do(t, h, "POST", "/control", `{"action":"pause"}`); code != http.StatusServiceUnavailable {
		t.Errorf("control on a stopping agent: %d %s", code, body)
	}
	start := time.Now()
	if code, body := do(t, h, "GET", "/status", ""); code != 200 || !strings.Contains(body, "deadline") || time.Since(start) > 2*time.Second {
		t.Errorf("status of a stopping agent: %d after %s: %s", code, time.Since(start), body)
	}
}

func TestRefused(t *testing.T) {
	base := errors.New("a detector change is still settling")
	err := Refused(base, ErrConflict)
	if !errors.Is(err, ErrConflict) || !errors.Is(err, base) || errors.Is(err, ErrBadRequest) || err.Error() != base.Error() {
		t.Errorf("Refused: %v (is conflict %v, is base %v)", err, errors.Is(err, ErrConflict), errors.Is(err, base))
	}
}

// unixClient talks HTTP over a Unix socket.
func unixClient(path string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		},
	}}
}

func TestCheckStatusAddr(t *testing.T) {
	tests := []struct {
		addr   string
		remote bool
		ok     bool
	}{
		{"127.0.0.1:9464", false, true},
		{"[::1]:9464", false, true},
		{"localhost:9464", false, true},
		{"127.0.0.2:0", false, true},
		{"0.0.0.0:9464", false, false},
		{":9464", false, false},
		{"10.0.0.1:9464", false, false},
		{"example.com:9464", false, false},
		{"0.0.0.0:9464", true, true},
		{"127.0.0.1", false, false},
		{"127.0.0.1:http", false, false},
		{"127.0.0.1:70000", false, false},
	}
	for _, tt := range tests {
		err := CheckStatusAddr(tt.addr, tt.remote)
		if (err == nil) != tt.ok {
			t.Errorf("CheckStatusAddr(%q, %v) = %v", tt.addr, tt.remote, err)
		}
	}
	if err := CheckStatusAddr("0.0.0.0:1", false); !errors.Is(err, ErrRemoteAddress) {
		t.Errorf("want ErrRemoteAddress, got %v", err)
	}
}

func TestServerUnixSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "run", "agent.sock")
	f := &fakeBackend{}
	s, err := NewServer(f, ServerConfig{Socket: sock, Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(sock)
	if err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %v mode %v", err, fi.Mode())
	}
	if di, _ := os.Stat(filepath.Dir(sock)); di.Mode().Perm() != 0o750 {
		t.Fatalf("socket directory mode %v", di.Mode().Perm())
	}
	c := unixClient(sock)
	resp, err := c.Post("http://agent/control", "application/json", strings.NewReader(`{"action":"pause"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !f.paused() {
		t.Fatalf("pause over the socket: %d %s", resp.StatusCode, b)
	}
	// TCP: status yes, control no.
	var tcp string
	for _, a := range s.Addrs() {
		if strings.HasPrefix(a, "http://") {
			tcp = a
		}
	}
	resp, err = http.Get(tcp + "/status")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /status over TCP: %v %v", err, resp)
	}
	resp.Body.Close()
	resp, err = http.Post(tcp+"/control", "application/json", strings.NewReader(`{"action":"resume"}`))
	if err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("POST /control over TCP: %v %v", err, resp)
	}
	resp.Body.Close()

	// A second server on the same socket waits while the first lives, and
	// its Close leaves the first's socket alone.
	s2, err := NewServer(f, ServerConfig{Socket: sock})
	if err != nil || !s2.Waiting() || len(s2.Addrs()) != 0 {
		t.Fatalf("second server: %v (waiting %v, addrs %v)", err, s2 != nil && s2.Waiting(), s2.Addrs())
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(sock); err != nil || !os.SameFile(fi, s.sock.info) {
		t.Fatalf("the waiting server's Close touched the first's socket: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}
	entries, _ := os.ReadDir(filepath.Dir(sock))
	if len(entries) != 0 {
		t.Fatalf("leftovers in the socket directory: %v", entries)
	}
}

func TestServerSocketSafety(t *testing.T) {
	dir := t.TempDir()
	f := &fakeBackend{}
	// A stale socket (its server died) is replaced.
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	s, err := NewServer(f, ServerConfig{Socket: stale})
	if err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	closeServer(t, s)
	// A regular file or a symbolic link is never replaced.
	file := filepath.Join(dir, "file.sock")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewServer(f, ServerConfig{Socket: file}); err == nil {
		t.Fatal("replaced a regular file")
	}
	link := filepath.Join(dir, "link.sock")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	if _, err := NewServer(f, ServerConfig{Socket: link}); err == nil {
		t.Fatal("replaced a symbolic link")
	}
	// A directory others can write to is refused.
	open := filepath.Join(dir, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil { // past the umask
		t.Fatal(err)
	}
	if _, err := NewServer(f, ServerConfig{Socket: filepath.Join(open, "a.sock")}); err == nil || !strings.Contains(err.Error(), "writable") {
		t.Fatalf("world-writable directory: %v", err)
	}
	if _, err := NewServer(f, ServerConfig{Addr: "0.0.0.0:0"}); !errors.Is(err, ErrRemoteAddress) {
		t.Fatalf("remote address: %v", err)
	}
}

// shortSocket is a socket path in a fresh directory short enough for
// sun_path (108 bytes) with listenUnix's private directory inside it,
// which a subtest's t.TempDir is not.
func shortSocket(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "agent.sock")
}

// holdSocket makes a listener at path that is not a Server: what an
// exiting agent's socket is to a new agent. With accept, it accepts
// connections and never answers them; without, they wait in its backlog.
// unlink: its close removes the path (else it leaves a stale socket).
// Closing the returned function closes it and what it accepted.
func holdSocket(t *testing.T, path string, accept, unlink bool) (closeHolder func()) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(unlink)
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	if accept {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
			}
		}()
	}
	var once sync.Once
	closeHolder = func() {
		once.Do(func() {
			ln.Close()
			wg.Wait()
			mu.Lock()
			for _, c := range conns {
				c.Close()
			}
			mu.Unlock()
		})
	}
	t.Cleanup(closeHolder)
	return closeHolder
}

// getStatus asks for /status over the socket at path, waiting at most d.
func getStatus(path string, d time.Duration) (int, error) {
	c := unixClient(path)
	c.Timeout = d
	resp, err := c.Get("http://agent/status")
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, err
}

// TestServerTakesSocketOnceHolderGoes: a server started while another
// listener holds its path (an agent still exiting: it accepts, or lets
// connections queue, and never answers) serves nothing there while the
// holder lives and answers there within seconds once it is gone.
func TestServerTakesSocketOnceHolderGoes(t *testing.T) {
	for _, tt := range []struct {
		name          string
		accept        bool
		unlink        bool
		wantTakeovers int64
	}{
		{"silent holder that leaves a stale socket", true, false, 1},
		{"holder that never accepts and leaves a stale socket", false, false, 1},
		{"silent holder that removes its socket", true, true, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sock := shortSocket(t)
			closeHolder := holdSocket(t, sock, tt.accept, tt.unlink)
			held, err := os.Lstat(sock)
			if err != nil {
				t.Fatal(err)
			}
			s, err := NewServer(&fakeBackend{}, ServerConfig{Socket: sock, Addr: "127.0.0.1:0", RetryInterval: 20 * time.Millisecond})
			if err != nil {
				t.Fatalf("NewServer with the socket held: %v", err)
			}
			defer closeServer(t, s)
			if !s.Waiting() || len(s.Addrs()) != 1 || !strings.HasPrefix(s.Addrs()[0], "http://") {
				t.Fatalf("waiting %v, addrs %v: want waiting, serving TCP only", s.Waiting(), s.Addrs())
			}
			time.Sleep(200 * time.Millisecond)
			if fi, err := os.Lstat(sock); err != nil || !os.SameFile(fi, held) {
				t.Fatalf("the holder's socket was replaced while it lived (%v)", err)
			}
			if code, err := getStatus(sock, 100*time.Millisecond); err == nil {
				t.Fatalf("the holder answered %d", code)
			}
			if n := s.Counters()["status_socket_retries"]; n < 3 {
				t.Errorf("%d retries in 200 ms at 20 ms", n)
			}

			closeHolder()
			gone := time.Now()
			for {
				// The socket answers from its bind on; the server's state
				// follows a moment later.
				code, err := getStatus(sock, 200*time.Millisecond)
				if err == nil && code == http.StatusOK && !s.Waiting() {
					break
				}
				if time.Since(gone) > 5*time.Second {
					t.Fatalf("no answer on the socket 5 s after its holder closed: %d %v", code, err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			c := s.Counters()
			if s.Waiting() || c["status_socket_waiting"] != 0 || c["status_socket_takeovers"] != tt.wantTakeovers || c["status_socket_lost"] != 0 {
				t.Errorf("after the takeover: waiting %v, counters %v, want %d takeovers", s.Waiting(), c, tt.wantTakeovers)
			}
			if !slices.Contains(s.Addrs(), "unix:"+sock) {
				t.Errorf("addrs %v lack the socket", s.Addrs())
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Lstat(sock); !os.IsNotExist(err) {
				t.Fatalf("socket left behind: %v", err)
			}
		})
	}
}

// TestServerLeavesLiveSocketAlone: a live agent's socket is never taken
// over while it answers, even when its answers wait for its main goroutine.
func TestServerLeavesLiveSocketAlone(t *testing.T) {
	for _, tt := range []struct {
		name string
		busy bool
	}{
		{"answering agent", false},
		{"agent whose reports wait for its main goroutine", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sock := shortSocket(t)
			live := &fakeBackend{blocked: tt.busy}
			s1, err := NewServer(live, ServerConfig{Socket: sock})
			if err != nil {
				t.Fatal(err)
			}
			defer closeServer(t, s1)
			s2, err := NewServer(&fakeBackend{}, ServerConfig{Socket: sock, RetryInterval: 10 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			// While the second server retries, the live one keeps answering
			// at the path and the path stays its socket.
			if code, err := getStatus(sock, 3*time.Second); err != nil || code != http.StatusOK {
				t.Fatalf("the live agent's status: %d %v", code, err)
			}
			time.Sleep(300 * time.Millisecond)
			if fi, err := os.Lstat(sock); err != nil || !os.SameFile(fi, s1.sock.info) {
				t.Fatalf("the live agent's socket was replaced (%v)", err)
			}
			c := s2.Counters()
			if !s2.Waiting() || c["status_socket_retries"] < 10 || c["status_socket_takeovers"] != 0 || c["status_socket_waiting"] != 1 {
				t.Errorf("second server: waiting %v, counters %v", s2.Waiting(), c)
			}
			if err := s2.Close(); err != nil {
				t.Fatal(err)
			}
			if code, err := getStatus(sock, 3*time.Second); err != nil || code != http.StatusOK {
				t.Fatalf("the live agent's status after the second server closed: %d %v", code, err)
			}
		})
	}
}

// TestServerRemakesRemovedSocket: a socket removed under the server (an
// exiting agent's Close racing the takeover, or a person) is made again.
func TestServerRemakesRemovedSocket(t *testing.T) {
	sock := shortSocket(t)
	s, err := NewServer(&fakeBackend{}, ServerConfig{Socket: sock, RetryInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer closeServer(t, s)
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		code, err := getStatus(sock, 200*time.Millisecond)
		if err == nil && code == http.StatusOK {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("no answer 5 s after the socket was removed: %d %v", code, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if c := s.Counters(); c["status_socket_lost"] != 1 || c["status_socket_takeovers"] != 0 || s.Waiting() {
		t.Errorf("counters %v, waiting %v", c, s.Waiting())
	}
}

// TestStaleDial: only a refused connection or a missing socket is stale;
// a full backlog or a timeout may be a live agent's.
func TestStaleDial(t *testing.T) {
	op := func(err error) error {
		return &net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("connect", err)}
	}
	for _, tt := range []struct {
		name  string
		err   error
		stale bool
	}{
		{"refused", op(syscall.ECONNREFUSED), true},
		{"removed meanwhile", op(syscall.ENOENT), true},
		{"backlog full", op(syscall.EAGAIN), false},
		{"timeout", &net.OpError{Op: "dial", Net: "unix", Err: os.ErrDeadlineExceeded}, false},
	} {
		if got := staleDial(tt.err); got != tt.stale {
			t.Errorf("%s: staleDial(%v) = %v, want %v", tt.name, tt.err, got, tt.stale)
		}
	}
}

// socketOfLength is a socket path of exactly n bytes in a fresh directory.
func socketOfLength(t *testing.T, n int) string {
	t.Helper()
	dir := filepath.Dir(shortSocket(t))
	name := "agent.sock"
	pad := n - len(dir) - 2 - len(name) // two separators
	if pad < 1 {
		t.Fatalf("temporary directory %s too long for a %d-byte path", dir, n)
	}
	sub := filepath.Join(dir, strings.Repeat("d", pad))
	return filepath.Join(sub, name)
}

func TestServerSocketPathLength(t *testing.T) {
	for _, tc := range []struct {
		name   string
		length int
		listen bool
	}{
		{"a path that leaves no room for the private directory still listens", maxSunPath, true},
		{"a path 20 bytes under the limit listens", maxSunPath - 20, true},
		{"a path over sun_path is refused with the limit named", maxSunPath + 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := socketOfLength(t, tc.length)
			if len(sock) != tc.length {
				t.Fatalf("built a %d-byte path, want %d", len(sock), tc.length)
			}
			f := &fakeBackend{}
			s, err := NewServer(f, ServerConfig{Socket: sock})
			if !tc.listen {
				if err == nil || !strings.Contains(err.Error(), "at most 107") {
					t.Fatalf("NewServer: %v, want the length refused", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer closeServer(t, s)
			fi, err := os.Lstat(sock)
			if err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
				t.Fatalf("socket %v mode %v", err, fi.Mode())
			}
			resp, err := unixClient(sock).Post("http://agent/control", "application/json", strings.NewReader(`{"action":"pause"}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 || !f.paused() {
				t.Fatalf("pause over the socket: %d", resp.StatusCode)
			}
		})
	}
}

// An answer the encoder refuses (a NaN in a report) is a 500 that says
// why, never the intended status with an empty body.
func TestWriteJSONUnencodableAnswersServerError(t *testing.T) {
	rec := httptest.NewRecorder()
	writeJSON(rec, http.StatusOK, map[string]float64{"share": math.NaN()})
	var cr ControlResponse[struct{}]
	if err := json.Unmarshal(rec.Body.Bytes(), &cr); err != nil {
		t.Fatalf("body %q: %v", rec.Body.String(), err)
	}
	if rec.Code != http.StatusInternalServerError || !strings.Contains(cr.Error, "NaN") {
		t.Fatalf("answered %d %+v, want 500 naming the NaN", rec.Code, cr)
	}
}

// closeServer closes s and fails the test when Close reports an error (a
// socket it could not remove).
func closeServer(t *testing.T, s *Server) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Error(err)
	}
}
