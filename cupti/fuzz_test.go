package cupti

import (
	"bytes"
	"debug/elf"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// FuzzDecodeBatch checks that DecodeBatch never panics, that whatever it
// accepts satisfies the ABI's invariants, and that accepted batches survive
// an encode/decode round trip. The seed corpus in
// testdata/fuzz/FuzzDecodeBatch holds batches from the real C converter
// (written by `make cupti-test`).
func FuzzDecodeBatch(f *testing.F) {
	seed, err := EncodeBatch(sampleBatch())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add(seed[:hdrSize])
	f.Add(rawBatch(record(0x7777, 24), record(recKernel, kernelSize+16)))
	f.Add(rawBatch(record(recNCCLColl, ncclCollSize), record(recNCCLKernel, ncclKernelSize+8),
		record(recNCCLComm, ncclCommSize)))
	f.Add(rawBatch(record(recNCCLColl, ncclCollSize-8)))
	f.Add([]byte{})
	if raws, err := readBatchFile("testdata/nccl-plugin.batches"); err == nil && len(raws) > 0 {
		f.Add(raws[0]) // the real plugin's records (cupti/test_nccl.c)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := DecodeBatch(b)
		if err != nil {
			if !errors.Is(err, ErrShort) && !errors.Is(err, ErrMagic) && !errors.Is(err, ErrVersion) && !errors.Is(err, ErrMalformed) {
				t.Fatalf("unexpected error type: %v", err)
			}
			return
		}
		h := got.Header
		if int(h.Len) > len(b) || h.Len > BatchMax || h.Version != ABIVersion {
			t.Fatalf("header %+v for %d bytes", h, len(b))
		}
		n := len(got.Kernels) + len(got.Copies) + len(got.Names) + len(got.Stats) + len(got.Transitions) +
			len(got.NCCLComms) + len(got.NCCLColls) + len(got.NCCLKernels) + got.Skipped
		if n != int(h.Count) {
			t.Fatalf("%d records decoded, header says %d", n, h.Count)
		}
		for _, nd := range got.Names {
			if len(nd.Name) > NameMax || nd.ID == 0 {
				t.Fatalf("name %+v", nd)
			}
		}
		if got.Skipped > 0 {
			return // unknown records cannot be re-encoded
		}
		if encodedSize(&got) > BatchMax {
			return // shorter stats records than canonical: no room to re-encode
		}
		re, err := EncodeBatch(&got)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		again, err := DecodeBatch(re)
		if err != nil {
			t.Fatalf("decode re-encoded: %v", err)
		}
		// The encoder writes every known counter and canonical sizes.
		for i := range got.Stats {
			got.Stats[i].N = int(NumStats)
		}
		got.Header.Len = again.Header.Len
		if !reflect.DeepEqual(normalize(got), normalize(again)) {
			t.Fatalf("round trip differs:\n%+v\n%+v", got, again)
		}
	})
}

// normalize makes empty and nil slices compare equal.
func normalize(b Batch) Batch {
	if len(b.Kernels) == 0 {
		b.Kernels = nil
	}
	if len(b.Copies) == 0 {
		b.Copies = nil
	}
	if len(b.Names) == 0 {
		b.Names = nil
	}
	if len(b.Stats) == 0 {
		b.Stats = nil
	}
	if len(b.Transitions) == 0 {
		b.Transitions = nil
	}
	if len(b.NCCLComms) == 0 {
		b.NCCLComms = nil
	}
	if len(b.NCCLColls) == 0 {
		b.NCCLColls = nil
	}
	if len(b.NCCLKernels) == 0 {
		b.NCCLKernels = nil
	}
	return b
}

// FuzzControlAddress: the agent finds where it writes from a process's
// /proc/PID/maps, which the process shapes. ControlAddress never panics, and
// an address it returns has the whole control block inside one writable
// mapping of the library's inode, at the file offset asked for.
func FuzzControlAddress(f *testing.F) {
	f.Add([]byte("7f0000000000-7f0000001000 r-xp 00000000 fd:01 77 /lib/libslowrank_cupti.so\n"+
		"7f0000010000-7f0000012000 rw-p 00010000 fd:01 77 /lib/libslowrank_cupti.so\n"), uint64(77), uint64(0x10100))
	f.Add([]byte("ffffffffffff0000-ffffffffffffffff rw-p fffffffffffff000 0:0 1\n"), uint64(1), uint64(0xfffffffffffff100))
	f.Add([]byte("1-0 rw-p 0 0:0 5\n2-1000 rw-p -1 0:0 5\n"), uint64(5), uint64(0))
	f.Fuzz(func(t *testing.T, maps []byte, inode, off uint64) {
		addr, err := ControlAddress(maps, inode, Library{ControlOffset: off})
		if err != nil {
			return
		}
		for _, line := range strings.Split(string(maps), "\n") {
			fs := strings.Fields(line)
			if len(fs) < 5 || !strings.Contains(fs[1], "w") {
				continue
			}
			lo, hi, _ := strings.Cut(fs[0], "-")
			start, err1 := strconv.ParseUint(lo, 16, 64)
			end, err2 := strconv.ParseUint(hi, 16, 64)
			moff, err3 := strconv.ParseUint(fs[2], 16, 64)
			ino, err4 := strconv.ParseUint(fs[4], 10, 64)
			if err1 != nil || err2 != nil || err3 != nil || err4 != nil || ino != inode {
				continue
			}
			if addr >= start && addr-start <= end-start && end-addr >= uint64(ControlSize) && addr-start == off-moff && off >= moff {
				return
			}
		}
		t.Fatalf("address %#x for inode %d offset %#x is not inside one of its writable mappings", addr, inode, off)
	})
}

// FuzzInspectELF: the injection library file belongs to whoever can write
// it. inspectELF never panics on what debug/elf accepts, and a control block
// it finds lies in bytes of a loaded segment.
func FuzzInspectELF(f *testing.F) {
	if p := os.Getenv("SLOWRANK_CUPTI_SO"); p != "" {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	} else if b, err := os.ReadFile(filepath.Join("..", "bin", "libslowrank_cupti.so")); err == nil {
		f.Add(b)
	}
	f.Add([]byte("\x7fELF\x02\x01\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ef, err := elf.NewFile(bytes.NewReader(b))
		if err != nil {
			return
		}
		defer ef.Close()
		lib, err := inspectELF(ef)
		if err != nil {
			return
		}
		for _, p := range ef.Progs {
			if p.Type == elf.PT_LOAD && lib.ControlOffset >= p.Off && lib.ControlOffset-p.Off < p.Filesz {
				return
			}
		}
		t.Fatalf("control block at file offset %#x outside every loaded segment", lib.ControlOffset)
	})
}
