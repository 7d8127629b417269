package export

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Drop reasons of slowrank.export.dropped.
const (
	DropQueueFull      = "queue_full"      // span queue full when the span ended
	DropExportFailed   = "export_failed"   // the exporter returned an error for the batch
	DropShutdown       = "shutdown"        // ended after Shutdown, or still queued at its deadline
	DropBufferOverflow = "buffer_overflow" // step facts of the oldest unsettled window evicted
	DropSettleQueue    = "settle_queue"    // settled window could not be queued for span building
	DropWindowBudget   = "window_budget"   // beyond Policy.MaxSpansPerWindow
)

// exportStats are the lock-free counters of the export path. Values are
// counts of spans unless the name says otherwise.
type exportStats struct {
	spansExported    atomic.Int64
	dropQueueFull    atomic.Int64
	dropExportFailed atomic.Int64
	dropShutdown     atomic.Int64
	dropOverflow     atomic.Int64 // step facts
	dropSettleQueue  atomic.Int64 // step facts
	dropBudget       atomic.Int64 // step facts
	factsShutdown    atomic.Int64 // step facts
	metricsFailed    atomic.Int64 // data points
	lateFacts        atomic.Int64
	forcedSettles    atomic.Int64 // windows
}

// queueProcessor is a bounded, counting batch span processor. OnEnd never
// blocks: a full queue drops the span and counts it. One goroutine batches
// and exports; a failed export drops its batch (after the exporter's own
// retries) and counts it.
type queueProcessor struct {
	exp   sdktrace.SpanExporter
	cfg   QueueConfig
	stats *exportStats

	q       chan sdktrace.ReadOnlySpan
	kickCh  chan struct{}
	flushCh chan chan struct{}
	stopCh  chan struct{}
	done    chan struct{}

	stopping atomic.Bool
	stopCtx  atomic.Pointer[context.Context] // Shutdown's context, for the final drain
	timeout  time.Duration                   // per export call
	once     sync.Once
}

func newQueueProcessor(exp sdktrace.SpanExporter, cfg QueueConfig, timeout time.Duration, stats *exportStats) *queueProcessor {
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	p := &queueProcessor{
		exp:     exp,
		cfg:     cfg,
		stats:   stats,
		q:       make(chan sdktrace.ReadOnlySpan, cfg.MaxQueueSize),
		kickCh:  make(chan struct{}, 1),
		flushCh: make(chan chan struct{}),
		stopCh:  make(chan struct{}),
		done:    make(chan struct{}),
		timeout: timeout,
	}
	go p.loop()
	return p
}

func (p *queueProcessor) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

func (p *queueProcessor) OnEnd(s sdktrace.ReadOnlySpan) {
	if p.stopping.Load() {
		p.stats.dropShutdown.Add(1)
		return
	}
	select {
	case p.q <- s:
	default:
		p.stats.dropQueueFull.Add(1)
	}
}

func (p *queueProcessor) loop() {
	defer close(p.done)
	batch := make([]sdktrace.ReadOnlySpan, 0, p.cfg.MaxExportBatchSize)
	timer := time.NewTimer(p.cfg.BatchTimeout)
	defer timer.Stop()
	for {
		select {
		case s := <-p.q:
			batch = append(batch, s)
			if len(batch) >= p.cfg.MaxExportBatchSize {
				batch = p.export(context.Background(), batch)
				resetTimer(timer, p.cfg.BatchTimeout)
			}
		case <-timer.C:
			batch = p.export(context.Background(), batch)
			timer.Reset(p.cfg.BatchTimeout)
		case <-p.kickCh:
			batch = p.drain(context.Background(), batch)
			resetTimer(timer, p.cfg.BatchTimeout)
		case reply := <-p.flushCh:
			batch = p.drain(context.Background(), batch)
			close(reply)
		case <-p.stopCh:
			ctx := context.Background()
			if c := p.stopCtx.Load(); c != nil {
				ctx = *c
			}
			batch = p.drain(ctx, batch)
			// Whatever the deadline left behind is lost: count it.
			p.stats.dropShutdown.Add(int64(len(batch) + len(p.q)))
			return
		}
	}
}

// drain exports everything queued now, in batches, until ctx ends.
func (p *queueProcessor) drain(ctx context.Context, batch []sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
	for {
	fill:
		for len(batch) < p.cfg.MaxExportBatchSize {
			select {
			case s := <-p.q:
				batch = append(batch, s)
			default:
				break fill
			}
		}
		if len(batch) == 0 || ctx.Err() != nil {
			return batch
		}
		batch = p.export(ctx, batch)
	}
}

// export sends batch and returns it emptied; a failure counts the batch as
// dropped and reports the error to the global error handler (counted there).
func (p *queueProcessor) export(parent context.Context, batch []sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
	if len(batch) == 0 {
		return batch
	}
	ctx, cancel := context.WithTimeout(parent, p.timeout)
	err := p.exp.ExportSpans(ctx, batch)
	cancel()
	if err != nil {
		p.stats.dropExportFailed.Add(int64(len(batch)))
		otel.Handle(err)
	} else {
		p.stats.spansExported.Add(int64(len(batch)))
	}
	clear(batch) // let the spans go
	return batch[:0]
}

// kick asks the export goroutine to send what is queued now instead of
// waiting for BatchTimeout; it never blocks. The span builder kicks after an
// anomalous window, so that a straggler's trace is not held back.
func (p *queueProcessor) kick() {
	select {
	case p.kickCh <- struct{}{}:
	default:
	}
}

// ForceFlush exports everything queued before it was called, waiting until
// done or ctx ends.
func (p *queueProcessor) ForceFlush(ctx context.Context) error {
	if p.stopping.Load() {
		return nil
	}
	reply := make(chan struct{})
	select {
	case p.flushCh <- reply:
	case <-p.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-reply:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Shutdown drains the queue within ctx, then shuts the exporter down. Spans
// left when ctx ends are counted as dropped. It returns by ctx's deadline
// (plus the exporter's own Shutdown, which gets the same ctx).
func (p *queueProcessor) Shutdown(ctx context.Context) error {
	var err error
	p.once.Do(func() {
		p.stopCtx.Store(&ctx)
		p.stopping.Store(true)
		close(p.stopCh)
		select {
		case <-p.done:
		case <-ctx.Done():
			err = ctx.Err()
		}
		if e := p.exp.Shutdown(ctx); e != nil && err == nil {
			err = e
		}
	})
	return err
}

func resetTimer(t *time.Timer, d time.Duration) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	t.Reset(d)
}
