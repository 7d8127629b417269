package bpf

import (
	"bytes"
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func openLibSymbols(t *testing.T, path string, kind LibKind) (*elf.File, *libSymbols) {
	t.Helper()
	var ks []ProbeSpec
	for _, s := range specs {
		if s.Kind == kind {
			ks = append(ks, s)
		}
	}
	w, err := newSymbolWanter(ks)
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	ls, err := loadLibSymbols(path, w)
	if err != nil {
		t.Fatal(err)
	}
	return f, ls
}

// The file offset of a function must point at its code in the file.
func TestFuncFileOffsets(t *testing.T) {
	dir := fakeLibs(t)
	path := filepath.Join(dir, "libnccl.so.2")
	f, ls := openLibSymbols(t, path, LibNCCL)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := f.Section(".text")
	code, err := text.Data()
	if err != nil {
		t.Fatal(err)
	}
	syms, _ := f.DynamicSymbols()
	checked := 0
	for _, s := range syms {
		off, ok := ls.funcs[s.Name]
		if !ok {
			continue
		}
		want := code[s.Value-text.Addr:][:8]
		if got := raw[off : off+8]; !bytes.Equal(got, want) {
			t.Errorf("%s: bytes at file offset %#x = %x, code = %x", s.Name, off, got, want)
		}
		checked++
	}
	if checked != fakeNCCLSymbols {
		t.Errorf("checked %d functions, want %d", checked, fakeNCCLSymbols)
	}
	if !ls.hasSymtab || !ls.hasDynsym {
		t.Errorf("symtab %v dynsym %v", ls.hasSymtab, ls.hasDynsym)
	}
}

func TestSemaphoreOffsets(t *testing.T) {
	dir := fakeLibs(t)
	for _, tc := range []struct {
		lib  string
		warn error
	}{
		{"probe/libslowrank_cupti.so", nil},
		{"probe/bss/libslowrank_cupti.so", errRefCtrBSS},
	} {
		f, ls := openLibSymbols(t, filepath.Join(dir, tc.lib), LibCUPTI)
		off, ok := ls.objects[CUPTISemaphoreSymbol]
		if !ok {
			t.Fatalf("%s: semaphore not found: %v", tc.lib, ls.objErrs)
		}
		if err := ls.objErrs[CUPTISemaphoreSymbol]; !errors.Is(err, tc.warn) || (tc.warn == nil) != (err == nil) {
			t.Errorf("%s: warning %v, want %v", tc.lib, err, tc.warn)
		}
		syms, _ := f.Symbols()
		for _, s := range syms {
			if s.Name != CUPTISemaphoreSymbol {
				continue
			}
			sec := f.Sections[s.Section]
			bySection := s.Value - sec.Addr + sec.Offset
			t.Logf("%s: %s in %s (%v): segment offset %#x, section offset %#x", tc.lib, s.Name, sec.Name, sec.Type, off, bySection)
			if sec.Type == elf.SHT_PROGBITS && bySection != off {
				t.Errorf("%s: PROGBITS offsets differ: %#x vs %#x", tc.lib, off, bySection)
			}
		}
	}
}

func TestStrippedLibrary(t *testing.T) {
	dir := fakeLibs(t)
	stripped := filepath.Join(t.TempDir(), "libnccl.so.2")
	out, err := exec.Command("strip", "--strip-all", "-o", stripped, filepath.Join(dir, "libnccl.so.2")).CombinedOutput()
	if err != nil {
		t.Skipf("strip: %v %s", err, out)
	}
	_, ls := openLibSymbols(t, stripped, LibNCCL)
	if ls.hasSymtab || !ls.hasDynsym {
		t.Errorf("stripped: symtab %v dynsym %v", ls.hasSymtab, ls.hasDynsym)
	}
	if len(ls.funcs) != fakeNCCLSymbols {
		t.Errorf("stripped: %d exported functions found, want %d", len(ls.funcs), fakeNCCLSymbols)
	}

	if os.Geteuid() != 0 || CheckSupport() != nil {
		return
	}
	p, err := Load(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer closeOK(t, p)
	a, err := p.AttachLibrary(LibSource{Path: stripped}, LibNCCL)
	if err != nil {
		t.Fatal(err)
	}
	if !a.Stripped || a.NoSymbols || a.Attached() != fakeNCCLFuncs {
		t.Errorf("stripped attach: stripped %v nosyms %v attached %d", a.Stripped, a.NoSymbols, a.Attached())
	}
	if st, _ := p.Stats(); st.LibrariesStripped != 1 {
		t.Errorf("LibrariesStripped = %d", st.LibrariesStripped)
	}
}

func TestAttachNotELF(t *testing.T) {
	requireBPF(t)
	p, err := Load(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer closeOK(t, p)
	path := filepath.Join(t.TempDir(), "libnccl.so.2")
	if err := os.WriteFile(path, []byte("not an elf file"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := p.AttachLibrary(LibSource{Path: path}, LibNCCL); err == nil {
		t.Error("attach of a non-ELF file succeeded")
	}
}
