package otel

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Errors of NewJSONLWriter and JSONLWriter.Write.
var (
	// ErrSymlink: the path is a symbolic link (possibly planted by someone
	// else); the writer refuses to follow it.
	ErrSymlink = errors.New("refusing to write through a symbolic link")
	// ErrUnsafeFile: an existing regular file with several hard links or
	// owned by another user.
	ErrUnsafeFile = errors.New("refusing to write an existing file that is hard-linked or owned by another user")
	// ErrBufferFull: the line was dropped (counted in Lost) because the
	// writer's buffer is full, e.g. while the disk is full.
	ErrBufferFull = errors.New("jsonl buffer full: line dropped")
	// ErrClosed: Write after Close; the line is counted in Lost.
	ErrClosed = errors.New("jsonl writer closed")
)

const (
	jsonlMaxBuffer    = 4 << 20  // bytes of lines waiting for the file
	jsonlFlushAt      = 64 << 10 // wake the writer early at this size
	jsonlInterval     = 200 * time.Millisecond
	jsonlMaxBackoff   = 5 * time.Second
	jsonlFirstBackoff = 100 * time.Millisecond
)

// JSONLWriter writes one JSON object per line (step facts, verdicts,
// summaries) to a file or stdout. Write only marshals and appends to a
// bounded memory buffer; a background goroutine writes it out every 200 ms
// (sooner past 64 KiB). A write error (disk full, EIO) keeps the lines for a
// retry with back-off, and the file is cut back to its last whole line, so
// it stays valid JSONL; lines that no longer fit the 4 MiB buffer are
// dropped and counted (Lost). Safe for concurrent use.
type JSONLWriter struct {
	path    string
	maxBuf  int // jsonlMaxBuffer; tests lower it
	f       *os.File
	own     bool // close f on Close (not stdout)
	regular bool

	mu      sync.Mutex // guards buf, closed, retryAt, backoff, lastErr
	buf     []byte
	spare   []byte // the last written buffer, reused (guarded by mu)
	closed  bool
	retryAt time.Time
	backoff time.Duration
	lastErr error

	ioMu    sync.Mutex // serialises file writes
	goodOff int64      // file size in whole lines (regular files)

	lost    atomic.Int64
	written atomic.Int64

	kick chan struct{}
	stop chan struct{}
	done chan struct{}
}

// NewJSONLWriter creates (or truncates) path for JSONL output; "-" means
// stdout. A new file gets mode 0640 regardless of umask. The last path
// element must not be a symbolic link (O_NOFOLLOW; ErrSymlink), and an
// existing regular file must be ours with a single link (ErrUnsafeFile).
// Devices such as /dev/null are allowed.
func NewJSONLWriter(path string) (*JSONLWriter, error) {
	w := &JSONLWriter{path: path, maxBuf: jsonlMaxBuffer, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	if path == "-" {
		w.f = os.Stdout
	} else {
		f, regular, err := openNoFollow(path)
		if err != nil {
			return nil, err
		}
		w.f, w.own, w.regular = f, true, regular
	}
	go w.loop()
	return w, nil
}

func openNoFollow(path string) (*os.File, bool, error) {
	const flags = os.O_WRONLY | syscall.O_NOFOLLOW | syscall.O_CLOEXEC
	f, err := os.OpenFile(path, flags|os.O_CREATE|os.O_EXCL, 0o640)
	created := err == nil
	if errors.Is(err, fs.ErrExist) {
		f, err = os.OpenFile(path, flags, 0)
	}
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, false, fmt.Errorf("open %s: %w", path, ErrSymlink)
		}
		return nil, false, fmt.Errorf("open jsonl output: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, false, fmt.Errorf("stat %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return f, false, nil // a device or pipe: write as is
	}
	if created {
		if err := f.Chmod(0o640); err != nil {
			f.Close()
			return nil, false, fmt.Errorf("chmod %s: %w", path, err)
		}
		return f, true, nil
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && (st.Nlink > 1 || int(st.Uid) != os.Geteuid()) {
		f.Close()
		return nil, false, fmt.Errorf("open %s: %w", path, ErrUnsafeFile)
	}
	if err := f.Truncate(0); err != nil {
		f.Close()
		return nil, false, fmt.Errorf("truncate %s: %w", path, err)
	}
	return f, true, nil
}

// Write appends v as one JSON line. It does not touch the file; it fails
// only when v cannot be marshalled, the buffer is full (ErrBufferFull) or
// the writer is closed (ErrClosed). The last two count the line as lost.
func (w *JSONLWriter) Write(v any) error {
	line, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("marshal jsonl line: %w", err)
	}
	w.mu.Lock()
	switch {
	case w.closed:
		err = ErrClosed
	case len(w.buf)+len(line)+1 > w.maxBuf:
		err = ErrBufferFull
	default:
		w.buf = append(append(w.buf, line...), '\n')
	}
	kick := len(w.buf) >= jsonlFlushAt
	w.mu.Unlock()
	if err != nil {
		w.lost.Add(1)
		return err
	}
	if kick {
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// Lost returns the number of lines dropped (buffer full, closed, or still
// unwritten when Close gave up).
func (w *JSONLWriter) Lost() int64 { return w.lost.Load() }

// Written returns the number of lines that reached the file.
func (w *JSONLWriter) Written() int64 { return w.written.Load() }

// Err returns the last write error, nil after a successful write.
func (w *JSONLWriter) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastErr
}

func (w *JSONLWriter) loop() {
	defer close(w.done)
	t := time.NewTicker(jsonlInterval)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		case <-w.kick:
		}
		_ = w.flush(false)
	}
}

// Flush writes the buffered lines now (ignoring any back-off) and returns
// the write error, if any; the lines stay buffered for a retry.
func (w *JSONLWriter) Flush() error { return w.flush(true) }

func (w *JSONLWriter) flush(force bool) error {
	w.ioMu.Lock()
	defer w.ioMu.Unlock()
	w.mu.Lock()
	if len(w.buf) == 0 || (!force && time.Now().Before(w.retryAt)) {
		err := w.lastErr
		if len(w.buf) == 0 {
			err = nil
		}
		w.mu.Unlock()
		return err
	}
	data := w.buf
	w.buf, w.spare = w.spare[:0], nil
	w.mu.Unlock()

	n, err := w.f.Write(data)
	var keep []byte
	if err != nil {
		// Cut a regular file back to its last whole line and retry all of
		// data later; elsewhere what was written stays written.
		if w.regular && w.f.Truncate(w.goodOff) == nil {
			if _, serr := w.f.Seek(w.goodOff, 0); serr == nil {
				n = 0
			}
		}
		if n > 0 {
			w.written.Add(int64(bytes.Count(data[:n], []byte{'\n'})))
			if w.regular {
				w.goodOff += int64(n)
			}
		}
		keep = data[n:]
	} else {
		w.written.Add(int64(bytes.Count(data, []byte{'\n'})))
		if w.regular {
			w.goodOff += int64(n)
		}
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil {
		w.lastErr, w.backoff, w.retryAt = nil, 0, time.Time{}
		if cap(data) <= 4*jsonlFlushAt { // not one grown in an outage
			w.spare = data[:0] // written: its buffer takes the next turn
		}
		return nil
	}
	w.lastErr = fmt.Errorf("write jsonl: %w", err)
	w.backoff = min(max(2*w.backoff, jsonlFirstBackoff), jsonlMaxBackoff)
	w.retryAt = time.Now().Add(w.backoff)
	// Older lines first; past the cap, drop the oldest whole lines.
	merged := append(keep, w.buf...)
	for len(merged) > w.maxBuf {
		i := bytes.IndexByte(merged, '\n')
		if i < 0 {
			i = len(merged) - 1
		}
		merged = merged[i+1:]
		w.lost.Add(1)
	}
	w.buf = merged
	return w.lastErr
}

// Close stops the background writer, makes a last attempt to write what is
// buffered (lines it cannot write are counted lost) and closes the file
// (not stdout).
func (w *JSONLWriter) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	w.mu.Unlock()
	close(w.stop)
	<-w.done
	err := w.flush(true)
	if err != nil {
		w.mu.Lock()
		w.lost.Add(int64(bytes.Count(w.buf, []byte{'\n'})))
		w.buf = nil
		w.mu.Unlock()
	}
	if w.own {
		if cerr := w.f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close %s: %w", w.path, cerr)
		}
	}
	return err
}
