package agent

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/slowrank/slowrank/agent/discover"
)

// A training process can exec another program under the same PID (a
// static, setuid or setcap one included) while the agent still writes into
// the injection library's control block at the address the first image
// published. Opening /proc/PID/mem by number for each write would then write
// into the new program. So the agent opens it once, when it finds the
// process: the descriptor holds that image's address space (the kernel takes
// the mm at open), and once the image is gone its reads and writes return
// nothing, never the new image's memory. The watcher reports the exec'd
// process as a new one (its exec signature changed), which gets a descriptor
// of its own.

// errImageGone: the image a memory descriptor was opened on is gone (exec,
// or exit): nothing is read or written through it any more.
var errImageGone = errors.New("process image gone (exec or exit)")

// errImageChanged: the process exec'ed between discovery's reading of its
// environment and the open of its memory: the descriptor would hold an image
// nobody judged, so it is closed unused.
var errImageChanged = errors.New("process exec'ed before its memory was opened")

// errNoMem: the process has no memory descriptor (never opened).
var errNoMem = errors.New("process memory not opened")

// procMem is one process image's memory, /proc/PID/mem opened once.
type procMem struct {
	f    *os.File // nil when the open failed (err says why)
	err  error
	gone bool // the image is gone: every access fails with errImageGone
	// goneCounted: the agent counted and logged that the image is gone.
	goneCounted bool
}

// openProcMem opens path (/proc/PID/mem) for reading and writing, or for
// reading only where writing other users' memory is not allowed
// (CAP_DAC_OVERRIDE): the library's status is still read, and writes fail
// and are counted as before.
func openProcMem(path string) *procMem {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		f, err = os.Open(path)
	}
	if err != nil {
		return &procMem{err: fmt.Errorf("open process memory: %w", err)}
	}
	return &procMem{f: f}
}

// openImageMem opens p's memory and keeps the descriptor only if it holds
// the image discovery judged (whose environment selected it). An exec
// between discovery and the open would give a descriptor on the new image (a
// setuid or setcap program included). The kernel takes the address space at
// open, so the image is checked after the open, from what the process shows
// now: its start time (PID reuse), its exec signature (the start of its
// argument and environment areas, which a new image gets anew on a stack
// the kernel places at random, setuid and setcap execs included: they clear
// ADDR_NO_RANDOMIZE) and its executable's device and inode, each against
// discovery's (Process.ExecSig, read before the environment, so an exec
// during discovery shows too). Either the process shows the judged image
// now, and then the image the descriptor holds is that one (another image
// would have replaced it by an exec after the open, and an exec'ed image's
// address space ends: reads and writes through the descriptor return
// nothing, errImageGone), or it does not, and the descriptor is closed and
// counted (proc_mem_image_changed); the watcher finds the new image as a
// new process. What passes unseen is an exec of the same executable whose
// stack lands at the same addresses: an unprivileged image with
// randomization off, of its own user, which the agent's writes cannot give
// anything that user lacks. Three reads, once per process found.
func (t *attacher) openImageMem(p discover.Process) *procMem {
	m := openProcMem(t.procPath(p.PID, "mem"))
	if m.f == nil {
		return m
	}
	if err := t.sameImage(p); err != nil {
		m.Close()
		m.err = err
		t.count("proc_mem_image_changed", 1)
		t.log.Info("training process exec'ed while it was being found: its memory is not used", "pid", p.PID, "err", err)
	}
	return m
}

// sameImage checks that p's process shows the image discovery judged.
func (t *attacher) sameImage(p discover.Process) error {
	if err := discover.CheckImage(t.procRoot, p); err != nil {
		return fmt.Errorf("%w: %w", errImageChanged, err)
	}
	return nil
}

// ReadAt implements io.ReaderAt.
func (m *procMem) ReadAt(b []byte, off int64) (int, error) {
	if err := m.usable(); err != nil {
		return 0, err
	}
	n, err := m.f.ReadAt(b, off)
	return n, m.check(err)
}

// WriteAt implements io.WriterAt.
func (m *procMem) WriteAt(b []byte, off int64) (int, error) {
	if err := m.usable(); err != nil {
		return 0, err
	}
	n, err := m.f.WriteAt(b, off)
	return n, m.check(err)
}

// isGone tells whether the image is known to be gone.
func (m *procMem) isGone() bool { return m != nil && m.gone }

func (m *procMem) usable() error {
	switch {
	case m == nil:
		return errNoMem
	case m.f == nil:
		return m.err
	case m.gone:
		return errImageGone
	}
	return nil
}

// check turns the end of the image into errImageGone: the kernel answers a
// read or write of an address space that no process uses any more with 0
// bytes (io.EOF, io.ErrUnexpectedEOF), an unmapped address of a live one
// with EIO.
func (m *procMem) check(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		m.gone = true
		return fmt.Errorf("%w: %w", errImageGone, err)
	}
	return err
}

// Close releases the descriptor (and with it the kernel's hold on the
// image's mm). Closing twice, or a procMem whose open failed, is a no-op.
// It returns nothing: /proc/PID/mem buffers nothing, every write went
// through pwrite(2) and was checked there, so the close has nothing to
// report.
func (m *procMem) Close() {
	if m == nil || m.f == nil {
		return
	}
	f := m.f
	m.f, m.err, m.gone = nil, errImageGone, true
	_ = f.Close()
}
