package agent

import (
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/slowrank/slowrank/agent/capture"
	"github.com/slowrank/slowrank/agent/discover"
	"github.com/slowrank/slowrank/agent/duty"
	"github.com/slowrank/slowrank/cupti"
	"github.com/slowrank/slowrank/detector"
)

// TestProcessCanCollect: the processes whose device on-time the ledger
// charges (SetCollecting): those with the injection library in a state
// that collects when asked.
func TestProcessCanCollect(t *testing.T) {
	lib := &discover.Library{}
	read := func(s cupti.State) cuptiState {
		var c cuptiState
		c.read, c.lastBlock.Status.State = true, s
		return c
	}
	for _, tc := range []struct {
		name string
		pe   procEntry
		want bool
	}{
		{"no injection library", procEntry{}, false},
		{"library not read yet", procEntry{inject: lib}, true},
		{"collecting", procEntry{inject: lib, cupti: read(cupti.StateOn)}, true},
		{"off-phase of the duty cycle", procEntry{inject: lib, cupti: read(cupti.StateOffPhase)}, true},
		{"refused by CUPTI", procEntry{inject: lib, cupti: read(cupti.StateRefused)}, false},
		{"yielded to another client", procEntry{inject: lib, cupti: read(cupti.StateYielded)}, false},
		{"no libcupti", procEntry{inject: lib, cupti: read(cupti.StateUnavailable)}, false},
		{"disabled by the user", procEntry{inject: lib, cupti: read(cupti.StateDisabled)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.pe.canCollect(); got != tc.want {
				t.Fatalf("canCollect %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPlanDutyFeedsPluginOpsPerProcess: the agent charges the plugin
// records the converter counted since the last plan (fed, superseded,
// withheld or dropped: each was recorded in a training process), divided among the
// tracked processes like the traps; with no libnccl uprobe event at all
// (collective uprobes detached) the base share still falls.
func TestPlanDutyFeedsPluginOpsPerProcess(t *testing.T) {
	cfg := duty.DefaultConfig()
	base := cfg.Budget*(1-cfg.EscalationReserve) - cfg.LibraryCost
	for _, tc := range []struct {
		name      string
		procs     int
		perSecond map[string]int64 // converter counts added each second, all processes
		wantSpend float64
	}{
		{"no plugin records", 2, nil, 0},
		{"2 processes, 1000 collectives/s fed", 2, map[string]int64{"nccl_plugin_colls": 1000}, 500e-6},
		{"superseded, withheld and dropped records were recorded too", 2, map[string]int64{"nccl_plugin_colls": 500,
			"nccl_plugin_records_superseded": 200, "nccl_plugin_records_kept_on_uprobes": 100,
			"nccl_plugin_records_implausible": 100, "nccl_plugin_records_before_comm": 100}, 500e-6},
		{"records dropped on the library's full ring were paid for", 2, map[string]int64{"nccl_plugin_colls": 600,
			"cupti_lib_nccl_ring_full": 400}, 500e-6},
		{"other counters are no operations", 1, map[string]int64{"nccl_plugin_comms": 1000, "nccl_uprobe_events_superseded": 1000,
			"cupti_lib_nccl_colls": 1000}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCounters()
			a := &Agent{duty: duty.New(cfg), conv: capture.New(capture.Config{Count: c.add, NCCLPlugin: true}), counters: c, log: slog.New(slog.DiscardHandler)}
			a.att = &attacher{procs: map[discover.ProcessKey]*procEntry{}, log: a.log, count: c.add}
			for i := range tc.procs {
				k := discover.ProcessKey{PID: 100 + i}
				a.att.procs[k] = &procEntry{proc: discover.Process{ProcessKey: k}, rank: i}
			}
			for i := int64(0); i <= 120; i++ {
				now := int64(1000*time.Second) + i*int64(time.Second)
				a.duty.ObserveStep(detector.Step{Rank: 0, Step: i, EndNS: now,
					Phases: map[string]float64{detector.PhaseStep: 1000, detector.PhaseSyncWait: 0}})
				if i > 0 {
					for k, n := range tc.perSecond {
						c.add(k, n)
					}
				}
				a.planDuty(now)
			}
			p := a.dutyPlan()
			if o := p.Overhead; math.Abs(o.NCCLPlugin-tc.wantSpend) > 1e-9 || o.Uprobes != 0 {
				t.Fatalf("plugin spend %g, uprobes %g, want %g and 0", o.NCCLPlugin, o.Uprobes, tc.wantSpend)
			}
			if want := (base - tc.wantSpend) / cfg.PriorCost; math.Abs(p.OnShare-want) > 1e-9 {
				t.Fatalf("share %g, want %g", p.OnShare, want)
			}
		})
	}
}
