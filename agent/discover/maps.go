package discover

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/slowrank/slowrank/agent/identity"
	"github.com/slowrank/slowrank/internal/hexname"
)

// LibraryKind says which probed library a mapped file is, judged by its basename.
//
//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type LibraryKind -linecomment
type LibraryKind uint8

// Library kinds. KindUnknown files are not reported. The line comments are
// the String() names, used in logs and metrics labels (stringer
// -linecomment, librarykind_string.go).
//
//	KindNCCL          libnccl.so*
//	KindCUDART        libcudart.so*
//	KindCUDA          libcuda.so* (the driver API)
//	KindTorchCPU      libtorch_cpu.so
//	KindTorchCUDA     libtorch_cuda.so
//	KindCUPTIInject   libslowrank_cupti.so, our injection library
//	KindCUPTIRuntime  libcupti.so*: watched for other CUPTI clients
const (
	KindUnknown      LibraryKind = iota // unknown
	KindNCCL                            // nccl
	KindCUDART                          // cudart
	KindCUDA                            // cuda
	KindTorchCPU                        // torch_cpu
	KindTorchCUDA                       // torch_cuda
	KindCUPTIInject                     // cupti_inject
	KindCUPTIRuntime                    // libcupti
)

// InjectionLibraryName is the basename of slowrank's CUPTI injection library.
const InjectionLibraryName = identity.InjectionLibraryName

// kindOfStem maps the name of a library up to ".so" to its kind.
func kindOfStem(stem []byte) LibraryKind {
	switch string(stem) { // no allocation: the compiler compares the bytes
	case "libnccl":
		return KindNCCL
	case "libcudart":
		return KindCUDART
	case "libcuda":
		return KindCUDA
	case "libtorch_cpu":
		return KindTorchCPU
	case "libtorch_cuda":
		return KindTorchCUDA
	case "libslowrank_cupti":
		return KindCUPTIInject
	case "libcupti":
		return KindCUPTIRuntime
	}
	return KindUnknown
}

// classifyLibrary returns the kind of a library from its basename. It accepts the name up to
// ".so" ("libnccl.so"), that name followed by a version ("libnccl.so.2", "libnccl.so.2.28.9"),
// and the names that auditwheel gives vendored copies, "-" and 8 hex digits before ".so"
// ("libcudart-d0da41ae.so.11.0"). "libnccl-net.so" (a plugin) is not NCCL.
func classifyLibrary(base string) LibraryKind { return classifyLibraryBytes([]byte(base)) }

func classifyLibraryBytes(base []byte) LibraryKind {
	if !bytes.HasPrefix(base, []byte("lib")) {
		return KindUnknown
	}
	i := bytes.Index(base, []byte(".so"))
	if i < 0 {
		return KindUnknown
	}
	stem, rest := base[:i], base[i+len(".so"):]
	if len(rest) > 0 && rest[0] != '.' {
		return KindUnknown
	}
	if k := kindOfStem(stem); k != KindUnknown {
		return k
	}
	if j := len(stem) - 9; j > 0 && stem[j] == '-' && hexname.IsLower(stem[j+1:]) {
		return kindOfStem(stem[:j])
	}
	return KindUnknown
}

// FileID identifies a file on the host: the device number (dev_t, as unix.Mkdev builds it and
// as syscall.Stat_t.Dev holds it) and the inode number, both as /proc/PID/maps shows them.
type FileID struct {
	Dev   uint64
	Inode uint64
}

// String formats the ID as "major:minor:inode".
func (f FileID) String() string {
	return fmt.Sprintf("%d:%d:%d", unix.Major(f.Dev), unix.Minor(f.Dev), f.Inode)
}

// Mapping is one line of /proc/PID/maps.
type Mapping struct {
	Start, End uint64 // [Start, End) in the process's address space
	Perms      string // "r-xp" and the like
	Offset     uint64 // file offset mapped at Start
	File       FileID // zero Inode for anonymous mappings
	// Path is the pathname in the process's mount namespace ("/usr/lib/libc.so.6"), a
	// pseudo-path ("[heap]", "[vdso]", "[anon:name]") or "" for anonymous memory. The kernel's
	// " (deleted)" suffix is removed and reported in Deleted; "\012" is unescaped to a newline.
	Path    string
	Deleted bool
}

// Exec reports whether the mapping is executable.
func (m Mapping) Exec() bool { return len(m.Perms) > 2 && m.Perms[2] == 'x' }

// fileBacked reports whether the mapping maps a file by pathname.
func (m Mapping) fileBacked() bool { return m.File.Inode != 0 && strings.HasPrefix(m.Path, "/") }

// errMapsSyntax is wrapped by errors about malformed /proc/PID/maps content.
var errMapsSyntax = errors.New("malformed maps line")

// parseMaps parses the content of /proc/PID/maps.
func parseMaps(data []byte) ([]Mapping, error) {
	var out []Mapping
	err := eachMapsLine(data, func(line []byte) error {
		m, err := parseMapsLine(line, true)
		if err != nil {
			return err
		}
		out = append(out, m)
		return nil
	})
	return out, err
}

// eachMapsLine calls fn for each non-empty line, wrapping its error with the line number.
func eachMapsLine(data []byte, fn func(line []byte) error) error {
	for n := 1; len(data) > 0; n++ {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		if len(line) == 0 {
			continue
		}
		if err := fn(line); err != nil {
			return fmt.Errorf("parse maps line %d: %w", n, err)
		}
	}
	return nil
}

// parseMapsLine parses "start-end perms offset major:minor inode [pathname]". The pathname
// begins after the blanks that follow the inode and runs to the end of the line, spaces
// included. With withPath false the pathname is left empty (and not allocated) for mappings
// whose basename is not a known library kind.
func parseMapsLine(line []byte, withPath bool) (Mapping, error) {
	var m Mapping
	field := func() []byte {
		line = bytes.TrimLeft(line, " ")
		i := bytes.IndexByte(line, ' ')
		if i < 0 {
			i = len(line)
		}
		f := line[:i]
		line = line[i:]
		return f
	}
	addrs, perms, off, dev, ino := field(), field(), field(), field(), field()
	if len(ino) == 0 {
		return m, fmt.Errorf("%w: %d fields, want at least 5", errMapsSyntax, countFields(addrs, perms, off, dev))
	}
	lo, hi, ok := bytes.Cut(addrs, []byte{'-'})
	var err error
	if !ok {
		return m, fmt.Errorf("%w: address range %q", errMapsSyntax, addrs)
	}
	if m.Start, err = parseHex(lo); err != nil {
		return m, err
	}
	if m.End, err = parseHex(hi); err != nil {
		return m, err
	}
	if m.Offset, err = parseHex(off); err != nil {
		return m, err
	}
	maj, min, ok := bytes.Cut(dev, []byte{':'})
	if !ok {
		return m, fmt.Errorf("%w: device %q", errMapsSyntax, dev)
	}
	major, err := parseHex(maj)
	if err != nil {
		return m, err
	}
	minor, err := parseHex(min)
	if err != nil {
		return m, err
	}
	m.File.Dev = unix.Mkdev(uint32(major), uint32(minor))
	if m.File.Inode, err = strconv.ParseUint(string(ino), 10, 64); err != nil {
		return m, fmt.Errorf("%w: inode %q", errMapsSyntax, ino)
	}
	m.Perms = internPerms(perms)
	name := bytes.TrimLeft(line, " ")
	if len(name) == 0 {
		return m, nil
	}
	deleted := false
	if n, ok := bytes.CutSuffix(name, []byte(" (deleted)")); ok && m.File.Inode != 0 {
		name, deleted = n, true
	}
	if !withPath && (m.File.Inode == 0 || classifyLibraryBytes(baseName(name)) == KindUnknown) {
		return m, nil
	}
	m.Path = string(name)
	if bytes.Contains(name, []byte(`\012`)) {
		m.Path = strings.ReplaceAll(m.Path, `\012`, "\n")
	}
	m.Deleted = deleted
	return m, nil
}

func countFields(fs ...[]byte) int {
	n := 0
	for _, f := range fs {
		if len(f) > 0 {
			n++
		}
	}
	return n
}

func parseHex(b []byte) (uint64, error) {
	if len(b) == 0 || len(b) > 16 {
		return 0, fmt.Errorf("%w: hex number %q", errMapsSyntax, b)
	}
	var v uint64
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, fmt.Errorf("%w: hex number %q", errMapsSyntax, b)
		}
		v = v<<4 | uint64(c)
	}
	return v, nil
}

// internPerms avoids one allocation per line for the common permission strings.
func internPerms(b []byte) string {
	for _, p := range [...]string{"r--p", "r-xp", "rw-p", "---p", "r--s", "rw-s", "r-xs", "rwxp"} {
		if string(b) == p {
			return p
		}
	}
	return string(b)
}

func baseName(p []byte) []byte {
	if i := bytes.LastIndexByte(p, '/'); i >= 0 {
		p = p[i+1:]
	}
	return p
}

// Library is one probed library file mapped into one process.
type Library struct {
	Kind LibraryKind
	// File keys the library on the host. The attach layer attaches once per File: uprobes
	// live on the inode and fire in every process that maps it.
	File FileID
	// Path is the pathname as the process sees it (its mount namespace).
	Path string
	// HostPath is Path seen from the agent: <proc>/PID/root/<Path>, valid while PID lives.
	// It resolves into containers. It does not resolve for a deleted file; use MapFilesPath.
	HostPath string
	// MapFilesPath is <proc>/PID/map_files/<start>-<end> of the base mapping: it opens the
	// mapped file even when it was deleted or replaced (needs CAP_SYS_ADMIN).
	MapFilesPath string
	Deleted      bool // the file was deleted or replaced after it was mapped
	// Base is the lowest address at which the file is mapped and BaseOffset the file offset
	// mapped there (0 for libraries that the dynamic loader mapped).
	Base       uint64
	BaseOffset uint64
	// Mappings are all the file's mappings in the process, by address. A library being
	// mapped while maps was read may show only some of its segments; Base is right as soon
	// as the first one is there, because ld.so reserves the whole span with it.
	Mappings []Mapping
}

// RuntimeAddr returns the address in the process of the ELF virtual address vaddr (a symbol's
// st_value), given firstLoadVaddr, the p_vaddr of the file's first PT_LOAD segment (0 for
// libraries linked by ld, gold and lld). Use it for /proc/PID/mem reads and writes of a
// variable, .bss included.
func (l Library) RuntimeAddr(vaddr, firstLoadVaddr uint64) uint64 {
	// ld.so maps the first PT_LOAD at bias + p_vaddr rounded down to a page: that is Base.
	pageMask := uint64(os.Getpagesize() - 1)
	return l.Base - firstLoadVaddr&^pageMask + vaddr
}

// maxLibrariesPerProcess bounds the probed library files of one process: a
// training process maps about 7; each one is an attach. More is a process
// made to cost the agent work (it is the process's owner who names files).
const maxLibrariesPerProcess = 64

// librariesFromMaps returns the probed libraries in a maps content, by File, each with all its
// mappings. procRoot and pid build HostPath and MapFilesPath. Only lines whose basename is a
// known kind allocate.
func librariesFromMaps(data []byte, procRoot string, pid int) ([]Library, error) {
	var libs []Library
	index := map[FileID]int{}
	err := eachMapsLine(data, func(line []byte) error {
		m, err := parseMapsLine(line, false)
		if err != nil {
			return err
		}
		if !m.fileBacked() {
			return nil
		}
		if i, ok := index[m.File]; ok {
			libs[i].Mappings = append(libs[i].Mappings, m)
			libs[i].Deleted = libs[i].Deleted || m.Deleted
			return nil
		}
		if len(libs) == maxLibrariesPerProcess {
			return fmt.Errorf("more than %d probed library files: %w", maxLibrariesPerProcess, errProcFileTooLarge)
		}
		index[m.File] = len(libs)
		libs = append(libs, Library{
			Kind:     classifyLibrary(path.Base(m.Path)),
			File:     m.File,
			Path:     m.Path,
			Deleted:  m.Deleted,
			Mappings: []Mapping{m},
		})
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i := range libs {
		l := &libs[i]
		sort.Slice(l.Mappings, func(a, b int) bool { return l.Mappings[a].Start < l.Mappings[b].Start })
		first := l.Mappings[0]
		l.Base, l.BaseOffset = first.Start, first.Offset
		l.HostPath = procPath(procRoot, pid, "root") + l.Path
		l.MapFilesPath = procPath(procRoot, pid, "map_files", fmt.Sprintf("%x-%x", first.Start, first.End))
	}
	sort.Slice(libs, func(a, b int) bool { return libs[a].Base < libs[b].Base })
	return libs, nil
}
