package agent

import (
	"math"
	"testing"
	"time"
)

func TestDutyUsesPriorUntilMeasured(t *testing.T) {
	d := NewDuty(DefaultDutyConfig())
	p := d.Plan(0)
	if p.Measured || math.Abs(p.OnShare-0.1) > 1e-9 {
		t.Fatalf("prior plan = %+v, want share 0.003/0.03 = 0.1", p)
	}
}

func TestDutySteersShareByMeasuredCost(t *testing.T) {
	tests := []struct {
		name      string
		onMS      float64
		wantShare float64
	}{
		{"8 % cost gives a small share", 108, 0.003 / 0.08},
		{"2 % cost", 102, 0.15},
		{"a cost measured near zero is floored", 100, 0.2},
		{"huge cost is bounded below", 300, 0.02},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDuty(DefaultDutyConfig())
			for r := 0; r < 4; r++ {
				for i := 0; i < 30; i++ {
					d.ObserveStep(r, 100, false)
					d.ObserveStep(r, tc.onMS, true)
				}
			}
			p := d.Plan(0)
			if !p.Measured || math.Abs(p.OnShare-tc.wantShare) > 1e-6 {
				t.Fatalf("plan = %+v, want share %g", p, tc.wantShare)
			}
		})
	}
}

func TestDutyEscalationIsBounded(t *testing.T) {
	cfg := DefaultDutyConfig()
	d := NewDuty(cfg)
	now := int64(0)
	if !d.Suspect(now) || !d.Plan(now).Escalate {
		t.Fatal("first suspicion did not escalate")
	}
	if d.Plan(now + int64(cfg.Escalation)).Escalate {
		t.Fatal("escalation did not end")
	}
	// An hour allows MaxEscalationShare*hour/Escalation = 18 escalations.
	granted := 1
	for i := 1; i < 100; i++ {
		now = int64(i) * int64(30*time.Second)
		if d.Suspect(now) {
			granted++
		}
	}
	if granted > 18+3 || granted < 18 {
		t.Fatalf("granted %d escalations over ~50 min, want about 18 per hour", granted)
	}
}
