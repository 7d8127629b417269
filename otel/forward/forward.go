package forward

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/pdata/plog/plogotlp"

	"github.com/slowrank/slowrank/detector"
	"github.com/slowrank/slowrank/internal/monoclock"
	"github.com/slowrank/slowrank/otel/wire"
)

// ClientCertSource is a TLS client certificate that may be renewed while
// the forwarder runs.
type ClientCertSource interface {
	GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error)
	// Failures counts renewals that failed to load (the previous
	// certificate is still sent).
	Failures() int64
}

// Config configures a Forwarder.
type Config struct {
	// Endpoint is the aggregator (or a collector in front of it):
	// "host:port" or "grpc://host:port" for OTLP/gRPC in plaintext,
	// "grpcs://host:port" for OTLP/gRPC over TLS, "http://host:port[/path]"
	// or "https://..." for OTLP/HTTP protobuf (path default /v1/logs).
	Endpoint string
	// HostName is the slowrank.host of the records (the aggregator keys
	// per-host state and topology merging by it).
	HostName string
	// Token, when set, is sent as "authorization: Bearer <token>".
	Token string
	// RootCAs verifies a TLS endpoint (nil: the system pool).
	RootCAs *x509.CertPool
	// ClientCert, when set, gives the certificate a TLS endpoint that
	// asks for one gets (an aggregator with --tls-client-ca lets a client
	// speak only for the hosts its certificate names); internal/certfile's
	// Reloader follows a renewed one. Its failed reloads are counted.
	ClientCert ClientCertSource
	// NoCompression sends request bodies as they are. By default they are
	// gzip'ed (gRPC's gzip compressor, or Content-Encoding: gzip): a step
	// fact's 14 attributes shrink about 7.6 times, which every collector
	// and the aggregator accept.
	NoCompression bool
	// QueueSize bounds the step facts waiting to leave (default 16384).
	// When full, the oldest fact is dropped and counted (stale facts are
	// worth less than fresh ones: the aggregator judges the present).
	QueueSize int
	// MaxBatch is the most records in one request (default 1024).
	MaxBatch int
	// FlushInterval is the longest a fact waits for a batch (default 200ms).
	FlushInterval time.Duration
	// Timeout bounds one request (default 5s).
	Timeout time.Duration
	// MaxBackoff caps the retry back-off (default 5s; first wait 100ms).
	MaxBackoff time.Duration
	// MaxAge drops step facts that ended longer ago than this before they
	// could be sent, counted as stale (default 15s): the aggregator would
	// count them late anyway.
	MaxAge time.Duration
	// TopologyEvery re-sends the latest topology of every job this often,
	// and after every recovery from a failure, so that a restarted
	// aggregator learns it again (default 60s).
	TopologyEvery time.Duration
	// MaxJobs bounds the jobs whose topology is kept (default 64).
	MaxJobs int

	NowMono    func() int64
	MonoToWall func(int64) time.Time
	Logger     *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.QueueSize <= 0 {
		c.QueueSize = 16384
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 1024
	}
	if c.FlushInterval <= 0 {
		c.FlushInterval = 200 * time.Millisecond
	}
	if c.Timeout <= 0 {
		c.Timeout = 5 * time.Second
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 5 * time.Second
	}
	if c.MaxAge <= 0 {
		c.MaxAge = 15 * time.Second
	}
	if c.TopologyEvery <= 0 {
		c.TopologyEvery = time.Minute
	}
	if c.MaxJobs <= 0 {
		c.MaxJobs = 64
	}
	if c.NowMono == nil {
		c.NowMono = monoclock.Now
	}
	if c.MonoToWall == nil {
		c.MonoToWall = monoclock.WallMapper()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Drop reasons (Stats.Dropped).
const (
	DropQueueFull = "queue_full" // oldest fact overwritten by a newer one
	DropStale     = "stale"      // older than MaxAge when it could be sent
	DropRejected  = "rejected"   // permanent error or rejected by the receiver (partial success)
	DropShutdown  = "shutdown"   // still queued when Close's deadline passed
	DropTopology  = "topology"   // topology of a job beyond MaxJobs
)

// Stats are a Forwarder's counters.
type Stats struct {
	Sent     int64            // records accepted by the receiver
	Requests int64            // successful requests
	Failures int64            // failed attempts (each retry counts)
	Dropped  map[string]int64 // records, by reason
	Queued   int              // step facts waiting now
}

// Forwarder sends an agent's step and topology facts to an aggregator as
// OTLP log records. It is a Sink of the agent's pipeline: Step and Topology
// only copy the fact into a bounded queue and never block; one goroutine
// batches, sends, and retries with exponential back-off and jitter on
// retryable errors (gRPC Unavailable, ResourceExhausted, DeadlineExceeded,
// ...; HTTP 429, 502, 503, 504 and transport errors), reconnecting after a
// failure so that a healed link is used at once. Everything it has to drop
// is counted by reason. Safe for concurrent use; Close ends the goroutine.
type Forwarder struct {
	cfg  Config
	log  *slog.Logger
	send sender

	mu      sync.Mutex
	ring    []detector.Step
	head, n int
	topos   map[string]detector.Topology
	dirty   map[string]bool
	order   []string // jobs in first-seen order
	closed  bool

	kick chan struct{}
	stop chan struct{}
	done chan struct{}
	// runCtx bounds sends in flight; Close cancels it at its deadline.
	runCtx    context.Context
	cancelRun context.CancelFunc
	// stopCtx is Close's context, for the final drain.
	stopCtx atomic.Pointer[context.Context]

	sent, requests, failures               atomic.Int64
	dropFull, dropStale, dropRej, dropShut atomic.Int64
	dropTopo                               atomic.Int64
	lastErrLog                             atomic.Int64
	closeOnce                              sync.Once
	closeErr                               error
	retryBase                              time.Duration // tests shorten it
	lastFail                               bool
}

// New checks cfg and starts the sending goroutine. Nothing dials
// yet: an unreachable aggregator shows up as counted failures.
func New(cfg Config) (*Forwarder, error) {
	cfg = cfg.withDefaults()
	if cfg.HostName == "" {
		return nil, fmt.Errorf("%w: forwarder needs a host name", ErrConfig)
	}
	snd, err := newSender(cfg)
	if err != nil {
		return nil, err
	}
	f := &Forwarder{
		cfg:       cfg,
		log:       cfg.Logger.With("component", "forward", "aggregator", cfg.Endpoint),
		send:      snd,
		ring:      make([]detector.Step, cfg.QueueSize),
		topos:     map[string]detector.Topology{},
		dirty:     map[string]bool{},
		kick:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
		retryBase: 100 * time.Millisecond,
	}
	f.runCtx, f.cancelRun = context.WithCancel(context.Background())
	go f.loop()
	return f, nil
}

// Topology keeps t as the latest topology of its job and sends it with the
// next batch. It never blocks.
func (f *Forwarder) Topology(t detector.Topology) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	if _, ok := f.topos[t.Job]; !ok {
		if len(f.topos) >= f.cfg.MaxJobs {
			f.dropTopo.Add(1)
			return
		}
		f.order = append(f.order, t.Job)
	}
	f.topos[t.Job] = t
	f.dirty[t.Job] = true
	f.kickLocked()
}

// Step queues s for the aggregator; when the queue is full the oldest fact
// is dropped (counted). It never blocks.
func (f *Forwarder) Step(s detector.Step, _ int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		f.dropShut.Add(1)
		return
	}
	size := len(f.ring)
	if f.n == size {
		f.ring[f.head] = detector.Step{}
		f.head = (f.head + 1) % size
		f.n--
		f.dropFull.Add(1)
	}
	f.ring[(f.head+f.n)%size] = s
	f.n++
	if f.n >= f.cfg.MaxBatch {
		f.kickLocked()
	}
}

// Settled is part of the agent's Sink interface; verdicts stay local.
func (f *Forwarder) Settled(detector.SettledWindow, []detector.Verdict) {}

func (f *Forwarder) kickLocked() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// Stats returns the forwarder's counters.
func (f *Forwarder) Stats() Stats {
	f.mu.Lock()
	q := f.n
	f.mu.Unlock()
	return Stats{
		Sent: f.sent.Load(), Requests: f.requests.Load(), Failures: f.failures.Load(), Queued: q,
		Dropped: map[string]int64{
			DropQueueFull: f.dropFull.Load(),
			DropStale:     f.dropStale.Load(),
			DropRejected:  f.dropRej.Load(),
			DropShutdown:  f.dropShut.Load(),
			DropTopology:  f.dropTopo.Load(),
		},
	}
}

// Counters returns the forwarder's counters under their selfmetrics keys
// (forward_sent, forward_dropped_REASON, ...). The agent merges them into
// its status counters, as it does for every sink that counts its losses.
func (f *Forwarder) Counters() map[string]int64 {
	st := f.Stats()
	m := map[string]int64{
		"forward_sent": st.Sent, "forward_requests": st.Requests, "forward_failures": st.Failures,
		"forward_queued": int64(st.Queued),
	}
	if f.cfg.ClientCert != nil {
		m["forward_cert_reload_failures"] = f.cfg.ClientCert.Failures()
	}
	for reason, n := range st.Dropped {
		m["forward_dropped_"+reason] = n
	}
	return m
}

// Close stops accepting facts, sends what is queued within ctx's deadline
// (one attempt per batch: a failure ends the drain), counts the rest as
// dropped and closes the connection. Calls after the first return the
// first result.
func (f *Forwarder) Close(ctx context.Context) error {
	f.closeOnce.Do(func() {
		f.mu.Lock()
		f.closed = true
		f.mu.Unlock()
		f.stopCtx.Store(&ctx)
		close(f.stop)
		select {
		case <-f.done:
		case <-ctx.Done():
			f.closeErr = fmt.Errorf("forwarder: %w", ctx.Err())
			f.cancelRun() // ends a send in flight
			<-f.done
		}
		f.cancelRun()
		if err := f.send.close(); err != nil && f.closeErr == nil {
			f.closeErr = err
		}
	})
	return f.closeErr
}

// take removes up to MaxBatch queued steps and the dirty topologies.
func (f *Forwarder) take() ([]detector.Topology, []detector.Step) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var topos []detector.Topology
	for _, job := range f.order {
		if f.dirty[job] {
			topos = append(topos, f.topos[job])
			delete(f.dirty, job)
		}
	}
	k := min(f.n, f.cfg.MaxBatch)
	steps := make([]detector.Step, k)
	size := len(f.ring)
	for i := range k {
		steps[i] = f.ring[f.head]
		f.ring[f.head] = detector.Step{}
		f.head = (f.head + 1) % size
	}
	f.n -= k
	return topos, steps
}

func (f *Forwarder) pending() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n > 0 || len(f.dirty) > 0
}

func (f *Forwarder) markAllTopologies() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, job := range f.order {
		f.dirty[job] = true
	}
}

func (f *Forwarder) loop() {
	defer close(f.done)
	flush := time.NewTicker(f.cfg.FlushInterval)
	defer flush.Stop()
	topoEvery := time.NewTicker(f.cfg.TopologyEvery)
	defer topoEvery.Stop()
	for {
		select {
		case <-f.stop:
			f.drainOnStop()
			return
		case <-topoEvery.C:
			f.markAllTopologies()
			continue
		case <-flush.C:
		case <-f.kick:
		}
		for f.pending() {
			if !f.sendBatch(f.runCtx, f.stop, true) {
				break
			}
		}
	}
}

// drainOnStop sends what is queued until Close's deadline.
func (f *Forwarder) drainOnStop() {
	ctx := context.Background()
	if c := f.stopCtx.Load(); c != nil {
		ctx = *c
	}
	for f.pending() && ctx.Err() == nil {
		if !f.sendBatch(ctx, ctx.Done(), false) {
			break
		}
	}
	f.mu.Lock()
	f.dropShut.Add(int64(f.n))
	f.n = 0
	clear(f.ring)
	f.mu.Unlock()
}

// sendBatch takes one batch and sends it, retrying (when retry) until it
// succeeds, fails permanently, goes stale, or quit is closed. It returns
// false when it gave up on a retryable failure (the batch is then counted
// as dropped at shutdown).
func (f *Forwarder) sendBatch(parent context.Context, quit <-chan struct{}, retry bool) bool {
	topos, steps := f.take()
	wait := f.retryBase
	for attempt := 0; ; attempt++ {
		steps = f.filterStale(steps)
		if len(topos) == 0 && len(steps) == 0 {
			return true
		}
		ld := wire.EncodeLogs(f.cfg.HostName, topos, steps, f.cfg.MonoToWall)
		n := int64(len(topos) + len(steps))
		wire.StampSent(ld, f.cfg.NowMono())
		ctx, cancel := context.WithTimeout(parent, f.cfg.Timeout)
		rejected, err := f.send.send(ctx, plogotlp.NewExportRequestFromLogs(ld))
		cancel()
		if err == nil {
			f.requests.Add(1)
			f.sent.Add(n - rejected)
			f.dropRej.Add(rejected)
			if f.lastFail {
				f.lastFail = false
				f.log.Info("aggregator reachable again", "after_attempts", attempt)
				f.markAllTopologies() // it may have restarted
			}
			return true
		}
		f.failures.Add(1)
		f.lastFail = true
		f.logErr(err)
		if !retryable(err) {
			f.dropRej.Add(n)
			return true
		}
		f.send.reset()
		if !retry {
			f.dropShut.Add(int64(len(steps)))
			return false
		}
		// Full jitter on an exponential back-off.
		sleep := time.Duration(rand.Int64N(int64(wait)) + 1)
		wait = min(2*wait, f.cfg.MaxBackoff)
		select {
		case <-quit:
			f.dropShut.Add(int64(len(steps)))
			return false
		case <-time.After(sleep):
		}
	}
}

// filterStale removes steps older than MaxAge (counted).
func (f *Forwarder) filterStale(steps []detector.Step) []detector.Step {
	now := f.cfg.NowMono()
	limit := int64(f.cfg.MaxAge)
	out := steps[:0]
	for _, s := range steps {
		if now-s.EndNS > limit {
			f.dropStale.Add(1)
			continue
		}
		out = append(out, s)
	}
	return out
}

// logErr logs a send failure at most once every 10 s.
func (f *Forwarder) logErr(err error) {
	now := time.Now().UnixNano()
	last := f.lastErrLog.Load()
	if now-last < int64(10*time.Second) || !f.lastErrLog.CompareAndSwap(last, now) {
		return
	}
	f.log.Warn("forward facts to aggregator (further errors for 10s only counted)", "err", err,
		"failures_total", f.failures.Load(), "retryable", retryable(err))
}

// ErrConfig is wrapped by every refusal of a Config. Its text is the one
// `slowrank agent --aggregator` has always printed.
var ErrConfig = errors.New("invalid otel configuration")
