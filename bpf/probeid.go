package bpf

import "fmt"

// ProbeID says which symbol produced an event (enum sr_probe_id in events.h).
// The constants are generated from the C enum (wire_gen.go).
type ProbeID uint32

// Layout says how a probe's programs read the function's arguments and which
// record they emit (enum sr_layout in events.h). The constants are generated
// from the C enum (wire_gen.go).
type Layout uint32

// cookieLayoutShift is SR_COOKIE_LAYOUT_SHIFT of events.h: an attach cookie
// carries the probe id below it and the layout from it.
const cookieLayoutShift = 32

// multiCookie is the attach cookie the multi_* programs read for a function
// of spec s.
func multiCookie(s ProbeSpec) uint64 { return uint64(s.ID) | uint64(s.Layout)<<cookieLayoutShift }

// decodeCookie is what the multi_* programs read from cookie.
func decodeCookie(cookie uint64) (ProbeID, Layout) {
	return ProbeID(uint32(cookie)), Layout(cookie >> cookieLayoutShift)
}

// MaxProbeID bounds the probe ids (events.h): tables indexed by id, here and
// in the agent, have this many entries.
const MaxProbeID = 256

// ProbeClass says what a probe's calls are: how the agent converts their
// records, and which record type the probe's programs emit (EventType).
//
//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type ProbeClass -linecomment
type ProbeClass uint8

// Probe classes. The line comments are the String() names (stringer
// -linecomment, probeclass_string.go).
//
//	ClassCollective       an NCCL collective or point-to-point call (Op: which)
//	ClassGroup            ncclGroupStart (entry only) and ncclGroupEnd
//	ClassCommInit         a communicator creation (ncclCommInitRank*, ncclCommSplit)
//	ClassSyncWait         the host waiting for the device (Op: the function)
//	ClassTorchCollective  a torch c10d collective, a host enqueue (Op: which)
//	ClassTorchWorkWait    c10d Work::wait: the host waiting for a collective
//	ClassTorchFutureWait  c10::ivalue::Future::wait: a collective wait in a
//	                      process that issues torch collectives
//	ClassCUPTIBatch       the injection library handing over a CUPTI batch
//	ClassCUPTICall        an entry point of libcupti (another CUPTI client)
const (
	ClassCollective      ProbeClass = iota + 1 // collective
	ClassGroup                                 // group
	ClassCommInit                              // comm_init
	ClassSyncWait                              // sync_wait
	ClassTorchCollective                       // torch_collective
	ClassTorchWorkWait                         // torch_work_wait
	ClassTorchFutureWait                       // torch_future_wait
	ClassCUPTIBatch                            // cupti_batch
	ClassCUPTICall                             // cupti_call
)

// classEvents is the record type the programs of each class emit, as the
// shape macros of slowrank.bpf.c write them.
var classEvents = [...]EventType{
	ClassCollective:      EventColl,
	ClassGroup:           EventGroup,
	ClassCommInit:        EventCommInit,
	ClassSyncWait:        EventSync,
	ClassTorchCollective: EventTorch,
	ClassTorchWorkWait:   EventTorch,
	ClassTorchFutureWait: EventTorch,
	ClassCUPTIBatch:      EventBatch,
	ClassCUPTICall:       EventCUPTICall,
}

// EventType is the type of record the class's programs emit, 0 for an
// unknown class.
func (c ProbeClass) EventType() EventType {
	if int(c) < len(classEvents) {
		return classEvents[c]
	}
	return 0
}

// probeInfo is what the decoder and the agent need to know about a probe id,
// from its spec.
type probeInfo struct {
	name    string
	class   ProbeClass
	op      string
	selfArg int
}

// probeInfos is indexed by id (the decoder and the agent look up every
// record's); class 0 marks an id without a spec.
var probeInfos = func() (t [MaxProbeID]probeInfo) {
	for _, s := range specs {
		if int(s.ID) >= len(t) || t[s.ID].class != 0 {
			continue // out of bounds (TestSpecsUnique), or an alternate spelling: first name wins
		}
		t[s.ID] = probeInfo{name: s.Name(), class: s.Class, op: s.Op, selfArg: s.SelfArg}
	}
	return t
}()

// info returns the probe's entry, nil for an id without a spec.
func (p ProbeID) info() *probeInfo {
	if p < MaxProbeID && probeInfos[p].class != 0 {
		return &probeInfos[p]
	}
	return nil
}

// String is the symbol or qualified name of the probe's spec.
func (p ProbeID) String() string {
	if i := p.info(); i != nil {
		return i.name
	}
	return fmt.Sprintf("ProbeID(%d)", uint32(p))
}

// Class is the probe's class, 0 for unknown ids.
func (p ProbeID) Class() ProbeClass {
	if i := p.info(); i != nil {
		return i.class
	}
	return 0
}

// Op is the probe's op (ProbeSpec.Op), "" for unknown ids.
func (p ProbeID) Op() string {
	if i := p.info(); i != nil {
		return i.op
	}
	return ""
}

// EventType is the type of record this probe emits, 0 for unknown ids.
func (p ProbeID) EventType() EventType { return p.Class().EventType() }
