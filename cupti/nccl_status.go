package cupti

import (
	"errors"
	"fmt"
	"io"
	"unsafe"
)

// NCCLStatusSymbol is the library's exported NCCL plugin status
// (struct slowrank_nccl_status), what status and doctor show as a
// process's NCCL capture path.
const NCCLStatusSymbol = "slowrank_nccl_status"

// NCCLStatusSize is the size of that block.
const NCCLStatusSize = int(unsafe.Sizeof(rawNCCLStatus{}))

// ErrNCCLStatus reports bytes that are not the library's NCCL status
// (wrong magic, version or size).
var ErrNCCLStatus = errors.New("nccl status block: not recognised")

// NCCLStatus is a decoded slowrank_nccl_status. The library writes each
// field with one aligned store; a reader from another process may see
// counters of slightly different instants, never torn values.
type NCCLStatus struct {
	// APIVersion is the profiler API NCCL bound (4, 5); 0: NCCL never
	// loaded the library as its profiler plugin.
	APIVersion uint32
	Mask       uint32 // activation mask last stored into NCCL
	LiveComms  uint32
	Disabled   bool // SLOWRANK_NCCL_DISABLE: init refused, NCCL runs without this plugin
	Inits      uint64
	Colls      uint64 // NCCL_COLL records queued
	// Dropped: ring full, bad handles and incomplete operations.
	Dropped     uint64
	FirstInitNs uint64 // CLOCK_MONOTONIC of NCCL's first init
}

// Bound reports whether NCCL bound the library as its profiler plugin.
func (s NCCLStatus) Bound() bool { return s.APIVersion != 0 && !s.Disabled }

// ParseNCCLStatus decodes the block from b (at least NCCLStatusSize bytes,
// read from another process: nothing in it is trusted beyond its checks).
func ParseNCCLStatus(b []byte) (NCCLStatus, error) {
	var r rawNCCLStatus
	if len(b) < NCCLStatusSize {
		return NCCLStatus{}, fmt.Errorf("%w: %d bytes", ErrNCCLStatus, len(b))
	}
	if m := u32(b, unsafe.Offsetof(r.Magic)); m != NCCLStatusMagic {
		return NCCLStatus{}, fmt.Errorf("%w: magic %#x", ErrNCCLStatus, m)
	}
	if v := u16(b, unsafe.Offsetof(r.Version)); v != NCCLStatusVer {
		return NCCLStatus{}, fmt.Errorf("%w: version %d", ErrNCCLStatus, v)
	}
	if s := int(u16(b, unsafe.Offsetof(r.Size))); s != NCCLStatusSize {
		return NCCLStatus{}, fmt.Errorf("%w: size %d", ErrNCCLStatus, s)
	}
	return NCCLStatus{
		APIVersion:  u32(b, unsafe.Offsetof(r.Api_version)),
		Mask:        u32(b, unsafe.Offsetof(r.Mask)),
		LiveComms:   u32(b, unsafe.Offsetof(r.Live_comms)),
		Disabled:    u32(b, unsafe.Offsetof(r.Disabled)) != 0,
		Inits:       u64(b, unsafe.Offsetof(r.Inits)),
		Colls:       u64(b, unsafe.Offsetof(r.Colls)),
		Dropped:     u64(b, unsafe.Offsetof(r.Dropped)),
		FirstInitNs: u64(b, unsafe.Offsetof(r.First_init_ns)),
	}, nil
}

// ReadNCCLStatus reads and decodes the block at addr, typically from
// /proc/PID/mem: one bounded read of NCCLStatusSize bytes.
func ReadNCCLStatus(r io.ReaderAt, addr int64) (NCCLStatus, error) {
	b := make([]byte, NCCLStatusSize)
	if _, err := r.ReadAt(b, addr); err != nil {
		return NCCLStatus{}, fmt.Errorf("read nccl status at %#x: %w", addr, err)
	}
	return ParseNCCLStatus(b)
}

// encodeNCCLStatus is the library's image of s (tests, fuzz seeds).
func encodeNCCLStatus(s NCCLStatus) []byte {
	var r rawNCCLStatus
	b := make([]byte, NCCLStatusSize)
	le.PutUint32(b[unsafe.Offsetof(r.Magic):], NCCLStatusMagic)
	le.PutUint16(b[unsafe.Offsetof(r.Version):], NCCLStatusVer)
	le.PutUint16(b[unsafe.Offsetof(r.Size):], uint16(NCCLStatusSize))
	le.PutUint32(b[unsafe.Offsetof(r.Api_version):], s.APIVersion)
	le.PutUint32(b[unsafe.Offsetof(r.Mask):], s.Mask)
	le.PutUint32(b[unsafe.Offsetof(r.Live_comms):], s.LiveComms)
	if s.Disabled {
		le.PutUint32(b[unsafe.Offsetof(r.Disabled):], 1)
	}
	le.PutUint64(b[unsafe.Offsetof(r.Inits):], s.Inits)
	le.PutUint64(b[unsafe.Offsetof(r.Colls):], s.Colls)
	le.PutUint64(b[unsafe.Offsetof(r.Dropped):], s.Dropped)
	le.PutUint64(b[unsafe.Offsetof(r.First_init_ns):], s.FirstInitNs)
	return b
}
