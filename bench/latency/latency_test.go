package main

import (
	"reflect"
	"testing"
)

func TestSummarizeSample(t *testing.T) {
	for _, tc := range []struct {
		xs            []float64
		p50, p95, max float64
	}{
		{[]float64{1}, 1, 1, 1},
		{[]float64{3, 1, 2, 4}, 2, 4, 4},
		{[]float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}, 10, 19, 20},
	} {
		s := summarizeSample(tc.xs)
		if s.N != len(tc.xs) || *s.P50 != tc.p50 || *s.P95 != tc.p95 || *s.Max != tc.max {
			t.Errorf("%v: n %d p50 %v p95 %v max %v, want %v %v %v", tc.xs, s.N, *s.P50, *s.P95, *s.Max, tc.p50, tc.p95, tc.max)
		}
	}
	if s := summarizeSample(nil); s.N != 0 || s.P50 != nil {
		t.Errorf("empty sample: %+v", s)
	}
}

func TestParseStragglers(t *testing.T) {
	body := `# HELP slowrank_straggler 1 while an alert is active
slowrank_straggler{hint="",job="slowrank",phase="host",rank="2",slowrank_job_id="j-1"} 1
slowrank_straggler{hint="",job="slowrank",phase="host",rank="1",slowrank_job_id="j-1"} 0
slowrank_straggler{hint="gpu_stream_stall",phase="compute",rank="13",slowrank_job_id="a \"q\" b"} 1 1700000000000
slowrank_stragglers_total 3
`
	got := parseStragglers(body)
	want := []stragglerPoint{{Job: "j-1", Rank: 2, Phase: "host"}, {Job: `a \"q\" b`, Rank: 13, Phase: "compute"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parseStragglers = %+v, want %+v", got, want)
	}
}

func TestFollowed(t *testing.T) {
	if !followed("00ff", 8) || !followed("08ff", 8) || followed("07ff", 8) || followed("zz", 8) || !followed("07", 1) {
		t.Error("followed: wrong sample")
	}
}

func TestShare(t *testing.T) {
	if got := share(30, 100, 120); got != 36 {
		t.Errorf("share(30, 100, 120) = %d, want 36", got)
	}
	if got := share(1, 0, 10); got != 0 {
		t.Errorf("share with no items = %d, want 0", got)
	}
}
