package aggregate

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
)

var (
	errTooLarge = errors.New("request body too large")
	errSlowBody = errors.New("request body arrived below the minimum rate")
	errNoMemory = errors.New("aggregator memory for request bodies is spent: retry")
)

// budget is a count of bytes that many goroutines take from and give back.
type budget struct {
	limit int64
	used  atomic.Int64
}

func (b *budget) take(n int64) bool {
	if b.used.Add(n) > b.limit {
		b.used.Add(-n)
		return false
	}
	return true
}

func (b *budget) give(n int64) { b.used.Add(-n) }

// bodyChunk is what a body read is charged ahead of the bytes it holds: the
// first read, and each growth of the buffer at most doubles what arrived.
const bodyChunk = 64 << 10

// readBody reads a request body whole before any decoding slot is taken:
// at most limit bytes, in a buffer charged to the memory budget as bytes
// arrive (a declared Content-Length reserves nothing: the buffer holds at
// most twice what came, and bodyChunk before anything did). The client
// must keep up MinBodyRate after BodyGrace: the read deadline is always
// BodyGrace + received/MinBodyRate after the start, so it moves only as
// bytes come, whatever the size declared. The returned func gives the
// buffer's bytes back to the budget; call it when the body is no longer
// needed, also after an error.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, func(), error) {
	var held int64
	done := func() { s.mem.give(held) }
	if r.ContentLength > limit {
		return nil, done, fmt.Errorf("%w: %d bytes (limit %d)", errTooLarge, r.ContentLength, limit)
	}
	// The buffer never grows past what the body may hold: the declared
	// length (and one byte to see its end), else the limit and one byte.
	ceiling := limit + 1
	if r.ContentLength >= 0 {
		ceiling = r.ContentLength + 1
	}
	var buf []byte
	rc := http.NewResponseController(w)
	start := time.Now()
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) > limit {
				return nil, done, fmt.Errorf("%w: more than %d bytes", errTooLarge, limit)
			}
			grow := min(max(2*int64(cap(buf)), bodyChunk), ceiling) - int64(cap(buf))
			if grow <= 0 {
				// A body longer than it declared: net/http stops at the
				// declared length, so this is never reached but by a bug.
				return nil, done, fmt.Errorf("%w: more than its declared %d bytes", errTooLarge, r.ContentLength)
			}
			if !s.mem.take(grow) {
				return nil, done, errNoMemory
			}
			held += grow
			buf = append(make([]byte, 0, int64(cap(buf))+grow), buf...)
		}
		// What arrived so far buys its time at the minimum rate; nothing
		// the client declared does.
		due := s.cfg.BodyGrace + time.Duration(float64(len(buf))/float64(s.cfg.MinBodyRate)*float64(time.Second))
		_ = rc.SetReadDeadline(start.Add(due))
		n, err := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return nil, done, fmt.Errorf("%w (%d bytes in %s)", errSlowBody, len(buf), time.Since(start).Round(time.Millisecond))
			}
			return nil, done, fmt.Errorf("read body: %w", err)
		}
	}
	// Decoding must not be cut by the body's deadline (HTTP/1 reads on in
	// the background to notice a client that went away).
	_ = rc.SetReadDeadline(time.Time{})
	if int64(len(buf)) > limit {
		return nil, done, fmt.Errorf("%w: more than %d bytes", errTooLarge, limit)
	}
	return buf, done, nil
}

// bodyRefusal counts a failed body and says how to answer it.
func (s *Server) bodyRefusal(err error) refusal {
	switch {
	case errors.Is(err, errTooLarge):
		s.stats.tooLarge.Add(1)
		return refusal{http.StatusRequestEntityTooLarge, codes.ResourceExhausted, err.Error(), true}
	case errors.Is(err, errSlowBody):
		s.stats.slow.Add(1)
		return refusal{http.StatusRequestTimeout, codes.DeadlineExceeded, err.Error(), true}
	case errors.Is(err, errNoMemory):
		s.stats.busy.Add(1)
		return refusal{http.StatusServiceUnavailable, codes.Unavailable, err.Error(), false}
	default:
		s.stats.bad.Add(1)
		return refusal{http.StatusBadRequest, codes.InvalidArgument, err.Error(), true}
	}
}

// gunzip decompresses a body, at most limit bytes of it.
func gunzip(body []byte, limit int64) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("gzip body: %w", err)
	}
	defer func() { _ = zr.Close() }() // repeats the error a read returned
	out, err := io.ReadAll(io.LimitReader(zr, limit+1))
	if err != nil {
		return nil, fmt.Errorf("gzip body: %w", err)
	}
	if int64(len(out)) > limit {
		return nil, fmt.Errorf("%w: more than %d bytes decompressed", errTooLarge, limit)
	}
	return out, nil
}
