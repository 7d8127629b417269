package agent

import (
	"encoding/json"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/slowrank/slowrank/detector"
)

func ptr[T any](v T) *T { return &v }

func TestControlRequestValidate(t *testing.T) {
	d := func(s string) *Duration { v, _ := time.ParseDuration(s); return ptr(Duration(v)) }
	tests := []struct {
		name string
		req  ControlRequest
		want string // "" for valid
	}{
		{"pause", ControlRequest{Action: "pause"}, ""},
		{"resume", ControlRequest{Action: "resume"}, ""},
		{"set window", ControlRequest{Action: "set", Window: d("2s")}, ""},
		{"set all", ControlRequest{Action: "set", Window: d("2s"), Threshold: ptr(0.1), Floor: d("2ms"), Consecutive: ptr(2),
			DutyBudget: ptr(0.002), DutyShare: ptr(0.5), DutyPeriod: d("5s")}, ""},
		{"duty auto", ControlRequest{Action: "set", DutyAuto: true}, ""},
		{"set phase threshold", ControlRequest{Action: "set", PhaseThresholds: map[string]float64{"host": 0.15}}, ""},
		{"remove phase threshold", ControlRequest{Action: "set", PhaseThresholds: map[string]float64{"host": 0}}, ""},
		{"negative phase threshold", ControlRequest{Action: "set", PhaseThresholds: map[string]float64{"host": -1}}, `phase threshold "host"`},
		{"unnamed phase threshold", ControlRequest{Action: "set", PhaseThresholds: map[string]float64{"": 0.1}}, "phase name"},
		{"pause with phase threshold", ControlRequest{Action: "pause", PhaseThresholds: map[string]float64{"host": 0.1}}, "takes no settings"},
		{"no action", ControlRequest{}, "action is missing"},
		{"unknown action", ControlRequest{Action: "stop"}, "unknown action"},
		{"pause with settings", ControlRequest{Action: "pause", Window: d("1s")}, "takes no settings"},
		{"empty set", ControlRequest{Action: "set"}, "needs at least one"},
		{"zero window", ControlRequest{Action: "set", Window: d("0s")}, "window must be at least 100ms"},
		{"window under the shortest duty period", ControlRequest{Action: "set", Window: d("99ms")}, "window must be at least 100ms"},
		{"negative threshold", ControlRequest{Action: "set", Threshold: ptr(-0.1)}, "threshold"},
		{"threshold as a percentage", ControlRequest{Action: "set", Threshold: ptr(5.0)}, "fraction in (0, 1)"},
		{"phase threshold as a percentage", ControlRequest{Action: "set", PhaseThresholds: map[string]float64{"host": 15}}, "fraction in (0, 1)"},
		{"negative floor", ControlRequest{Action: "set", Floor: d("-1ms")}, "floor"},
		{"zero consecutive", ControlRequest{Action: "set", Consecutive: ptr(0)}, "consecutive"},
		{"budget 1", ControlRequest{Action: "set", DutyBudget: ptr(1.0)}, "duty_budget"},
		{"share 0", ControlRequest{Action: "set", DutyShare: ptr(0.0)}, "duty_share"},
		{"share and auto", ControlRequest{Action: "set", DutyShare: ptr(0.5), DutyAuto: true}, "exclude"},
		{"short period", ControlRequest{Action: "set", DutyPeriod: d("10ms")}, "duty_period"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.req.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrInvalidControl) {
				t.Fatalf("error %v, want one containing %q wrapping ErrInvalidControl", err, tt.want)
			}
		})
	}
}

func TestWithDetectorSettingsMergesPhaseThresholds(t *testing.T) {
	base := detector.DefaultConfig()
	base.PhaseThresholds = map[string]float64{"host": 0.2}
	tests := []struct {
		name string
		set  map[string]float64
		want map[string]float64
	}{
		{"none named: kept", nil, map[string]float64{"host": 0.2}},
		{"added", map[string]float64{"compute": 0.08}, map[string]float64{"host": 0.2, "compute": 0.08}},
		{"changed", map[string]float64{"host": 0.15}, map[string]float64{"host": 0.15}},
		{"removed", map[string]float64{"host": 0}, map[string]float64{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := withDetectorSettings(base, ControlRequest{Action: ActionSet, PhaseThresholds: tc.set})
			if !maps.Equal(got.PhaseThresholds, tc.want) {
				t.Errorf("phase thresholds %v, want %v", got.PhaseThresholds, tc.want)
			}
			if base.PhaseThresholds["host"] != 0.2 || len(base.PhaseThresholds) != 1 {
				t.Fatalf("the running detector's map was changed: %v", base.PhaseThresholds)
			}
		})
	}
}

func TestControlRequestJSON(t *testing.T) {
	var r ControlRequest
	if err := json.Unmarshal([]byte(`{"action":"set","window":"2.5s","floor":"500us","threshold":0.1}`), &r); err != nil {
		t.Fatal(err)
	}
	if time.Duration(*r.Window) != 2500*time.Millisecond || time.Duration(*r.Floor) != 500*time.Microsecond || *r.Threshold != 0.1 {
		t.Fatalf("decoded %+v", r)
	}
	for _, bad := range []string{`{"window":5}`, `{"window":"5 parsecs"}`} {
		if err := json.Unmarshal([]byte(bad), &r); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
	b, _ := json.Marshal(DetectorSettings{Window: Duration(5 * time.Second), Floor: Duration(time.Millisecond)})
	if !strings.Contains(string(b), `"window":"5s"`) || !strings.Contains(string(b), `"floor":"1ms"`) {
		t.Fatalf("encoded %s", b)
	}
}
