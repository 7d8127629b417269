package bpf

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// libSymbols is what attaching needs from one ELF file: file offsets of the
// wanted functions and objects.
type libSymbols struct {
	funcs     map[string]uint64 // STT_FUNC name -> file offset of its entry
	objects   map[string]uint64 // STT_OBJECT name -> file offset (ref_ctr_offset)
	objErrs   map[string]error  // STT_OBJECT names unusable (not in objects) or unreliable (in objects)
	hasSymtab bool              // .symtab present (not stripped)
	hasDynsym bool              // .dynsym present
}

// mangledPrefixes returns the Itanium ABI prefixes of every overload of a
// plain qualified function name such as "c10d::ProcessGroupNCCL::allreduce":
// "_ZN4c10d16ProcessGroupNCCL9allreduceE" and the const-method form with
// "_ZNK". Names with templates or operators are not supported.
func mangledPrefixes(qualified string) ([]string, error) {
	parts := strings.Split(qualified, "::")
	if len(parts) < 2 {
		return nil, fmt.Errorf("qualified name %q needs a scope", qualified)
	}
	var b strings.Builder
	for _, p := range parts {
		if p == "" || strings.ContainsAny(p, "<>()~ ,*&") {
			return nil, fmt.Errorf("qualified name %q: unsupported component %q", qualified, p)
		}
		b.WriteString(strconv.Itoa(len(p)))
		b.WriteString(p)
	}
	nested := b.String() + "E"
	return []string{"_ZN" + nested, "_ZNK" + nested}, nil
}

// symbolWanter decides which symbol names to keep while scanning (a torch
// library has hundreds of thousands).
type symbolWanter struct {
	exact    map[string]bool
	maxExact int // the longest exact name
	prefixes []string
}

func newSymbolWanter(specs []ProbeSpec) (*symbolWanter, error) {
	w := &symbolWanter{exact: map[string]bool{}}
	for _, s := range specs {
		for _, name := range []string{s.Symbol, s.RefCtr} {
			if name != "" {
				w.exact[name] = true
				w.maxExact = max(w.maxExact, len(name))
			}
		}
		if s.Qualified != "" {
			ps, err := mangledPrefixes(s.Qualified)
			if err != nil {
				return nil, err
			}
			w.prefixes = append(w.prefixes, ps...)
		}
	}
	return w, nil
}

// find looks for a wanted name at the start of b, the bytes of a string
// table from a symbol's name, and reports a hit: an exact name (looked for
// within the longest exact name's length) or a name with a wanted prefix
// (nil when it has no NUL within b). It allocates nothing (the map lookup of
// a converted slice does not copy it).
func (w *symbolWanter) find(b []byte) (name []byte, hit bool) {
	if i := bytes.IndexByte(b[:min(len(b), w.maxExact+1)], 0); i >= 0 && w.exact[string(b[:i])] {
		return b[:i], true
	}
	for _, p := range w.prefixes {
		if bytes.HasPrefix(b, []byte(p)) {
			if i := bytes.IndexByte(b, 0); i >= 0 {
				return b[:i], true
			}
			return nil, true
		}
	}
	return nil, false
}

// collectLibSymbols scans the symbol tables for the wanted names and maps
// them to file offsets through progs.
func collectLibSymbols(progs []elf.ProgHeader, bo binary.ByteOrder, tabs []symbolTable, w *symbolWanter) (*libSymbols, error) {
	ls := &libSymbols{funcs: map[string]uint64{}, objects: map[string]uint64{}, objErrs: map[string]error{}}
	for _, t := range tabs {
		if t.typ == elf.SHT_SYMTAB {
			ls.hasSymtab = true
		} else {
			ls.hasDynsym = true
		}
		err := scanSymbols(t, bo, w, func(s elf.Symbol) { ls.add(progs, s) })
		if err != nil {
			return nil, fmt.Errorf("read %v symbols: %w", t.typ, err)
		}
	}
	return ls, nil
}

// add records a wanted function or object symbol at its file offset.
func (ls *libSymbols) add(progs []elf.ProgHeader, s elf.Symbol) {
	switch elf.ST_TYPE(s.Info) {
	case elf.STT_FUNC:
		if off, ok := funcFileOffset(progs, s.Value); ok {
			ls.funcs[s.Name] = off
		}
	case elf.STT_OBJECT:
		off, warn, err := objectFileOffset(progs, s)
		if err != nil {
			ls.objErrs[s.Name] = err
			return
		}
		ls.objects[s.Name] = off
		if warn != nil {
			ls.objErrs[s.Name] = warn
		}
	}
}

// funcFileOffset maps a function's virtual address to its file offset through
// the executable PT_LOAD segment that contains it (what uprobes want).
func funcFileOffset(progs []elf.ProgHeader, vaddr uint64) (uint64, bool) {
	for _, p := range progs {
		if p.Type != elf.PT_LOAD || p.Flags&elf.PF_X == 0 {
			continue
		}
		if p.Vaddr <= vaddr && vaddr < p.Vaddr+p.Memsz {
			return vaddr - p.Vaddr + p.Off, true
		}
	}
	return 0, false
}

// objectFileOffset is the file offset of a data symbol as the kernel maps
// it: value - p_vaddr + p_offset of the PT_LOAD segment that contains it.
// That is the uprobe ref_ctr_offset of a semaphore. It is deliberately not
// computed from the section (value - sh_addr + sh_offset): for a .bss
// symbol sh_offset ignores the alignment padding between .data and .bss,
// which would make the kernel bump the wrong bytes.
//
// The kernel only updates a reference counter inside the file-backed part of
// a writable mapping: a symbol past the last file-backed page is an error. A
// symbol in .bss inside that page is usable but unreliable (warn): ld.so
// zeroes that tail after mapping, wiping the kernel's increment in processes
// that load the library after the uprobe exists.
func objectFileOffset(progs []elf.ProgHeader, s elf.Symbol) (off uint64, warn, err error) {
	for _, p := range progs {
		if p.Type != elf.PT_LOAD || s.Value < p.Vaddr || s.Value >= p.Vaddr+p.Memsz {
			continue
		}
		if p.Flags&elf.PF_W == 0 {
			return 0, nil, fmt.Errorf("symbol %s is in a read-only segment", s.Name)
		}
		const page = 4096
		fileBackedEnd := (p.Vaddr + p.Filesz + page - 1) &^ (page - 1)
		if s.Value+2 > fileBackedEnd {
			return 0, nil, fmt.Errorf("symbol %s: %w", s.Name, errRefCtrAnonymous)
		}
		if s.Value >= p.Vaddr+p.Filesz {
			warn = fmt.Errorf("symbol %s: %w", s.Name, errRefCtrBSS)
		}
		return s.Value - p.Vaddr + p.Off, warn, nil
	}
	return 0, nil, fmt.Errorf("symbol %s is in no loadable segment", s.Name)
}

var (
	// errRefCtrAnonymous: the semaphore lies in anonymous memory, where the
	// kernel never updates a uprobe reference counter.
	errRefCtrAnonymous = errors.New("semaphore beyond the file-backed pages of its segment: never updated (put it in .data or .probes)")
	// errRefCtrBSS: the semaphore is in the zero-filled tail of the last file
	// page; processes that load the library after attach see 0.
	errRefCtrBSS = errors.New("semaphore in .bss: stays 0 in processes that load the library after attach (put it in .data or .probes)")
)

// resolved is one spec matched to one function in a library.
type resolved struct {
	spec    ProbeSpec
	elfName string
	offset  uint64
}

// resolve matches specs against ls. It returns the matches (every overload
// of a qualified name, sorted by name for a stable order) and the specs that
// matched nothing.
func resolve(specs []ProbeSpec, ls *libSymbols) (found []resolved, missing []ProbeSpec) {
	for _, s := range specs {
		n := len(found)
		if s.Symbol != "" {
			if off, ok := ls.funcs[s.Symbol]; ok {
				found = append(found, resolved{spec: s, elfName: s.Symbol, offset: off})
			}
		} else if s.Qualified != "" {
			prefixes, _ := mangledPrefixes(s.Qualified) // validated by newSymbolWanter
			var names []string
			for name := range ls.funcs {
				if strings.Contains(name, ".") { // .cold, .isra.0, .constprop.0: not entry points
					continue
				}
				for _, p := range prefixes {
					if strings.HasPrefix(name, p) {
						names = append(names, name)
						break
					}
				}
			}
			sort.Strings(names)
			for _, name := range names {
				found = append(found, resolved{spec: s, elfName: name, offset: ls.funcs[name]})
			}
		}
		if len(found) == n {
			missing = append(missing, s)
		}
	}
	return found, missing
}
