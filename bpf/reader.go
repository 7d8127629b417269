package bpf

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf/ringbuf"
)

// ErrClosed is returned by Reader.Read after Close (it is os.ErrClosed).
var ErrClosed = os.ErrClosed

// ErrFlushed is returned by Reader.Read once every record pending at Flush
// has been read.
var ErrFlushed = ringbuf.ErrFlushed

// Reader drains the ring buffer and decodes records. Read must be called
// from one goroutine at a time; Close and SetDeadline may be called from any
// goroutine.
type Reader struct {
	p       *Probes
	rd      *ringbuf.Reader
	rec     ringbuf.Record
	scratch scratch       // Next's events
	renew   atomic.Bool   // set a new ReadInto deadline before the next read
	wait    time.Duration // the next poll wait (backOff)
	got     bool          // a record was read since the last poll tick
	once    sync.Once
	cerr    error
	// deadline is the user's deadline as monotonic ns since clockBase
	// (time.Since(clockBase) compares with it), 0 = none.
	deadline atomic.Int64

	decoded   atomic.Uint64
	malformed atomic.Uint64
}

// NewReader opens a reader on the ring buffer. A BPF ring buffer has one
// consumer: open one Reader per Probes.
func (p *Probes) NewReader() (*Reader, error) {
	rd, err := ringbuf.NewReader(p.events)
	if err != nil {
		return nil, fmt.Errorf("open ring buffer reader: %w", err)
	}
	r := &Reader{p: p, rd: rd, wait: p.poll}
	r.renew.Store(true)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		rd.Close()
		return nil, fmt.Errorf("open ring buffer reader: %w", ErrClosed)
	}
	p.readers[r] = struct{}{}
	return r, nil
}

// Read blocks until a record is available and returns it decoded. Records
// reach it within Options.PollInterval while they flow (BPF does not wake
// the reader for each record), the first after an idle spell within
// maxIdlePolls intervals. After Close it returns an error matching ErrClosed; past a
// deadline one matching os.ErrDeadlineExceeded. A record the decoder refuses
// is counted and returned as an error matching ErrMalformed: the caller may
// keep reading.
func (r *Reader) Read() (Event, error) { return r.read1(nil) }

// Next is Read without allocating: the event it returns, and a batch's Data,
// are overwritten by the next call to Next. Copy what must outlive it.
func (r *Reader) Next() (Event, error) { return r.read1(&r.scratch) }

func (r *Reader) read1(s *scratch) (Event, error) {
	for {
		// The deadline only matters when the ring is drained and ReadInto
		// waits; it is renewed after it expired, not per record (a clock
		// read and a lock each). An expired one makes that wait return at
		// once, and the loop renews it.
		if r.renew.Swap(false) {
			dl := time.Now().Add(r.wait)
			if user := r.deadline.Load(); user != 0 && user < int64(dl.Sub(clockBase)) {
				dl = clockBase.Add(time.Duration(user))
			}
			r.rd.SetDeadline(dl)
		}
		err := r.rd.ReadInto(&r.rec)
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded):
			if user := r.deadline.Load(); user != 0 && int64(time.Since(clockBase)) >= user {
				return nil, fmt.Errorf("read ring buffer: %w", err)
			}
			r.renew.Store(true)
			r.backOff()
			continue // poll tick: look again
		case errors.Is(err, ringbuf.ErrClosed):
			return nil, ErrClosed
		case errors.Is(err, ringbuf.ErrFlushed):
			return nil, ErrFlushed
		default:
			return nil, fmt.Errorf("read ring buffer: %w", err)
		}
		r.got = true
		ev, err := decode(r.rec.RawSample, s)
		if err != nil {
			r.malformed.Add(1)
			return nil, err
		}
		r.decoded.Add(1)
		return ev, nil
	}
}

// maxIdlePolls bounds the poll back-off: an idle agent (no training on the
// host) wakes 5 times a second instead of 50, and the first record after an
// idle spell waits at most this many poll intervals.
const maxIdlePolls = 10

// backOff sets the next poll wait after a poll tick: the poll interval
// while records flow, doubling up to maxIdlePolls intervals while none do.
func (r *Reader) backOff() {
	if r.got {
		r.wait = r.p.poll
	} else {
		r.wait = min(2*r.wait, maxIdlePolls*r.p.poll)
	}
	r.got = false
}

// SetDeadline makes Read return os.ErrDeadlineExceeded once t has passed and
// no record is pending; a Read already waiting notices within PollInterval.
// The zero time means no deadline. Safe from any goroutine.
func (r *Reader) SetDeadline(t time.Time) {
	if t.IsZero() {
		r.deadline.Store(0)
		r.renew.Store(true)
		return
	}
	r.deadline.Store(max(int64(t.Sub(clockBase)), 1))
	r.renew.Store(true)
}

// clockBase is what Reader deadlines are kept relative to: a time with a
// monotonic reading, so that a deadline from time.Now().Add expires by the
// monotonic clock like the caller's time.Since, not by the wall clock, which
// NTP or a VM's clock may run faster or slower (TestReadDeadline saw a 100 ms
// deadline end after 99.5 ms of monotonic time).
var clockBase = time.Now()

// Flush makes Read return every record already in the ring buffer without
// waiting, then ErrFlushed once. Use it to drain on shutdown after detaching.
func (r *Reader) Flush() error { return r.rd.Flush() }

// Pending is the number of unread bytes in the ring buffer.
func (r *Reader) Pending() int { return r.rd.AvailableBytes() }

// Decoded and Malformed count records returned by Read.
func (r *Reader) Decoded() uint64   { return r.decoded.Load() }
func (r *Reader) Malformed() uint64 { return r.malformed.Load() }

// Close unblocks a pending Read and releases the reader. It is the first
// thing to close on shutdown (before attachments and Probes).
func (r *Reader) Close() error {
	r.p.forgetReader(r)
	return r.close()
}

func (r *Reader) close() error {
	r.once.Do(func() {
		if err := r.rd.Close(); err != nil {
			r.cerr = fmt.Errorf("close ring buffer reader: %w", err)
		}
	})
	return r.cerr
}
