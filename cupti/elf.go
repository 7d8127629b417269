package cupti

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Exported symbols of libslowrank_cupti.so.
const (
	// EmitSymbol is the function to uprobe: rdi/x0 = batch pointer,
	// esi/w1 = length (<= BatchMax).
	EmitSymbol = "slowrank_cupti_emit"
	// SemaphoreSymbol is the uprobe reference counter (volatile uint16_t in
	// section .probes).
	SemaphoreSymbol = "slowrank_cupti_semaphore"
	// ControlSymbol is the control block (struct slowrank_cupti_control).
	ControlSymbol = "slowrank_cupti_control"
	// InjectionSymbol is what the CUDA driver calls (CUDA_INJECTION64_PATH).
	InjectionSymbol = "InitializeInjection"
)

// ErrNotInjectionLibrary reports a file without the library's symbols.
var ErrNotInjectionLibrary = errors.New("not a slowrank injection library")

// Library locates the library's symbols in its file, for attaching.
type Library struct {
	// SemaphoreOffset is the file offset of the semaphore: the
	// ref_ctr_offset (cilium/ebpf UprobeOptions.RefCtrOffset) to use when
	// attaching the uprobe on EmitSymbol.
	SemaphoreOffset uint64
	// ControlVaddr and ControlOffset are the link-time address and the file
	// offset of the control block; ControlAddress turns the offset into an
	// address in a process.
	ControlVaddr  uint64
	ControlOffset uint64
	// EmitVaddr is the link-time address of EmitSymbol.
	EmitVaddr uint64
	// NCCLStatusOffset is the file offset of NCCLStatusSymbol, 0 for a
	// library without the NCCL plugin (before issue 20).
	NCCLStatusOffset uint64
}

// InspectLibrary reads the library's symbol table.
func InspectLibrary(path string) (Library, error) {
	raw, err := readLibraryFile(path)
	if err != nil {
		return Library{}, err
	}
	f, err := elf.NewFile(bytes.NewReader(raw))
	if err != nil {
		return Library{}, fmt.Errorf("open injection library: %w", err)
	}
	defer f.Close()
	lib, err := inspectELF(f)
	if err != nil {
		return Library{}, fmt.Errorf("inspect %s: %w", path, err)
	}
	return lib, nil
}

// maxLibraryBytes bounds the injection library file the agent reads (ours
// is about 160 kB): the path is in a training process's maps, and whoever
// can write that file decides what it holds.
const maxLibraryBytes = 16 << 20

// readLibraryFile reads the file at path whole, refusing anything but a
// regular file (a FIFO would block the agent) and files over
// maxLibraryBytes, so that parsing it costs bounded memory whatever its
// headers claim.
func readLibraryFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open injection library: %w", err)
	}
	defer func() { _ = f.Close() }() // read only
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat injection library: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file (%s)", ErrNotInjectionLibrary, path, fi.Mode().Type())
	}
	if fi.Size() > maxLibraryBytes {
		return nil, fmt.Errorf("%w: %s has %d bytes (at most %d)", ErrNotInjectionLibrary, path, fi.Size(), maxLibraryBytes)
	}
	raw, err := io.ReadAll(io.LimitReader(f, maxLibraryBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read injection library: %w", err)
	}
	if len(raw) > maxLibraryBytes {
		return nil, fmt.Errorf("%w: %s grew past %d bytes", ErrNotInjectionLibrary, path, maxLibraryBytes)
	}
	return raw, nil
}

func inspectELF(f *elf.File) (Library, error) {
	syms, err := f.DynamicSymbols()
	if err != nil {
		return Library{}, fmt.Errorf("read dynamic symbols: %w", err)
	}
	want := map[string]*elf.Symbol{EmitSymbol: nil, SemaphoreSymbol: nil, ControlSymbol: nil}
	for i := range syms {
		if _, ok := want[syms[i].Name]; ok && syms[i].Section != elf.SHN_UNDEF {
			want[syms[i].Name] = &syms[i]
		}
	}
	for name, s := range want {
		if s == nil {
			return Library{}, fmt.Errorf("%w: no symbol %s", ErrNotInjectionLibrary, name)
		}
	}
	if want[ControlSymbol].Size != uint64(ControlSize) {
		return Library{}, fmt.Errorf("%w: %s is %d bytes, want %d", ErrNotInjectionLibrary, ControlSymbol, want[ControlSymbol].Size, ControlSize)
	}
	var lib Library
	lib.EmitVaddr = want[EmitSymbol].Value
	if lib.SemaphoreOffset, err = fileOffset(f, want[SemaphoreSymbol].Value); err != nil {
		return Library{}, fmt.Errorf("%s: %w", SemaphoreSymbol, err)
	}
	lib.ControlVaddr = want[ControlSymbol].Value
	if lib.ControlOffset, err = fileOffset(f, lib.ControlVaddr); err != nil {
		return Library{}, fmt.Errorf("%s: %w", ControlSymbol, err)
	}
	// Optional: older libraries have no NCCL plugin; one of the wrong size
	// is not read.
	for i := range syms {
		if s := syms[i]; s.Name == NCCLStatusSymbol && s.Section != elf.SHN_UNDEF && s.Size == uint64(NCCLStatusSize) {
			if off, err := fileOffset(f, s.Value); err == nil {
				lib.NCCLStatusOffset = off
			}
		}
	}
	return lib, nil
}

// fileOffset maps a virtual address to its offset in the file, through the
// PT_LOAD segment holding it (file-backed bytes only, not .bss).
func fileOffset(f *elf.File, vaddr uint64) (uint64, error) {
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD {
			continue
		}
		if vaddr >= p.Vaddr && vaddr < p.Vaddr+p.Filesz {
			return vaddr - p.Vaddr + p.Off, nil
		}
	}
	return 0, fmt.Errorf("address %#x is not backed by the file", vaddr)
}

// ControlAddress finds the control block in a process from its
// /proc/PID/maps: the writable mapping of the library's file (by inode) that
// covers lib.ControlOffset.
func ControlAddress(maps []byte, inode uint64, lib Library) (uint64, error) {
	return mappedAddress(maps, inode, lib.ControlOffset, uint64(ControlSize), "control block")
}

// ErrNoNCCLStatus: the library has no NCCL status block (before issue 20).
var ErrNoNCCLStatus = errors.New("injection library has no NCCL status block")

// NCCLStatusAddress finds the NCCL status block in a process, as
// ControlAddress finds the control block.
func NCCLStatusAddress(maps []byte, inode uint64, lib Library) (uint64, error) {
	if lib.NCCLStatusOffset == 0 {
		return 0, ErrNoNCCLStatus
	}
	return mappedAddress(maps, inode, lib.NCCLStatusOffset, uint64(NCCLStatusSize), "nccl status block")
}

// mappedAddress returns the address of the size bytes at file offset off of
// the file (by inode) in its writable mapping.
func mappedAddress(maps []byte, inode, off0, size uint64, what string) (uint64, error) {
	sc := bufio.NewScanner(bytes.NewReader(maps))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		// start-end perms offset dev inode [path]
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		ino, err := strconv.ParseUint(fields[4], 10, 64)
		if err != nil || ino != inode || !strings.Contains(fields[1], "w") {
			continue // the block lives in the writable data mapping
		}
		startS, endS, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(startS, 16, 64)
		end, err2 := strconv.ParseUint(endS, 16, 64)
		off, err3 := strconv.ParseUint(fields[2], 16, 64)
		if err1 != nil || err2 != nil || err3 != nil || end <= start {
			continue
		}
		if off0 >= off && off0+size <= off+(end-start) {
			return start + (off0 - off), nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read maps: %w", err)
	}
	return 0, fmt.Errorf("no mapping of inode %d covers the %s (offset %#x)", inode, what, off0)
}
