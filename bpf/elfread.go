package bpf

import (
	"bytes"
	"cmp"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
)

// A library file belongs to whoever can write it, often the user whose
// process maps it: its reader allocates nothing that the file's headers ask
// for before checking it. Scale of real tables (torch 2.11 cu130):
// libtorch_cpu.so .symtab 13 MB (553k symbols) and .strtab 80 MB, libnccl.so.2
// .symtab 0.3 MB, libcudart.so.13 .dynsym 14 kB; 49 sections at most.
const (
	maxELFSections = 1 << 10  // section headers read
	maxELFProgs    = 1 << 8   // program headers read
	maxSymtabBytes = 64 << 20 // one .symtab or .dynsym: 2.8M symbols
	maxStrtabBytes = 1 << 30  // its string table: streamed, never held
	// maxSymbolName is the longest name looked at; longer names are not
	// wanted (the probed ones are under 200 bytes).
	maxSymbolName = 4 << 10
	// maxWantedSymbols bounds the names kept: a probed library has a few
	// dozen; more means a file made to match.
	maxWantedSymbols = 4096
	// allocSlack is how much larger than the file's allocated bytes its
	// tables may be: a compressing file system (ZFS, btrfs) reports the
	// compressed size; a sparse file reports its holes as nothing.
	allocSlack = 4
	// strtabChunk is the window of a string table held at a time.
	strtabChunk = 1 << 20
)

// errELFBounds is wrapped by the errors about a file whose headers ask for
// more than a library needs, or more than the file holds.
var errELFBounds = errors.New("ELF file out of bounds")

// elfImage is what reading symbols needs of an ELF file: its program and
// section headers, parsed from one read of each table, and the file.
type elfImage struct {
	r        io.ReaderAt
	size     int64
	bo       binary.ByteOrder
	progs    []elf.ProgHeader
	sections []elf.SectionHeader
}

// readLibSymbols reads the wanted symbols of the open library lf, whose
// symbol and string tables must lie inside it and take at most allocSlack
// times its allocated blocks: a sparse file cannot make the agent read tables
// that cost its owner no disk.
func readLibSymbols(lf *libFile, w *symbolWanter) (*libSymbols, error) {
	img, err := readELFImage(lf.f, lf.size)
	if err != nil {
		return nil, err
	}
	tabs, err := symbolTables(img.sections, img.size, img.section)
	if err != nil {
		return nil, err
	}
	if err := checkAllocated(tabs, lf.alloc); err != nil {
		return nil, err
	}
	return collectLibSymbols(img.progs, img.bo, tabs, w)
}

// readELFImage reads the ELF header and the program and section headers of
// a 64-bit ELF file of size bytes, checking every count and offset against
// the limits above and the file's size before reading.
func readELFImage(r io.ReaderAt, size int64) (*elfImage, error) {
	var hdr [64]byte
	if _, err := r.ReadAt(hdr[:], 0); err != nil {
		return nil, fmt.Errorf("read ELF header: %w", err)
	}
	if !bytes.HasPrefix(hdr[:], []byte(elf.ELFMAG)) {
		return nil, errors.New("not an ELF file")
	}
	if elf.Class(hdr[elf.EI_CLASS]) != elf.ELFCLASS64 {
		return nil, fmt.Errorf("unsupported ELF class %v", elf.Class(hdr[elf.EI_CLASS]))
	}
	img := &elfImage{r: r, size: size}
	switch elf.Data(hdr[elf.EI_DATA]) {
	case elf.ELFDATA2LSB:
		img.bo = binary.LittleEndian
	case elf.ELFDATA2MSB:
		img.bo = binary.BigEndian
	default:
		return nil, fmt.Errorf("unsupported ELF data encoding %v", elf.Data(hdr[elf.EI_DATA]))
	}
	bo := img.bo
	phoff, shoff := bo.Uint64(hdr[32:]), bo.Uint64(hdr[40:])
	phentsize, phnum := uint64(bo.Uint16(hdr[54:])), uint64(bo.Uint16(hdr[56:]))
	shentsize, shnum := uint64(bo.Uint16(hdr[58:])), uint64(bo.Uint16(hdr[60:]))
	if phnum > 0 && phentsize != 56 || shoff > 0 && shentsize != 64 {
		return nil, fmt.Errorf("%w: header entry sizes %d and %d", errELFBounds, phentsize, shentsize)
	}
	if shnum == 0 && shoff > 0 {
		// More than 0xff00 sections: the count is section 0's sh_size.
		var s0 [64]byte
		if err := readRange(r, size, shoff, s0[:]); err != nil {
			return nil, fmt.Errorf("read section 0: %w", err)
		}
		shnum = bo.Uint64(s0[32:])
	}
	if phnum > maxELFProgs || shnum > maxELFSections {
		return nil, fmt.Errorf("%w: %d program and %d section headers", errELFBounds, phnum, shnum)
	}
	ph := make([]byte, phnum*56)
	if err := readRange(r, size, phoff, ph); err != nil {
		return nil, fmt.Errorf("read program headers: %w", err)
	}
	for b := ph; len(b) > 0; b = b[56:] {
		img.progs = append(img.progs, elf.ProgHeader{
			Type: elf.ProgType(bo.Uint32(b)), Flags: elf.ProgFlag(bo.Uint32(b[4:])),
			Off: bo.Uint64(b[8:]), Vaddr: bo.Uint64(b[16:]), Paddr: bo.Uint64(b[24:]),
			Filesz: bo.Uint64(b[32:]), Memsz: bo.Uint64(b[40:]), Align: bo.Uint64(b[48:]),
		})
	}
	sh := make([]byte, shnum*64)
	if err := readRange(r, size, shoff, sh); err != nil {
		return nil, fmt.Errorf("read section headers: %w", err)
	}
	for b := sh; len(b) > 0; b = b[64:] {
		size := bo.Uint64(b[32:])
		img.sections = append(img.sections, elf.SectionHeader{
			Type: elf.SectionType(bo.Uint32(b[4:])), Flags: elf.SectionFlag(bo.Uint64(b[8:])),
			Addr: bo.Uint64(b[16:]), Offset: bo.Uint64(b[24:]), Size: size, FileSize: size,
			Link: bo.Uint32(b[40:]), Info: bo.Uint32(b[44:]), Entsize: bo.Uint64(b[56:]),
		})
	}
	return img, nil
}

// section opens the data of section i.
func (img *elfImage) section(i int) *io.SectionReader {
	s := img.sections[i]
	return io.NewSectionReader(img.r, int64(s.Offset), int64(s.Size))
}

// readRange fills buf from off, which must lie with it inside size bytes.
func readRange(r io.ReaderAt, size int64, off uint64, buf []byte) error {
	if len(buf) == 0 {
		return nil
	}
	if off > uint64(size) || uint64(len(buf)) > uint64(size)-off {
		return fmt.Errorf("%w: %d bytes at %d beyond the file's %d", errELFBounds, len(buf), off, size)
	}
	_, err := r.ReadAt(buf, int64(off))
	return err
}

// symbolTable is one symbol table (.symtab or .dynsym) and its strings.
type symbolTable struct {
	typ        elf.SectionType // SHT_SYMTAB or SHT_DYNSYM
	syms, strs *io.SectionReader
}

// symbolTables returns the .symtab and .dynsym among sections (the first
// section of each type, as debug/elf takes them), with their string tables,
// each checked to lie inside the file of fileSize bytes and under its size
// limit; section opens the data of a section.
func symbolTables(sections []elf.SectionHeader, fileSize int64, section func(i int) *io.SectionReader) ([]symbolTable, error) {
	var tabs []symbolTable
	for _, typ := range []elf.SectionType{elf.SHT_SYMTAB, elf.SHT_DYNSYM} {
		i := slices.IndexFunc(sections, func(s elf.SectionHeader) bool { return s.Type == typ })
		if i < 0 {
			continue
		}
		sym := sections[i]
		if int(sym.Link) >= len(sections) || sections[sym.Link].Type != elf.SHT_STRTAB {
			return nil, fmt.Errorf("%v section %d: link %d is not a string table", typ, i, sym.Link)
		}
		if err := checkTable(typ, sym, maxSymtabBytes, fileSize); err != nil {
			return nil, err
		}
		if err := checkTable(elf.SHT_STRTAB, sections[sym.Link], maxStrtabBytes, fileSize); err != nil {
			return nil, err
		}
		if sym.Entsize != elf.Sym64Size || sym.Size%elf.Sym64Size != 0 {
			return nil, fmt.Errorf("%v section %d: entry size %d, size %d", typ, i, sym.Entsize, sym.Size)
		}
		tabs = append(tabs, symbolTable{typ: typ, syms: section(i), strs: section(int(sym.Link))})
	}
	return tabs, nil
}

func checkTable(typ elf.SectionType, s elf.SectionHeader, limit uint64, fileSize int64) error {
	switch {
	case s.Flags&elf.SHF_COMPRESSED != 0:
		return fmt.Errorf("%v section is compressed", typ)
	case s.Size > limit:
		return fmt.Errorf("%w: %v section of %d bytes (limit %d)", errELFBounds, typ, s.Size, limit)
	case s.Offset > uint64(fileSize) || s.Size > uint64(fileSize)-s.Offset:
		return fmt.Errorf("%w: %v section of %d bytes at %d beyond the file's %d", errELFBounds, typ, s.Size, s.Offset, fileSize)
	}
	return nil
}

// checkAllocated refuses tables larger than allocSlack times the file's
// allocated bytes.
func checkAllocated(tabs []symbolTable, alloc int64) error {
	var total int64
	for _, t := range tabs {
		total += t.syms.Size() + t.strs.Size()
	}
	if total > allocSlack*alloc {
		return fmt.Errorf("%w: symbol tables of %d bytes in a file of %d allocated bytes (sparse?)", errELFBounds, total, alloc)
	}
	return nil
}

// candidate is a symbol that may be wanted: defined, with a value, a
// function or an object. Only these have their names looked at.
type candidate struct {
	name  uint32 // st_name: offset in the string table
	index uint32 // in the symbol table
}

// scanSymbols calls visit with each wanted symbol of t. Memory does not grow
// with the tables: the symbols are read in chunks, the candidates (8 bytes
// each) sorted by name offset, and the string table read forward once, a
// window at a time. Time does not grow with the names: a candidate costs a
// look at as many bytes as the longest exact wanted name, or at most
// maxSymbolName bytes for a prefix hit, of which there are at most
// maxWantedSymbols.
func scanSymbols(t symbolTable, bo binary.ByteOrder, w *symbolWanter, visit func(elf.Symbol)) error {
	cands, err := candidates(t.syms, bo)
	if err != nil {
		return err
	}
	slices.SortFunc(cands, func(a, b candidate) int { return cmp.Compare(a.name, b.name) })
	type match struct {
		index uint32
		name  string
	}
	var matches []match
	win := strtabWindow{r: t.strs}
	for _, c := range cands {
		b, err := win.at(int64(c.name))
		if err != nil {
			return fmt.Errorf("read %v strings: %w", t.typ, err)
		}
		name, hit := w.find(b)
		if !hit {
			continue
		}
		if len(matches) == maxWantedSymbols {
			return fmt.Errorf("%w: more than %d wanted symbols in %v", errELFBounds, maxWantedSymbols, t.typ)
		}
		if name != nil {
			matches = append(matches, match{c.index, string(name)})
		}
	}
	slices.SortFunc(matches, func(a, b match) int { return cmp.Compare(a.index, b.index) })
	var b [elf.Sym64Size]byte
	for _, m := range matches {
		if _, err := t.syms.ReadAt(b[:], int64(m.index)*elf.Sym64Size); err != nil {
			return fmt.Errorf("read %v: %w", t.typ, err)
		}
		if s := decodeSym(b[:], bo); isCandidate(s) {
			s.Name = m.name
			visit(s)
		}
	}
	return nil
}

// candidates reads a symbol table in chunks and returns its candidates.
func candidates(r *io.SectionReader, bo binary.ByteOrder) ([]candidate, error) {
	var out []candidate
	buf := make([]byte, 2730*elf.Sym64Size) // 64 kB
	for off := int64(0); off < r.Size(); off += int64(len(buf)) {
		n, err := r.ReadAt(buf, off)
		if err != nil && err != io.EOF {
			return nil, err
		}
		if n%elf.Sym64Size != 0 {
			return nil, fmt.Errorf("short symbol table read: %d bytes at %d", n, off)
		}
		for i := 0; i < n; i += elf.Sym64Size {
			index := (off + int64(i)) / elf.Sym64Size
			if s := bo.Uint32(buf[i:]); index > 0 && s != 0 && isCandidate(decodeSym(buf[i:], bo)) {
				out = append(out, candidate{name: s, index: uint32(index)})
			}
		}
		if err == io.EOF {
			break
		}
	}
	return out, nil
}

func decodeSym(b []byte, bo binary.ByteOrder) elf.Symbol {
	return elf.Symbol{
		Info: b[4], Other: b[5], Section: elf.SectionIndex(bo.Uint16(b[6:])),
		Value: bo.Uint64(b[8:]), Size: bo.Uint64(b[16:]),
	}
}

func isCandidate(s elf.Symbol) bool {
	t := elf.ST_TYPE(s.Info)
	return s.Section != elf.SHN_UNDEF && s.Value != 0 && (t == elf.STT_FUNC || t == elf.STT_OBJECT)
}

// strtabWindow reads names from a string table in increasing offset order,
// holding at most strtabChunk bytes.
type strtabWindow struct {
	r   *io.SectionReader
	off int64 // table offset of buf[0]
	buf []byte
}

// at returns the bytes of the table from off, at most maxSymbolName+1 of
// them (nil outside the table). The slice is valid until the next call.
func (s *strtabWindow) at(off int64) ([]byte, error) {
	if off >= s.r.Size() {
		return nil, nil
	}
	end := min(off+maxSymbolName+1, s.r.Size())
	if off < s.off || end > s.off+int64(len(s.buf)) {
		if s.buf == nil {
			s.buf = make([]byte, 0, strtabChunk)
		}
		n, err := s.r.ReadAt(s.buf[:min(strtabChunk, s.r.Size()-off)], off)
		if err != nil && err != io.EOF {
			return nil, err
		}
		s.off, s.buf = off, s.buf[:n]
	}
	return s.buf[off-s.off : min(end, s.off+int64(len(s.buf)))-s.off], nil
}
