package export

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
	// ErrNotRegular: the path is a FIFO, a device, a socket or a
	// directory (possibly planted by someone else: an agent writing into
	// another user's FIFO would block or feed it).
	ErrNotRegular = errors.New("refusing to write to something other than a regular file (FIFO, device, socket or directory)")
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
	jsonlCheckEvery   = time.Second // look for a rotated file this often
)

// JSONLWriter writes one JSON object per line (step facts, verdicts,
// summaries) to a file or stdout. Write only marshals and appends to a
// bounded memory buffer; a background goroutine writes it out every 200 ms
// (sooner past 64 KiB). A write error (disk full, EIO) keeps the lines for a
// retry with back-off, and the file is cut back to its last whole line, so
// it stays valid JSONL; lines that no longer fit the 4 MiB buffer are
// dropped and counted (Lost). Safe for concurrent use.
type JSONLWriter struct {
	path       string
	maxBuf     int           // jsonlMaxBuffer; tests lower it
	checkEvery time.Duration // jsonlCheckEvery; tests lower it
	own        bool          // a file (not stdout): close, reopen on rotation

	// f and id are guarded by ioMu (and read by Close after the background
	// writer stopped).
	f         *os.File
	id        fileID // device and inode of f
	lastCheck time.Time
	reopened  atomic.Int64

	mu      sync.Mutex // guards buf, closed, retryAt, backoff, lastErr
	buf     []byte
	spare   []byte // the last written buffer, reused (guarded by mu)
	closed  bool
	retryAt time.Time
	backoff time.Duration
	lastErr error

	ioMu sync.Mutex // serialises file writes and reopening

	lost    atomic.Int64
	written atomic.Int64

	kick chan struct{}
	stop chan struct{}
	done chan struct{}
}

// NewJSONLWriter creates (or truncates) path for JSONL output; "-" means
// stdout. A new file gets mode 0640 regardless of umask. The path must name
// a regular file or nothing: a symbolic link is refused (O_NOFOLLOW;
// ErrSymlink), so is a FIFO, device, socket or directory (ErrNotRegular,
// without blocking on a FIFO), and an existing file must be ours with a
// single link (ErrUnsafeFile).
//
// The writer follows log rotation: when the path names another file or
// none (checked at most once a second) or on Reopen (SIGHUP), it opens the
// path again with the same checks and appends to what is there.
func NewJSONLWriter(path string) (*JSONLWriter, error) {
	if path == "-" {
		return newJSONLWriter(path, os.Stdout, fileID{}, false), nil
	}
	f, id, err := openOutput(path, true)
	if err != nil {
		return nil, err
	}
	return newJSONLWriter(path, f, id, true), nil
}

func newJSONLWriter(path string, f *os.File, id fileID, own bool) *JSONLWriter {
	w := &JSONLWriter{path: path, maxBuf: jsonlMaxBuffer, checkEvery: jsonlCheckEvery, f: f, id: id, own: own, lastCheck: time.Now(),
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go w.loop()
	return w
}

// CreateOutput creates or truncates path with mode 0640 under the checks of
// NewJSONLWriter, for outputs written straight through (replay, simulate).
func CreateOutput(path string) (*os.File, error) {
	f, _, err := openOutput(path, true)
	return f, err
}

type fileID struct{ dev, ino uint64 }

func idOf(fi fs.FileInfo) fileID {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return fileID{uint64(st.Dev), uint64(st.Ino)}
	}
	return fileID{}
}

// openOutput opens path for writing without following a symlink and
// without blocking (O_NONBLOCK: a FIFO without a reader fails with ENXIO
// instead of waiting for one), then checks with fstat that what it opened
// is a regular file; so no path swap between a check and the open matters.
// truncate empties an existing file. Every write appends (O_APPEND): after
// a copytruncate rotation the next line lands at the file's new end, not
// at the old offset behind a run of NULs.
func openOutput(path string, truncate bool) (*os.File, fileID, error) {
	const flags = os.O_WRONLY | os.O_APPEND | syscall.O_NOFOLLOW | syscall.O_CLOEXEC | syscall.O_NONBLOCK
	f, err := os.OpenFile(path, flags|os.O_CREATE|os.O_EXCL, 0o640)
	created := err == nil
	if errors.Is(err, fs.ErrExist) {
		f, err = os.OpenFile(path, flags, 0)
	}
	if err != nil {
		switch {
		case errors.Is(err, syscall.ELOOP):
			return nil, fileID{}, fmt.Errorf("open %s: %w", path, ErrSymlink)
		case errors.Is(err, syscall.ENXIO), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.EOPNOTSUPP):
			// A FIFO without a reader, a socket, a directory.
			return nil, fileID{}, fmt.Errorf("open %s: %w", path, ErrNotRegular)
		}
		return nil, fileID{}, fmt.Errorf("open jsonl output: %w", err)
	}
	id, err := checkOutput(f, path, created, truncate)
	if err != nil {
		_ = f.Close() // nothing was written through it: the check's error is the one to return
		return nil, fileID{}, err
	}
	return f, id, nil
}

// checkOutput is openOutput's check of what it opened: a regular file, ours
// with a single link unless we just created it (then mode 0640 regardless
// of umask), emptied when truncate.
func checkOutput(f *os.File, path string, created, truncate bool) (fileID, error) {
	fi, err := f.Stat()
	if err != nil {
		return fileID{}, fmt.Errorf("stat %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return fileID{}, fmt.Errorf("open %s (%s): %w", path, fi.Mode().Type(), ErrNotRegular)
	}
	if created {
		if err := f.Chmod(0o640); err != nil {
			return fileID{}, fmt.Errorf("chmod %s: %w", path, err)
		}
		return idOf(fi), nil
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && (st.Nlink > 1 || int(st.Uid) != os.Geteuid()) {
		return fileID{}, fmt.Errorf("open %s: %w", path, ErrUnsafeFile)
	}
	if truncate {
		if err := f.Truncate(0); err != nil {
			return fileID{}, fmt.Errorf("truncate %s: %w", path, err)
		}
	}
	return idOf(fi), nil
}

// Reopen opens the path again and writes there from now on (after log
// rotation; SIGHUP). An existing file is appended to. On failure the writer
// keeps the file it has. A no-op for stdout and after Close.
func (w *JSONLWriter) Reopen() error {
	if !w.own {
		return nil
	}
	w.ioMu.Lock()
	defer w.ioMu.Unlock()
	return w.reopenLocked()
}

// Reopened returns how many times the writer opened its path again.
func (w *JSONLWriter) Reopened() int64 { return w.reopened.Load() }

func (w *JSONLWriter) reopenLocked() error {
	w.mu.Lock()
	closed := w.closed
	w.mu.Unlock()
	if closed {
		return nil
	}
	f, id, err := openOutput(w.path, false)
	if err != nil {
		err = fmt.Errorf("reopen: %w", err)
		w.mu.Lock()
		w.lastErr = err
		w.mu.Unlock()
		return err
	}
	old := w.f
	w.f, w.id = f, id
	w.reopened.Add(1)
	if err := old.Close(); err != nil {
		// Its lines went out through write(2) and were counted written; a
		// close error (NFS reporting a deferred write failure) cannot say
		// which were lost, so it shows as the writer's last error
		// (jsonl_NAME_write_failing) until the next write succeeds.
		w.mu.Lock()
		w.lastErr = fmt.Errorf("close rotated %s: %w", w.path, err)
		w.mu.Unlock()
	}
	return nil
}

// checkRotated reopens the path when it no longer names the open file
// (renamed or removed by log rotation), at most once per checkEvery.
func (w *JSONLWriter) checkRotated() {
	if !w.own {
		return
	}
	w.ioMu.Lock()
	defer w.ioMu.Unlock()
	if time.Since(w.lastCheck) < w.checkEvery {
		return
	}
	w.lastCheck = time.Now()
	fi, err := os.Lstat(w.path)
	if err == nil && idOf(fi) == w.id {
		return
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return
	}
	_ = w.reopenLocked()
}

// Write appends v as one JSON line. It does not touch the file; it fails
// only when v cannot be marshalled (a NaN, a channel), the buffer is full
// (ErrBufferFull) or the writer is closed (ErrClosed), and counts the line
// as lost in each case: a caller may drop the error, the loss is in Lost.
func (w *JSONLWriter) Write(v any) error {
	line, err := json.Marshal(v)
	if err != nil {
		w.lost.Add(1)
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

// Lost returns the number of lines dropped (not marshallable, buffer full,
// closed, or still unwritten when Close gave up).
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
			w.checkRotated()
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
		// Cut a regular file back to its last whole line (the n bytes of a
		// partial write are its end: O_APPEND) and retry all of data
		// later; elsewhere what was written stays written.
		if w.own && n > 0 {
			if fi, serr := w.f.Stat(); serr == nil && fi.Size() >= int64(n) && w.f.Truncate(fi.Size()-int64(n)) == nil {
				n = 0
			}
		}
		if n > 0 {
			w.written.Add(int64(bytes.Count(data[:n], []byte{'\n'})))
		}
		keep = data[n:]
	} else {
		w.written.Add(int64(bytes.Count(data, []byte{'\n'})))
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
		w.ioMu.Lock()
		f := w.f
		w.ioMu.Unlock()
		if cerr := f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close %s: %w", w.path, cerr)
		}
	}
	return err
}
