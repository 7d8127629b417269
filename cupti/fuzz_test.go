package cupti

import (
	"errors"
	"reflect"
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
