package main

import (
	"strings"
	"testing"
)

func TestAggregateLimitsAreUsageErrors(t *testing.T) {
	base := []string{"aggregate", "--listen", "127.0.0.1:0", "--duration", "100ms"}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"negative max-conns", []string{"--max-conns", "-1"}},
		{"zero max-concurrent", []string{"--max-concurrent", "0"}},
		{"negative max-concurrent", []string{"--max-concurrent", "-16"}},
		{"negative max-conns-per-source", []string{"--max-conns-per-source", "-1"}},
		{"more per source than in all", []string{"--max-conns", "10", "--max-conns-per-source", "11"}},
		{"negative max-memory", []string{"--max-memory", "-1"}},
		{"max-memory without a number", []string{"--max-memory", "lots"}},
		{"max-memory with an unknown unit", []string{"--max-memory", "5TB"}},
		{"max-memory overflowing", []string{"--max-memory", "9000000000000GiB"}},
		{"max-memory below one request", []string{"--max-memory", "1KiB"}},
		{"zero max-ranks", []string{"--max-ranks", "0"}},
		{"negative max-ranks-per-host", []string{"--max-ranks-per-host", "-3"}},
		{"negative max-jobs-per-host", []string{"--max-jobs-per-host", "-3"}},
		{"negative max-ranks-per-client", []string{"--max-ranks-per-client", "-1"}},
		{"negative max-hosts-per-client", []string{"--max-hosts-per-client", "-1"}},
		{"negative max-jobs-per-client", []string{"--max-jobs-per-client", "-1"}},
		{"negative max-queue-per-client", []string{"--max-queue-per-client", "-1"}},
		{"more hosts per client than in all", []string{"--max-hosts", "100", "--max-hosts-per-client", "101"}},
		{"client CA without TLS", []string{"--tls-client-ca", "/nonexistent"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg, code := runErr(t, nil, append(append([]string(nil), base...), tc.args...)...)
			if code != exitUsage {
				t.Fatalf("exit %d (%s), want %d", code, msg, exitUsage)
			}
			if msg == "" || strings.Contains(msg, "\n") {
				t.Errorf("message %q is not one line", msg)
			}
		})
	}
}

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"1", 1}, {"4096", 4096}, {"64KiB", 64 << 10}, {"256MiB", 256 << 20}, {"2GiB", 2 << 30},
		{"0", 0}, {"-1", 0}, {"MiB", 0}, {"1.5GiB", 0}, {"1 GB", 0},
	} {
		got, err := parseBytes(tc.in)
		if tc.want == 0 && err == nil {
			t.Errorf("parseBytes(%q) = %d, want an error", tc.in, got)
		} else if tc.want != 0 && (err != nil || got != tc.want) {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}
