package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/slowrank/slowrank/agent"
	"github.com/slowrank/slowrank/agent/duty"
	"github.com/slowrank/slowrank/agent/localapi"
	"github.com/slowrank/slowrank/detector"
)

// statusServerFlags are the agent's flags for its local endpoint.
func statusServerFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "status-socket", Value: localapi.DefaultSocket, Usage: "serve status, metrics and runtime control on this Unix socket (mode 0600; empty: none)", EnvVars: []string{"SLOWRANK_STATUS_SOCKET"}},
		&cli.StringFlag{Name: "status-addr", Usage: "also serve GET /status and /metrics (read-only) on this TCP address, e.g. 127.0.0.1:9464", EnvVars: []string{"SLOWRANK_STATUS_ADDR"}},
		&cli.BoolFlag{Name: "status-allow-remote", Usage: "allow a non-loopback --status-addr (e.g. 0.0.0.0:9464 for Prometheus in Kubernetes)", EnvVars: []string{"SLOWRANK_STATUS_ALLOW_REMOTE"}},
	}
}

// checkStatusServerFlags validates the endpoint flags before anything
// starts.
func checkStatusServerFlags(c *cli.Context) error {
	if sock := c.String("status-socket"); sock != "" {
		if err := localapi.CheckSocketPath(sock); err != nil {
			return cli.Exit(fmt.Sprintf("--status-socket: %v", err), exitUsage)
		}
	}
	if addr := c.String("status-addr"); addr != "" {
		if err := localapi.CheckStatusAddr(addr, c.Bool("status-allow-remote")); err != nil {
			return cli.Exit(fmt.Sprintf("--status-addr: %v", err), exitUsage)
		}
	}
	return nil
}

// startStatusServer serves the agent's local endpoint. The endpoint is an
// aid, not the agent's job: when it cannot listen, the agent runs on
// without it and says so; a socket that another listener holds (an agent
// still exiting) is waited for in the background (the server logs that it
// waits, and when it listens). srv is nil without an endpoint; the returned
// close function is never nil.
func startStatusServer(c *cli.Context, a *agent.Agent, sinks *sinkSet) (srv *localapi.Server, closeStatus func()) {
	cfg := localapi.ServerConfig{
		Socket: c.String("status-socket"), Addr: c.String("status-addr"), AllowRemote: c.Bool("status-allow-remote"),
		Metrics: sinks.metrics, Logger: slog.Default(),
	}
	if cfg.Socket == "" && cfg.Addr == "" {
		return nil, func() {}
	}
	srv, err := localapi.NewServer(agent.LocalAPI(a, version, sinks.health(c)), cfg)
	if err != nil {
		slog.Warn("local status endpoint unavailable; the agent runs without it", "err", err)
		return nil, func() {}
	}
	if addrs := srv.Addrs(); len(addrs) > 0 {
		slog.Info("local status endpoint", "listen", strings.Join(addrs, " "), "waiting_for_socket", srv.Waiting())
	}
	return srv, func() {
		if err := srv.Close(); err != nil {
			slog.Warn("closing the status endpoint", "err", err)
		}
	}
}

// observeAgent reports the agent's self-metrics and, with srv, the status
// endpoint's.
func observeAgent(a *agent.Agent, srv *localapi.Server) func(func(string, float64, ...string)) {
	if srv == nil {
		return a.Observe
	}
	return func(obs func(string, float64, ...string)) {
		a.Observe(obs)
		for k, v := range srv.Counters() {
			obs(k, float64(v))
		}
	}
}

// health reports the outputs for the status endpoint.
func (s *sinkSet) health(c *cli.Context) func() agent.ExportHealth {
	files := map[string]string{}
	for _, name := range []string{"facts", "verdicts"} {
		if p := c.String(name); p != "" {
			files[name] = p
		}
	}
	mode := "off"
	endpoint := ""
	if s.otelOn {
		mode = "otlp"
		if c.String("otel") == "stdout" {
			mode = "stdout"
		}
		endpoint = os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
		if endpoint == "" {
			endpoint = os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
		}
	}
	return func() agent.ExportHealth {
		h := agent.ExportHealth{OTel: mode, Endpoint: redactEndpoint(endpoint), Files: files}
		if s.otelOn {
			st := s.otel.Stats()
			h.Counters = map[string]int64{
				"spans_exported":       st.SpansExported,
				"export_errors":        st.ExportErrors,
				"metric_points_failed": st.MetricPointsFailed,
				"late_facts":           st.LateFacts,
				"forced_settles":       st.ForcedSettles,
				"buffered_steps":       int64(st.BufferedSteps),
			}
			for k, v := range st.SpansDropped {
				h.Counters["spans_dropped_"+k] = v
			}
			for k, v := range st.FactsDropped {
				h.Counters["facts_dropped_"+k] = v
			}
		}
		for _, w := range []struct {
			name string
			lost func() int64
		}{{"facts", s.factsLost}, {"verdicts", s.verdictsLost}} {
			if n := w.lost(); n > 0 {
				if h.Counters == nil {
					h.Counters = map[string]int64{}
				}
				h.Counters[w.name+"_lines_lost"] = n
			}
		}
		return h
	}
}

func (s *sinkSet) factsLost() int64 {
	if s.facts == nil {
		return 0
	}
	return s.facts.Lost()
}

func (s *sinkSet) verdictsLost() int64 {
	if s.verdicts == nil {
		return 0
	}
	return s.verdicts.Lost()
}

// endpointFlags select the agent to talk to.
func endpointFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "socket", Value: localapi.DefaultSocket, Usage: "the agent's Unix socket", EnvVars: []string{"SLOWRANK_STATUS_SOCKET"}},
		&cli.StringFlag{Name: "addr", Usage: "the agent's TCP status address (HOST:PORT) instead of the socket (read-only)", EnvVars: []string{"SLOWRANK_STATUS_ADDR"}},
	}
}

// lineageString is the value of string flag name where it was given on the
// command line: on the command itself or on a parent ("control --socket S
// pause"). cli's own lookup stops at the nearest command that defines the
// flag, and so returns the subcommand's default or environment value. A
// level's flag definition holds that default or environment value (cli
// writes the environment's into it), so a level whose value differs was
// given on the command line.
func lineageString(c *cli.Context, name string) string {
	for _, x := range c.Lineage() {
		if x.Command == nil {
			continue
		}
		for _, f := range x.Command.Flags {
			if sf, ok := f.(*cli.StringFlag); ok && slices.Contains(sf.Names(), name) && x.String(name) != sf.Value {
				return x.String(name)
			}
		}
	}
	return c.String(name)
}

// endpoint is a client of an agent's local endpoint.
type endpoint struct {
	where  string // for messages
	base   string
	client *http.Client
}

func newEndpoint(c *cli.Context) (*endpoint, error) {
	if addr := lineageString(c, "addr"); addr != "" {
		if err := checkHostPort(addr); err != nil {
			return nil, cli.Exit(fmt.Sprintf("--addr %q: %v", addr, err), exitUsage)
		}
		return &endpoint{where: addr, base: "http://" + addr, client: &http.Client{Timeout: 5 * time.Second}}, nil
	}
	sock := lineageString(c, "socket")
	return &endpoint{where: sock, base: "http://slowrank-agent", client: newEndpointClient(sock, 5*time.Second)}, nil
}

// checkHostPort refuses an address that no request could reach, a usage
// error rather than a failure to reach the agent: it must be host:port
// with a port number in 1..65535.
func checkHostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want host:port: %w", err)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("port %q is not a number in 1..65535", port)
	}
	return nil
}

// newEndpointClient is an HTTP client that dials the Unix socket sock.
func newEndpointClient(sock string, timeout time.Duration) *http.Client {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}
	return &http.Client{Timeout: timeout, Transport: tr}
}

// explain turns a connection failure into what the operator should do;
// the failure stays in the chain for errors.Is.
func (e *endpoint) explain(err error) error {
	var ne net.Error
	switch {
	case errors.Is(err, os.ErrNotExist), errors.Is(err, syscall.ECONNREFUSED):
		return &explained{fmt.Sprintf("no agent answers at %s: start it (slowrank agent, systemctl start slowrank-agent) or pass --socket/--addr", e.where), err}
	case errors.Is(err, os.ErrPermission), errors.Is(err, syscall.EACCES):
		return &explained{fmt.Sprintf("permission denied on %s: the socket is root's (mode 0600): run with sudo", e.where), err}
	case errors.As(err, &ne) && ne.Timeout():
		return &explained{fmt.Sprintf("%s accepts connections but no agent answered in time: an agent still exiting "+
			"(a killed agent's exit can take seconds) or one that is stuck; a new agent takes the socket once it is gone", e.where), err}
	}
	return fmt.Errorf("ask the agent at %s: %w", e.where, err)
}

// explained is explain's answer: its message, and the failure it explains.
type explained struct {
	msg string
	err error
}

func (x *explained) Error() string { return x.msg }
func (x *explained) Unwrap() error { return x.err }

func (e *endpoint) status(ctx context.Context) (agent.StatusReport, error) {
	var rep agent.StatusReport
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.base+"/status", nil)
	if err != nil {
		return rep, err
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return rep, e.explain(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return rep, fmt.Errorf("agent at %s answered %s: %s", e.where, resp.Status, bytes.TrimSpace(b))
	}
	if err := json.NewDecoder(resp.Body).Decode(&rep); err != nil {
		return rep, fmt.Errorf("decode the agent's status: %w", err)
	}
	return rep, nil
}

func (e *endpoint) control(ctx context.Context, creq agent.ControlRequest) (agent.ControlResponse, error) {
	var cr agent.ControlResponse
	body, _ := json.Marshal(creq)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.base+"/control", bytes.NewReader(body))
	if err != nil {
		return cr, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.client.Do(req)
	if err != nil {
		return cr, e.explain(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&cr); err != nil {
		return cr, fmt.Errorf("agent at %s answered %s", e.where, resp.Status)
	}
	if resp.StatusCode != http.StatusOK {
		return cr, fmt.Errorf("agent refused: %s", cr.Error)
	}
	return cr, nil
}

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:      "status",
		Usage:     "show what a running agent is doing: attachments, counters, exporter health, last verdicts",
		UsageText: "slowrank status [--socket PATH | --addr HOST:PORT] [--json] [--watch]",
		Description: "Asks the agent's local endpoint (its Unix socket, root only, or its loopback TCP\n" +
			"address) for its status. --watch refreshes a live per-rank table every second\n" +
			"(the same as slowrank top).",
		Flags: append(endpointFlags(),
			&cli.BoolFlag{Name: "json", Usage: "print the agent's status as JSON", EnvVars: []string{"SLOWRANK_JSON"}},
			&cli.IntFlag{Name: "verdicts", Value: 8, Usage: "how many of the last verdicts to show", EnvVars: []string{"SLOWRANK_STATUS_VERDICTS"}},
			&cli.BoolFlag{Name: "watch", Aliases: []string{"w"}, Usage: "refresh a live table (slowrank top)"},
			&cli.DurationFlag{Name: "interval", Value: time.Second, Usage: "refresh period with --watch"},
		),
		Action: func(c *cli.Context) error {
			e, err := newEndpoint(c)
			if err != nil {
				return err
			}
			if c.Bool("watch") {
				return watch(c.Context, e, os.Stdout, c.Duration("interval"), 0)
			}
			rep, err := e.status(c.Context)
			if err != nil {
				return cli.Exit(err.Error(), 1)
			}
			if c.Bool("json") {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			var b bytes.Buffer
			writeStatus(&b, rep, e.where, c.Int("verdicts"))
			return writeOut(os.Stdout, &b)
		},
	}
}

func controlCommand() *cli.Command {
	show := func(c *cli.Context, req agent.ControlRequest) error {
		e, err := newEndpoint(c)
		if err != nil {
			return err
		}
		cr, err := e.control(c.Context, req)
		if err != nil {
			return cli.Exit(err.Error(), 1)
		}
		var b bytes.Buffer
		writeControl(&b, *cr.Control)
		return writeOut(os.Stdout, &b)
	}
	return &cli.Command{
		Name:  "control",
		Usage: "change a running agent without a restart: pause, resume, set detector and duty-cycle settings",
		UsageText: "slowrank control pause|resume\n" +
			"slowrank control set [--window 5s] [--threshold 0.05] [--phase-threshold host=0.15] [--floor 1ms]\n" +
			"                     [--consecutive 3]\n" +
			"                     [--duty-budget 0.003] [--duty-share 0.1 | --duty-auto] [--duty-period 10s]",
		Description: "Talks to the agent's Unix socket (root only). pause untracks every training process\n" +
			"in BPF and turns device collection off; resume undoes it. Detector changes take\n" +
			"effect at the next window boundary with fresh evidence: an alert needs --consecutive\n" +
			"slow windows again. --duty-share pins the share of each period with device\n" +
			"collection on; --duty-auto returns it to the overhead budget.",
		Flags: endpointFlags(),
		Subcommands: []*cli.Command{
			{Name: "pause", Usage: "stop collecting (processes stay attached)", Flags: endpointFlags(),
				Action: func(c *cli.Context) error { return show(c, agent.ControlRequest{Action: agent.ActionPause}) }},
			{Name: "resume", Usage: "collect again", Flags: endpointFlags(),
				Action: func(c *cli.Context) error { return show(c, agent.ControlRequest{Action: agent.ActionResume}) }},
			{Name: "set", Usage: "change detector or duty-cycle settings", Flags: append(endpointFlags(),
				&cli.DurationFlag{Name: "window", Usage: "evaluation window"},
				&cli.Float64Flag{Name: "threshold", Usage: "relative deviation that makes a window slow, a fraction in (0, 1)"},
				&cli.StringFlag{Name: "phase-threshold", Usage: "per-phase overrides of --threshold, e.g. host=0.15 (host=0 removes the override)"},
				&cli.DurationFlag{Name: "floor", Usage: "absolute difference below which no window is slow"},
				&cli.IntFlag{Name: "consecutive", Usage: "slow windows before an alert"},
				&cli.Float64Flag{Name: "duty-budget", Usage: "overhead budget of the agent: uprobes, device records, escalations (fraction of step time)"},
				&cli.Float64Flag{Name: "duty-share", Usage: "pin the on-share of device collection (0 < share <= 1)"},
				&cli.BoolFlag{Name: "duty-auto", Usage: "steer the on-share by the budget again"},
				&cli.DurationFlag{Name: "duty-period", Usage: "duty-cycle period"},
			), Action: func(c *cli.Context) error {
				req, err := controlSetRequest(c)
				if err != nil {
					return cli.Exit(err.Error(), exitUsage)
				}
				if err := req.Validate(); err != nil {
					return cli.Exit("control set: "+strings.ReplaceAll(err.Error(), "\n", "; "), exitUsage)
				}
				return show(c, req)
			}},
		},
	}
}

// controlSetRequest builds a "set" request from the flags given.
func controlSetRequest(c *cli.Context) (agent.ControlRequest, error) {
	req := agent.ControlRequest{Action: agent.ActionSet, DutyAuto: c.Bool("duty-auto")}
	dur := func(name string) *agent.Duration {
		if !c.IsSet(name) {
			return nil
		}
		d := agent.Duration(c.Duration(name))
		return &d
	}
	f64 := func(name string) *float64 {
		if !c.IsSet(name) {
			return nil
		}
		v := c.Float64(name)
		return &v
	}
	req.Window, req.Floor, req.DutyPeriod = dur("window"), dur("floor"), dur("duty-period")
	req.Threshold, req.DutyBudget, req.DutyShare = f64("threshold"), f64("duty-budget"), f64("duty-share")
	if c.IsSet("consecutive") {
		n := c.Int("consecutive")
		req.Consecutive = &n
	}
	if req.Threshold != nil {
		if err := checkThreshold(c, "threshold", *req.Threshold); err != nil {
			return req, err
		}
	}
	pt, err := parsePhaseThresholds(c.String("phase-threshold"))
	if err != nil {
		return req, fmt.Errorf("invalid --phase-threshold: %w", err)
	}
	for _, ph := range slices.Sorted(maps.Keys(pt)) {
		if t := pt[ph]; t != 0 { // 0 removes the phase's override
			if err := checkThreshold(c, "phase-threshold", t, ph); err != nil {
				return req, err
			}
		}
	}
	req.PhaseThresholds = pt
	return req, nil
}

// writeOut writes what a printer rendered into b (the write* functions
// render into a buffer, which cannot fail) to w, once: a write that fails
// (a full disk under a redirection) is the command's error, not an output
// cut short under exit status 0.
func writeOut(w io.Writer, b *bytes.Buffer) error {
	if _, err := w.Write(b.Bytes()); err != nil {
		return fmt.Errorf("write output: %w", err)
	}
	return nil
}

// writeControl prints the runtime-control state in a few lines.
func writeControl(w *bytes.Buffer, cs agent.ControlState) {
	state := "running"
	if cs.Paused {
		state = fmt.Sprintf("PAUSED for %s", time.Duration(cs.PausedFor).Round(time.Second))
	}
	fmt.Fprintf(w, "collection %s\n", state)
	d := cs.Detector
	settling := ""
	if cs.SwapSettling {
		settling = ", change settling"
	}
	fmt.Fprintf(w, "detector   window %s  threshold %s  floor %s  consecutive %d  (%d changes%s)\n",
		time.Duration(d.Window), thresholdText(d), time.Duration(d.Floor), d.Consecutive, cs.DetectorSwaps, settling)
	if u := cs.Duty; u != nil {
		share := "steered by the budget"
		if u.PinnedShare > 0 {
			share = fmt.Sprintf("pinned at %.0f%%", u.PinnedShare*100)
		}
		fmt.Fprintf(w, "duty       budget %.2f%%  period %s  share %s\n", u.Budget*100, time.Duration(u.Period), share)
	}
}

// writeStatus prints a status report for people (80 columns).
func writeStatus(w *bytes.Buffer, rep agent.StatusReport, where string, nVerdicts int) {
	ver := rep.Version
	if ver == "" {
		ver = "?"
	}
	fmt.Fprintf(w, "slowrank agent %s at %s, up %s\n", ver, where, rep.Uptime.Round(time.Second))
	if rep.Control != nil {
		writeControl(w, *rep.Control)
	} else if rep.ControlError != "" {
		fmt.Fprintf(w, "collection unknown (%s)\n", rep.ControlError)
	}
	dev := rep.DeviceState
	switch dev {
	case "no-lib":
		dev = "off: no process loaded libslowrank_cupti.so"
	case "duty", "escalated":
		dev = fmt.Sprintf("%s, on %.1f%% of the time, cost estimate %.2f%%", dev, rep.DutyShare*100, rep.DutyCost*100)
		if p := time.Duration(rep.DutyPeriodNS); p > 0 && rep.DutyShare > 0 && rep.DutyShare < 1 {
			dev += fmt.Sprintf(" (blocks of %s every %s)", time.Duration(float64(p)*rep.DutyShare).Round(time.Millisecond), p)
		}
	}
	fmt.Fprintf(w, "device     %s\n", dev)
	if o := rep.Overhead; o != nil {
		writeOverhead(w, *o)
	}

	fmt.Fprintf(w, "\nattached   %d processes, %d libraries (%s uprobes)\n", rep.Processes, rep.Attached, cmp.Or(rep.Uprobes, "?"))
	if len(rep.Procs) > 0 {
		// COLL: the libnccl collective uprobes, "off" once every process
		// mapping the file is on the plugin path.
		// NCCL is as wide as its longest path: a reason ("uprobes
		// (alltoall: ...)") must not push the columns after it.
		nw := len("plugin v5")
		for _, p := range rep.Procs {
			nw = max(nw, len(p.NCCL))
		}
		fmt.Fprintf(w, "  %-8s %5s  %-20s %-4s %-*s %-4s %s\n", "PID", "RANK", "JOB", "LIB", nw, "NCCL", "COLL", "LIBRARIES")
		for _, p := range rep.Procs {
			inj := "no"
			if p.Injected {
				inj = "yes"
			}
			coll := map[string]string{"attached": "on", "detached": "off"}[p.NCCLUprobes]
			fmt.Fprintf(w, "  %-8d %5d  %-20s %-4s %-*s %-4s %s\n", p.PID, p.Rank, clip(p.Job, 20), inj, nw, cmp.Or(p.NCCL, "-"),
				cmp.Or(coll, "-"), clip(strings.Join(p.Libraries, " "), 20))
		}
	}

	c := rep.Counters
	fmt.Fprintf(w, "\ncounters   events %d  lost %d (ring buffer %d, queue %d, malformed %d)\n",
		rep.Events, rep.Lost, c["ringbuf_lost"], c["events_lost_queue"], c["events_malformed"])
	if cs := rep.Control; cs != nil {
		fmt.Fprintf(w, "           late: records %d, facts %d   duplicates: records %d, facts %d\n",
			cs.Records.Late, cs.Facts.Late+cs.Facts.LateAfterSwap, cs.Records.Duplicate, cs.Facts.Duplicates)
	}
	fmt.Fprintf(w, "           windows %d  facts %d  verdicts %d  attach errors %d\n",
		rep.Windows, rep.Facts, rep.Verdicts, c["attach_errors"])

	if e := rep.Export; e != nil {
		line := "export     otel " + e.OTel
		if e.Endpoint != "" {
			line += " " + e.Endpoint
		}
		if e.OTel != "off" {
			ec := e.Counters
			var dropped int64
			for k, v := range ec {
				if strings.HasPrefix(k, "spans_dropped_") {
					dropped += v
				}
			}
			health := "healthy"
			if ec["export_errors"] > 0 || dropped > 0 {
				health = "DEGRADED"
			}
			line += fmt.Sprintf(": %s, spans %d, dropped %d, errors %d", health, ec["spans_exported"], dropped, ec["export_errors"])
		}
		fmt.Fprintln(w, clip(line, 79))
		for _, k := range sortedNames(e.Files) {
			fmt.Fprintf(w, "           %s %s\n", k, e.Files[k])
		}
	}

	if len(rep.Alerts) > 0 {
		fmt.Fprintf(w, "\nALERTS\n")
		for _, v := range rep.Alerts {
			fmt.Fprintln(w, "  "+verdictLine(v))
		}
	}
	recent := rep.Recent
	if nVerdicts >= 0 && len(recent) > nVerdicts {
		recent = recent[len(recent)-nVerdicts:]
	}
	fmt.Fprintf(w, "\nlast verdicts (newest last)\n")
	if len(recent) == 0 {
		fmt.Fprintln(w, "  (none yet)")
	}
	for _, v := range recent {
		fmt.Fprintln(w, "  "+verdictLine(v))
	}
}

// verdictLine is one verdict in at most 77 columns.
func verdictLine(v detector.Verdict) string {
	state := v.State
	if v.AlertActive && state != detector.StateStraggler {
		state += "*"
	}
	dev := ""
	if v.State != detector.StateUncertain {
		dev = fmt.Sprintf("%+.1f%% vs r%d", v.Deviation*100, v.ReferenceRank)
	}
	line := fmt.Sprintf("w%-4d rank %-4d %-9s %-10s %-15s %s %s", v.Window, v.Rank, v.Phase, state, dev, v.Hint, clip(v.Job, 16))
	return clip(strings.TrimRight(line, " "), 77)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n <= 3 {
		return s[:n]
	}
	return s[:n-3] + "..."
}

func sortedNames(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// thresholdText is the global threshold followed by per-phase overrides,
// e.g. "0.05 (host 0.15)".
func thresholdText(d agent.DetectorSettings) string {
	s := strconv.FormatFloat(d.Threshold, 'g', -1, 64)
	if len(d.PhaseThresholds) == 0 {
		return s
	}
	var over []string
	for _, ph := range slices.Sorted(maps.Keys(d.PhaseThresholds)) {
		over = append(over, ph+" "+strconv.FormatFloat(d.PhaseThresholds[ph], 'g', -1, 64))
	}
	return s + " (" + strings.Join(over, ", ") + ")"
}

// writeOverhead prints the overhead ledger and the cost estimate behind it.
func writeOverhead(w *bytes.Buffer, o agent.Overhead) {
	cost := fmt.Sprintf("prior %.2f%% (%d pairs so far)", o.Cost.Cost*100, o.Cost.Pairs)
	if o.Cost.Measured {
		cost = fmt.Sprintf("%.2f%% [%.2f%%, %.2f%%] from %d pairs", o.Cost.Cost*100, o.Cost.Low*100, o.Cost.High*100, o.Cost.Pairs)
	}
	fmt.Fprintf(w, "overhead   spent %.3f%% of %.3f%% (device %.3f%%, uprobes %.3f%%, lib %.3f%%)\n",
		o.Total*100, o.Budget*100, o.Device*100, o.Uprobes*100, o.Library*100)
	if o.UprobesHidden > 0 {
		fmt.Fprintf(w, "           uprobe traps hidden in the host's wait for the GPU, not charged: %.3f%%\n", o.UprobesHidden*100)
	}
	if o.NCCLPlugin > 0 {
		fmt.Fprintf(w, "           NCCL operations the profiler plugin recorded, in spent: %.3f%%\n", o.NCCLPlugin*100)
	}
	fmt.Fprintf(w, "           over %s of training; escalations %d granted, %d refused\n",
		o.Training.Round(time.Second), o.EscalationsGranted, o.EscalationsRefused)
	if o.Refused != "" {
		writeWrapped(w, "last escalation refused:", o.Refused)
	}
	if o.Calibrating {
		fmt.Fprintf(w, "           calibrating: on-blocks sized to measure the cost (%.3f s of %.3f s allowed spent)\n",
			o.Total*o.Training.Seconds(), o.Allowance)
	}
	fmt.Fprintf(w, "           device collection cost %s\n", cost)
	if k := o.KernelChannels; k != nil {
		fmt.Fprintf(w, "           %s\n", kernelChannelsText(k))
	}
}

// writeWrapped prints prefix and text at the overhead block's indent,
// wrapped at 80 columns (the whole text is in --json).
func writeWrapped(w *bytes.Buffer, prefix, text string) {
	const indent = "           "
	line := indent + prefix
	for _, word := range strings.Fields(text) {
		if len(line)+1+len(word) > 80 {
			fmt.Fprintln(w, line)
			line = indent + " "
		}
		line += " " + word
	}
	fmt.Fprintln(w, line)
}

// kernelChannelsText is the NCCL plugin's kernel-channel trial in one line
// of at most 69 columns: the cost is of an on-phase's step time (its reason
// in full is in --json).
func kernelChannelsText(k *duty.KernelChannels) string {
	switch {
	case k.State == duty.KernelChannelsTrial:
		return fmt.Sprintf("NCCL kernel channels: cost measured apart, %d/%d blocks with/without", k.With, k.Apart)
	case k.Limit == 0:
		return fmt.Sprintf("NCCL kernel channels %s (--nccl-kernel-channels)", k.State)
	}
	return fmt.Sprintf("NCCL kernel channels %s: %+.2f%% [%+.2f, %+.2f] (limit %g%%)",
		k.State, 100*k.Cost, 100*k.Low, 100*k.High, 100*k.Limit)
}
