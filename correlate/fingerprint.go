package correlate

import "fmt"

// Workload fingerprint: an FNV-1a based 64-bit hash of the multiset of a
// step's compute kernels (name, grid, block). Each kernel's hash
// (kernelHash) is mixed and summed, so that the order of the kernels does
// not matter and equal multisets give equal strings on every rank; names
// are hashed, never per-process name ids.

// fingerprint sums the kernel hashes of one step.
type fingerprint struct {
	sum, sum2 uint64
	kernels   int
	unnamed   bool // a kernel without a name: no fingerprint
}

// add adds a kernel by its kernelHash (0: its name is unknown).
func (f *fingerprint) add(h uint64) {
	f.kernels++
	if h == 0 {
		f.unnamed = true
	}
	f.sum += h
	f.sum2 += mix64(h ^ 0x5bd1e9955bd1e995)
}

// hex is the fingerprint as 16 hex digits, "" without kernels or with an
// unnamed one.
func (f *fingerprint) hex() string {
	if f.kernels == 0 || f.unnamed {
		return ""
	}
	h := uint64(fnvOffset)
	for _, v := range [3]uint64{f.sum, f.sum2, uint64(f.kernels)} {
		for b := 0; b < 8; b++ {
			h ^= (v >> (8 * b)) & 0xff
			h *= fnvPrime
		}
	}
	return fmt.Sprintf("%016x", h)
}

// 64-bit FNV-1a.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// fnvString is the FNV-1a hash of s.
func fnvString(s string) uint64 {
	h := uint64(fnvOffset)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime
	}
	return h
}

// mix64 is the splitmix64 finaliser: every bit of x affects every bit of
// the result.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// kernelHash is the fingerprint contribution of one compute kernel: its
// name, grid and block. Zero when the name is unknown.
func (c *Correlator) kernelHash(p *proc, d *DeviceInterval) uint64 {
	var nh uint64
	if h, ok := p.names[d.NameID]; ok && d.NameID != 0 {
		nh = h
	} else {
		name := d.Name
		if name == "" && c.cfg.KernelName != nil {
			name = c.cfg.KernelName(d.PID, d.NameID)
		}
		if name == "" {
			return 0
		}
		nh = fnvString(name)
		if d.NameID != 0 {
			if p.names == nil || len(p.names) >= 1<<16 {
				p.names = make(map[uint32]uint64)
			}
			p.names[d.NameID] = nh
		}
	}
	h := nh
	for _, v := range d.Grid {
		h = (h ^ uint64(v)) * fnvPrime
	}
	for _, v := range d.Block {
		h = (h ^ uint64(v)) * fnvPrime
	}
	if h = mix64(h); h == 0 {
		h = 1
	}
	return h
}
