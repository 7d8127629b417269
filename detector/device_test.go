package detector_test

import (
	"strings"
	"testing"

	"github.com/slowrank/slowrank/detector"
)

// A verdict carries who the others waited for on the GPU: the share of
// the rank's steps whose collectives' kernels it started last on its host,
// and its collectives' GPU time against its peers' (the last to arrive
// waits least), read in its reason as waited for or waiting.
func TestVerdictsCarryDeviceArrivalEvidence(t *testing.T) {
	for _, tc := range []struct {
		name      string
		collMS    func(r int) float64 // 0: not reported
		last      func(r int) *bool
		wantShare *float64
		wantColl  [2]float64 // rank 2's, its peers'; 0: absent
		wantText  string     // in rank 2's straggler reason; "" : no device text
	}{
		{"the straggler's collectives are short: its peers waited for it",
			func(r int) float64 { return map[bool]float64{true: 2, false: 12}[r == 2] },
			func(r int) *bool { v := r == 2; return &v },
			ptr(1.0), [2]float64{2, 12}, "its GPU started the collectives last on its host in 100% of its steps; its collectives took 2.00 ms on its GPU against its peers' 12.00 ms: they waited for it"},
		{"a rank whose collectives are long waited for its peers",
			func(r int) float64 { return map[bool]float64{true: 20, false: 12}[r == 2] },
			func(int) *bool { return nil },
			nil, [2]float64{20, 12}, "its collectives took 20.00 ms on its GPU against its peers' 12.00 ms: it waited for them"},
		{"within the margin nothing is said",
			func(r int) float64 { return map[bool]float64{true: 11.5, false: 12}[r == 2] },
			func(int) *bool { return nil },
			nil, [2]float64{11.5, 12}, ""},
		{"without the plugin's kernel records there is no device evidence",
			func(int) float64 { return 0 }, func(int) *bool { return nil }, nil, [2]float64{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newJob(t, 4)
			for w := range 4 {
				j.win(w, slowOn(2, 150), nil)
			}
			for i := range j.facts {
				f := &j.facts[i]
				if c := tc.collMS(f.Rank); c > 0 {
					f.DeviceCollMS = &c
				}
				f.DeviceLastArrival = tc.last(f.Rank)
			}
			vs, _ := j.run()
			var got *detector.Verdict
			for i := range vs {
				if vs[i].Rank == 2 && vs[i].Phase == "compute" && vs[i].State == detector.StateStraggler {
					got = &vs[i]
					break
				}
			}
			if got == nil {
				t.Fatalf("no straggler verdict for rank 2: %v", states(vs, 2, "compute"))
			}
			if (got.DeviceLastArrivalShare == nil) != (tc.wantShare == nil) ||
				got.DeviceLastArrivalShare != nil && *got.DeviceLastArrivalShare != *tc.wantShare {
				t.Errorf("device last arrival share %v, want %v", deref(got.DeviceLastArrivalShare), deref(tc.wantShare))
			}
			if tc.wantColl[0] == 0 {
				if got.DeviceCollMS != nil || got.DeviceCollPeerMS != nil {
					t.Errorf("device coll %v / %v without reports", deref(got.DeviceCollMS), deref(got.DeviceCollPeerMS))
				}
			} else if got.DeviceCollMS == nil || *got.DeviceCollMS != tc.wantColl[0] || *got.DeviceCollPeerMS != tc.wantColl[1] {
				t.Errorf("device coll %v / %v, want %v", deref(got.DeviceCollMS), deref(got.DeviceCollPeerMS), tc.wantColl)
			}
			has := strings.Contains(got.Reason, "on its GPU") || strings.Contains(got.Reason, "its GPU started")
			if tc.wantText == "" && has || tc.wantText != "" && !strings.Contains(got.Reason, tc.wantText) {
				t.Errorf("reason %q\nwant it to say %q", got.Reason, tc.wantText)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}
