package cupti

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestEnumNames pins the String() of every enum of the package: the names
// reach the status JSON and `slowrank doctor` (State), the agent's counter
// names cupti_lib_* and so the self-metrics (Stat), and the ops of the
// NCCL plugin's collectives (NCCLFunc), so a renamed or reordered constant
// must not change them. Out-of-range values have stringer's Type(N) form,
// as in bpf/ (the hand-written methods printed type(N) in lower case: no
// consumer parses either).
func TestEnumNames(t *testing.T) {
	for _, c := range []struct {
		got  fmt.Stringer
		want string
	}{
		{ClassOther, "other"},
		{ClassCommunication, "communication"},
		{ClassAttention, "attention"},
		{ClassGEMM, "gemm"},
		{ClassMoE, "moe"},
		{ClassCopy, "copy"},
		{Class(6), "Class(6)"},
		{Class(255), "Class(255)"},

		{ClockMonotonicCallback, "monotonic_callback"},
		{ClockCalibrated, "calibrated"},
		{ClockUnknown, "unknown"},
		{ClockSource(3), "ClockSource(3)"},
		{ClockSource(65535), "ClockSource(65535)"},

		{ReasonDuty, "duty"},
		{ReasonEscalation, "escalation"},
		{ReasonAttach, "attach"},
		{ReasonExit, "exit"},
		{ReasonError, "error"},
		{ReasonYield, "yield"},
		{ReasonLease, "lease"},
		{Reason(7), "Reason(7)"},
		{Reason(255), "Reason(255)"},

		{DutyOff, "off"},
		{DutyAlways, "always"},
		{DutyTime, "time"},
		{DutySteps, "steps"},
		{DutyMode(4), "DutyMode(4)"},
		{DutyMode(4000000000), "DutyMode(4000000000)"},

		{StateInit, "init"},
		{StateIdle, "idle"},
		{StateOn, "on"},
		{StateOffPhase, "off_phase"},
		{StateUnavailable, "unavailable"},
		{StateRefused, "refused"},
		{StateDisabled, "disabled"},
		{StateYielded, "yielded"},
		{State(8), "State(8)"},
		{State(4000000000), "State(4000000000)"},

		{StatRecordsSeen, "records_seen"},
		{StatKernels, "kernels"},
		{StatMemcpys, "memcpys"},
		{StatMemsets, "memsets"},
		{StatUnknownKinds, "unknown_kinds"},
		{StatBadRecords, "bad_records"},
		{StatNames, "names"},
		{StatNamesOverflow, "names_overflow"},
		{StatBuffersRequested, "buffers_requested"},
		{StatBuffersRefused, "buffers_refused"},
		{StatBuffersCompleted, "buffers_completed"},
		{StatBatches, "batches"},
		{StatBatchBytes, "batch_bytes"},
		{StatFlushes, "flushes"},
		{StatEnables, "enables"},
		{StatAttaches, "attaches"},
		{StatCUPTIErrors, "cupti_errors"},
		{StatOnNs, "on_ns"},
		{StatDiscardedDetached, "discarded_detached"},
		{StatYields, "yields"},
		{StatYieldedNs, "yielded_ns"},
		{StatBuffersOrphaned, "buffers_orphaned"},
		{StatForeignClock, "foreign_clock"},
		{StatLeaseExpired, "lease_expired"},
		{StatControlRejected, "control_rejected"},
		{StatReenabled, "reenabled"},
		{StatSetups, "setups"},
		{StatClockConverted, "clock_converted"},
		{StatHandbacks, "handbacks"},
		{StatForwarded, "forwarded"},
		{StatCallbacksTaken, "callbacks_taken"},
		{StatHandbackRejected, "handback_rejected"},
		{StatNCCLEvents, "nccl_events"},
		{StatNCCLColls, "nccl_colls"},
		{StatNCCLKernels, "nccl_kernels"},
		{StatNCCLRingFull, "nccl_ring_full"},
		{StatNCCLDiscarded, "nccl_discarded"},
		{StatNCCLBadHandles, "nccl_bad_handles"},
		{StatNCCLIncomplete, "nccl_incomplete"},
		{StatNCCLComms, "nccl_comms"},
		{StatNCCLCommOverflow, "nccl_comm_overflow"},
		{StatNCCLClockSuspect, "nccl_clock_suspect"},
		{StatNCCLUnknownEvents, "nccl_unknown_events"},
		{StatNCCLAPILost, "nccl_api_lost"},
		{StatNCCLClockClamped, "nccl_clock_clamped"},
		{StatIncompleteRecords, "incomplete_records"},
		{Stat(46), "Stat(46)"},
		{Stat(-1), "Stat(-1)"},

		{NCCLFuncUnknown, "unknown"},
		{NCCLFuncBroadcast, "broadcast"},
		{NCCLFuncReduce, "reduce"},
		{NCCLFuncAllGather, "all_gather"},
		{NCCLFuncReduceScatter, "reduce_scatter"},
		{NCCLFuncAllReduce, "all_reduce"},
		{NCCLFuncSendRecv, "send_recv"},
		{NCCLFuncSend, "send"},
		{NCCLFuncRecv, "recv"},
		{NCCLFuncAllToAll, "all_to_all"},
		{NCCLFuncGather, "gather"},
		{NCCLFuncScatter, "scatter"},
		{NCCLFunc(12), "NCCLFunc(12)"},
		{NCCLFunc(200), "NCCLFunc(200)"},

		{NCCLDatatypeUnknown, "unknown"},
		{NCCLDatatypeInt8, "int8"},
		{NCCLDatatypeUint8, "uint8"},
		{NCCLDatatypeInt32, "int32"},
		{NCCLDatatypeUint32, "uint32"},
		{NCCLDatatypeInt64, "int64"},
		{NCCLDatatypeUint64, "uint64"},
		{NCCLDatatypeFloat16, "float16"},
		{NCCLDatatypeFloat32, "float32"},
		{NCCLDatatypeFloat64, "float64"},
		{NCCLDatatypeBfloat16, "bfloat16"},
		{NCCLDatatypeFloat8e4m3, "float8e4m3"},
		{NCCLDatatypeFloat8e5m2, "float8e5m2"},
		{NCCLDatatype(13), "NCCLDatatype(13)"},
		{NCCLDatatype(99), "NCCLDatatype(99)"},

		{NCCLAlgoUnknown, "unknown"},
		{NCCLAlgoTree, "tree"},
		{NCCLAlgoRing, "ring"},
		{NCCLAlgoCollNetDirect, "collnet_direct"},
		{NCCLAlgoCollNetChain, "collnet_chain"},
		{NCCLAlgoNVLS, "nvls"},
		{NCCLAlgoNVLSTree, "nvls_tree"},
		{NCCLAlgoPAT, "pat"},
		{NCCLAlgo(8), "NCCLAlgo(8)"},

		{NCCLProtoUnknown, "unknown"},
		{NCCLProtoLL, "ll"},
		{NCCLProtoLL128, "ll128"},
		{NCCLProtoSimple, "simple"},
		{NCCLProto(4), "NCCLProto(4)"},
		{NCCLProto(9), "NCCLProto(9)"},
	} {
		if s := c.got.String(); s != c.want {
			t.Errorf("%T %d: String() = %q, want %q", c.got, c.got, s, c.want)
		}
	}
}

// TestEnumNamesMatchHeader ties the names to slowrank_abi.h: every
// SLOWRANK_<ENUM>_<NAME> value prints NAME (lower case, underscores aside),
// the values run from 0 without a gap, and where the header has a _COUNT
// the value after the last has no name (Stat indexes the counters, so its
// names must cover exactly SLOWRANK_STAT_COUNT).
func TestEnumNamesMatchHeader(t *testing.T) {
	h, err := os.ReadFile("slowrank_abi.h")
	if err != nil {
		t.Fatal(err)
	}
	defs := regexp.MustCompile(`(?m)^#define (SLOWRANK_\w+?)\s+(\d+)\b`).FindAllStringSubmatch(string(h), -1)
	fold := func(s string) string { return strings.ToLower(strings.ReplaceAll(s, "_", "")) }
	for _, e := range []struct {
		prefix string
		name   func(v int) string
	}{
		{"SLOWRANK_CLASS_", func(v int) string { return Class(v).String() }},
		{"SLOWRANK_CLOCK_", func(v int) string { return ClockSource(v).String() }},
		{"SLOWRANK_REASON_", func(v int) string { return Reason(v).String() }},
		{"SLOWRANK_DUTY_", func(v int) string { return DutyMode(v).String() }},
		{"SLOWRANK_STATE_", func(v int) string { return State(v).String() }},
		{"SLOWRANK_STAT_", func(v int) string { return Stat(v).String() }},
		{"SLOWRANK_NCCL_FUNC_", func(v int) string { return NCCLFunc(v).String() }},
		{"SLOWRANK_NCCL_DT_", func(v int) string { return NCCLDatatype(v).String() }},
		{"SLOWRANK_NCCL_ALGO_", func(v int) string { return NCCLAlgo(v).String() }},
		{"SLOWRANK_NCCL_PROTO_", func(v int) string { return NCCLProto(v).String() }},
	} {
		seen := map[int]bool{}
		count := -1
		for _, d := range defs {
			name, ok := strings.CutPrefix(d[1], e.prefix)
			if !ok {
				continue
			}
			v, err := strconv.Atoi(d[2])
			if err != nil {
				t.Fatal(err)
			}
			if name == "COUNT" {
				count = v
				continue
			}
			seen[v] = true
			if got := e.name(v); fold(got) != fold(name) {
				t.Errorf("%s%s = %d: String() = %q", e.prefix, name, v, got)
			}
		}
		if len(seen) == 0 {
			t.Errorf("%s: no values in slowrank_abi.h", e.prefix)
		}
		for v := range len(seen) {
			if !seen[v] {
				t.Errorf("%s: no value %d", e.prefix, v)
			}
		}
		if count >= 0 && count != len(seen) {
			t.Errorf("%sCOUNT = %d, %d values", e.prefix, count, len(seen))
		}
		if got := e.name(len(seen)); !strings.HasSuffix(got, "("+strconv.Itoa(len(seen))+")") {
			t.Errorf("%s: %d, past the last value, has a name: %q", e.prefix, len(seen), got)
		}
	}
}

// TestEnumNamesCoverCounts checks the Go side of the same tie: each enum
// with a _COUNT in abi_defs.go has a name for the value below it and none
// for the count (Stats.Counters has NumStats entries, all named).
func TestEnumNamesCoverCounts(t *testing.T) {
	for _, e := range []struct {
		last, count fmt.Stringer
	}{
		{Class(numClasses - 1), Class(numClasses)},
		{Stat(NumStats - 1), Stat(NumStats)},
		{NCCLFunc(numNCCLFuncs - 1), NCCLFunc(numNCCLFuncs)},
		{NCCLDatatype(numNCCLDatatypes - 1), NCCLDatatype(numNCCLDatatypes)},
		{NCCLAlgo(numNCCLAlgos - 1), NCCLAlgo(numNCCLAlgos)},
		{NCCLProto(numNCCLProtos - 1), NCCLProto(numNCCLProtos)},
	} {
		if s := e.last.String(); strings.HasSuffix(s, ")") {
			t.Errorf("%T %d, the last before the count, has no name: %q", e.last, e.last, s)
		}
		if s, want := e.count.String(), strings.TrimPrefix(fmt.Sprintf("%T(%d)", e.count, e.count), "cupti."); s != want {
			t.Errorf("%T %d, the count, has a name: %q", e.count, e.count, s)
		}
	}
}
