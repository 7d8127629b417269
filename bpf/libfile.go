package bpf

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
)

// The file a library is attached to is chosen by the process that maps it:
// its owner may rename another file onto the path the agent opens at any
// moment. So the agent opens the path once, checks that what it opened is the
// file the process maps (FileID, from /proc/PID/maps), reads the symbols from
// that descriptor and has the kernel make the uprobes through the same
// descriptor (/proc/self/fd/N, a link the kernel follows to the open file, not
// to a name): the breakpoints land in the file whose symbols were read, which
// is the mapped one, or nowhere.

// FileID is a file's identity as /proc/PID/maps shows it and stat reports
// it: the device number (as unix.Mkdev builds it) and the inode number.
type FileID struct {
	Dev, Inode uint64
}

// ErrFileChanged is wrapped by the errors of AttachLibrary and ReattachClass
// when the file a path opens is not the one expected: another file was
// renamed onto the path after the caller read it from /proc/PID/maps (or
// after the attachment was made). Nothing is attached; Stats.FilesRefused
// counts it.
var ErrFileChanged = errors.New("file at path is not the mapped file")

// libFile is a library file opened once: every read and attach goes through
// f, never through the path again.
type libFile struct {
	f     *os.File
	id    FileID
	size  int64
	alloc int64 // bytes allocated on disk (st_blocks)
}

// openLibFile opens path without blocking (another user may have put a FIFO
// there) and checks that it is a regular file and, unless want is zero, the
// file want names.
func openLibFile(path string, want FileID) (*libFile, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open library: %w", err)
	}
	lf, err := statLibFile(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	if want != (FileID{}) && lf.id != want {
		f.Close()
		return nil, fmt.Errorf("%w: %s is %d:%d, the mapping %d:%d", ErrFileChanged, path, lf.id.Dev, lf.id.Inode, want.Dev, want.Inode)
	}
	return lf, nil
}

func statLibFile(f *os.File) (*libFile, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("stat library: %w", err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, fmt.Errorf("library %s is not a regular file (mode %#o)", f.Name(), st.Mode&syscall.S_IFMT)
	}
	return &libFile{f: f, id: FileID{Dev: st.Dev, Inode: st.Ino}, size: st.Size, alloc: st.Blocks * 512}, nil
}

// attachPath is the name through which the kernel reaches the open file
// when it makes a uprobe: it follows the descriptor, not a directory entry.
func (lf *libFile) attachPath() string {
	return "/proc/self/fd/" + strconv.Itoa(int(lf.f.Fd()))
}

func (lf *libFile) Close() error { return lf.f.Close() }

// openLibFile is openLibFile counting the refusals.
func (p *Probes) openLibFile(path string, want FileID) (*libFile, error) {
	lf, err := openLibFile(path, want)
	if errors.Is(err, ErrFileChanged) {
		p.filesRefused.Add(1)
	}
	if err == nil && testHookOpened != nil {
		testHookOpened(path)
	}
	return lf, err
}

// testHookOpened, set by tests only, runs once a library file is open and
// checked: where a rename onto the path used to change what the kernel
// attached to.
var testHookOpened func(path string)
