package agent

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

// converter turns decoded ring-buffer events into correlate inputs. It runs
// on the reader goroutine only and keeps the per-process state that decoding
// CUPTI batches needs (interned kernel names, open collection periods, batch
// sequence numbers to detect lost batches).
type converter struct {
	mu       sync.Mutex // forgetPID comes from the main goroutine
	names    *cupti.Interner
	procs    map[uint32]*convProc
	counters *counters
	// refused counts name definitions dropped by MaxInternedNames.
	refused int64
	// latencies of recent batches (ns), a ring of latencyRing.
	latencies []int64
	latIdx    int
	// marker is the probe whose calls cut steps (Config.StepMarker), 0: none.
	marker bpf.ProbeID
	// ncclPlugin: profiler-plugin records replace the libnccl uprobes
	// (Config.NCCLPlugin); off, they are counted and ignored.
	ncclPlugin bool
	// tids translates the plugin records' thread ids (the process's PID
	// namespace's) into the uprobes' (the host's); nil: as they come.
	tids *tidMap
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

func newConverter(c *counters, ncclPlugin bool) *converter {
	return &converter{
		names: cupti.NewInternerWithLimits(MaxInternedProcesses, MaxNamesPerProcess),
		procs: map[uint32]*convProc{}, counters: c, ncclPlugin: ncclPlugin,
	}
}

func (c *converter) proc(pid uint32) *convProc {
	p := c.procs[pid]
	if p == nil {
		p = &convProc{}
		c.procs[pid] = p
	}
	return p
}

// refusedNames returns the name definitions dropped by MaxInternedNames.
func (c *converter) refusedNames() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.refused
}

// forgetPID drops a process's decoding state.
func (c *converter) forgetPID(pid uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.procs, pid)
	c.names.Forget(pid)
	c.tids.forget(pid)
}

// convert appends the correlate inputs of ev to out. Only batches touch the
// per-process state (under mu); host calls are converted without locking.
func (c *converter) convert(ev bpf.Event, out []pipeline.Input) []pipeline.Input {
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
			c.counters.add("comm_init_failed", 1)
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
	c.counters.add("events_unknown", 1)
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
func (c *converter) torch(e *bpf.TorchEvent, out []pipeline.Input) []pipeline.Input {
	h := correlate.HostCall{PID: e.PID, TID: e.TID, StartNS: int64(e.StartNs), EndNS: int64(e.EndNs), Comm: e.Self}
	switch e.Probe.Class() {
	case bpf.ClassTorchWorkWait:
		h.Kind, h.Comm = correlate.HostCollWait, 0
	case bpf.ClassTorchFutureWait:
		c.mu.Lock()
		coll := c.proc(e.PID).sawTorchColl
		c.mu.Unlock()
		if !coll {
			c.counters.add("torch_future_waits_ignored", 1)
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
			c.counters.add("torch_collectives_redundant", 1)
			return out
		}
		h.Kind, h.Op = correlate.HostCollective, probeOp(e.Probe)
	default: // unreachable: the decoder gives torch records to torch classes only
		c.counters.add("events_unknown", 1)
		return out
	}
	return append(out, pipeline.HostInput(h))
}

// batch converts one CUPTI batch: kernels and copies into device intervals,
// collection transitions into coverage, lost batches and records into drops.
func (c *converter) batch(e *bpf.BatchEvent, out []pipeline.Input) []pipeline.Input {
	b, err := cupti.DecodeBatch(e.Data)
	if err != nil {
		c.counters.add("batches_malformed", 1)
		return out
	}
	c.counters.add("batches", 1)
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
		c.counters.add("batches_lost", int64(gap))
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
		c.counters.add("device_records_dropped", int64(n))
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
	c.counters.add("device_records", int64(len(b.Kernels)+len(b.Copies)))
	if implausible > 0 {
		c.counters.add("device_records_implausible", int64(implausible))
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

func (c *converter) plausible(n uint64) uint64 {
	if n > maxPlausibleLoss {
		c.counters.add("batches_implausible", 1)
		return maxPlausibleLoss
	}
	return n
}

// latencyRing is how many batch latencies the device latency quantiles use.
const latencyRing = 4096

// deviceLatency records how long after the newest kernel of a batch ended the
// batch reached the agent (emit time, CLOCK_MONOTONIC on both sides).
func (c *converter) deviceLatency(b *cupti.Batch, emitted int64) {
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

// latencyQuantiles returns the median and 99th percentile (ns) of recent
// device-record latencies, ok false without samples.
func (c *converter) latencyQuantiles() (p50, p99 int64, ok bool) {
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
func (c *converter) libStats(p *convProc, st cupti.Stats) {
	for i := 0; i < st.N && i < cupti.NumStats; i++ {
		v := st.Counters[i]
		prev := p.libStats[i]
		if v < prev {
			prev = 0 // the process restarted its counters (a new library instance)
		}
		if d := v - prev; d > 0 {
			c.counters.add("cupti_lib_"+cupti.Stat(i).String(), int64(min(d, 1<<62)))
		}
		p.libStats[i] = v
	}
}
