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
// moment. So the agent opens the mapped file itself where it can:
// /proc/PID/map_files/<start>-<end> names a mapping, not a file, and the
// kernel opens the file of that mapping (its vm_file's path, a dentry
// pinned by the mapping: a rename onto the name the process used changes
// nothing). No device and inode comparison is needed, nor made: on
// overlayfs before Linux 6.8, /proc/PID/maps shows the underlying layer's
// inode and fstat of the overlay file another, so a comparison would refuse
// every library of a container's overlay root. Opening map_files takes
// CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE) and a mapping that still
// exists; where it fails, the path is opened once and its fstat device and
// inode must be the mapping's (FileID, from /proc/PID/maps). Either way the
// symbols are read from that descriptor and the kernel makes the uprobes
// through the same descriptor (/proc/self/fd/N, a link the kernel follows
// to the open file, not to a name; uprobe registration resolves the
// overlay file to the inode the mapping maps, d_real_inode): the breakpoints
// land in the file whose symbols were read, which is the mapped one, or
// nowhere.

// FileID is a file's identity as /proc/PID/maps shows it and stat reports
// it: the device number (as unix.Mkdev builds it) and the inode number.
type FileID struct {
	Dev, Inode uint64
}

// LibSource says where a process maps a library file: how AttachLibrary
// and ReattachClass reach it.
type LibSource struct {
	// MapFiles is /proc/PID/map_files/<start>-<end> of one mapping of the
	// file, its range from the same read of /proc/PID/maps as Want. Empty:
	// the path is opened.
	MapFiles string
	// Path reaches the file by name (/proc/PID/root/<path>): opened where
	// MapFiles cannot be (no CAP_SYS_ADMIN, the mapping went away), and
	// then it must open Want.
	Path string
	// Want is the file as /proc/PID/maps shows it; zero accepts whatever
	// Path opens.
	Want FileID
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
	id    FileID // fstat's: on overlayfs not always what maps shows
	size  int64
	alloc int64 // bytes allocated on disk (st_blocks)
	// mapped: opened through map_files (else the path, checked)
	mapped bool
}

// opener opens a file by name: the seam through which tests refuse
// map_files, as an agent without CAP_SYS_ADMIN is refused.
type opener func(name string) (*os.File, error)

// openNonblock opens name read-only without blocking (another user may
// have put a FIFO there).
func openNonblock(name string) (*os.File, error) {
	return os.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}

// openLibFile opens the file src names: its mapping through mapFiles, and
// where that fails its path, checked against src.Want (ErrFileChanged).
func openLibFile(src LibSource, mapFiles opener) (*libFile, error) {
	if src.MapFiles != "" {
		f, mfErr := mapFiles(src.MapFiles)
		if mfErr == nil {
			lf, err := statLibFile(f, true)
			if err != nil {
				_ = f.Close() // read only
			}
			return lf, err
		}
		if src.Path == "" {
			return nil, fmt.Errorf("open library mapping: %w", mfErr)
		}
	}
	f, err := openNonblock(src.Path)
	if err != nil {
		return nil, fmt.Errorf("open library: %w", err)
	}
	lf, err := statLibFile(f, false)
	if err != nil {
		_ = f.Close() // read only
		return nil, err
	}
	if src.Want != (FileID{}) && lf.id != src.Want {
		_ = f.Close() // read only
		return nil, fmt.Errorf("%w: %s is %d:%d, the mapping %d:%d", ErrFileChanged, src.Path, lf.id.Dev, lf.id.Inode, src.Want.Dev, src.Want.Inode)
	}
	return lf, nil
}

func statLibFile(f *os.File, mapped bool) (*libFile, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("stat library: %w", err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, fmt.Errorf("library %s is not a regular file (mode %#o)", f.Name(), st.Mode&syscall.S_IFMT)
	}
	return &libFile{f: f, id: FileID{Dev: st.Dev, Inode: st.Ino}, size: st.Size, alloc: st.Blocks * 512, mapped: mapped}, nil
}

// OpenMapped opens the library file src names as AttachLibrary does (its
// mapping, else its path checked against src.Want: ErrFileChanged) and
// says how: mapped when through the mapping, false when through the path.
// For readers of a mapped file other than the attach (the injection
// library's control block offset).
func OpenMapped(src LibSource) (f *os.File, mapped bool, err error) {
	lf, err := openLibFile(src, openNonblock)
	if err != nil {
		return nil, false, err
	}
	return lf.f, lf.mapped, nil
}

// attachPath is the name through which the kernel reaches the open file
// when it makes a uprobe: it follows the descriptor, not a directory entry.
func (lf *libFile) attachPath() string {
	return "/proc/self/fd/" + strconv.Itoa(int(lf.f.Fd()))
}

// Close closes the file. It returns nothing: the file is open read-only,
// and the uprobes made through it hold the inode, not the descriptor.
func (lf *libFile) Close() { _ = lf.f.Close() }

// openLibFile is openLibFile counting the refusals and how each file was
// opened.
func (p *Probes) openLibFile(src LibSource) (*libFile, error) {
	mf := p.openMapFiles
	if mf == nil {
		mf = openNonblock
	}
	lf, err := openLibFile(src, mf)
	if errors.Is(err, ErrFileChanged) {
		p.filesRefused.Add(1)
	}
	if err != nil {
		return nil, err
	}
	if lf.mapped {
		p.openedMapFiles.Add(1)
	} else {
		p.openedPath.Add(1)
	}
	if testHookOpened != nil {
		testHookOpened(src.Path)
	}
	return lf, nil
}

// testHookOpened, set by tests only, runs once a library file is open and
// checked: where a rename onto the path used to change what the kernel
// attached to.
var testHookOpened func(path string)
