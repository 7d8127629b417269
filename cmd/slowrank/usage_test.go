package main

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/slowrank/slowrank/agent"
)

// noAgent points the endpoint flags' default at a socket nobody serves, so
// that a test never reaches an agent running on the machine.
func noAgent(t *testing.T) {
	t.Setenv("SLOWRANK_STATUS_SOCKET", filepath.Join(t.TempDir(), "none.sock"))
	t.Setenv("SLOWRANK_STATUS_ADDR", "")
}

func TestUsageErrorsExitTwoOnOneLine(t *testing.T) {
	noAgent(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"no command", nil},
		{"unknown command", []string{"nosuch"}},
		{"control without a subcommand", []string{"control"}},
		{"control with an unknown subcommand", []string{"control", "frobnicate"}},
		{"control set with a bad value", []string{"control", "set", "--threshold", "x"}},
		{"control set with an invalid setting", []string{"control", "set", "--threshold", "-1"}},
		{"control set with nothing to set", []string{"control", "set"}},
		{"control pause with an argument", []string{"control", "pause", "extra", "--socket", "/nonexistent"}},
		{"status with an argument", []string{"status", "extra"}},
		{"agent with a status socket path over sun_path", []string{"agent", "--status-socket", "/run/" + strings.Repeat("s", 110)}},
		{"simulate factor NaN", []string{"simulate", "--slow", "rank=1,phase=compute,from=1s,factor=NaN", "--output", "$DIR/out"}},
		{"simulate factor Inf", []string{"simulate", "--slow", "rank=1,phase=compute,from=1s,factor=+Inf", "--output", "$DIR/out"}},
		{"simulate jitter NaN", []string{"simulate", "--jitter", "NaN", "--output", "$DIR/out"}},
		{"simulate comm-ms NaN", []string{"simulate", "--comm-ms", "NaN", "--output", "$DIR/out"}},
		{"aggregate negative max-hosts", []string{"aggregate", "--listen", "127.0.0.1:0", "--duration", "100ms", "--max-hosts", "-1"}},
		{"aggregate negative max-request-bytes", []string{"aggregate", "--listen", "127.0.0.1:0", "--duration", "100ms", "--max-request-bytes", "-5"}},
		{"aggregate zero max-hosts", []string{"aggregate", "--listen", "127.0.0.1:0", "--duration", "100ms", "--max-hosts", "0"}},
		{"top with a negative count", []string{"top", "--count", "-1"}},
		{"replay of a directory", []string{"replay", "--input", "$DIR"}},
		{"status at a port that is not a number", []string{"status", "--addr", "127.0.0.1:badport"}},
		{"status at port 0", []string{"status", "--addr", "127.0.0.1:0"}},
		{"status at an address without a port", []string{"status", "--addr", "localhost"}},
		{"top at a bad port", []string{"top", "--addr", "localhost:99999", "--count", "1"}},
		{"control at a bad port", []string{"control", "pause", "--addr", "localhost:x"}},
		{"aggregate negative stats-every", []string{"aggregate", "--listen", "127.0.0.1:0", "--duration", "100ms", "--stats-every", "-1s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg, code := runErr(t, nil, tc.args...)
			if code != exitUsage {
				t.Fatalf("exit %d (%s), want %d", code, msg, exitUsage)
			}
			if msg == "" || strings.Contains(msg, "\n") {
				t.Errorf("message %q is not one line", msg)
			}
		})
	}
}

func TestHelpAndVersionExitZero(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"control", "--help"}, {"control", "set", "--help"}, {"--version"}} {
		if msg, code := runErr(t, nil, args...); code != 0 {
			t.Errorf("%v: exit %d (%s), want 0", args, code, msg)
		}
	}
}

// fakeControlSocket serves /control on a Unix socket and counts the requests.
func fakeControlSocket(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	dir, err := os.MkdirTemp("", "sr") // short: socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "a.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		if err := json.NewEncoder(w).Encode(agent.ControlResponse{OK: true, Control: &agent.ControlState{}}); err != nil {
			t.Error(err)
		}
	})}
	go func() { _ = srv.Serve(ln) }() // http.ErrServerClosed at cleanup; failing to serve fails the requests
	t.Cleanup(func() { srv.Close() })
	return sock, &n
}

func TestControlHonoursSocketWhereverGiven(t *testing.T) {
	noAgent(t)
	sock, n := fakeControlSocket(t)
	for _, args := range [][]string{
		{"control", "pause", "--socket", sock},
		{"control", "--socket", sock, "pause"},
		{"control", "--socket", sock, "resume"},
		{"control", "--socket", sock, "set", "--threshold", "0.1"},
	} {
		before := n.Load()
		if msg, code := runErr(t, nil, args...); code != 0 || n.Load() != before+1 {
			t.Errorf("%v: exit %d (%s), %d requests to %s, want exit 0 and one", args, code, msg, n.Load()-before, sock)
		}
	}
	before := n.Load()
	if _, code := runErr(t, nil, "control", "pause", "extra", "--socket", sock); code != exitUsage || n.Load() != before {
		t.Errorf("argument before --socket: exit %d, %d requests; want exit 2 and none", code, n.Load()-before)
	}
}
