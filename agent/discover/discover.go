package discover

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/prometheus/procfs"

	"github.com/slowrank/slowrank/agent/identity"
)

// Identity is what a training process's environment (and its cgroup) says
// about its place in the job and the cluster: package identity reads it.
type Identity = identity.Identity

// Unknown is the value of an Identity number that the environment did not
// give.
const Unknown = identity.Unknown

// DefaultEnvKey is the environment variable whose presence selects a process by default.
const DefaultEnvKey = "RANK"

// ErrNoSuchProcess is matched (errors.Is) by the error about an explicitly selected PID that
// does not exist; errors.As with *NoSuchProcessError gives the PID.
var ErrNoSuchProcess = errors.New("no such process")

// NoSuchProcessError says that an explicitly selected PID does not exist.
type NoSuchProcessError struct{ PID int }

func (e *NoSuchProcessError) Error() string {
	return fmt.Sprintf("pid %d: %v", e.PID, ErrNoSuchProcess)
}

// Is makes errors.Is(err, ErrNoSuchProcess) true.
func (e *NoSuchProcessError) Is(target error) bool { return target == ErrNoSuchProcess }

// AccessError reports processes whose environment this agent may not read: reading another
// user's /proc/PID/environ needs CAP_SYS_PTRACE over the process (root has it, except over
// processes of a user namespace it does not own). errors.Is(err, fs.ErrPermission) is true.
// Such processes are not selected (unless by PID) and not retried until they exec.
type AccessError struct {
	PIDs []int // ascending
	Err  error // the first underlying error
}

func (e *AccessError) Error() string {
	return fmt.Sprintf("read environment of %d processes (needs CAP_SYS_PTRACE over them, in their user namespace): first: %v", len(e.PIDs), e.Err)
}

func (e *AccessError) Unwrap() error { return e.Err }

// ProcessKey identifies a process over time: a PID reused by a new process (an elastic
// restart, say) gets a new key because its start time differs.
type ProcessKey struct {
	PID int
	// StartTime is field 22 of /proc/PID/stat: clock ticks (USER_HZ) after boot.
	StartTime uint64
}

// Process is a selected training process.
type Process struct {
	ProcessKey
	PPID     int
	Comm     string   // /proc/PID/comm, as stat shows it
	Exe      string   // target of /proc/PID/exe, in the process's mount namespace
	Cmdline  []string // /proc/PID/cmdline
	Root     string   // <proc>/PID/root: prefix that makes the process's paths host-visible
	Identity Identity
	// SelectedBy says why the process was selected: "pid", "match" or "env:<key>".
	SelectedBy string
	// EnvDenied is true when the environment could not be read (an explicitly selected PID
	// of a process the agent may not inspect); Identity is then all Unknown.
	EnvDenied bool
	Owner     Owner
	// ExecSig and ExeFile are the image discovery judged, as stat showed it
	// before the environment was read (procStat.ExecSig) and /proc/PID/exe
	// after (zero when unreadable): the agent checks them again once it
	// holds the process's memory (procmem.go, openImageMem).
	ExecSig [2]uint64
	ExeFile FileID
}

// Selector decides which processes are training processes. A process is selected when its PID
// is in PIDs (and it is the process that had that PID when selection started) or when Match
// matches its exe basename, its comm or its command line (arguments joined by spaces). When
// PIDs and Match are both empty, a process is selected when its environment has EnvKey
// (DefaultEnvKey when empty). The agent's own process is never selected.
type Selector struct {
	PIDs   []int
	Match  *regexp.Regexp
	EnvKey string
	// Policy says whose processes may be selected (by Match or EnvKey; a
	// PID given explicitly is the operator's choice) and how many per owner.
	Policy Policy
}

func (s Selector) envKey() string {
	if s.EnvKey == "" {
		return DefaultEnvKey
	}
	return s.EnvKey
}

// byEnv reports whether selection is by the environment alone.
func (s Selector) byEnv() bool { return len(s.PIDs) == 0 && s.Match == nil }

// matches reports whether Match matches one of the names of a process.
func (s Selector) matches(exe, comm string, cmdline []string) bool {
	if s.Match == nil {
		return false
	}
	if exe != "" && s.Match.MatchString(filepath.Base(exe)) {
		return true
	}
	if comm != "" && s.Match.MatchString(comm) {
		return true
	}
	return len(cmdline) > 0 && s.Match.MatchString(strings.Join(cmdline, " "))
}

// procStat is what discovery uses of /proc/PID/stat.
type procStat struct {
	PID       int
	Comm      string
	State     byte
	PPID      int
	Flags     uint64
	StartTime uint64
	// VSize is the address-space size in bytes (field 23); every mmap or munmap that a
	// dlopen or dlclose does changes it.
	VSize uint64
	// ExecSig changes when the process execs: the start addresses of its argument and
	// environment areas (fields 48 and 50), which a new image gets anew on its new stack. The
	// ends are left out: setproctitle implementations move them. Zero when not readable.
	ExecSig [2]uint64
}

// pfKthread is PF_KTHREAD in the flags field of stat.
const pfKthread = 0x00200000

// parseStat parses the content of /proc/PID/stat. The comm field is what lies between the
// first "(" and the last ")", so a comm holding parentheses or spaces parses right.
func parseStat(data []byte) (procStat, error) {
	var s procStat
	l, r := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
	if l < 1 || r < l {
		return s, fmt.Errorf("parse stat: no comm in %q", clipBytes(data, 64))
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(data[:l])))
	if err != nil {
		return s, fmt.Errorf("parse stat: pid: %w", err)
	}
	s.PID, s.Comm = pid, string(data[l+1:r])
	f := bytes.Fields(data[r+1:]) // f[i] is field i+3 of proc(5)
	if len(f) < 21 || len(f[0]) != 1 {
		return s, fmt.Errorf("parse stat: %d fields after comm, want at least 21", len(f))
	}
	s.State = f[0][0]
	ppid, err := strconv.Atoi(string(f[1]))
	if err != nil {
		return s, fmt.Errorf("parse stat: ppid: %w", err)
	}
	s.PPID = ppid
	if s.Flags, err = strconv.ParseUint(string(f[6]), 10, 64); err != nil {
		return s, fmt.Errorf("parse stat: flags: %w", err)
	}
	if s.StartTime, err = strconv.ParseUint(string(f[19]), 10, 64); err != nil {
		return s, fmt.Errorf("parse stat: starttime: %w", err)
	}
	if s.VSize, err = strconv.ParseUint(string(f[20]), 10, 64); err != nil {
		return s, fmt.Errorf("parse stat: vsize: %w", err)
	}
	if len(f) >= 48 {
		s.ExecSig[0], _ = strconv.ParseUint(string(f[45]), 10, 64)
		s.ExecSig[1], _ = strconv.ParseUint(string(f[47]), 10, 64)
	}
	return s, nil
}

func clipBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// exited reports a process that ended and was not reaped yet (zombie or dead).
func (s procStat) exited() bool { return s.State == 'Z' || s.State == 'X' || s.State == 'x' }

// procReader reads the files of one proc tree: the host's /proc or a fixture.
type procReader struct {
	fs   procfs.FS
	root string
	self int
	// readFile reads a whole file; tests replace it to inject errors that root cannot meet.
	readFile func(name string) ([]byte, error)
}

func newProcReader(root string) (*procReader, error) {
	if root == "" {
		root = procfs.DefaultMountPoint
	}
	pfs, err := procfs.NewFS(root)
	if err != nil {
		return nil, fmt.Errorf("open proc filesystem: %w", err)
	}
	return &procReader{fs: pfs, root: root, self: os.Getpid(), readFile: readProcFile}, nil
}

func procPath(root string, pid int, elem ...string) string {
	return filepath.Join(append([]string{root, strconv.Itoa(pid)}, elem...)...)
}

func (r *procReader) path(pid int, elem ...string) string { return procPath(r.root, pid, elem...) }

// pids lists the processes (thread group leaders) in the tree, ascending.
func (r *procReader) pids() ([]int, error) {
	procs, err := r.fs.AllProcs()
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	out := make([]int, len(procs))
	for i, p := range procs {
		out[i] = p.PID
	}
	slices.Sort(out)
	return out, nil
}

// exeFile is the device and inode of pid's executable, zero when
// unreadable.
func (r *procReader) exeFile(pid int) FileID {
	return statFileID(r.path(pid, "exe"))
}

// statFileID is the device and inode of the file path names (following a
// link such as /proc/PID/exe), zero when it cannot be stat'ed.
func statFileID(path string) FileID {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return FileID{}
	}
	return FileID{Dev: st.Dev, Inode: st.Ino}
}

// CheckImage checks that the process p names, under procRoot ("" for
// /proc), still shows the image discovery judged: the same start time,
// exec signature and executable (an exec or a reused PID shows another).
func CheckImage(procRoot string, p Process) error {
	if procRoot == "" {
		procRoot = procfs.DefaultMountPoint
	}
	data, err := os.ReadFile(procPath(procRoot, p.PID, "stat"))
	if err != nil {
		return fmt.Errorf("read stat: %w", err)
	}
	st, err := parseStat(data)
	if err != nil {
		return err
	}
	if st.StartTime != p.StartTime || st.ExecSig != p.ExecSig {
		return fmt.Errorf("start %d, exec signature %x; found with %d, %x", st.StartTime, st.ExecSig, p.StartTime, p.ExecSig)
	}
	if exe := statFileID(procPath(procRoot, p.PID, "exe")); exe != p.ExeFile {
		return fmt.Errorf("executable %v, found with %v", exe, p.ExeFile)
	}
	return nil
}

func (r *procReader) stat(pid int) (procStat, error) {
	data, err := r.readFile(r.path(pid, "stat"))
	if err != nil {
		return procStat{}, err
	}
	return parseStat(data)
}

// Bounds of the proc files read. Their process's owner sizes them: prctl
// PR_SET_MM_MAP (allowed in a user namespace the user owns) points the
// environment and argument areas at any memory of the process, and 65,530
// mappings with 4 kB paths make a maps file of 270 MB. A training process
// has an environment of kilobytes and a maps file of about 1 MB (5,000
// mappings).
const (
	maxProcFile  = 1 << 20  // stat, environ, cmdline
	maxMapsBytes = 16 << 20 // maps
)

// errProcFileTooLarge is wrapped by the errors about a proc file larger
// than its bound; its process is not looked at again until it execs.
var errProcFileTooLarge = errors.New("proc file larger than its bound")

func readProcFile(name string) ([]byte, error) { return ReadInto(name, nil, maxProcFile) }

// ReadMaps reads PID's maps file under procRoot ("" for /proc) within the
// agent's bound (16 MiB), for what looks at a process the way discovery
// does (the agent's injection control, doctor).
func ReadMaps(procRoot string, pid int) ([]byte, error) {
	if procRoot == "" {
		procRoot = procfs.DefaultMountPoint
	}
	return ReadInto(procPath(procRoot, pid, "maps"), nil, maxMapsBytes)
}

// ReadInto reads a whole file of at most limit bytes into buf[:0], reusing
// its capacity; a larger file is an error (errProcFileTooLarge) after
// reading limit+1 bytes. Every proc file a process shapes is read through
// it.
func ReadInto(name string, buf []byte, limit int) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return buf[:0], err
	}
	defer func() { _ = f.Close() }() // read only
	buf = buf[:0]
	if cap(buf) == 0 {
		buf = make([]byte, 0, min(64<<10, limit+1))
	}
	for {
		n, err := f.Read(buf[len(buf):min(cap(buf), limit+1)])
		buf = buf[:len(buf)+n]
		if len(buf) > limit {
			return buf[:0], fmt.Errorf("read %s: %w (%d bytes)", name, errProcFileTooLarge, limit)
		}
		if err == io.EOF || (err == nil && n == 0) {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, min(cap(buf), limit+1-len(buf)))
		}
	}
}

// procGone reports errors that mean the process ended while it was being read.
func procGone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH)
}

// evalResult is the outcome of looking at one process.
type evalResult int

const (
	evalSelected evalResult = iota
	evalRejected
	evalGone   // vanished while read
	evalDenied // environ unreadable and needed for the decision
	evalFailed // unexpected read or parse error
	// evalOversized: environ or cmdline beyond maxProcFile; not looked at
	// again until the process execs.
	evalOversized
	evalRefused // its owner is not allowed by the policy
)

// evaluate reads one process and decides whether sel selects it. explicit holds the start
// times recorded for the explicitly selected PIDs.
func (r *procReader) evaluate(st procStat, sel Selector, explicit map[int]uint64) (Process, evalResult, error) {
	pid := st.PID
	p := Process{
		ProcessKey: ProcessKey{PID: pid, StartTime: st.StartTime},
		PPID:       st.PPID,
		Comm:       st.Comm,
		Root:       r.path(pid, "root"),
		ExecSig:    st.ExecSig,
	}
	if pid == r.self || st.Flags&pfKthread != 0 || st.exited() {
		return p, evalRejected, nil
	}
	explicitPID := isExplicit(explicit, st)
	var cg identity.Cgroup
	if sel.Policy.restricted() && !explicitPID {
		// Before the environment: a disallowed owner's processes cost no read of it.
		if p.Owner, cg = r.owner(pid); !sel.Policy.allows(p.Owner) {
			return p, evalRefused, nil
		}
	}
	envKey := sel.envKey()
	keep := func(k string) bool { return identity.IsVar(k) || k == envKey }
	var env map[string]string
	envErr := error(nil)
	readEnv := func() {
		data, err := r.readFile(r.path(pid, "environ"))
		if err != nil {
			envErr = err
			return
		}
		env = identity.ParseEnviron(data, keep)
	}
	switch {
	case explicitPID:
		p.SelectedBy = "pid"
	case sel.byEnv():
		readEnv()
		if envErr == nil {
			if _, ok := env[envKey]; !ok {
				return p, evalRejected, nil
			}
			p.SelectedBy = "env:" + envKey
		}
	case sel.Match != nil:
		exe, err := os.Readlink(r.path(pid, "exe"))
		if err != nil && !procGone(err) && !errors.Is(err, fs.ErrPermission) {
			return p, evalFailed, fmt.Errorf("read exe of pid %d: %w", pid, err)
		}
		if err == nil {
			p.Exe = exe
		}
		if p.Cmdline, err = r.cmdline(pid); err != nil {
			if procGone(err) {
				return p, evalGone, nil
			}
			if errors.Is(err, errProcFileTooLarge) {
				return p, evalOversized, err
			}
			return p, evalFailed, fmt.Errorf("read cmdline of pid %d: %w", pid, err)
		}
		if !sel.matches(p.Exe, p.Comm, p.Cmdline) {
			return p, evalRejected, nil
		}
		p.SelectedBy = "match"
	default:
		return p, evalRejected, nil
	}
	if env == nil && envErr == nil {
		readEnv()
	}
	switch {
	case envErr == nil:
	case procGone(envErr):
		return p, evalGone, nil
	case errors.Is(envErr, errProcFileTooLarge):
		return p, evalOversized, envErr
	case errors.Is(envErr, fs.ErrPermission):
		if p.SelectedBy == "" { // the decision needed the environment
			return p, evalDenied, envErr
		}
		p.EnvDenied = true
	default:
		return p, evalFailed, fmt.Errorf("read environ of pid %d: %w", pid, envErr)
	}
	p.Identity = identity.FromEnv(env)
	if p.Exe == "" {
		exe, err := os.Readlink(r.path(pid, "exe"))
		if procGone(err) {
			return p, evalGone, nil
		}
		p.Exe = exe // "" when unreadable: not needed
	}
	p.ExeFile = r.exeFile(pid)
	if p.Cmdline == nil {
		cmd, err := r.cmdline(pid)
		if procGone(err) {
			return p, evalGone, nil
		}
		p.Cmdline = cmd
	}
	if !sel.Policy.restricted() || explicitPID {
		p.Owner, cg = r.owner(pid)
	}
	p.Identity.WithCgroup(cg)
	// A process that ended while being read has an empty environ and cmdline: look again.
	if st2, err := r.stat(pid); err != nil || st2.StartTime != st.StartTime || st2.exited() {
		return p, evalGone, nil
	}
	return p, evalSelected, nil
}

func isExplicit(explicit map[int]uint64, st procStat) bool {
	start, ok := explicit[st.PID]
	return ok && start == st.StartTime
}

func (r *procReader) cmdline(pid int) ([]string, error) {
	data, err := r.readFile(r.path(pid, "cmdline"))
	if err != nil {
		return nil, err
	}
	data = bytes.TrimRight(data, "\x00")
	if len(data) == 0 {
		return []string{}, nil
	}
	return strings.Split(string(data), "\x00"), nil
}

// explicitStarts checks that every PID in pids exists and is alive, and returns its start time.
// The error joins a *NoSuchProcessError for each PID that does not.
func (r *procReader) explicitStarts(pids []int) (map[int]uint64, error) {
	starts := make(map[int]uint64, len(pids))
	var errs []error
	for _, pid := range pids {
		st, err := r.stat(pid)
		switch {
		case err == nil && !st.exited():
			starts[pid] = st.StartTime
		case err == nil || procGone(err):
			errs = append(errs, &NoSuchProcessError{PID: pid})
		default:
			errs = append(errs, fmt.Errorf("read stat of pid %d: %w", pid, err))
		}
	}
	return starts, errors.Join(errs...)
}

// ScanStats counts what one Discover call met.
type ScanStats struct {
	Scanned  int // processes looked at
	Selected int
	Vanished int // ended while being read; skipped
	Denied   int // environ unreadable; see AccessError
	Failed   int // unexpected read or parse errors
	// Oversized counts processes whose environ or cmdline exceeds
	// maxProcFile; they are not selected.
	Oversized int
	Refused   int // owner not allowed by the policy
}

// Discover scans the proc tree at procRoot ("" for /proc) once and returns the processes that
// sel selects, by PID. A PID in sel.PIDs that does not exist is an error (*NoSuchProcessError,
// joined per PID) and nothing is returned. Processes whose environment could not be read are
// reported in an *AccessError alongside the result; processes that ended during the scan are
// skipped and counted. Discover does not read /proc/PID/maps; see ReadLibraries.
func Discover(procRoot string, sel Selector) ([]Process, ScanStats, error) {
	r, err := newProcReader(procRoot)
	if err != nil {
		return nil, ScanStats{}, err
	}
	return r.discover(sel)
}

func (r *procReader) discover(sel Selector) ([]Process, ScanStats, error) {
	var stats ScanStats
	starts, err := r.explicitStarts(sel.PIDs)
	if err != nil {
		return nil, stats, err
	}
	pids, err := r.pids()
	if err != nil {
		return nil, stats, err
	}
	var (
		out    []Process
		denied *AccessError
		errs   []error
	)
	for _, pid := range pids {
		stats.Scanned++
		st, err := r.stat(pid)
		if err != nil {
			if procGone(err) {
				stats.Vanished++
			} else {
				stats.Failed++
				errs = append(errs, fmt.Errorf("read stat of pid %d: %w", pid, err))
			}
			continue
		}
		p, res, err := r.evaluate(st, sel, starts)
		switch res {
		case evalSelected:
			stats.Selected++
			out = append(out, p)
		case evalGone:
			stats.Vanished++
		case evalDenied:
			stats.Denied++
			if denied == nil {
				denied = &AccessError{Err: err}
			}
			denied.PIDs = append(denied.PIDs, pid)
		case evalFailed:
			stats.Failed++
			errs = append(errs, err)
		case evalOversized:
			stats.Oversized++
		case evalRefused:
			stats.Refused++
		}
	}
	if denied != nil {
		errs = append(errs, denied)
	}
	slices.SortFunc(out, func(a, b Process) int { return a.PID - b.PID })
	return out, stats, errors.Join(errs...)
}

// ReadLibraries returns the probed libraries mapped by a process, read from
// <procRoot>/PID/maps ("" for /proc).
func ReadLibraries(procRoot string, pid int) ([]Library, error) {
	if procRoot == "" {
		procRoot = procfs.DefaultMountPoint
	}
	data, err := ReadInto(procPath(procRoot, pid, "maps"), nil, maxMapsBytes)
	if err != nil {
		return nil, fmt.Errorf("read maps: %w", err)
	}
	return librariesFromMaps(data, procRoot, pid)
}
