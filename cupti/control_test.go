package cupti

import (
	"errors"
	"testing"
	"time"
	"unsafe"
)

// memFile is an io.ReaderAt/WriterAt over a byte slice that logs writes, as
// /proc/PID/mem would be written.
type memFile struct {
	b      []byte
	writes []int64
}

func (m *memFile) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || int(off)+len(p) > len(m.b) {
		return 0, errors.New("out of range")
	}
	return copy(p, m.b[off:]), nil
}

func (m *memFile) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || int(off)+len(p) > len(m.b) {
		return 0, errors.New("out of range")
	}
	m.writes = append(m.writes, off)
	return copy(m.b[off:], p), nil
}

// initialControl is the block as the library initialises it.
func initialControl(base int) *memFile {
	m := &memFile{b: make([]byte, base+ControlSize+64)}
	var r rawControl
	b := m.b[base:]
	le.PutUint32(b[unsafe.Offsetof(r.Magic):], ControlMagic)
	le.PutUint16(b[unsafe.Offsetof(r.Version):], ControlVer)
	le.PutUint16(b[unsafe.Offsetof(r.Size):], uint16(ControlSize))
	le.PutUint32(b[unsafe.Offsetof(r.Mode):], uint32(DutyTime))
	le.PutUint32(b[unsafe.Offsetof(r.On_ms):], defaultDutyOnMs)
	le.PutUint32(b[unsafe.Offsetof(r.Period_ms):], defaultDutyPeriodMs)
	le.PutUint32(b[unsafe.Offsetof(r.State):], uint32(StateIdle))
	le.PutUint64(b[unsafe.Offsetof(r.On_ns_total):], uint64(3*time.Second))
	return m
}

func TestControlRoundTrip(t *testing.T) {
	const base = 128
	m := initialControl(base)
	c, err := ReadControl(m, base)
	if err != nil {
		t.Fatal(err)
	}
	if c.Duty != DefaultDuty || c.Status.State != StateIdle || c.Status.OnTotal != 3*time.Second || c.Generation != 0 {
		t.Fatalf("initial %+v", c)
	}
	d := Duty{Mode: DutySteps, On: 150 * time.Millisecond, Period: 5 * time.Second, PhaseOffset: -7 * time.Millisecond,
		KSteps: 1, NSteps: 20, EscalateUntilNs: 123456789, NameResend: 3, NCCLPlugin: true, NCCLNoKernelChannels: true}
	gen, err := WriteDuty(m, base, c.Generation, d)
	if err != nil || gen != 2 {
		t.Fatalf("WriteDuty: %d %v", gen, err)
	}
	// The seqlock order: odd generation, fields, even generation.
	var r rawControl
	genOff := int64(base) + int64(unsafe.Offsetof(r.Generation))
	if len(m.writes) != 3 || m.writes[0] != genOff || m.writes[1] != int64(base)+int64(unsafe.Offsetof(r.Mode)) || m.writes[2] != genOff {
		t.Fatalf("writes %v", m.writes)
	}
	if err := WriteStep(m, base, 41); err != nil {
		t.Fatal(err)
	}
	c, err = ReadControl(m, base)
	if err != nil {
		t.Fatal(err)
	}
	if c.Duty != d || c.Generation != 2 || c.Step != 41 || c.Status.State != StateIdle {
		t.Fatalf("after write %+v", c)
	}
	// The library's fields were not touched.
	if c.Status.OnTotal != 3*time.Second {
		t.Errorf("status clobbered: %+v", c.Status)
	}
	gen, _ = WriteDuty(m, base, gen+1, DefaultDuty) // an odd gen is rounded down
	if gen != 4 {
		t.Errorf("gen %d", gen)
	}
}

func TestControlRejectsForeignMemory(t *testing.T) {
	m := initialControl(0)
	for name, patch := range map[string]func([]byte){
		"magic":   func(b []byte) { b[0] ^= 0xff },
		"version": func(b []byte) { b[4] = 9 },
		"size":    func(b []byte) { b[6] = 1 },
	} {
		b := append([]byte{}, m.b...)
		patch(b)
		if _, err := ParseControl(b); !errors.Is(err, ErrControl) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := ParseControl(m.b[:ControlSize-1]); !errors.Is(err, ErrControl) {
		t.Errorf("short: %v", err)
	}
	if _, err := ReadControl(m, int64(len(m.b))); err == nil {
		t.Error("read past the end")
	}
}

// Every write reads the block first, through the same memory: where the
// block is not the library's, or its generation is not the one the agent
// last wrote, nothing is written.
func TestWritesRefusedWhereTheBlockIsNot(t *testing.T) {
	var r rawControl
	for _, tc := range []struct {
		name  string
		patch func(b []byte)
		want  error
	}{
		{"magic", func(b []byte) { b[0] ^= 0xff }, ErrControl},
		{"version", func(b []byte) { b[4] = 9 }, ErrControl},
		{"generation moved", func(b []byte) { le.PutUint32(b[unsafe.Offsetof(r.Generation):], 6) }, ErrBlockMoved},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := initialControl(0)
			tc.patch(m.b)
			if _, err := WriteDuty(m, 0, 0, DefaultDuty); !errors.Is(err, tc.want) {
				t.Errorf("WriteDuty: %v, want %v", err, tc.want)
			}
			if errors.Is(tc.want, ErrControl) {
				if err := WriteYield(m, 0, Yield{Gen: 1, Active: true}); !errors.Is(err, ErrControl) {
					t.Errorf("WriteYield: %v", err)
				}
				if err := WriteStep(m, 0, 1); !errors.Is(err, ErrControl) {
					t.Errorf("WriteStep: %v", err)
				}
			}
			if len(m.writes) != 0 {
				t.Errorf("%d writes, want 0", len(m.writes))
			}
		})
	}
}
