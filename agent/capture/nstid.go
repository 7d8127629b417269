package capture

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/slowrank/slowrank/agent/discover"
)

// A training process in its own PID namespace (a Kubernetes pod without
// hostPID, `unshare --pid`) has two ids per thread: the one its namespace
// gives, which gettid() returns inside it and the injection library
// publishes (the control block's ctl_tid, the NCCL plugin records' tid),
// and the host's, which the uprobes report (bpf_get_current_pid_tgid).
// Compared as they come, the library's own CUPTI calls look like another
// client's and its plugin records match no uprobe call. TIDMap turns the
// library's ids into the host's from the NSpid line of
// /proc/PID/task/TID/status, which lists a thread's id in every namespace
// from the proc mount's (the host's: the agent reads the host's /proc)
// down to its own.

// NSpid parsing errors.
var (
	// errNoNSpid: the status file has no NSpid line (kernels before 4.1).
	errNoNSpid  = errors.New("no NSpid line")
	errBadNSpid = errors.New("malformed NSpid line")
)

// maxNSLevels bounds the ids of one NSpid line (the kernel nests PID
// namespaces 32 deep at most).
const maxNSLevels = 33

// parseNSpid returns a task's ids from its /proc status: outer is the id in
// the proc mount's namespace, inner in the task's own; levels is how many
// namespaces the line lists (1: the task lives in the proc mount's own).
func parseNSpid(status []byte) (outer, inner uint32, levels int, err error) {
	for len(status) > 0 {
		line := status
		if i := bytes.IndexByte(status, '\n'); i >= 0 {
			line, status = status[:i], status[i+1:]
		} else {
			status = nil
		}
		rest, ok := bytes.CutPrefix(line, []byte("NSpid:"))
		if !ok {
			continue
		}
		for _, f := range bytes.Fields(rest) {
			if levels == maxNSLevels {
				return 0, 0, 0, fmt.Errorf("%w: more than %d ids", errBadNSpid, maxNSLevels)
			}
			v, err := strconv.ParseUint(string(f), 10, 32)
			if err != nil || v == 0 {
				return 0, 0, 0, fmt.Errorf("%w: id %q", errBadNSpid, f)
			}
			if levels == 0 {
				outer = uint32(v)
			}
			inner = uint32(v)
			levels++
		}
		if levels == 0 {
			return 0, 0, 0, fmt.Errorf("%w: no id", errBadNSpid)
		}
		return outer, inner, levels, nil
	}
	return 0, 0, 0, errNoNSpid
}

// Bounds of the map.
const (
	// maxNSThreads bounds the threads remembered per process; a scan of a
	// process with more keeps the first ones (a later thread's id is then
	// not translated, which is counted).
	maxNSThreads = 4096
	// nsRescanEvery is the least time between two scans of one process's
	// threads: an id that is no thread of it (one that exited) must not
	// make every record scan the process again.
	nsRescanEvery = 200 * time.Millisecond
	// maxStatusBytes bounds the read of one status file (about 1.5 KiB).
	maxStatusBytes = 16 << 10
)

// nsProc is what TIDMap knows of one process.
type nsProc struct {
	// nested: the process lives in a PID namespace below the proc mount's
	// (known once its own status was read; false: ids are the host's).
	known, nested bool
	host          map[uint32]uint32 // namespace id -> host id
	scannedAt     time.Time         // last scan of its threads
}

// TIDMap translates the thread ids an injection library publishes into
// host thread ids, per process, with a cache that a miss refreshes (at most
// every nsRescanEvery). Safe for concurrent use: the Converter (reader
// goroutine) and the attacher (main goroutine) share it.
type TIDMap struct {
	root string // the proc filesystem
	mu   sync.Mutex
	// procs are bounded by the processes the agent tracks: forget drops
	// an exited one.
	procs map[uint32]*nsProc
	// buf is the status files' read buffer (under mu: one scan at a time).
	buf []byte
	// now, readFile and readDir are replaced by tests.
	now      func() time.Time
	readFile func(name string) ([]byte, error)
	readDir  func(name string) ([]os.DirEntry, error)
}

// NewTIDMap returns a TIDMap over the proc filesystem at procRoot ("" for
// /proc).
func NewTIDMap(procRoot string) *TIDMap {
	if procRoot == "" {
		procRoot = "/proc"
	}
	m := &TIDMap{root: procRoot, procs: map[uint32]*nsProc{}, now: time.Now, readDir: os.ReadDir,
		buf: make([]byte, 0, 4<<10)}
	m.readFile = func(name string) ([]byte, error) {
		b, err := discover.ReadInto(name, m.buf, maxStatusBytes)
		m.buf = b[:0]
		return b, err
	}
	return m
}

// errTIDUnknown: the id is no thread of the process the scan found.
var errTIDUnknown = errors.New("no thread of the process has that id in its namespace")

// Host returns the host id of the thread that process pid (a host id)
// calls tid in its own namespace. In the host's namespace that is tid
// itself; 0 stays 0 (not published yet).
func (m *TIDMap) Host(pid, tid uint32) (uint32, error) {
	if m == nil || tid == 0 {
		return tid, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.procs[pid]
	if p == nil {
		p = &nsProc{}
		m.procs[pid] = p
	}
	if !p.known {
		b, err := m.readFile(filepath.Join(m.root, strconv.Itoa(int(pid)), "status"))
		if err != nil {
			return 0, fmt.Errorf("read status of %d: %w", pid, err)
		}
		_, _, levels, err := parseNSpid(b)
		if err != nil {
			return 0, fmt.Errorf("status of %d: %w", pid, err)
		}
		p.known, p.nested = true, levels > 1
	}
	if !p.nested {
		return tid, nil
	}
	if h, ok := p.host[tid]; ok {
		return h, nil
	}
	if now := m.now(); p.host == nil || now.Sub(p.scannedAt) >= nsRescanEvery {
		p.scannedAt = now
		if err := m.scan(pid, p); err != nil {
			return 0, err
		}
		if h, ok := p.host[tid]; ok {
			return h, nil
		}
	}
	return 0, errTIDUnknown
}

// scan rebuilds p's map from the threads of pid alive now.
func (m *TIDMap) scan(pid uint32, p *nsProc) error {
	dir := filepath.Join(m.root, strconv.Itoa(int(pid)), "task")
	ents, err := m.readDir(dir)
	if err != nil {
		return fmt.Errorf("list threads of %d: %w", pid, err)
	}
	host := make(map[uint32]uint32, min(len(ents), maxNSThreads))
	for _, e := range ents {
		if len(host) == maxNSThreads {
			break
		}
		b, err := m.readFile(filepath.Join(dir, e.Name(), "status"))
		if err != nil {
			continue // the thread exited meanwhile
		}
		outer, inner, levels, err := parseNSpid(b)
		if err != nil || levels < 2 {
			continue
		}
		host[inner] = outer
	}
	p.host = host
	return nil
}

// forget drops an exited process.
func (m *TIDMap) forget(pid uint32) {
	if m == nil {
		return
	}
	m.mu.Lock()
	delete(m.procs, pid)
	m.mu.Unlock()
}
