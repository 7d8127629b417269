package aggregate

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/plog/plogotlp"

	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/otel/wire"
)

// dialFrom opens a TCP connection to addr from the loopback address src
// (127.0.0.2 and so on all reach the loopback device on Linux), so that a
// test can play several sources.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 2 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial from %s: %v", src, err)
	}
	return c
}

// goodLogsBody is an OTLP/HTTP protobuf body with one valid step fact.
func goodLogsBody(t *testing.T) []byte {
	t.Helper()
	body, err := plogotlp.NewExportRequestFromLogs(wire.EncodeLogs("h1", nil, []detector.Step{sampleStep()}, nil)).MarshalProto()
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// agentPost sends one authenticated request on a fresh connection, as an
// agent would, and returns its status (0 when it did not complete in time).
func agentPost(t *testing.T, addr, token string, body []byte) int {
	t.Helper()
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/logs", strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/x-protobuf")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Logf("agent request: %v", err)
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// unauthorizedThenIdle sends one request without a token, reads the 401 and
// keeps the connection open, as the 4,100 connections did. It
// reports whether the server closed the connection after its answer.
func unauthorizedThenIdle(c net.Conn) (closed bool, err error) {
	_, err = fmt.Fprintf(c, "POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: 4\r\n\r\njunk")
	if err != nil {
		return false, err
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return false, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		return false, fmt.Errorf("status %d, want 401", resp.StatusCode)
	}
	return resp.Close, nil
}

func TestIdleConnectionsAfterUnauthorizedDoNotBlockAnAgent(t *testing.T) {
	const maxConns = 64
	ts := startServer(t, ServerConfig{Token: "s3cret", MaxConns: maxConns, MaxConnsPerSource: maxConns})
	// More 401'd, idle connections than the server has slots, from one
	// source (the issue used 4,100 against the default 4,096 slots).
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	closedByServer := 0
	for range maxConns + 4 {
		c := dialFrom(t, "127.0.0.2", ts.addr)
		conns = append(conns, c)
		closed, err := unauthorizedThenIdle(c)
		if err != nil {
			break // today's server stops accepting once its slots are held
		}
		if closed {
			closedByServer++
		}
	}
	if closedByServer < maxConns {
		t.Errorf("%d of %d connections closed by the server after their 401", closedByServer, len(conns))
	}
	if code := agentPost(t, ts.addr, "s3cret", goodLogsBody(t)); code != http.StatusOK {
		t.Fatalf("authenticated agent got %d behind %d idle unauthorized connections, want 200", code, len(conns))
	}
}

func TestSilentConnectionsOfOneSourceDoNotBlockAnother(t *testing.T) {
	ts := startServer(t, ServerConfig{Token: "s3cret", MaxConns: 32, MaxConnsPerSource: 8})
	// Connections that send nothing at all hold a slot until the header
	// timeout; one source may hold only its share.
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for range 40 {
		conns = append(conns, dialFrom(t, "127.0.0.3", ts.addr))
	}
	if code := agentPost(t, ts.addr, "s3cret", goodLogsBody(t)); code != http.StatusOK {
		t.Fatalf("agent from another source got %d while one source opened 40 silent connections, want 200", code)
	}
	deadline := time.Now().Add(2 * time.Second)
	for ts.srv.Stats().RefusedConns < 40-8 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := ts.srv.Stats().RefusedConns; got < 40-8 {
		t.Errorf("connections refused beyond the source's share: %d, want at least %d", got, 40-8)
	}
}

// slowBody starts a request that declares a body and then sends it one byte
// at a time, far below any reasonable rate.
func slowBody(ctx context.Context, c net.Conn, token string, wg *sync.WaitGroup) {
	defer wg.Done()
	_, err := fmt.Fprintf(c, "POST /v1/logs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/x-protobuf\r\nContent-Length: 100000\r\n\r\n", token)
	if err != nil {
		return
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if _, err := c.Write([]byte{0}); err != nil {
				return
			}
		}
	}
}

func TestSlowBodiesDoNotTakeEveryDecodeSlot(t *testing.T) {
	const slots = 16
	ts := startServer(t, ServerConfig{Token: "s3cret", MaxConcurrent: slots})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var conns []net.Conn
	for i := range slots {
		c := dialFrom(t, fmt.Sprintf("127.0.0.%d", 10+i), ts.addr)
		conns = append(conns, c)
		wg.Add(1)
		go slowBody(ctx, c, "s3cret", &wg)
	}
	t.Cleanup(func() {
		cancel()
		for _, c := range conns {
			c.Close()
		}
		wg.Wait()
	})
	time.Sleep(300 * time.Millisecond) // every slow body has started
	if code := agentPost(t, ts.addr, "s3cret", goodLogsBody(t)); code != http.StatusOK {
		t.Fatalf("agent got %d while %d slow bodies were being sent, want 200", code, slots)
	}
}

func TestBodyBelowMinimumRateIsCut(t *testing.T) {
	ts := startServer(t, ServerConfig{Token: "s3cret", MinBodyRate: 1 << 20, BodyGrace: 300 * time.Millisecond})
	c := dialFrom(t, "127.0.0.4", ts.addr)
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go slowBody(ctx, c, "s3cret", &wg)
	defer func() { cancel(); c.Close(); wg.Wait() }()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a body sent below the minimum rate: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout || !resp.Close {
		t.Errorf("slow body answered %d (close %v), want 408 and the connection closed", resp.StatusCode, resp.Close)
	}
	if got := ts.srv.Stats().SlowBodies; got != 1 {
		t.Errorf("slow bodies counted: %d, want 1", got)
	}
}

func TestBodiesBeyondTheMemoryBudgetAreRefused(t *testing.T) {
	// Two bodies of 48 KiB fit in 100 KiB; the third waits for none of them.
	ts := startServer(t, ServerConfig{Token: "s3cret", MaxRequestBytes: 64 << 10, MaxMemory: 100 << 10})
	var conns []net.Conn
	for i := range 2 {
		c := dialFrom(t, fmt.Sprintf("127.0.0.%d", 40+i), ts.addr)
		conns = append(conns, c)
		if _, err := fmt.Fprintf(c, "POST /v1/logs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\nContent-Type: application/x-protobuf\r\nContent-Length: %d\r\n\r\n", 48<<10); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(make([]byte, 1)); err != nil { // the rest never comes
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	time.Sleep(200 * time.Millisecond)
	body := make([]byte, 48<<10)
	if code := agentPost(t, ts.addr, "s3cret", body); code != http.StatusServiceUnavailable {
		t.Errorf("third 48 KiB body within a 100 KiB budget: %d, want 503", code)
	}
	// Small requests still fit.
	if code := agentPost(t, ts.addr, "s3cret", goodLogsBody(t)); code != http.StatusOK {
		t.Errorf("small request: %d, want 200", code)
	}
}

// declareAndStall starts a request that declares a body of size bytes and
// sends none of it, as the 64 connections did.
func declareAndStall(t *testing.T, c net.Conn, token string, size int) {
	t.Helper()
	if _, err := fmt.Fprintf(c, "POST /v1/logs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/x-protobuf\r\nContent-Length: %d\r\n\r\n", token, size); err != nil {
		t.Fatal(err)
	}
}

func TestDeclaredBodiesHoldNoMemoryUntilTheyArrive(t *testing.T) {
	// Before: each stalled request reserved its declared 4 MiB, so that
	// two of them spent this 8 MiB budget (the issue: 64 spent 256 MiB)
	// and every other client got 503 until their deadline (69 s).
	const stalled = 32
	ts := startServer(t, ServerConfig{Token: "s3cret", MaxRequestBytes: 4 << 20, MaxMemory: 8 << 20})
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := range stalled {
		c := dialFrom(t, fmt.Sprintf("127.0.1.%d", 1+i), ts.addr)
		conns = append(conns, c)
		declareAndStall(t, c, "s3cret", 4<<20)
	}
	time.Sleep(200 * time.Millisecond) // every stalled body is being read
	if used := ts.srv.mem.used.Load(); used > stalled*bodyChunk {
		t.Errorf("%d stalled bodies hold %d bytes of the budget, want at most %d (one chunk each)", stalled, used, stalled*bodyChunk)
	}
	if code := agentPost(t, ts.addr, "s3cret", goodLogsBody(t)); code != http.StatusOK {
		t.Errorf("agent got %d behind %d stalled 4 MiB bodies, want 200", code, stalled)
	}
	// A large honest body still fits beside them.
	big := make([]byte, 2<<20)
	if code := agentPost(t, ts.addr, "s3cret", big); code != http.StatusBadRequest {
		t.Errorf("honest 2 MiB body (undecodable, so 400 once read) got %d, want 400: it was not read", code)
	}
}

func TestBodyDeadlineFollowsTheBytesReceivedNotTheDeclaredSize(t *testing.T) {
	// Before: the deadline was grace + declared size / rate: 4 MiB at
	// 64 KiB/s bought 64 s with nothing sent.
	ts := startServer(t, ServerConfig{Token: "s3cret", MinBodyRate: 64 << 10, BodyGrace: 300 * time.Millisecond})
	c := dialFrom(t, "127.0.0.5", ts.addr)
	defer c.Close()
	start := time.Now()
	declareAndStall(t, c, "s3cret", 4<<20)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer within 5 s to a declared 4 MiB body that never came: %v", err)
	}
	resp.Body.Close()
	if took := time.Since(start); resp.StatusCode != http.StatusRequestTimeout || took > 2*time.Second {
		t.Errorf("stalled body answered %d after %s, want 408 within the 300 ms grace (+ scheduling)", resp.StatusCode, took.Round(time.Millisecond))
	}
	if got := ts.srv.mem.used.Load(); got != 0 {
		t.Errorf("%d bytes still charged after the body was cut", got)
	}
}

// postStepsFrom sends one request from the loopback address src: steps of
// job for ranks, claimed by host. It returns the HTTP status (0: no answer).
func postStepsFrom(t *testing.T, src, addr, token, host, job string, ranks []int) int {
	t.Helper()
	var steps []detector.Step
	for _, r := range ranks {
		st := sampleStep()
		st.Job, st.Rank, st.Host = job, r, host
		steps = append(steps, st)
	}
	body, err := plogotlp.NewExportRequestFromLogs(wire.EncodeLogs(host, nil, steps, nil)).MarshalProto()
	if err != nil {
		t.Fatal(err)
	}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 2 * time.Second}
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}}
	defer client.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/logs", strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		t.Logf("request from %s: %v", src, err)
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func TestClaimedHostNamesDoNotMultiplyAClientsRankQuota(t *testing.T) {
	// Before: quotas were per claimed host name, so one client naming a
	// new host in every request took the whole global rank budget (the
	// issue: 2^19 ranks, 1.75 GB, in 20 s) and honest ranks were refused.
	const budget, share = 64, 8
	ts := startServerWith(t, Config{MaxRanks: budget, MaxRanksPerClient: share}, ServerConfig{Token: "s3cret"})
	for i := range 16 {
		ranks := []int{4 * i, 4*i + 1, 4*i + 2, 4*i + 3}
		if code := postStepsFrom(t, "127.0.3.1", ts.addr, "s3cret", fmt.Sprint("evil-", i), "big", ranks); code != http.StatusOK {
			t.Fatalf("attacker's request %d: %d", i, code)
		}
	}
	// An honest agent (another source) gets all its ranks judged.
	if code := postStepsFrom(t, "127.0.3.2", ts.addr, "s3cret", "honest", "train", []int{0, 1, 2, 3}); code != http.StatusOK {
		t.Fatalf("honest agent: %d", code)
	}
	ts.waitFacts(t, share+4)
	time.Sleep(50 * time.Millisecond) // nothing more arrives
	st := ts.agg.Stats()
	if st.Facts != share+4 || st.RefusedRanksClient != 64-share || st.Ranks > share+4 {
		t.Errorf("facts %d, refused by the client share %d, ranks with state %d; want %d, %d, at most %d",
			st.Facts, st.RefusedRanksClient, st.Ranks, share+4, 64-share, share+4)
	}
}

func TestConnectionFillFromManySourcesDelaysNoAgent(t *testing.T) {
	// Before: when every slot was taken, Accept waited for one, and silent
	// connections from many loopback addresses held them until the header
	// timeout: honest agents waited 4–5 s.
	tests := []struct {
		name               string
		sources, perSource int
	}{
		{"many sources at their share", 16, 4},
		{"one connection from each of many sources", 64, 1},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const total = 64
			ts := startServer(t, ServerConfig{Token: "s3cret", MaxConns: total, MaxConnsPerSource: 4})
			var conns []net.Conn
			t.Cleanup(func() {
				for _, c := range conns {
					c.Close()
				}
			})
			for s := range tt.sources {
				for range tt.perSource {
					conns = append(conns, dialFrom(t, fmt.Sprintf("127.0.%d.%d", 10+i, 1+s), ts.addr))
				}
			}
			// Every slot is taken (the listener counted them all).
			deadline := time.Now().Add(2 * time.Second)
			for ts.srv.conns.openCount() < total && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			start := time.Now()
			code := agentPost(t, ts.addr, "s3cret", goodLogsBody(t))
			if took := time.Since(start); code != http.StatusOK || took > time.Second {
				t.Fatalf("agent got %d after %s with all %d slots held by silent connections, want 200 at once", code, took.Round(time.Millisecond), total)
			}
			if st := ts.srv.Stats(); st.EvictedConns < 1 {
				t.Errorf("evicted connections: %d, want at least 1", st.EvictedConns)
			}
		})
	}
}

func TestEvictionNeverTakesFromASourceNoLargerThanTheNewcomers(t *testing.T) {
	ts := startServer(t, ServerConfig{Token: "s3cret", MaxConns: 4, MaxConnsPerSource: 4})
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for s := range 2 {
		for range 2 {
			conns = append(conns, dialFrom(t, fmt.Sprintf("127.0.20.%d", 1+s), ts.addr))
		}
	}
	// A third connection from source 1 finds the others no larger than its
	// own: it is refused, nobody is evicted.
	conns = append(conns, dialFrom(t, "127.0.20.1", ts.addr))
	deadline := time.Now().Add(2 * time.Second)
	for ts.srv.Stats().RefusedConns < 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if st := ts.srv.Stats(); st.RefusedConns != 1 || st.EvictedConns != 0 {
		t.Errorf("refused %d, evicted %d; want 1 and 0", st.RefusedConns, st.EvictedConns)
	}
}

// openCount is the number of connections holding a slot.
func (l *limitListener) openCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}
