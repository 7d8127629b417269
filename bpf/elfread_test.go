package bpf

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// wanterOf returns the wanter of every spec of kind (0: of all kinds).
func wanterOf(tb testing.TB, kind LibKind) *symbolWanter {
	tb.Helper()
	var ks []ProbeSpec
	for _, s := range specs {
		if kind == 0 || s.Kind == kind {
			ks = append(ks, s)
		}
	}
	w, err := newSymbolWanter(ks)
	if err != nil {
		tb.Fatal(err)
	}
	return w
}

// referenceSymbols is the reader before the bounds: debug/elf's whole
// tables, filtered. The bounded reader must find the same.
func referenceSymbols(f *elf.File, w *symbolWanter) *libSymbols {
	ls := &libSymbols{funcs: map[string]uint64{}, objects: map[string]uint64{}, objErrs: map[string]error{}}
	progs := make([]elf.ProgHeader, len(f.Progs))
	for i, p := range f.Progs {
		progs[i] = p.ProgHeader
	}
	var all []elf.Symbol
	if syms, err := f.Symbols(); err == nil {
		ls.hasSymtab = true
		all = append(all, syms...)
	}
	if dyn, err := f.DynamicSymbols(); err == nil {
		ls.hasDynsym = true
		all = append(all, dyn...)
	}
	for _, s := range all {
		if !isCandidate(s) || len(s.Name) > maxSymbolName || !wants(w, s.Name) {
			continue
		}
		ls.add(progs, s)
	}
	return ls
}

func wants(w *symbolWanter, name string) bool {
	n, hit := w.find(append([]byte(name), 0))
	return hit && n != nil
}

func TestLoadLibSymbolsFindsWhatDebugELFFinds(t *testing.T) {
	dir := fakeLibs(t)
	for _, tc := range []struct {
		lib  string
		kind LibKind
	}{
		{"libnccl.so.2", LibNCCL},
		{"libcudart.so.13", LibCUDART},
		{"libcuda.so.1", LibCUDA},
		{"libtorch_cpu.so", LibTorch},
		{"probe/libslowrank_cupti.so", LibCUPTI},
		{"probe/bss/libslowrank_cupti.so", LibCUPTI},
	} {
		t.Run(tc.lib, func(t *testing.T) {
			path := filepath.Join(dir, tc.lib)
			w := wanterOf(t, tc.kind)
			got, err := loadLibSymbols(path, w)
			if err != nil {
				t.Fatal(err)
			}
			f, err := elf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			want := referenceSymbols(f, w)
			if len(got.funcs)+len(got.objects) == 0 || !reflect.DeepEqual(got, want) {
				t.Errorf("bounded reader:\n%+v\ndebug/elf:\n%+v", got, want)
			}
		})
	}
}

// testELF builds a small 64-bit ELF file: a text and a data segment, a
// .symtab and a .dynsym with their string tables. The fields after syms
// make it hostile.
type testELF struct {
	syms []testSym
	// symtabSize, when set, replaces the declared size of .symtab; its data
	// then sits at symtabOff (the file is not grown to it).
	symtabSize, symtabOff uint64
	shnum                 uint16 // replaces e_shnum (0: extended count from section 0)
	extendedCount         uint64 // section 0's sh_size
	noNUL                 bool   // the string tables end without NUL
}

type testSym struct {
	name  string
	typ   elf.SymType
	value uint64
}

const (
	testTextAddr = 0x1200 // file offset 0x200
	testDataAddr = 0x3300 // file offset 0x300
)

func (e testELF) bytes() []byte {
	le := binary.LittleEndian
	strtab := []byte{0}
	symtab := make([]byte, elf.Sym64Size) // entry 0 is null
	for _, s := range e.syms {
		var b [elf.Sym64Size]byte
		le.PutUint32(b[0:], uint32(len(strtab)))
		b[4] = byte(elf.STB_GLOBAL)<<4 | byte(s.typ)
		shndx := uint16(1)
		if s.value >= testDataAddr {
			shndx = 2
		}
		le.PutUint16(b[6:], shndx)
		le.PutUint64(b[8:], s.value)
		le.PutUint64(b[16:], 8)
		symtab = append(symtab, b[:]...)
		strtab = append(append(strtab, s.name...), 0)
	}
	if e.noNUL {
		strtab = bytes.ReplaceAll(strtab, []byte{0}, []byte{'x'})
	}
	out := make([]byte, 0x400)
	copy(out, elf.ELFMAG)
	out[elf.EI_CLASS], out[elf.EI_DATA], out[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), 1
	le.PutUint16(out[16:], uint16(elf.ET_DYN))
	le.PutUint16(out[18:], uint16(elf.EM_X86_64))
	le.PutUint32(out[20:], 1)
	le.PutUint64(out[32:], 64) // phoff
	le.PutUint16(out[52:], 64)
	le.PutUint16(out[54:], 56)
	le.PutUint16(out[56:], 2)
	le.PutUint16(out[58:], 64)
	putProg := func(i int, flags elf.ProgFlag, off, vaddr, filesz, memsz uint64) {
		b := out[64+56*i:]
		le.PutUint32(b, uint32(elf.PT_LOAD))
		le.PutUint32(b[4:], uint32(flags))
		le.PutUint64(b[8:], off)
		le.PutUint64(b[16:], vaddr)
		le.PutUint64(b[24:], vaddr)
		le.PutUint64(b[32:], filesz)
		le.PutUint64(b[40:], memsz)
		le.PutUint64(b[48:], 0x1000)
	}
	putProg(0, elf.PF_R|elf.PF_X, 0x200, testTextAddr, 0x100, 0x100)
	putProg(1, elf.PF_R|elf.PF_W, 0x300, testDataAddr, 0x100, 0x200)

	type sec struct {
		typ          elf.SectionType
		off, size    uint64
		link         uint32
		addr, ensize uint64
	}
	place := func(b []byte) uint64 {
		off := uint64(len(out))
		out = append(out, b...)
		return off
	}
	symOff, strOff := place(symtab), place(strtab)
	dynOff, dynstrOff := place(symtab), place(strtab)
	symSize := uint64(len(symtab))
	if e.symtabSize != 0 {
		symOff, symSize = e.symtabOff, e.symtabSize
	}
	secs := []sec{
		{typ: elf.SHT_NULL, size: e.extendedCount},
		{typ: elf.SHT_PROGBITS, off: 0x200, size: 0x100, addr: testTextAddr},
		{typ: elf.SHT_PROGBITS, off: 0x300, size: 0x100, addr: testDataAddr},
		{typ: elf.SHT_SYMTAB, off: symOff, size: symSize, link: 4, ensize: elf.Sym64Size},
		{typ: elf.SHT_STRTAB, off: strOff, size: uint64(len(strtab))},
		{typ: elf.SHT_DYNSYM, off: dynOff, size: uint64(len(symtab)), link: 6, ensize: elf.Sym64Size},
		{typ: elf.SHT_STRTAB, off: dynstrOff, size: uint64(len(strtab))},
	}
	shoff := uint64(len(out))
	for _, s := range secs {
		var b [64]byte
		le.PutUint32(b[4:], uint32(s.typ))
		le.PutUint64(b[16:], s.addr)
		le.PutUint64(b[24:], s.off)
		le.PutUint64(b[32:], s.size)
		le.PutUint32(b[40:], s.link)
		le.PutUint64(b[56:], s.ensize)
		out = append(out, b[:]...)
	}
	le.PutUint64(out[40:], shoff)
	shnum := uint16(len(secs))
	if e.shnum != 0 || e.extendedCount != 0 {
		shnum = e.shnum
	}
	le.PutUint16(out[60:], shnum)
	return out
}

func ncclSyms() []testSym {
	return []testSym{
		{"ncclAllReduce", elf.STT_FUNC, testTextAddr + 0x10},
		{"ncclBroadcast", elf.STT_FUNC, testTextAddr + 0x20},
		{"unrelated", elf.STT_FUNC, testTextAddr + 0x30},
	}
}

// writeSparse writes b to a file of size bytes (a hole after b).
func writeSparse(tb testing.TB, b []byte, size int64) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "libnccl.so.2")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		tb.Fatal(err)
	}
	if size > int64(len(b)) {
		if err := os.Truncate(path, size); err != nil {
			tb.Fatal(err)
		}
	}
	return path
}

func TestTestELFIsReadable(t *testing.T) {
	path := writeSparse(t, testELF{syms: ncclSyms()}.bytes(), 0)
	ls, err := loadLibSymbols(path, wanterOf(t, LibNCCL))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{"ncclAllReduce": 0x210, "ncclBroadcast": 0x220}
	if !reflect.DeepEqual(ls.funcs, want) || !ls.hasSymtab || !ls.hasDynsym {
		t.Errorf("funcs %v (want %v), symtab %v, dynsym %v", ls.funcs, want, ls.hasSymtab, ls.hasDynsym)
	}
}

func TestLoadLibSymbolsRefusesHostileFiles(t *testing.T) {
	const mib = 1 << 20
	small := testELF{syms: ncclSyms()}.bytes()
	for _, tc := range []struct {
		name string
		elf  testELF
		size int64 // file size: the hole after the headers
	}{
		{"a sparse 200 MiB symtab (over the size limit)", testELF{syms: ncclSyms(), symtabOff: mib, symtabSize: 200 * mib / elf.Sym64Size * elf.Sym64Size}, 201 * mib},
		{"a sparse 60 MiB symtab (under the limit, no blocks)", testELF{syms: ncclSyms(), symtabOff: mib, symtabSize: 60 * mib / elf.Sym64Size * elf.Sym64Size}, 61 * mib},
		{"a symtab beyond the end of the file", testELF{syms: ncclSyms(), symtabOff: 1 << 40, symtabSize: elf.Sym64Size}, 0},
		{"a symtab that wraps around", testELF{syms: ncclSyms(), symtabOff: ^uint64(0) - 7, symtabSize: 48}, 0},
		{"an extended section count of 2^40", testELF{syms: ncclSyms(), extendedCount: 1 << 40}, 0},
		{"an extended section count beyond the limit", testELF{syms: ncclSyms(), extendedCount: maxELFSections + 1}, 0},
		{"a symtab whose size is not a whole number of symbols", testELF{syms: ncclSyms(), symtabOff: uint64(len(small)) - 100, symtabSize: 25}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeSparse(t, tc.elf.bytes(), tc.size)
			before := allocated()
			start := time.Now()
			ls, err := loadLibSymbols(path, wanterOf(t, LibNCCL))
			took, alloc := time.Since(start), allocated()-before
			if err == nil {
				t.Fatalf("accepted: %d funcs", len(ls.funcs))
			}
			t.Logf("%v (%v, %d kB allocated)", err, took, alloc>>10)
			if alloc > 4*mib {
				t.Errorf("allocated %d MiB refusing it", alloc/mib)
			}
		})
	}
}

func allocated() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.TotalAlloc
}

// The reader AttachLibrary uses must refuse the table of the reported
// attack without reading it: 1.56 GiB of heap and 44 s of CPU before the
// bounds.
func TestLoadLibSymbolsRefusesSparseHugeSymtab(t *testing.T) {
	const mib = 1 << 20
	path := writeSparse(t, testELF{syms: ncclSyms(), symtabOff: mib, symtabSize: 200 * mib / elf.Sym64Size * elf.Sym64Size}.bytes(), 201*mib)
	before := allocated()
	_, err := loadLibSymbols(path, wanterOf(t, LibNCCL))
	if alloc := allocated() - before; !errors.Is(err, errELFBounds) || alloc > 4*mib {
		t.Errorf("err %v after %d MiB allocated; want %v with next to nothing", err, alloc/mib, errELFBounds)
	}
}

func TestLoadLibSymbolsSkipsNamesWithoutNUL(t *testing.T) {
	path := writeSparse(t, testELF{syms: ncclSyms(), noNUL: true}.bytes(), 0)
	ls, err := loadLibSymbols(path, wanterOf(t, LibNCCL))
	if err != nil || len(ls.funcs) != 0 {
		t.Errorf("funcs %v, err %v; want none and no error", ls, err)
	}
}

func TestLoadLibSymbolsRefusesTooManyMatches(t *testing.T) {
	syms := make([]testSym, maxWantedSymbols+1)
	for i := range syms {
		syms[i] = testSym{"ncclAllReduce", elf.STT_FUNC, testTextAddr + 0x10}
	}
	path := writeSparse(t, testELF{syms: syms}.bytes(), 0)
	if _, err := loadLibSymbols(path, wanterOf(t, LibNCCL)); !errors.Is(err, errELFBounds) {
		t.Errorf("err %v, want %v", err, errELFBounds)
	}
}

func TestLoadLibSymbolsRefusesAFIFOWithoutBlocking(t *testing.T) {
	path := filepath.Join(t.TempDir(), "libnccl.so.2")
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := loadLibSymbols(path, wanterOf(t, LibNCCL))
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a FIFO was read as a library")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("opening a FIFO blocked")
	}
}

// FuzzLibSymbols: any file is refused or read within the bounds, never a
// panic, and what is read agrees with debug/elf.
func FuzzLibSymbols(f *testing.F) {
	f.Add(testELF{syms: ncclSyms()}.bytes())
	f.Add(testELF{syms: ncclSyms(), noNUL: true}.bytes())
	f.Add(testELF{syms: ncclSyms(), extendedCount: 0x10000}.bytes())
	w := wanterOf(f, 0)
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		img, err := readELFImage(r, int64(len(b)))
		if err != nil {
			return
		}
		tabs, err := symbolTables(img.sections, img.size, img.section)
		if err != nil || checkAllocated(tabs, int64(len(b))) != nil {
			return
		}
		ls, err := collectLibSymbols(img.progs, img.bo, tabs, w)
		if err != nil {
			return
		}
		ef, err := elf.NewFile(bytes.NewReader(b))
		if err != nil {
			return
		}
		if ref := referenceSymbols(ef, w); !reflect.DeepEqual(ls.funcs, ref.funcs) || !reflect.DeepEqual(ls.objects, ref.objects) {
			t.Errorf("bounded reader funcs %v objects %v; debug/elf %v %v", ls.funcs, ls.objects, ref.funcs, ref.objects)
		}
	})
}
