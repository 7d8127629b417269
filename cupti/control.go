package cupti

import (
	"errors"
	"fmt"
	"io"
	"time"
	"unsafe"
)

// ControlSize is the size of the library's control block.
const ControlSize = int(unsafe.Sizeof(rawControl{}))

// ErrControl reports a control block that is not the library's (wrong
// magic, version or size): the agent must not write to it.
var ErrControl = errors.New("cupti control block: not recognised")

// Duty is the part of the control block the agent writes: when the library
// collects while the agent is attached.
type Duty struct {
	Mode DutyMode
	// On and Period drive DutyTime: collect for On of every Period, phase
	// from CLOCK_MONOTONIC + PhaseOffset (give every rank of a job the same
	// phase to sample the same steps). Millisecond resolution.
	On, Period  time.Duration
	PhaseOffset time.Duration
	// KSteps and NSteps drive DutySteps: collect while step % NSteps < KSteps,
	// the agent writing the step with WriteStep.
	KSteps, NSteps uint32
	// EscalateUntilNs (CLOCK_MONOTONIC) makes the library collect until then
	// whatever the mode (suspicious window: detailed evidence for a while).
	EscalateUntilNs uint64
	// NameResend: changing it makes the library re-send every name (after
	// the agent lost batches, say).
	NameResend uint32
	// NCCLPlugin: the agent takes the NCCL profiler plugin's records, so the
	// library may turn NCCL's activation mask on (without it NCCL calls the
	// plugin for nothing).
	NCCLPlugin bool
	// NCCLNoKernelChannels: the plugin's kernel-channel events stay off in
	// on-phases too (the agent measures their cost apart, or found it too
	// high).
	NCCLNoKernelChannels bool
}

// agentFlagNCCLPlugin and agentFlagNCCLNoKernelCh are
// SLOWRANK_AGENT_F_NCCL_PLUGIN and _NO_KERNELCH (agent_flags).
const (
	agentFlagNCCLPlugin     = 1
	agentFlagNCCLNoKernelCh = 2
)

// DefaultDuty is what the library does when no agent ever wrote its block:
// 200 ms of every 20 s.
var DefaultDuty = Duty{Mode: DutyTime, On: defaultDutyOnMs * time.Millisecond, Period: defaultDutyPeriodMs * time.Millisecond}

// Status is the part of the control block the library writes.
type Status struct {
	State             State
	Flags             StatusFlags
	AppliedGeneration uint32
	LastError         int32 // last CUptiResult that was not CUPTI_SUCCESS
	OnTotal           time.Duration
	Enables           uint64
	Batches           uint64
	Records           uint64
	CUPTIDropped      uint64
	LibDropped        uint64
	HeartbeatNs       uint64 // CLOCK_MONOTONIC of the control thread's last poll (every <= 50 ms; <= 200 ms while waiting undecided for the first yield decision)
	CUPTIVersion      uint32 // cuptiGetVersion of the loaded libcupti
	// CtlTID is the library's control thread: CUPTI calls from it are the
	// library's own, calls from any other thread another client's.
	CtlTID          uint32
	Yields          uint32        // times the library yielded to another CUPTI client
	YieldedTotal    time.Duration // time spent yielded
	BuffersOrphaned uint64        // buffers CUPTI never handed back (another client, cuptiFinalize)
	// HandbackAddr is the address of the library's handback block in the
	// process (ReadHandback, WriteHandback); 0 for libraries before it.
	HandbackAddr uint64
}

// Yield is the agent's decision about other CUPTI clients in the process
// (see Yield in slowrank_abi.h).
type Yield struct {
	// Gen advances with every decision; the library waits for it to move
	// after each attach before it uses CUPTI.
	Gen uint32
	// Active: another client is active, the library makes no CUPTI call.
	Active bool
	// ForeignSinceNs is the CLOCK_MONOTONIC time of the other client's
	// first call (kinds the library disabled after it are enabled again).
	ForeignSinceNs uint64
}

// ControlBlock is a decoded slowrank_cupti_control.
type ControlBlock struct {
	Generation uint32
	Duty       Duty
	Step       uint64
	Status     Status
	Yield      Yield
}

// ParseControl decodes a control block read from the process.
func ParseControl(b []byte) (ControlBlock, error) {
	var c ControlBlock
	var r rawControl
	if len(b) < ControlSize {
		return c, fmt.Errorf("%w: %d bytes", ErrControl, len(b))
	}
	if m := u32(b, unsafe.Offsetof(r.Magic)); m != ControlMagic {
		return c, fmt.Errorf("%w: magic %#x", ErrControl, m)
	}
	if v := u16(b, unsafe.Offsetof(r.Version)); v != ControlVer {
		return c, fmt.Errorf("%w: version %d", ErrControl, v)
	}
	if s := int(u16(b, unsafe.Offsetof(r.Size))); s != ControlSize {
		return c, fmt.Errorf("%w: size %d", ErrControl, s)
	}
	ms := func(off uintptr) time.Duration { return time.Duration(u32(b, off)) * time.Millisecond }
	c.Generation = u32(b, unsafe.Offsetof(r.Generation))
	c.Duty = Duty{
		Mode:                 DutyMode(u32(b, unsafe.Offsetof(r.Mode))),
		On:                   ms(unsafe.Offsetof(r.On_ms)),
		Period:               ms(unsafe.Offsetof(r.Period_ms)),
		KSteps:               u32(b, unsafe.Offsetof(r.K_steps)),
		NSteps:               u32(b, unsafe.Offsetof(r.N_steps)),
		PhaseOffset:          time.Duration(int64(u64(b, unsafe.Offsetof(r.Phase_offset_ns)))),
		EscalateUntilNs:      u64(b, unsafe.Offsetof(r.Escalate_until_ns)),
		NameResend:           u32(b, unsafe.Offsetof(r.Name_resend)),
		NCCLPlugin:           u32(b, unsafe.Offsetof(r.Agent_flags))&agentFlagNCCLPlugin != 0,
		NCCLNoKernelChannels: u32(b, unsafe.Offsetof(r.Agent_flags))&agentFlagNCCLNoKernelCh != 0,
	}
	c.Step = u64(b, unsafe.Offsetof(r.Step))
	c.Status = Status{
		State:             State(u32(b, unsafe.Offsetof(r.State))),
		Flags:             StatusFlags(u32(b, unsafe.Offsetof(r.Status_flags))),
		AppliedGeneration: u32(b, unsafe.Offsetof(r.Applied_generation)),
		LastError:         int32(u32(b, unsafe.Offsetof(r.Last_error))),
		OnTotal:           time.Duration(u64(b, unsafe.Offsetof(r.On_ns_total))),
		Enables:           u64(b, unsafe.Offsetof(r.Enables)),
		Batches:           u64(b, unsafe.Offsetof(r.Batches)),
		Records:           u64(b, unsafe.Offsetof(r.Records)),
		CUPTIDropped:      u64(b, unsafe.Offsetof(r.Cupti_dropped)),
		LibDropped:        u64(b, unsafe.Offsetof(r.Lib_dropped)),
		HeartbeatNs:       u64(b, unsafe.Offsetof(r.Heartbeat_ns)),
		CUPTIVersion:      u32(b, unsafe.Offsetof(r.Cupti_version)),
		CtlTID:            u32(b, unsafe.Offsetof(r.Ctl_tid)),
		Yields:            u32(b, unsafe.Offsetof(r.Yields)),
		YieldedTotal:      time.Duration(u64(b, unsafe.Offsetof(r.Yielded_ns_total))),
		BuffersOrphaned:   u64(b, unsafe.Offsetof(r.Buffers_orphaned)),
		HandbackAddr:      u64(b, unsafe.Offsetof(r.Handback_addr)),
	}
	c.Yield = Yield{
		Gen:            u32(b, unsafe.Offsetof(r.Cupti_gen)),
		Active:         u32(b, unsafe.Offsetof(r.Yield)) != 0,
		ForeignSinceNs: u64(b, unsafe.Offsetof(r.Foreign_since_ns)),
	}
	return c, nil
}

// ReadControl reads and decodes the control block at addr, typically from
// /proc/PID/mem.
func ReadControl(r io.ReaderAt, addr int64) (ControlBlock, error) {
	b := make([]byte, ControlSize)
	if _, err := r.ReadAt(b, addr); err != nil {
		return ControlBlock{}, fmt.Errorf("read control block at %#x: %w", addr, err)
	}
	return ParseControl(b)
}

// encodeDuty returns the bytes from `mode` to `agent_flags`.
func encodeDuty(d Duty) []byte {
	var r rawControl
	start := unsafe.Offsetof(r.Mode)
	b := make([]byte, unsafe.Offsetof(r.Step)-start)
	put32 := func(off uintptr, v uint32) { le.PutUint32(b[off-start:], v) }
	ms := func(d time.Duration) uint32 {
		if d <= 0 {
			return 0
		}
		v := d.Milliseconds()
		if v > int64(^uint32(0)) {
			v = int64(^uint32(0))
		}
		return uint32(v)
	}
	put32(unsafe.Offsetof(r.Mode), uint32(d.Mode))
	put32(unsafe.Offsetof(r.On_ms), ms(d.On))
	put32(unsafe.Offsetof(r.Period_ms), ms(d.Period))
	put32(unsafe.Offsetof(r.K_steps), d.KSteps)
	put32(unsafe.Offsetof(r.N_steps), d.NSteps)
	le.PutUint64(b[unsafe.Offsetof(r.Phase_offset_ns)-start:], uint64(d.PhaseOffset.Nanoseconds()))
	le.PutUint64(b[unsafe.Offsetof(r.Escalate_until_ns)-start:], d.EscalateUntilNs)
	put32(unsafe.Offsetof(r.Name_resend), d.NameResend)
	var flags uint32
	if d.NCCLPlugin {
		flags |= agentFlagNCCLPlugin
	}
	if d.NCCLNoKernelChannels {
		flags |= agentFlagNCCLNoKernelCh
	}
	put32(unsafe.Offsetof(r.Agent_flags), flags)
	return b
}

// Mem is a process's memory as the agent reaches it: /proc/PID/mem, opened
// once per process image. Every write first reads the block it writes
// (magic, version, size, and the writer's seqlock value) through the same
// Mem: a write never lands where the block is not, or is not as the agent
// left it.
type Mem interface {
	io.ReaderAt
	io.WriterAt
}

// ErrBlockMoved reports a control or handback block whose agent-written
// generation (or seqlock) is not the one the agent last read or wrote:
// another writer, or a new block at the address. Nothing was written; read
// the block again before writing.
var ErrBlockMoved = errors.New("cupti block changed under the agent")

// checkControl reads the control block at addr and checks that its
// generation, rounded down to even, is gen's.
func checkControl(m io.ReaderAt, addr int64, gen uint32) (ControlBlock, error) {
	cb, err := ReadControl(m, addr)
	if err != nil {
		return cb, err
	}
	if cb.Generation&^1 != gen&^1 {
		return cb, fmt.Errorf("%w: generation %d, last written %d", ErrBlockMoved, cb.Generation, gen)
	}
	return cb, nil
}

// WriteDuty writes d into the control block at addr (through /proc/PID/mem)
// with the library's seqlock protocol: generation+1 (odd), the fields,
// generation+2. gen is the generation the caller last read or wrote (even);
// the new generation is returned. The block is read first: a block that is
// not one (ErrControl) or whose generation is not gen (ErrBlockMoved) is not
// written. The library applies it within 50 ms and reports it in
// Status.AppliedGeneration. Only one writer per process.
func WriteDuty(m Mem, addr int64, gen uint32, d Duty) (uint32, error) {
	if _, err := checkControl(m, addr, gen); err != nil {
		return gen, err
	}
	var r rawControl
	gen &^= 1
	genAt := addr + int64(unsafe.Offsetof(r.Generation))
	var g [4]byte
	le.PutUint32(g[:], gen+1)
	if _, err := m.WriteAt(g[:], genAt); err != nil {
		return gen, fmt.Errorf("write control generation: %w", err)
	}
	if _, err := m.WriteAt(encodeDuty(d), addr+int64(unsafe.Offsetof(r.Mode))); err != nil {
		return gen + 1, fmt.Errorf("write control fields: %w", err)
	}
	le.PutUint32(g[:], gen+2)
	if _, err := m.WriteAt(g[:], genAt); err != nil {
		return gen + 1, fmt.Errorf("write control generation: %w", err)
	}
	return gen + 2, nil
}

// WriteStep publishes the current training step for DutySteps (one aligned
// 8-byte write, outside the seqlock), where a control block is (ErrControl).
func WriteStep(m Mem, addr int64, step uint64) error {
	if _, err := ReadControl(m, addr); err != nil {
		return err
	}
	var r rawControl
	var b [8]byte
	le.PutUint64(b[:], step)
	if _, err := m.WriteAt(b[:], addr+int64(unsafe.Offsetof(r.Step))); err != nil {
		return fmt.Errorf("write control step: %w", err)
	}
	return nil
}

// WriteYield publishes the agent's decision about other CUPTI clients:
// foreign_since_ns and yield first, then cupti_gen = y.Gen (the library
// acts on a moved generation; one aligned store each). The caller advances
// Gen past the value it last read or wrote. The block is read first: where
// no control block is (ErrControl), nothing is written.
func WriteYield(m Mem, addr int64, y Yield) error {
	if _, err := ReadControl(m, addr); err != nil {
		return err
	}
	var r rawControl
	var b8 [8]byte
	le.PutUint64(b8[:], y.ForeignSinceNs)
	if _, err := m.WriteAt(b8[:], addr+int64(unsafe.Offsetof(r.Foreign_since_ns))); err != nil {
		return fmt.Errorf("write control foreign_since_ns: %w", err)
	}
	var b4 [4]byte
	if y.Active {
		le.PutUint32(b4[:], 1)
	}
	if _, err := m.WriteAt(b4[:], addr+int64(unsafe.Offsetof(r.Yield))); err != nil {
		return fmt.Errorf("write control yield: %w", err)
	}
	le.PutUint32(b4[:], y.Gen)
	if _, err := m.WriteAt(b4[:], addr+int64(unsafe.Offsetof(r.Cupti_gen))); err != nil {
		return fmt.Errorf("write control cupti_gen: %w", err)
	}
	return nil
}
