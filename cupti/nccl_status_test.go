package cupti

import (
	"bytes"
	"errors"
	"os"
	"testing"
	"unsafe"
)

func TestParseNCCLStatus(t *testing.T) {
	var r rawNCCLStatus
	bound := NCCLStatus{APIVersion: 5, Mask: 0x646, LiveComms: 2, Inits: 3, Colls: 1000, Dropped: 7, FirstInitNs: 42}
	corrupt := func(off uintptr, v uint16) []byte {
		b := encodeNCCLStatus(bound)
		le.PutUint16(b[off:], v)
		return b
	}
	tests := []struct {
		name string
		in   []byte
		want NCCLStatus
		err  bool
	}{
		{"a bound plugin decodes every field", encodeNCCLStatus(bound), bound, false},
		{"a library NCCL never loaded has API version 0", encodeNCCLStatus(NCCLStatus{}), NCCLStatus{}, false},
		{"disabled is a flag", encodeNCCLStatus(NCCLStatus{APIVersion: 4, Disabled: true}), NCCLStatus{APIVersion: 4, Disabled: true}, false},
		{"trailing bytes are ignored", append(encodeNCCLStatus(bound), 1, 2, 3), bound, false},
		{"a short read is refused", encodeNCCLStatus(bound)[:NCCLStatusSize-1], NCCLStatus{}, true},
		{"another magic is refused", corrupt(unsafe.Offsetof(r.Magic), 0x1234), NCCLStatus{}, true},
		{"another version is refused", corrupt(unsafe.Offsetof(r.Version), 2), NCCLStatus{}, true},
		{"another size is refused", corrupt(unsafe.Offsetof(r.Size), 128), NCCLStatus{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseNCCLStatus(tt.in)
			if (err != nil) != tt.err || got != tt.want {
				t.Fatalf("ParseNCCLStatus = %+v, %v; want %+v, error %v", got, err, tt.want, tt.err)
			}
			if err != nil && !errors.Is(err, ErrNCCLStatus) {
				t.Errorf("error %v is not ErrNCCLStatus", err)
			}
		})
	}
	if !bound.Bound() || (NCCLStatus{APIVersion: 5, Disabled: true}).Bound() || (NCCLStatus{}).Bound() {
		t.Error("Bound: wrong for bound, disabled or never loaded")
	}
}

func TestReadNCCLStatusReadsOneBlockAtTheAddress(t *testing.T) {
	const base = 4096
	m := &memFile{b: make([]byte, base+NCCLStatusSize)}
	want := NCCLStatus{APIVersion: 5, LiveComms: 1, Colls: 9}
	copy(m.b[base:], encodeNCCLStatus(want))
	if got, err := ReadNCCLStatus(m, base); err != nil || got != want {
		t.Fatalf("ReadNCCLStatus = %+v, %v; want %+v", got, err, want)
	}
	if _, err := ReadNCCLStatus(m, base+8); err == nil {
		t.Error("read past the end: no error")
	}
}

func TestInspectLibraryFindsTheNCCLStatus(t *testing.T) {
	path := builtLibrary(t)
	lib, err := InspectLibrary(path)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if lib.NCCLStatusOffset == 0 || lib.NCCLStatusOffset+uint64(NCCLStatusSize) > uint64(len(data)) {
		t.Fatalf("NCCL status offset %#x", lib.NCCLStatusOffset)
	}
	// The file holds the initial image: recognised, never bound.
	st, err := ParseNCCLStatus(data[lib.NCCLStatusOffset:])
	if err != nil || st != (NCCLStatus{}) {
		t.Fatalf("initial image %+v, %v", st, err)
	}
	if _, err := NCCLStatusAddress(nil, 1, Library{}); !errors.Is(err, ErrNoNCCLStatus) {
		t.Errorf("a library without the block: %v, want ErrNoNCCLStatus", err)
	}
}

// FuzzParseNCCLStatus: bytes read from another process never panic the
// decoder, and whatever it accepts re-encodes to the same fields.
func FuzzParseNCCLStatus(f *testing.F) {
	f.Add(encodeNCCLStatus(NCCLStatus{APIVersion: 5, Mask: 0x646, LiveComms: 1, Colls: 3}))
	f.Add(encodeNCCLStatus(NCCLStatus{}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := ParseNCCLStatus(b)
		if err != nil {
			return
		}
		again, err := ParseNCCLStatus(encodeNCCLStatus(st))
		if err != nil || again != st {
			t.Fatalf("re-encoded %+v: %+v, %v", st, again, err)
		}
		if !bytes.Equal(b[:4], encodeNCCLStatus(st)[:4]) {
			t.Fatal("accepted another magic")
		}
	})
}
