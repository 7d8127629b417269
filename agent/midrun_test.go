package agent

import "testing"

func TestMidRun(t *testing.T) {
	a := &attacher{startTicks: 10_000}
	tests := []struct {
		start uint64
		want  bool
	}{
		{0, true},             // long before the agent
		{10_000 - 201, true},  // a little over 2 s before
		{10_000 - 200, false}, // started with the agent: could not have set up NCCL
		{10_500, false},       // after the agent
	}
	for _, tt := range tests {
		if got := a.midRun(tt.start); got != tt.want {
			t.Errorf("midRun(%d) = %v, want %v", tt.start, got, tt.want)
		}
	}
	if (&attacher{}).midRun(0) {
		t.Errorf("unknown agent start: nothing is mid-run")
	}
	if selfStartTicks() == 0 {
		t.Errorf("no start time for this process in /proc/self/stat")
	}
}
