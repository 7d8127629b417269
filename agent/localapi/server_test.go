package localapi

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
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

	// A second server on the same socket: refused while the first lives.
	if _, err := NewServer(f, ServerConfig{Socket: sock}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second server: %v", err)
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
	s.Close()
	// A regular file or a symbolic link is never replaced.
	file := filepath.Join(dir, "file.sock")
	os.WriteFile(file, []byte("x"), 0o600)
	if _, err := NewServer(f, ServerConfig{Socket: file}); err == nil {
		t.Fatal("replaced a regular file")
	}
	link := filepath.Join(dir, "link.sock")
	os.Symlink(file, link)
	if _, err := NewServer(f, ServerConfig{Socket: link}); err == nil {
		t.Fatal("replaced a symbolic link")
	}
	// A directory others can write to is refused.
	open := filepath.Join(dir, "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o777)
	if _, err := NewServer(f, ServerConfig{Socket: filepath.Join(open, "a.sock")}); err == nil || !strings.Contains(err.Error(), "writable") {
		t.Fatalf("world-writable directory: %v", err)
	}
	if _, err := NewServer(f, ServerConfig{Addr: "0.0.0.0:0"}); !errors.Is(err, ErrRemoteAddress) {
		t.Fatalf("remote address: %v", err)
	}
}
