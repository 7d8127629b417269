package agent

import (
	"testing"

	"github.com/slowrank/slowrank/bpf"
)

func TestMissingNamesBounded(t *testing.T) {
	all := bpf.Specs()
	tests := []struct {
		n, max int
		want   string
	}{
		{0, 6, ""},
		{2, 6, all[0].Name() + ", " + all[1].Name()},
		{8, 2, all[0].Name() + ", " + all[1].Name() + ", and 6 more"},
	}
	for _, tc := range tests {
		if got := missingNames(all[:tc.n], tc.max); got != tc.want {
			t.Errorf("missingNames(%d specs, %d) = %q, want %q", tc.n, tc.max, got, tc.want)
		}
	}
}
