// Package e2e runs slowrank's OpenTelemetry export against a real
// OpenTelemetry Collector and Jaeger v2 on 127.0.0.1. The servers are built
// by test/e2e/build-tools.sh into .cache/tools/bin (or $SLOWRANK_TOOLS_BIN);
// without them the tests skip and say so.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// repoRoot is the repository root (tests run in test/e2e).
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test source")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// toolsBin returns the directory with the jaeger and otelcol binaries, or
// skips the test with the command that builds them.
func toolsBin(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("SLOWRANK_TOOLS_BIN")
	if dir == "" {
		dir = filepath.Join(repoRoot(t), ".cache", "tools", "bin")
	}
	for _, name := range []string{"jaeger", "otelcol"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode()&0o111 == 0 {
			msg := fmt.Sprintf("e2e: %s not found in %s: run test/e2e/build-tools.sh first (about 5 minutes on 2 cores)", name, dir)
			if os.Getenv("SLOWRANK_E2E_REQUIRED") != "" {
				t.Fatal(msg) // make test builds the tools: missing ones are a failure there
			}
			t.Skip(msg)
		}
	}
	return dir
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func addr(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

// lockedBuffer collects a server's output.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type server struct {
	name string
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{}
	err  error
}

// startServer runs bin with args and env; cleanup stops it (SIGTERM, then
// SIGKILL after 5 s) and prints its output when the test failed.
func startServer(t testing.TB, name, bin string, args []string, env map[string]string) *server {
	t.Helper()
	s := &server{name: name, out: &lockedBuffer{}, done: make(chan struct{})}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Env = os.Environ()
	for k, v := range env {
		s.cmd.Env = append(s.cmd.Env, k+"="+v)
	}
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		s.err = s.cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() {
		s.stop()
		if t.Failed() {
			t.Logf("--- %s output ---\n%s", name, tail(s.out.String(), 4000))
		}
	})
	return s
}

func (s *server) stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// waitReady polls url until it answers 200 or the server exits.
func waitReady(t testing.TB, s *server, client *http.Client, url string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			t.Fatalf("%s exited: %v\n%s", s.name, s.err, tail(s.out.String(), 4000))
		default:
		}
		resp, err := client.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s not ready at %s after 30s\n%s", s.name, url, tail(s.out.String(), 4000))
}

func waitTCP(t testing.TB, address string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", address, time.Second)
		if err == nil {
			c.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("nothing listens on %s after 30s", address)
}

// stack is a running Jaeger plus a collector that forwards to it.
type stack struct {
	jaegerQuery string // http://127.0.0.1:port
	otlpGRPC    string // 127.0.0.1:port of the collector
	otlpHTTP    string
	prom        string // http://127.0.0.1:port/metrics
	client      *http.Client
}

// startStack starts Jaeger with test/e2e/testdata/jaeger.yaml and the
// collector with deploy/otelcol.yaml, all on free 127.0.0.1 ports.
func startStack(t testing.TB, bin string) *stack {
	t.Helper()
	root := repoRoot(t)
	tr := &http.Transport{}
	st := &stack{client: &http.Client{Timeout: 5 * time.Second, Transport: tr}}
	t.Cleanup(tr.CloseIdleConnections)

	jq, jqg, jog, joh := freePort(t), freePort(t), freePort(t), freePort(t)
	j := startServer(t, "jaeger", filepath.Join(bin, "jaeger"),
		[]string{"--config", filepath.Join(root, "test", "e2e", "testdata", "jaeger.yaml")},
		map[string]string{
			"JAEGER_QUERY_HTTP": addr(jq), "JAEGER_QUERY_GRPC": addr(jqg),
			"JAEGER_OTLP_GRPC": addr(jog), "JAEGER_OTLP_HTTP": addr(joh),
		})
	st.jaegerQuery = "http://" + addr(jq)
	waitReady(t, j, st.client, st.jaegerQuery+"/api/services")
	waitTCP(t, addr(jog))

	cg, ch, cp := freePort(t), freePort(t), freePort(t)
	c := startServer(t, "otelcol", filepath.Join(bin, "otelcol"),
		[]string{"--config", filepath.Join(root, "deploy", "otelcol.yaml")},
		map[string]string{
			"SLOWRANK_OTLP_GRPC": addr(cg), "SLOWRANK_OTLP_HTTP": addr(ch),
			"SLOWRANK_JAEGER_OTLP": addr(jog), "SLOWRANK_PROM_ENDPOINT": addr(cp),
			"SLOWRANK_OTELCOL_LOG_LEVEL": "warn",
		})
	st.otlpGRPC, st.otlpHTTP, st.prom = addr(cg), addr(ch), "http://"+addr(cp)+"/metrics"
	waitReady(t, c, st.client, st.prom)
	waitTCP(t, st.otlpGRPC)
	waitTCP(t, st.otlpHTTP)
	return st
}

// Jaeger's JSON API model (the part the test reads).
type jaegerResponse struct {
	Data   []jaegerTrace `json:"data"`
	Errors []struct {
		Code int    `json:"code"`
		Msg  string `json:"msg"`
	} `json:"errors"`
}

type jaegerTrace struct {
	TraceID   string                   `json:"traceID"`
	Spans     []jaegerSpan             `json:"spans"`
	Processes map[string]jaegerProcess `json:"processes"`
}

type jaegerSpan struct {
	TraceID       string `json:"traceID"`
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	StartTime int64       `json:"startTime"`
	Duration  int64       `json:"duration"`
	Tags      []jaegerKV  `json:"tags"`
	Logs      []jaegerLog `json:"logs"`
	ProcessID string      `json:"processID"`
}

type jaegerKV struct {
	Key   string `json:"key"`
	Type  string `json:"type"`
	Value any    `json:"value"`
}

type jaegerLog struct {
	Timestamp int64      `json:"timestamp"`
	Fields    []jaegerKV `json:"fields"`
}

type jaegerProcess struct {
	ServiceName string     `json:"serviceName"`
	Tags        []jaegerKV `json:"tags"`
}

func tag(kvs []jaegerKV, key string) (any, bool) {
	for _, kv := range kvs {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return nil, false
}

func tagString(kvs []jaegerKV, key string) string {
	v, ok := tag(kvs, key)
	if !ok {
		return ""
	}
	return fmt.Sprint(v)
}

// getJSON GETs url into v; 404 gives errNotFound.
var errNotFound = errors.New("not found")

func getJSON(ctx context.Context, c *http.Client, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode == http.StatusNotFound {
		return errNotFound
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, tail(string(body), 300))
	}
	return json.Unmarshal(body, v)
}

func getText(c *http.Client, url string) (string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// monoNow reads CLOCK_MONOTONIC, the clock of step facts.
func monoNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// percentile of xs (sorted copy), p in [0, 1].
func percentile(xs []time.Duration, p float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(p*float64(len(s)-1) + 0.5)
	return s[i]
}

func emptyEnv(string) (string, bool) { return "", false }
