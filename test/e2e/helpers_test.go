// Package e2e runs slowrank's OpenTelemetry export against a real
// OpenTelemetry Collector and Jaeger v2 on 127.0.0.1. The servers are built
// by test/e2e/build-tools.sh into .cache/tools/bin (or $SLOWRANK_TOOLS_BIN);
// without them the tests skip and say so.
package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/slowrank/slowrank/test/testutil"
)

// startServer runs bin with args and env; cleanup stops it (SIGTERM, then
// SIGKILL after 5 s) and prints its output when the test failed.
func startServer(t testing.TB, name, bin string, args []string, env map[string]string) *testutil.Proc {
	t.Helper()
	var kvs []string
	for k, v := range env {
		kvs = append(kvs, k+"="+v)
	}
	return testutil.StartProc(t, name, 5*time.Second, 4000, kvs, append([]string{bin}, args...)...)
}

// waitReady polls url until it answers 200 or the server exits.
func waitReady(t testing.TB, s *testutil.Proc, client *http.Client, url string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.Done:
			t.Fatalf("%s exited: %v\n%s", s.Name, s.Err, testutil.Tail(s.Out.String(), 4000))
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
	t.Fatalf("%s not ready at %s after 30s\n%s", s.Name, url, testutil.Tail(s.Out.String(), 4000))
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
	root := testutil.RepoRoot(t)
	tr := &http.Transport{}
	st := &stack{client: &http.Client{Timeout: 5 * time.Second, Transport: tr}}
	t.Cleanup(tr.CloseIdleConnections)

	jq, jqg, jog, joh := testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t)
	j := startServer(t, "jaeger", filepath.Join(bin, "jaeger"),
		[]string{"--config", filepath.Join(root, "test", "e2e", "testdata", "jaeger.yaml")},
		map[string]string{
			"JAEGER_QUERY_HTTP": jq, "JAEGER_QUERY_GRPC": jqg,
			"JAEGER_OTLP_GRPC": jog, "JAEGER_OTLP_HTTP": joh,
		})
	st.jaegerQuery = "http://" + jq
	waitReady(t, j, st.client, st.jaegerQuery+"/api/services")
	waitTCP(t, jog)

	cg, ch, cp := testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t)
	c := startServer(t, "otelcol", filepath.Join(bin, "otelcol"),
		[]string{"--config", filepath.Join(root, "deploy", "otelcol.yaml")},
		map[string]string{
			"SLOWRANK_OTLP_GRPC": cg, "SLOWRANK_OTLP_HTTP": ch,
			"SLOWRANK_JAEGER_OTLP": jog, "SLOWRANK_PROM_ENDPOINT": cp,
			"SLOWRANK_OTELCOL_LOG_LEVEL": "warn",
		})
	st.otlpGRPC, st.otlpHTTP, st.prom = cg, ch, "http://"+cp+"/metrics"
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
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, testutil.Tail(string(body), 300))
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
