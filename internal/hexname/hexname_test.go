package hexname

import "testing"

func TestIsLower(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{"", false},
		{"0123456789abcdef", true},
		{"deadbeef", true},
		{"DEADBEEF", false}, // the kernel and pip write lowercase
		{"abcg", false},
		{"12-34", false},
		{"a b", false},
	}
	for _, tc := range tests {
		if got := IsLower([]byte(tc.in)); got != tc.want {
			t.Errorf("IsLower(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
