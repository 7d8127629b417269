package agent

import (
	"testing"
	"time"
)

func TestYieldTrackerDecisions(t *testing.T) {
	const ctl = 77
	s := int64(time.Second)
	call := func(fn CUPTIFn, tid uint32, at int64, arg uint64) CUPTICall {
		return CUPTICall{PID: 1, TID: tid, Fn: fn, Arg: arg, TimeNs: at}
	}
	type step struct {
		call     *CUPTICall
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
			{call: ptr(call(CUPTIEnable, ctl, 1*s, 10)), active: false},
			{call: ptr(call(CUPTIDisable, ctl, 2*s, 10)), active: false},
			{call: ptr(call(CUPTIFlushAll, ctl, 3*s, flushForced)), active: false},
		}},
		{"a Kineto session yields at its first call and resumes after the grace", []step{
			{call: ptr(call(CUPTIRegisterTimestamp, 5, 10*s, 0)), active: true, changed: true, sinceNow: 10 * s},
			{call: ptr(call(CUPTIRegisterCallbacks, 5, 10*s+1, 0)), active: true},
			{call: ptr(call(CUPTIEnable, 5, 10*s+2, 10)), active: true},
			{call: ptr(call(CUPTIFlushAll, 5, 12*s, 0)), active: true}, // warm-up end: mid-session
			{call: ptr(call(CUPTIDisable, 5, 20*s, 10)), active: true},
			{call: ptr(call(CUPTIFlushAll, 5, 20*s+5, flushForced)), active: true},
			{tick: 21 * s, active: true},
			{tick: 22*s + 5, active: false, changed: true},
		}},
		{"a new session inside the grace keeps the yield", []step{
			{call: ptr(call(CUPTIEnable, 5, 1*s, 10)), active: true, changed: true},
			{call: ptr(call(CUPTIDisable, 5, 2*s, 10)), active: true},
			{call: ptr(call(CUPTIEnable, 5, 3*s, 10)), active: true},
			{tick: 10 * s, active: true},
		}},
		{"cuptiFinalize ends a session", []step{
			{call: ptr(call(CUPTISubscribe, 9, 1*s, 0)), active: true, changed: true},
			{call: ptr(call(CUPTIFinalize, 9, 2*s, 0)), active: true},
			{tick: 4 * s, active: false, changed: true},
		}},
		{"a subscriber at attach is cautious until the quiet period", []step{
			{tick: 1 * s, attach: true, active: true, changed: true},
			{tick: 30 * s, active: true},
			{tick: 61 * s, active: false, changed: true},
		}},
		{"a session seen after a cautious attach is a real one", []step{
			{tick: 1 * s, attach: true, active: true, changed: true},
			{call: ptr(call(CUPTIEnable, 5, 50*s, 10)), active: true, sinceNow: 50 * s},
			{tick: 200 * s, active: true}, // no end seen: stays
			{call: ptr(call(CUPTIDisable, 5, 201*s, 10)), active: true},
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
