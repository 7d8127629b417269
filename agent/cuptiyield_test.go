package agent

import (
	"testing"
	"time"

	"github.com/slowrank/slowrank/agent/capture"
	"github.com/slowrank/slowrank/bpf"
	"github.com/slowrank/slowrank/cupti"
)

func TestYieldTrackerDecisions(t *testing.T) {
	const ctl = 77
	s := int64(time.Second)
	call := func(fn bpf.ProbeID, tid uint32, at int64, arg uint64) capture.CUPTICall {
		return capture.CUPTICall{PID: 1, TID: tid, Fn: fn, Arg: arg, TimeNs: at}
	}
	type step struct {
		call     *capture.CUPTICall
		tick     int64 // when call is nil
		attach   bool  // attached(tick, foreignSubscriber=true)
		active   bool
		changed  bool
		sinceNow int64 // expected since when active (0: do not check)
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"the library's own calls never yield", []step{
			{call: ptr(call(bpf.ProbeCUPTIEnable, ctl, 1*s, 10)), active: false},
			{call: ptr(call(bpf.ProbeCUPTIDisable, ctl, 2*s, 10)), active: false},
			{call: ptr(call(bpf.ProbeCUPTIFlushAll, ctl, 3*s, flushForced)), active: false},
		}},
		{"a Kineto session yields at its first call and resumes after the grace", []step{
			{call: ptr(call(bpf.ProbeCUPTIRegisterTimestamp, 5, 10*s, 0)), active: true, changed: true, sinceNow: 10 * s},
			{call: ptr(call(bpf.ProbeCUPTIRegisterCallbacks, 5, 10*s+1, 0)), active: true},
			{call: ptr(call(bpf.ProbeCUPTIEnable, 5, 10*s+2, 10)), active: true},
			{call: ptr(call(bpf.ProbeCUPTIFlushAll, 5, 12*s, 0)), active: true}, // warm-up end: mid-session
			{call: ptr(call(bpf.ProbeCUPTIDisable, 5, 20*s, 10)), active: true},
			{call: ptr(call(bpf.ProbeCUPTIFlushAll, 5, 20*s+5, flushForced)), active: true},
			{tick: 21 * s, active: true},
			{tick: 22*s + 5, active: false, changed: true},
		}},
		{"a new session inside the grace keeps the yield", []step{
			{call: ptr(call(bpf.ProbeCUPTIEnable, 5, 1*s, 10)), active: true, changed: true},
			{call: ptr(call(bpf.ProbeCUPTIDisable, 5, 2*s, 10)), active: true},
			{call: ptr(call(bpf.ProbeCUPTIEnable, 5, 3*s, 10)), active: true},
			{tick: 10 * s, active: true},
		}},
		{"cuptiFinalize ends a session", []step{
			{call: ptr(call(bpf.ProbeCUPTISubscribe, 9, 1*s, 0)), active: true, changed: true},
			{call: ptr(call(bpf.ProbeCUPTIFinalize, 9, 2*s, 0)), active: true},
			{tick: 4 * s, active: false, changed: true},
		}},
		{"a subscriber at attach is cautious until the quiet period", []step{
			{tick: 1 * s, attach: true, active: true, changed: true},
			{tick: 30 * s, active: true},
			{tick: 61 * s, active: false, changed: true},
		}},
		{"a session seen after a cautious attach is a real one", []step{
			{tick: 1 * s, attach: true, active: true, changed: true},
			{call: ptr(call(bpf.ProbeCUPTIEnable, 5, 50*s, 10)), active: true, sinceNow: 50 * s},
			{tick: 200 * s, active: true}, // no end seen: stays
			{call: ptr(call(bpf.ProbeCUPTIDisable, 5, 201*s, 10)), active: true},
			{tick: 204 * s, active: false, changed: true},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			y := yieldTracker{ctlTID: ctl}
			for i, st := range tc.steps {
				var changed bool
				switch {
				case st.call != nil:
					changed = y.call(*st.call)
				case st.attach:
					y.attached(st.tick, true)
					changed = y.tick(st.tick)
				default:
					changed = y.tick(st.tick)
				}
				active, since := y.decision()
				if active != st.active || changed != st.changed {
					t.Fatalf("step %d: active %v changed %v, want %v %v", i, active, changed, st.active, st.changed)
				}
				if st.sinceNow != 0 && since != uint64(st.sinceNow) {
					t.Fatalf("step %d: since %d, want %d", i, since, st.sinceNow)
				}
			}
		})
	}
}

// TestYieldTrackerRemembersForeignCallbacks: what the other client
// registered and enabled is kept for the library's hand-back, its kinds
// trusted only once its registration was seen.
func TestYieldTrackerRemembersForeignCallbacks(t *testing.T) {
	const ctl, kineto = 77, 5
	c := func(fn bpf.ProbeID, tid uint32, at int64, arg, arg2 uint64) capture.CUPTICall {
		return capture.CUPTICall{PID: 1, TID: tid, Fn: fn, Arg: arg, Arg2: arg2, TimeNs: at}
	}
	cases := []struct {
		name      string
		calls     []capture.CUPTICall
		want      cupti.ForeignCallbacks
		wantDirty bool
	}{
		{"the library's own calls are not the other client's", []capture.CUPTICall{
			c(bpf.ProbeCUPTIRegisterCallbacks, ctl, 10, 0x1000, 0x2000),
			c(bpf.ProbeCUPTIEnable, ctl, 11, 10, 0),
		}, cupti.ForeignCallbacks{}, false},
		{"a Kineto session from its registration on", []capture.CUPTICall{
			c(bpf.ProbeCUPTIRegisterTimestamp, kineto, 10, 0x3000, 0),
			c(bpf.ProbeCUPTIRegisterCallbacks, kineto, 11, 0x1000, 0x2000),
			c(bpf.ProbeCUPTIEnable, kineto, 12, 10, 0),
			c(bpf.ProbeCUPTIEnable, kineto, 13, 41, 0),
			c(bpf.ProbeCUPTIEnable, kineto, 14, 200, 0), // no such kind bit: ignored
			c(bpf.ProbeCUPTIDisable, kineto, 15, 41, 0),
		}, cupti.ForeignCallbacks{RequestFn: 0x1000, CompleteFn: 0x2000, PairNs: 11, TimestampFn: 0x3000, TimestampNs: 10,
			Kinds: 1 << 10, KindsKept: true}, true},
		{"kinds enabled before the agent watched are unknown: not kept", []capture.CUPTICall{
			c(bpf.ProbeCUPTIEnable, kineto, 12, 10, 0),
		}, cupti.ForeignCallbacks{Kinds: 1 << 10}, true},
		{"finalize clears the kinds but keeps the callbacks", []capture.CUPTICall{
			c(bpf.ProbeCUPTIRegisterCallbacks, kineto, 11, 0x1000, 0x2000),
			c(bpf.ProbeCUPTIEnable, kineto, 12, 10, 0),
			c(bpf.ProbeCUPTIFinalize, kineto, 20, 0, 0),
		}, cupti.ForeignCallbacks{RequestFn: 0x1000, CompleteFn: 0x2000, PairNs: 11, KindsKept: true}, true},
		{"a flush changes nothing to give back", []capture.CUPTICall{
			c(bpf.ProbeCUPTIFlushAll, kineto, 12, 0, 0),
		}, cupti.ForeignCallbacks{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			y := yieldTracker{ctlTID: ctl}
			for _, call := range tc.calls {
				y.call(call)
			}
			if y.foreign != tc.want || y.foreignDirty != tc.wantDirty {
				t.Errorf("foreign %+v dirty %v, want %+v dirty %v", y.foreign, y.foreignDirty, tc.want, tc.wantDirty)
			}
		})
	}
}
