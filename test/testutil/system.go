package testutil

import (
	"net"
	"testing"

	"github.com/slowrank/slowrank/internal/monoclock"
)

// FreeAddr returns a TCP address on 127.0.0.1 ("127.0.0.1:port") that
// was free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// MonoNow reads CLOCK_MONOTONIC, the clock of the agent's step facts.
func MonoNow() int64 { return monoclock.Now() }
