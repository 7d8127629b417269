package cupti

import (
	"fmt"
	"unsafe"
)

// EncodeBatch lays out b in the library's batch format, for tests and fake
// libraries: names, kernels, copies, transitions, then stats (name
// definitions thus precede their uses), NCCL records. Header.Count, Header.Len and
// Header.Version are computed; Skipped is ignored.
func EncodeBatch(b *Batch) ([]byte, error) {
	for _, n := range b.Names {
		if len(n.Name) > NameMax {
			return nil, fmt.Errorf("encode name %d: %d bytes > %d", n.ID, len(n.Name), NameMax)
		}
		if n.ID == 0 {
			return nil, fmt.Errorf("encode name %q: id 0", n.Name)
		}
	}
	size := encodedSize(b)
	if size > BatchMax {
		return nil, fmt.Errorf("encode batch: %d bytes > %d", size, BatchMax)
	}
	out := make([]byte, size)
	count := len(b.Kernels) + len(b.Copies) + len(b.Names) + len(b.Transitions) + len(b.Stats) +
		len(b.NCCLComms) + len(b.NCCLColls) + len(b.NCCLKernels)

	var h rawBatchHeader
	le.PutUint32(out[unsafe.Offsetof(h.Magic):], BatchMagic)
	le.PutUint16(out[unsafe.Offsetof(h.Version):], ABIVersion)
	le.PutUint16(out[unsafe.Offsetof(h.Flags):], b.Header.Flags)
	le.PutUint32(out[unsafe.Offsetof(h.Pid):], b.Header.PID)
	le.PutUint32(out[unsafe.Offsetof(h.Count):], uint32(count))
	le.PutUint64(out[unsafe.Offsetof(h.Seq):], b.Header.Seq)
	le.PutUint64(out[unsafe.Offsetof(h.Cupti_dropped):], b.Header.CUPTIDropped)
	le.PutUint64(out[unsafe.Offsetof(h.Lib_dropped):], b.Header.LibDropped)
	le.PutUint32(out[unsafe.Offsetof(h.Total_len):], uint32(size))
	le.PutUint16(out[unsafe.Offsetof(h.Header_size):], uint16(hdrSize))
	le.PutUint16(out[unsafe.Offsetof(h.Clock_source):], uint16(b.Header.Clock))
	le.PutUint64(out[unsafe.Offsetof(h.Clock_offset_ns):], uint64(b.Header.ClockOffsetNs))
	le.PutUint32(out[unsafe.Offsetof(h.Clock_bracket_ns):], b.Header.ClockBracketNs)
	le.PutUint32(out[unsafe.Offsetof(h.Generation):], b.Header.Generation)

	off := hdrSize
	put := func(kind uint16, n int) []byte {
		r := out[off : off+n]
		le.PutUint16(r, kind)
		le.PutUint16(r[2:], uint16(n))
		off += n
		return r
	}
	for _, n := range b.Names {
		var rn rawName
		r := put(recName, roundUp(nameSize+len(n.Name)))
		le.PutUint16(r[unsafe.Offsetof(rn.Len):], uint16(len(n.Name)))
		r[unsafe.Offsetof(rn.Kclass)] = byte(n.Class)
		if n.Truncated {
			r[unsafe.Offsetof(rn.Flags)] = nameFlagTruncated
		}
		le.PutUint32(r[unsafe.Offsetof(rn.Name_id):], n.ID)
		le.PutUint32(r[unsafe.Offsetof(rn.Full_len):], n.FullLen)
		copy(r[nameSize:], n.Name)
	}
	for _, k := range b.Kernels {
		var rk rawKernel
		r := put(recKernel, kernelSize)
		r[unsafe.Offsetof(rk.Kclass)] = byte(k.Class)
		if k.Serial {
			r[unsafe.Offsetof(rk.Flags)] = kernelFlagSerial
		}
		le.PutUint64(r[unsafe.Offsetof(rk.Start_ns):], k.StartNs)
		le.PutUint64(r[unsafe.Offsetof(rk.End_ns):], k.EndNs)
		le.PutUint32(r[unsafe.Offsetof(rk.Device):], k.Device)
		le.PutUint32(r[unsafe.Offsetof(rk.Context):], k.Context)
		le.PutUint32(r[unsafe.Offsetof(rk.Stream):], k.Stream)
		le.PutUint32(r[unsafe.Offsetof(rk.Correlation):], k.Correlation)
		le.PutUint32(r[unsafe.Offsetof(rk.Grid_x):], uint32(k.Grid[0]))
		le.PutUint32(r[unsafe.Offsetof(rk.Grid_y):], uint32(k.Grid[1]))
		le.PutUint32(r[unsafe.Offsetof(rk.Grid_z):], uint32(k.Grid[2]))
		le.PutUint32(r[unsafe.Offsetof(rk.Block_x):], uint32(k.Block[0]))
		le.PutUint32(r[unsafe.Offsetof(rk.Block_y):], uint32(k.Block[1]))
		le.PutUint32(r[unsafe.Offsetof(rk.Block_z):], uint32(k.Block[2]))
		le.PutUint32(r[unsafe.Offsetof(rk.Name_id):], k.NameID)
	}
	for _, c := range b.Copies {
		var rc rawCopy
		kind := uint16(recMemcpy)
		if c.Memset {
			kind = recMemset
		}
		r := put(kind, copySize)
		r[unsafe.Offsetof(rc.Copy_kind)] = c.CopyKind
		r[unsafe.Offsetof(rc.Src_kind)] = c.SrcKind
		r[unsafe.Offsetof(rc.Dst_kind)] = c.DstKind
		r[unsafe.Offsetof(rc.Flags)] = c.Flags
		le.PutUint64(r[unsafe.Offsetof(rc.Start_ns):], c.StartNs)
		le.PutUint64(r[unsafe.Offsetof(rc.End_ns):], c.EndNs)
		le.PutUint64(r[unsafe.Offsetof(rc.Bytes):], c.Bytes)
		le.PutUint32(r[unsafe.Offsetof(rc.Device):], c.Device)
		le.PutUint32(r[unsafe.Offsetof(rc.Context):], c.Context)
		le.PutUint32(r[unsafe.Offsetof(rc.Stream):], c.Stream)
		le.PutUint32(r[unsafe.Offsetof(rc.Correlation):], c.Correlation)
	}
	for _, t := range b.Transitions {
		var rt rawTransition
		r := put(recTransition, transitionSize)
		if t.On {
			r[unsafe.Offsetof(rt.On)] = 1
		}
		r[unsafe.Offsetof(rt.Reason)] = byte(t.Reason)
		le.PutUint16(r[unsafe.Offsetof(rt.Mode):], uint16(t.Mode))
		le.PutUint64(r[unsafe.Offsetof(rt.Timestamp):], t.TimestampNs)
	}
	for _, c := range b.NCCLComms {
		encodeNCCLComm(put(recNCCLComm, ncclCommSize), c)
	}
	for _, c := range b.NCCLColls {
		encodeNCCLColl(put(recNCCLColl, ncclCollSize), c)
	}
	for _, k := range b.NCCLKernels {
		encodeNCCLKernel(put(recNCCLKernel, ncclKernelSize), k)
	}
	for _, s := range b.Stats {
		var rs rawStats
		r := put(recStats, statsSize+8*int(NumStats))
		le.PutUint16(r[unsafe.Offsetof(rs.N):], uint16(NumStats))
		for i, v := range s.Counters {
			le.PutUint64(r[statsSize+8*i:], v)
		}
	}
	return out, nil
}

func roundUp(n int) int { return (n + RecordAlign - 1) &^ (RecordAlign - 1) }

// encodedSize is the size of b in the canonical layout EncodeBatch writes
// (every stats record with all NumStats counters). A batch decoded from a
// library that wrote shorter records can exceed BatchMax in it.
func encodedSize(b *Batch) int {
	size := hdrSize + len(b.Kernels)*kernelSize + len(b.Copies)*copySize +
		len(b.Transitions)*transitionSize + len(b.Stats)*(statsSize+8*int(NumStats)) +
		len(b.NCCLComms)*ncclCommSize + len(b.NCCLColls)*ncclCollSize + len(b.NCCLKernels)*ncclKernelSize
	for _, n := range b.Names {
		size += roundUp(nameSize + len(n.Name))
	}
	return size
}
