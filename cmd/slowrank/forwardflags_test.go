package main

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/slowrank/slowrank/internal/certfile/certtest"
)

// TestForwarderFlags: the agent's --aggregator-* flags build a forwarder
// or refuse, with exit 2, what could not work as the user meant.
func TestForwarderFlags(t *testing.T) {
	dir := t.TempDir()
	certtest.Write(t, dir, 1, "hostA")
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	for _, tc := range []struct {
		name string
		args []string
		ok   bool
	}{
		{"no aggregator", nil, true},
		{"a client certificate over TLS", []string{"--aggregator", "grpcs://127.0.0.1:1", "--aggregator-cert", cert, "--aggregator-key", key}, true},
		{"a client certificate over HTTPS", []string{"--aggregator", "https://127.0.0.1:1", "--aggregator-cert", cert, "--aggregator-key", key}, true},
		{"a certificate without its key", []string{"--aggregator", "grpcs://127.0.0.1:1", "--aggregator-cert", cert}, false},
		{"a key without its certificate", []string{"--aggregator", "grpcs://127.0.0.1:1", "--aggregator-key", key}, false},
		{"a certificate over plaintext, never asked for", []string{"--aggregator", "127.0.0.1:1", "--aggregator-cert", cert, "--aggregator-key", key}, false},
		{"a certificate that is not one", []string{"--aggregator", "grpcs://127.0.0.1:1", "--aggregator-cert", key, "--aggregator-key", key}, false},
		{"a bad compression", []string{"--aggregator", "127.0.0.1:1", "--aggregator-compression", "zstd"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			app := &cli.App{Name: "t", Flags: aggregatorFlags(), ExitErrHandler: func(*cli.Context, error) {},
				Action: func(c *cli.Context) error {
					f, err := openForwarder(c, "hostA")
					if f != nil {
						if cerr := f.Close(context.Background()); cerr != nil {
							t.Logf("close: %v", cerr)
						}
					}
					return err
				}}
			err := app.Run(append([]string{"t"}, tc.args...))
			var ec cli.ExitCoder
			switch {
			case tc.ok && err != nil:
				t.Fatalf("refused: %v", err)
			case !tc.ok && (!errors.As(err, &ec) || ec.ExitCode() != exitUsage):
				t.Fatalf("got %v, want exit %d", err, exitUsage)
			}
		})
	}
}
