package correlate

import "testing"

// The fingerprint hashes kernel names, grid and block, in any order, and
// is comparable across processes whose name ids differ.
func TestFingerprint(t *testing.T) {
	names := map[uint32]map[uint32]string{
		pid(0): {1: "gemm", 2: "flash_fwd", 3: "layernorm"},
		pid(1): {7: "layernorm", 8: "gemm", 9: "flash_fwd"},
		pid(2): {1: "gemm", 2: "flash_fwd", 3: "layernorm"},
		pid(3): {1: "gemm", 2: "flash_fwd", 3: "layernorm"},
	}
	c := newTest(Config{KernelName: func(pid, id uint32) string { return names[pid][id] }}, 0, 1, 2, 3)
	var b batch
	pids := []uint32{pid(0), pid(1), pid(2), pid(3)}
	simulate(&b, pids, 1, repeat("AB S", 10), 0, 10*ms, nil)
	for i := range b.host {
		b.host[i].Comm = uint64(b.host[i].PID)
	}
	b.feed(c)
	k := func(p, id uint32, start int64, grid uint32) DeviceInterval {
		return DeviceInterval{PID: p, Kind: DeviceKernel, Class: ClassGEMM, NameID: id, StartNS: start, EndNS: start + ms,
			Grid: [3]uint32{grid, 1, 1}, Block: [3]uint32{128, 1, 1}, Corr: uint32(start / us)}
	}
	for _, p := range pids {
		c.AddCoverage(Coverage{PID: p, StartNS: 0})
	}
	for i := range 10 {
		base := int64(i) * 10 * ms
		c.AddDevice(k(pid(0), 1, base+1*ms, 64))
		c.AddDevice(k(pid(0), 2, base+2*ms, 64))
		c.AddDevice(k(pid(0), 3, base+3*ms, 64))
		c.AddDevice(k(pid(1), 9, base+1*ms, 64)) // same multiset, other ids and order
		c.AddDevice(k(pid(1), 7, base+2*ms, 64))
		c.AddDevice(k(pid(1), 8, base+3*ms, 64))
		c.AddDevice(k(pid(2), 1, base+1*ms, 64))
		c.AddDevice(k(pid(2), 2, base+2*ms, 64))
		c.AddDevice(k(pid(2), 3, base+3*ms, 65)) // other grid
		c.AddDevice(k(pid(3), 1, base+1*ms, 64))
		c.AddDevice(k(pid(3), 2, base+2*ms, 64))
		c.AddDevice(k(pid(3), 3, base+3*ms, 64))
		c.AddDevice(k(pid(3), 3, base+4*ms, 64)) // one more
	}
	steps, _ := c.Flush()
	m := byRank(steps)
	fp := func(r int) string {
		if len(m[r]) == 0 || m[r][0].Workload == nil {
			t.Fatalf("rank %d has no fingerprint", r)
		}
		for _, s := range m[r] {
			if s.Workload.FP != m[r][0].Workload.FP {
				t.Fatalf("rank %d fingerprint varies", r)
			}
		}
		return m[r][0].Workload.FP
	}
	if fp(0) != fp(1) {
		t.Errorf("same kernels, different fingerprints: %s %s", fp(0), fp(1))
	}
	if fp(0) == fp(2) || fp(0) == fp(3) || fp(2) == fp(3) {
		t.Errorf("different kernels, equal fingerprints: %s %s %s", fp(0), fp(2), fp(3))
	}
	if len(fp(0)) != 16 {
		t.Errorf("fingerprint %q", fp(0))
	}
}

// Without kernel names there is no fingerprint (ids are per process).
func TestFingerprintNeedsNames(t *testing.T) {
	c := newTest(Config{}, 0)
	c.AddCoverage(Coverage{PID: pid(0), StartNS: 0})
	var b batch
	simulate(&b, []uint32{pid(0)}, 1, repeat("AB S", 10), 0, 10*ms, nil)
	b.feed(c)
	for i := range 10 {
		c.AddDevice(DeviceInterval{PID: pid(0), Class: ClassGEMM, NameID: 4, StartNS: int64(i)*10*ms + ms, EndNS: int64(i)*10*ms + 2*ms, Corr: uint32(i)})
	}
	steps, _ := c.Flush()
	for _, s := range steps {
		if s.Workload != nil || !s.GPU || !near(s.Phases["compute"], 1) {
			t.Fatalf("step %+v", s)
		}
	}
}
