package privilege

// Least privilege. What the agent needs, measured on Linux 6.18 by running
// `slowrank agent` under `setpriv --bounding-set=-all,+...` against fake
// trainers running as root and as another user (test/reliability):
//
//	CAP_BPF            load the BPF programs and create their maps (ring buffer)
//	CAP_PERFMON        kprobe-type BPF programs; perf events for uprobes
//	CAP_SYS_ADMIN      create uprobes through perf_event_open: Linux 6.16 (and
//	                   the stable kernels it was backported to) require it
//	                   again ("perf: Revert to requiring CAP_SYS_ADMIN for
//	                   uprobes"); with BPF uprobe_multi links (6.6+) CAP_BPF +
//	                   CAP_PERFMON would do. Probed at start (UprobesNeedSysAdmin).
//	CAP_SYS_PTRACE     /proc/PID/root (libraries, also inside containers),
//	                   /proc/PID/mem and /proc/PID/map_files of processes of
//	                   other users or with capabilities beyond the agent's
//	                   (after the drop, every root process has more)
//	CAP_DAC_READ_SEARCH  /proc/PID/environ (mode 0400) of other users'
//	                   processes: discovery by RANK and the job id
//	CAP_DAC_OVERRIDE   writing /proc/PID/mem (mode 0600) of other users'
//	                   processes: the duty cycle of the injection library
//	CAP_CHECKPOINT_RESTORE (or CAP_SYS_ADMIN) /proc/PID/map_files: every
//	                   library is opened through the mapping; without it,
//	                   through the path checked against the mapping, which
//	                   refuses libraries deleted or replaced on disk while
//	                   mapped and, before Linux 6.8, those on overlayfs
//	                   (containers)
//
// CAP_SYS_RESOURCE is not needed from Linux 5.11 (BPF memory is charged to
// the memory cgroup, not RLIMIT_MEMLOCK); on older kernels it is. Nothing
// else is used: no CAP_NET_*, CAP_SETUID, CAP_KILL, CAP_SYS_MODULE, ...
//
// Dropping. Every capability above is needed again whenever the agent
// attaches: a new training process, a library loaded later, an elastic
// restart. An agent that drops them after its first attach goes blind to all
// of that, so the agent keeps them for its life and drops everything else at
// start, before it touches any process (DropCapabilities). Capabilities are
// per thread and a Go program with cgo cannot change them on all its threads
// (syscall.AllThreadsSyscall refuses), so the drop lowers the bounding set of
// one locked thread and re-executes the binary from it: every thread of the
// new image has exactly the kept set, and the bounding set keeps it from ever
// getting the rest back.

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Capability is a Linux capability number (capabilities(7)).
type Capability uint

// The capabilities the agent uses.
const (
	CapDACOverride       Capability = unix.CAP_DAC_OVERRIDE
	CapDACReadSearch     Capability = unix.CAP_DAC_READ_SEARCH
	CapSetPCap           Capability = unix.CAP_SETPCAP
	CapSysPtrace         Capability = unix.CAP_SYS_PTRACE
	CapSysAdmin          Capability = unix.CAP_SYS_ADMIN
	CapSysResource       Capability = unix.CAP_SYS_RESOURCE
	CapPerfmon           Capability = unix.CAP_PERFMON
	CapBPF               Capability = unix.CAP_BPF
	CapCheckpointRestore Capability = unix.CAP_CHECKPOINT_RESTORE
)

var capNames = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
	"CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER",
	"CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT",
	"CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME",
	"CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL",
	"CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM",
	"CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
}

func (c Capability) String() string {
	if int(c) < len(capNames) {
		return capNames[c]
	}
	return fmt.Sprintf("CAP_%d", uint(c))
}

// CapSet is a set of capabilities.
type CapSet uint64

// Caps returns the set of cs.
func Caps(cs ...Capability) CapSet {
	var s CapSet
	for _, c := range cs {
		s |= 1 << c
	}
	return s
}

// Has reports whether c is in s.
func (s CapSet) Has(c Capability) bool { return c < 64 && s&(1<<c) != 0 }

// List returns the capabilities of s in numeric order.
func (s CapSet) List() []Capability {
	var out []Capability
	for c := Capability(0); c < 64; c++ {
		if s.Has(c) {
			out = append(out, c)
		}
	}
	return out
}

func (s CapSet) String() string {
	var names []string
	for _, c := range s.List() {
		names = append(names, c.String())
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ",")
}

// ThreadCapabilities returns the calling thread's effective, permitted and
// bounding sets.
func ThreadCapabilities() (eff, perm, bnd CapSet, err error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return 0, 0, 0, fmt.Errorf("capget: %w", err)
	}
	eff = CapSet(data[0].Effective) | CapSet(data[1].Effective)<<32
	perm = CapSet(data[0].Permitted) | CapSet(data[1].Permitted)<<32
	for c := Capability(0); c <= unix.CAP_LAST_CAP; c++ {
		if r, _ := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); r == 1 {
			bnd |= Caps(c)
		}
	}
	return eff, perm, bnd, nil
}

// ParseCapEff reads the effective capability set (the CapEff line) of a
// /proc/PID/status file.
func ParseCapEff(status []byte) (CapSet, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != "CapEff" {
			continue
		}
		caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			return 0, fmt.Errorf("parse CapEff %q: %w", strings.TrimSpace(v), err)
		}
		return CapSet(caps), nil
	}
	return 0, errors.New("status has no CapEff line")
}

// CapRequirement is one capability the agent uses and what for.
type CapRequirement struct {
	Cap Capability
	// Also lists capabilities that serve instead (CAP_SYS_ADMIN covers
	// CAP_BPF, CAP_PERFMON and CAP_CHECKPOINT_RESTORE).
	Also []Capability
	Why  string
	// Required: the agent refuses to start without it. Otherwise it starts,
	// warns, and the feature named in Why does not work.
	Required bool
}

// SatisfiedBy reports whether s holds r.Cap or one of r.Also.
func (r CapRequirement) SatisfiedBy(s CapSet) bool {
	if s.Has(r.Cap) {
		return true
	}
	for _, c := range r.Also {
		if s.Has(c) {
			return true
		}
	}
	return false
}

// CapRequirements lists the capabilities the agent uses on this kernel.
// uprobesNeedSysAdmin comes from UprobesNeedSysAdmin; deviceCollection is
// Config.DeviceCollection (writes into the injection library).
func CapRequirements(uprobesNeedSysAdmin, deviceCollection bool) []CapRequirement {
	reqs := []CapRequirement{
		{Cap: CapBPF, Also: []Capability{CapSysAdmin}, Required: true, Why: "load the BPF programs and the ring buffer"},
		{Cap: CapPerfmon, Also: []Capability{CapSysAdmin}, Required: true, Why: "run uprobe BPF programs (perf events)"},
	}
	if uprobesNeedSysAdmin {
		reqs = append(reqs, CapRequirement{Cap: CapSysAdmin, Required: true,
			Why: "create uprobes through perf_event_open (this kernel requires it, as Linux 6.16+ do)"})
	}
	reqs = append(reqs,
		CapRequirement{Cap: CapSysPtrace, Required: true,
			Why: "open the libraries, memory and mappings of training processes of other users or with more capabilities (/proc/PID/root, mem, map_files)"},
		CapRequirement{Cap: CapDACReadSearch, Also: []Capability{CapDACOverride},
			Why: "read the environment (RANK, job id) of other users' training processes (/proc/PID/environ is 0400)"},
		CapRequirement{Cap: CapCheckpointRestore, Also: []Capability{CapSysAdmin},
			Why: "open the library a process maps through the mapping (/proc/PID/map_files); without it, libraries deleted or replaced while mapped, and before Linux 6.8 those on overlayfs (containers), are refused"},
	)
	if deviceCollection {
		reqs = append(reqs, CapRequirement{Cap: CapDACOverride,
			Why: "steer the injection library's duty cycle in other users' processes (/proc/PID/mem is 0600)"})
	}
	if kernelBefore(5, 11) {
		reqs = append(reqs, CapRequirement{Cap: CapSysResource, Required: true,
			Why: "raise RLIMIT_MEMLOCK for BPF maps (kernels before 5.11)"})
	}
	return reqs
}

// ErrMissingCapability is wrapped by the error of CheckCapabilities.
var ErrMissingCapability = errors.New("missing capability")

// MissingCapabilityError names a required capability that the process
// lacks.
type MissingCapabilityError struct{ Req CapRequirement }

func (e *MissingCapabilityError) Error() string {
	return fmt.Sprintf("%v %s: needed to %s; run as root or grant it (e.g. systemd AmbientCapabilities=)", ErrMissingCapability, e.Req.Cap, e.Req.Why)
}

func (e *MissingCapabilityError) Unwrap() error { return ErrMissingCapability }

// CapCheck is the outcome of CheckCapabilities.
type CapCheck struct {
	Effective CapSet
	// Keep is what the agent needs for its life (present and wanted).
	Keep CapSet
	// Missing lists the optional capabilities the process lacks.
	Missing []CapRequirement
	// UprobesNeedSysAdmin reports what the kernel probe found.
	UprobesNeedSysAdmin bool
	// IgnoredMark: CapsDroppedEnv was set but the process's capabilities
	// show no drop (set by the user, a unit or a parent, not by
	// DropCapabilities); it was ignored.
	IgnoredMark bool
}

// CheckCapabilities checks the calling thread's effective capabilities
// against CapRequirements. It returns a *MissingCapabilityError for the first
// required one missing; optional ones missing are listed in the result.
func CheckCapabilities(deviceCollection bool) (CapCheck, error) {
	eff, _, bnd, err := ThreadCapabilities()
	if err != nil {
		return CapCheck{}, err
	}
	mark, ignored := dropMark(os.Getenv(CapsDroppedEnv), bnd)
	var needAdmin bool
	switch mark {
	case capsDroppedAdmin: // re-executed by DropCapabilities: probed already
		needAdmin = true
	case capsDroppedNoAdmin:
	default:
		if needAdmin, err = probeUprobes(); err != nil {
			// Cannot tell (e.g. no CAP_BPF to load the probe program):
			// assume the stricter kernel; the BPF requirements name what
			// is missing.
			needAdmin = true
		}
	}
	chk, err := checkCaps(eff, CapRequirements(needAdmin, deviceCollection), needAdmin)
	chk.IgnoredMark = ignored
	return chk, err
}

// probeUprobes is UprobesNeedSysAdmin; tests replace it.
var probeUprobes = UprobesNeedSysAdmin

// dropMark returns the value of CapsDroppedEnv (env) to act on, given the
// process's bounding set bnd. The variable is in the environment, which the
// user controls as much as DropCapabilities does; it is believed only when
// the bounding set shows that a drop happened: DropCapabilities never keeps
// CAP_SETPCAP, which root otherwise holds. A mark that the process's
// capabilities contradict, or an unknown value, is ignored (ignored true):
// the probe and the drop then run as if it were absent.
func dropMark(env string, bnd CapSet) (mark string, ignored bool) {
	switch {
	case env == "":
		return "", false
	case bnd.Has(CapSetPCap), env != capsDroppedAdmin && env != capsDroppedNoAdmin:
		return "", true
	}
	return env, false
}

func checkCaps(eff CapSet, reqs []CapRequirement, needAdmin bool) (CapCheck, error) {
	res := CapCheck{Effective: eff, UprobesNeedSysAdmin: needAdmin}
	for _, r := range reqs {
		if !r.SatisfiedBy(eff) {
			if r.Required {
				return res, &MissingCapabilityError{Req: r}
			}
			res.Missing = append(res.Missing, r)
			continue
		}
		for _, c := range append([]Capability{r.Cap}, r.Also...) {
			if eff.Has(c) {
				res.Keep |= Caps(c)
				break
			}
		}
	}
	return res, nil
}

// MissingCapabilities splits the requirements that eff does not satisfy
// (neither the capability nor one that serves instead) into required and
// optional ones, in the order of reqs. CheckCapabilities stops at the first
// required one; `slowrank doctor` lists them all.
func MissingCapabilities(eff CapSet, reqs []CapRequirement) (required, optional []CapRequirement) {
	for _, r := range reqs {
		switch {
		case r.SatisfiedBy(eff):
		case r.Required:
			required = append(required, r)
		default:
			optional = append(optional, r)
		}
	}
	return required, optional
}

// UprobesNeedSysAdmin reports whether this kernel requires CAP_SYS_ADMIN to
// create a uprobe through perf_event_open. It creates (and removes at once) a
// uprobe on this executable's entry point from a thread whose effective set
// lacks CAP_SYS_ADMIN for the duration (then raised again). A process
// without CAP_SYS_ADMIN probes itself as it is.
func UprobesNeedSysAdmin() (bool, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "slowrank_capchk", Type: ebpf.Kprobe, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		return false, fmt.Errorf("load probe program: %w", err)
	}
	defer prog.Close()
	exe, err := os.Executable()
	if err != nil {
		return false, fmt.Errorf("find executable: %w", err)
	}
	entry, err := entryOffset(exe)
	if err != nil {
		return false, err
	}
	ex, err := link.OpenExecutable(exe)
	if err != nil {
		return false, fmt.Errorf("open executable: %w", err)
	}
	type result struct {
		need bool
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data, saved [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("capget: %w", err)}
			return
		}
		saved = data
		data[CapSysAdmin/32].Effective &^= 1 << (CapSysAdmin % 32)
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("capset: %w", err)}
			return
		}
		var r result
		l, err := ex.Uprobe("slowrank_capchk", prog, &link.UprobeOptions{Address: entry})
		switch {
		case err == nil:
			l.Close()
		case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
			r.need = true
		default:
			r.err = fmt.Errorf("probe uprobe creation: %w", err)
		}
		// Raise the effective set again (it stays within the permitted
		// set). Should that fail, the thread stays locked and ends with
		// this goroutine, so its lowered set never serves other code.
		if unix.Capset(&hdr, &saved[0]) == nil {
			runtime.UnlockOSThread()
		}
		ch <- r
	}()
	r := <-ch
	return r.need, r.err
}

// entryOffset returns the file offset of the ELF entry point of path.
func entryOffset(path string) (uint64, error) {
	f, err := elf.Open(path)
	if err != nil {
		return 0, fmt.Errorf("read executable: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && f.Entry >= p.Vaddr && f.Entry < p.Vaddr+p.Filesz {
			return f.Entry - p.Vaddr + p.Off, nil
		}
	}
	return 0, fmt.Errorf("executable %s: entry point outside its text", path)
}

// CapsDroppedEnv marks a process that DropCapabilities re-executed; its
// value carries what UprobesNeedSysAdmin found, so that the new image does
// not probe again. It is believed only in a process whose bounding set
// shows the drop (dropMark): set in the environment of a process with its
// capabilities, it neither skips the probe nor the drop.
const CapsDroppedEnv = "SLOWRANK_CAPS_DROPPED"

const (
	capsDroppedAdmin   = "uprobes-need-sys-admin"
	capsDroppedNoAdmin = "1"
)

// ErrCannotDrop is returned by DropCapabilities when the process cannot
// lower its capabilities (not root, or without CAP_SETPCAP).
var ErrCannotDrop = errors.New("cannot drop capabilities")

// DropCapabilities limits the whole process to chk.Keep, for the rest of its
// life: it lowers the bounding set of a locked thread to it, clears the
// inheritable and ambient sets and re-executes this binary with the same
// arguments and CapsDroppedEnv set (carrying chk.UprobesNeedSysAdmin). It
// returns only on failure, or at once (nil) in the re-executed process,
// whose bounding set it checks. It acts
// only for root (uid 0 gets its permitted set from the bounding set at
// exec); other users (file or ambient capabilities) return ErrCannotDrop:
// grant them only what CapRequirements lists.
func DropCapabilities(chk CapCheck) error {
	keep := chk.Keep
	eff, perm, bnd, err := ThreadCapabilities()
	if err != nil {
		return err
	}
	if mark, _ := dropMark(os.Getenv(CapsDroppedEnv), bnd); mark != "" {
		if extra := bnd &^ keep; extra != 0 {
			return fmt.Errorf("re-executed with capabilities %s still in the bounding set", extra)
		}
		return nil
	}
	if os.Geteuid() != 0 || os.Getuid() != 0 {
		return fmt.Errorf("%w: not running as root (grant only the needed capabilities instead)", ErrCannotDrop)
	}
	if bnd&^keep == 0 && perm&^keep == 0 && eff&^keep == 0 {
		return nil // started with no more than it needs (a systemd unit, setpriv)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find executable: %w", err)
	}
	mark := capsDroppedNoAdmin
	if chk.UprobesNeedSysAdmin {
		mark = capsDroppedAdmin
	}
	// A mark already in the environment was not believed (dropMark); it
	// must not shadow this one in the new image.
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, CapsDroppedEnv+"=") {
			env = append(env, kv)
		}
	}
	env = append(env, CapsDroppedEnv+"="+mark)
	runtime.LockOSThread() // exec replaces the process; on failure this thread is tainted
	for _, c := range (bnd &^ keep).List() {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("%w: drop %s from the bounding set: %w", ErrCannotDrop, c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("%w: clear ambient set: %w", ErrCannotDrop, err)
	}
	// Root's new image gains its inheritable set whatever the bounding set
	// says: a set left as it is would carry the capabilities dropped above
	// across the exec.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("%w: read the capability sets: %w", ErrCannotDrop, err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("%w: clear the inheritable set: %w", ErrCannotDrop, err)
	}
	err = syscall.Exec(exe, os.Args, env)
	return fmt.Errorf("%w: re-execute %s: %w", ErrCannotDrop, exe, err)
}
