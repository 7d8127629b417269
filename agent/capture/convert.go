package capture

import (
	"math"
	"slices"
	"sync"
	"time"

	"github.com/slowrank/slowrank/agent/pipeline"
	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/correlate"
	"github.com/slowrank/slowrank/cupti"
)

// Bounds on what training processes can make the agent hold. Everything a
// traced process sends is bounded: a batch by cupti.BatchMax (decoded without
// unbounded allocation), a kernel name by cupti.NameMax, the records per
// process by correlate.Config.MaxHostRecords/MaxDeviceRecords, the queue
// between reader and pipeline by the agent's Config.InputQueue, and the interned kernel
// names by the limits below (per process and in total; refused definitions
// are counted in names_refused and resolve to "kernel#<id>").
const (
	// MaxInternedProcesses bounds the processes whose kernel names are kept.
	MaxInternedProcesses = 1024
	// MaxNamesPerProcess bounds the kernel names kept per process.
	MaxNamesPerProcess = 1 << 14
	// MaxInternedNames bounds the kernel names kept in total (at most
	// cupti.NameMax bytes each: about 40 MiB in the worst case).
	MaxInternedNames = 1 << 16
)

// Config configures a Converter.
type Config struct {
	// Count adds n to the agent's counter name: every record dropped,
	// refused or superseded is counted through it, none silently. It is
	// called from the converting goroutine and must be safe for that.
	Count func(name string, n int64)
	// NCCLPlugin takes a process's NCCL collectives from the injection
	// library's profiler-plugin records once it has them (the agent's
	// Config.NCCLPlugin); off, those records are counted and ignored.
	NCCLPlugin bool
	// Marker is the synchronisation probe whose every return also ends a
	// step (the agent's Config.StepMarker), 0 for none.
	Marker bpf.ProbeID
	// TIDs translates the plugin records' thread ids into the uprobes'
	// (nil: taken as they come); the agent shares it with its control of
	// the injection library.
	TIDs *TIDMap
}

// Converter turns decoded ring-buffer events into correlate inputs and
// keeps the per-process state that needs (interned kernel names, open
// collection periods, batch sequence numbers to detect lost batches, the
// NCCL capture path). Convert runs on one goroutine (the agent's ring-buffer
// reader); Forget, PluginReady, NCCLPaths, NameStats and LatencyQuantiles
// may be called from another (the agent's main goroutine): the state they
// share is under mu.
type Converter struct {
	mu    sync.Mutex
	names *cupti.Interner
	procs map[uint32]*convProc
	count func(name string, n int64)
	// refused counts name definitions dropped by MaxInternedNames.
	refused int64
	// latencies of recent batches (ns), a ring of latencyRing.
	latencies []int64
	latIdx    int
	// marker is the probe whose calls cut steps (Config.Marker), 0: none.
	marker bpf.ProbeID
	// ncclPlugin: profiler-plugin records replace the libnccl uprobes
	// (Config.NCCLPlugin); off, they are counted and ignored.
	ncclPlugin bool
	// tids translates the plugin records' thread ids (the process's PID
	// namespace's) into the uprobes' (the host's); nil: as they come.
	tids *TIDMap
}

type convProc struct {
	openSince int64                  // start of the open collection period, 0 if none
	lastSeq   uint64                 // last batch sequence number seen
	lastDrop  uint64                 // cumulative CUPTI + library drops reported so far
	libStats  [cupti.NumStats]uint64 // the injection library's last counters (cumulative)
	// sawNCCL: the process calls NCCL directly; its torch c10d collectives
	// are then redundant for step detection (and carry no sizes).
	sawNCCL bool
	// sawTorchColl: the process has issued a torch c10d collective (a
	// ProcessGroup method we probe); only then is its Future::wait a
	// collective wait.
	sawTorchColl bool
	// nccl is the process's NCCL capture path (convert_nccl.go).
	nccl ncclCapture
	// lastBroadcast is per thread the latest ncclBroadcast the uprobes
	// reported (nestedBcast).
	lastBroadcast map[uint32]callSpan
}

type callSpan struct{ start, end uint64 }

// New returns a Converter.
func New(cfg Config) *Converter {
	return &Converter{
		names: cupti.NewInternerWithLimits(MaxInternedProcesses, MaxNamesPerProcess),
		procs: map[uint32]*convProc{}, count: cfg.Count, ncclPlugin: cfg.NCCLPlugin,
		marker: cfg.Marker, tids: cfg.TIDs,
	}
}

func (c *Converter) proc(pid uint32) *convProc {
	p := c.procs[pid]
	if p == nil {
		p = &convProc{}
		c.procs[pid] = p
	}
	return p
}

// NameStats returns the interner's counts of kernel names, Refused
// including the definitions dropped by MaxInternedNames.
func (c *Converter) NameStats() cupti.InternerStats {
	st := c.names.Stats()
	c.mu.Lock()
	defer c.mu.Unlock()
	st.Refused += uint64(c.refused)
	return st
}

// Forget drops a process's decoding state.
func (c *Converter) Forget(pid uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.procs, pid)
	c.names.Forget(pid)
	c.tids.forget(pid)
}

// Convert appends the correlate inputs of ev to out. What touches the
// per-process state (batches, and the NCCL, communicator-init and torch
// events that the capture paths and the torch gates follow) takes mu; the
// rest (synchronisations, CUPTI calls) is converted without it.
func (c *Converter) Convert(ev bpf.Event, out []pipeline.Input) []pipeline.Input {
	switch e := ev.(type) {
	case *bpf.CollEvent:
		if !c.ncclUprobeColl(e) {
			return out // the plugin reports this call (convert_nccl.go)
		}
		return append(out, pipeline.HostInput(correlate.HostCall{
			PID: e.PID, TID: e.TID, Kind: correlate.HostCollective, Op: probeOp(e.Probe),
			Count: e.Count, Datatype: e.Datatype, Comm: e.Comm, Stream: e.Stream,
			StartNS: int64(e.StartNs), EndNS: int64(e.EndNs),
		}))
	case *bpf.SyncEvent:
		h := correlate.HostCall{
			PID: e.PID, TID: e.TID, Kind: correlate.HostSyncWait, Op: probeOp(e.Probe),
			Stream: e.Handle, StartNS: int64(e.StartNs), EndNS: int64(e.EndNs),
		}
		out = append(out, pipeline.HostInput(h))
		if e.Probe == c.marker && c.marker != 0 {
			h.Kind = correlate.HostMarker
			out = append(out, pipeline.HostInput(h))
		}
		return out
	case *bpf.GroupEvent:
		kind := correlate.HostGroupStart
		if e.HasReturn {
			kind = correlate.HostGroupEnd
			c.ncclGroupEnd(e)
		}
		return append(out, pipeline.HostInput(correlate.HostCall{PID: e.PID, TID: e.TID, Kind: kind, StartNS: int64(e.StartNs), EndNS: int64(e.EndNs)}))
	case *bpf.CommInitEvent:
		if !e.CommValid || e.Ret != 0 && e.Ret != 7 { // 7: ncclInProgress (non-blocking)
			c.count("comm_init_failed", 1)
			return out
		}
		c.ncclUprobeInit(e)
		ci := correlate.CommInit{
			PID: e.PID, Comm: e.Comm, NRanks: int(e.NRanks), Rank: int(e.Rank),
			Color: int(e.Color), Key: int(e.Key), AtNS: int64(e.EndNs),
		}
		if e.IDValid {
			ci.UniqueIDHash = e.IDHash
		}
		if e.IsSplit {
			ci.Parent = e.Parent
		}
		return append(out, pipeline.OtherInput(ci))
	case *bpf.TorchEvent:
		return c.torch(e, out)
	case *bpf.CUPTICallEvent:
		return append(out, pipeline.OtherInput(CUPTICall{PID: e.PID, TID: e.TID, Fn: e.Probe, Arg: e.Arg, Arg2: e.Arg2, TimeNs: int64(e.StartNs)}))
	case *bpf.BatchEvent:
		return c.batch(e, out)
	}
	c.count("events_unknown", 1)
	return out
}

// torch converts a c10d call. Collectives are host enqueues (for NCCL and
// gloo alike); the host blocks for a collective in Work::wait or, under DDP,
// in c10::ivalue::Future::wait on the bucket futures: both are the
// coll_wait.
//
// Future::wait is generic: besides the futures of c10d work (DDP's reducer
// and comm hooks, work.get_future().wait()) it waits for RPC replies,
// torch.jit.fork tasks, distributed autograd and Python torch.futures. It is
// taken as a collective wait only in a process that has issued a torch c10d
// collective (a training process whose collectives we probe): there the
// futures waited on in a step are the collectives' in the common case, and
// a rank waiting for a slow peer is a victim in coll_wait instead of having
// the wait in its host phase (which hides the slow rank's host time or makes
// a victim look like a host straggler). (With NCCL the work's future is completed at enqueue:
// Future::wait only orders streams and returns at once.) The price, in such
// a process: a thread blocked on a non-collective future (a jit.fork join,
// an RPC, a future completed by a Python prefetch thread) is counted as
// coll_wait, not host, so a rank slowed inside such work looks like it is
// waiting rather than slow in host. The gate is per process, not per
// thread: DDP waits on the thread that completes the backward pass (an
// autograd device thread under CUDA), which need not be the one that issued
// the all-reduce. Waits of a process with no torch collective yet are
// counted (torch_future_waits_ignored) and dropped.
func (c *Converter) torch(e *bpf.TorchEvent, out []pipeline.Input) []pipeline.Input {
	h := correlate.HostCall{PID: e.PID, TID: e.TID, StartNS: int64(e.StartNs), EndNS: int64(e.EndNs), Comm: e.Self}
	switch e.Probe.Class() {
	case bpf.ClassTorchWorkWait:
		h.Kind, h.Comm = correlate.HostCollWait, 0
	case bpf.ClassTorchFutureWait:
		c.mu.Lock()
		coll := c.proc(e.PID).sawTorchColl
		c.mu.Unlock()
		if !coll {
			c.count("torch_future_waits_ignored", 1)
			return out
		}
		h.Kind, h.Comm = correlate.HostCollWait, 0
	case bpf.ClassTorchCollective:
		c.mu.Lock()
		p := c.proc(e.PID)
		p.sawTorchColl = true
		sawNCCL := p.sawNCCL
		c.mu.Unlock()
		if sawNCCL {
			c.count("torch_collectives_redundant", 1)
			return out
		}
		h.Kind, h.Op = correlate.HostCollective, probeOp(e.Probe)
	default: // unreachable: the decoder gives torch records to torch classes only
		c.count("events_unknown", 1)
		return out
	}
	return append(out, pipeline.HostInput(h))
}

// batch converts one CUPTI batch: kernels and copies into device intervals,
// collection transitions into coverage, lost batches and records into drops.
func (c *Converter) batch(e *bpf.BatchEvent, out []pipeline.Input) []pipeline.Input {
	b, err := cupti.DecodeBatch(e.Data)
	if err != nil {
		c.count("batches_malformed", 1)
		return out
	}
	c.count("batches", 1)
	pid := e.PID
	c.hostTIDs(pid, b.NCCLColls) // reads /proc: before the lock
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.proc(pid)
	c.deviceLatency(&b, int64(e.EndNs))
	if len(b.Names) > 0 {
		// The interner bounds names per process; bound them in total too,
		// so that many processes cannot add up to unbounded memory.
		if st := c.names.Stats(); st.Names+len(b.Names) > MaxInternedNames {
			c.refused += int64(len(b.Names))
			b.Names = nil
		}
	}
	c.names.Observe(pid, &b)
	if p.lastSeq != 0 && b.Header.Seq > p.lastSeq+1 && !b.Header.EpochStart() {
		gap := c.plausible(b.Header.Seq - p.lastSeq - 1)
		c.count("batches_lost", int64(gap))
		out = append(out, pipeline.OtherInput(correlate.Drop{PID: pid, Device: gap, FromNS: p.openSince, ToNS: int64(e.EndNs)}))
	}
	p.lastSeq = b.Header.Seq
	for _, st := range b.Stats {
		c.libStats(p, st)
	}
	drops := b.Header.CUPTIDropped + b.Header.LibDropped
	if drops < b.Header.CUPTIDropped {
		drops = ^uint64(0) // a sum that wraps is a lie: saturate
	}
	if drops > p.lastDrop {
		n := c.plausible(drops - p.lastDrop)
		c.count("device_records_dropped", int64(n))
		out = append(out, pipeline.OtherInput(correlate.Drop{PID: pid, Device: n, FromNS: p.openSince, ToNS: int64(e.EndNs)}))
		p.lastDrop = drops
	}
	emitted := int64(e.EndNs)
	implausible := 0
	for _, t := range b.Transitions {
		if !plausibleSpan(t.TimestampNs, t.TimestampNs, emitted) {
			implausible++
			continue
		}
		ts := int64(t.TimestampNs)
		switch {
		case t.On && p.openSince == 0:
			p.openSince = ts
			out = append(out, pipeline.OtherInput(correlate.Coverage{PID: pid, StartNS: ts}))
		case !t.On && p.openSince != 0:
			out = append(out, pipeline.OtherInput(correlate.Coverage{PID: pid, StartNS: p.openSince, EndNS: ts}))
			p.openSince = 0
		}
	}
	for _, k := range b.Kernels {
		if !plausibleSpan(k.StartNs, k.EndNs, emitted) {
			implausible++
			continue
		}
		out = append(out, pipeline.DeviceInput(correlate.DeviceInterval{
			PID: pid, Kind: correlate.DeviceKernel, Class: kernelClass(k.Class),
			StartNS: int64(k.StartNs), EndNS: int64(k.EndNs), Device: k.Device, Stream: k.Stream,
			NameID: k.NameID, Name: c.names.Name(pid, k.NameID),
			Grid:  [3]uint32{uint32(k.Grid[0]), uint32(k.Grid[1]), uint32(k.Grid[2])},
			Block: [3]uint32{uint32(k.Block[0]), uint32(k.Block[1]), uint32(k.Block[2])},
			Corr:  k.Correlation,
		}))
	}
	for _, cp := range b.Copies {
		if !plausibleSpan(cp.StartNs, cp.EndNs, emitted) {
			implausible++
			continue
		}
		kind := correlate.DeviceMemcpy
		if cp.Memset {
			kind = correlate.DeviceMemset
		}
		out = append(out, pipeline.DeviceInput(correlate.DeviceInterval{
			PID: pid, Kind: kind, Class: correlate.ClassCopy, StartNS: int64(cp.StartNs), EndNS: int64(cp.EndNs),
			Device: cp.Device, Stream: cp.Stream, Corr: cp.Correlation,
		}))
	}
	out = c.ncclRecords(pid, p, &b, emitted, out)
	c.count("device_records", int64(len(b.Kernels)+len(b.Copies)))
	if implausible > 0 {
		c.count("device_records_implausible", int64(implausible))
	}
	return out
}

// The times of device records are written by the training process (its
// injection library); the batch's emit time is the kernel's clock at the
// uprobe, which the process cannot set. A record is believed from
// maxRecordAge before its batch's emission (CUPTI hands over buffers
// seconds late) to maxRecordLead after it (clock mapping of another
// client's timestamps); outside, it is dropped and counted in
// device_records_implausible. So a process cannot push its job's
// timeline into the far future or past.
const (
	maxRecordAge  = int64(time.Hour)
	maxRecordLead = int64(time.Second)
)

func plausibleSpan(start, end uint64, emitted int64) bool {
	if start > end || end > math.MaxInt64 {
		return false
	}
	s, e := int64(start), int64(end)
	return e <= emitted+maxRecordLead && s >= emitted-maxRecordAge
}

// maxPlausibleLoss bounds the records or batches one batch header may claim
// lost (a billion: far more than a library can drop between two batches).
// Larger claims come from a buggy or hostile process; they are counted in
// batches_implausible and clamped, so counters never wrap.
const maxPlausibleLoss = 1 << 30

func (c *Converter) plausible(n uint64) uint64 {
	if n > maxPlausibleLoss {
		c.count("batches_implausible", 1)
		return maxPlausibleLoss
	}
	return n
}

// latencyRing is how many batch latencies the device latency quantiles use.
const latencyRing = 4096

// deviceLatency records how long after the newest kernel of a batch ended the
// batch reached the agent (emit time, CLOCK_MONOTONIC on both sides).
func (c *Converter) deviceLatency(b *cupti.Batch, emitted int64) {
	var newest uint64
	for _, k := range b.Kernels {
		newest = max(newest, k.EndNs)
	}
	if newest == 0 || int64(newest) > emitted {
		return
	}
	if c.latencies == nil {
		c.latencies = make([]int64, 0, latencyRing)
	}
	if len(c.latencies) < latencyRing {
		c.latencies = append(c.latencies, emitted-int64(newest))
	} else {
		c.latencies[c.latIdx] = emitted - int64(newest)
		c.latIdx = (c.latIdx + 1) % latencyRing
	}
}

// LatencyQuantiles returns the median and 99th percentile (ns) of recent
// device-record latencies, ok false without samples.
func (c *Converter) LatencyQuantiles() (p50, p99 int64, ok bool) {
	c.mu.Lock()
	s := slices.Clone(c.latencies)
	c.mu.Unlock()
	if len(s) == 0 {
		return 0, 0, false
	}
	slices.Sort(s)
	return s[len(s)/2], s[(len(s)*99)/100], true
}

func kernelClass(c cupti.Class) correlate.KernelClass {
	switch c {
	case cupti.ClassCommunication:
		return correlate.ClassComm
	case cupti.ClassAttention:
		return correlate.ClassAttention
	case cupti.ClassGEMM:
		return correlate.ClassGEMM
	case cupti.ClassMoE:
		return correlate.ClassMoE
	case cupti.ClassCopy:
		return correlate.ClassCopy
	}
	return correlate.ClassOther
}

// probeOp is the op of a probe's calls: its spec's Op, which is in
// correlate's vocabulary (TestSpecOpsAreCorrelateOps), the collective of a
// collective, the function of a synchronisation.
func probeOp(p bpf.ProbeID) correlate.Op { return correlate.Op(p.Op()) }

// libStats exports the injection library's own counters (yields to another
// CUPTI client, orphaned buffers, records on another clock, refused
// configurations, ...) as agent counters cupti_lib_NAME, summed over
// processes: each stats record carries a process's cumulative values, and
// what grew since its last record is added.
func (c *Converter) libStats(p *convProc, st cupti.Stats) {
	for i := 0; i < st.N && i < cupti.NumStats; i++ {
		v := st.Counters[i]
		prev := p.libStats[i]
		if v < prev {
			prev = 0 // the process restarted its counters (a new library instance)
		}
		if d := v - prev; d > 0 {
			c.count("cupti_lib_"+cupti.Stat(i).String(), int64(min(d, 1<<62)))
		}
		p.libStats[i] = v
	}
}
