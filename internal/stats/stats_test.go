package stats

import (
	"math"
	"slices"
	"testing"
)

func TestMedians(t *testing.T) {
	tests := []struct {
		name string
		in   []int64
		want float64 // Median and MedianIntFloat
		int  int64   // MedianInt
	}{
		{"one value", []int64{7}, 7, 7},
		{"odd count, unsorted", []int64{9, 1, 5}, 5, 5},
		{"even count: the mean of the middle two", []int64{4, 1, 2, 8}, 3, 3},
		{"even count: an odd sum is truncated in integers only", []int64{1, 2}, 1.5, 1},
		{"negative: truncated toward zero", []int64{-1, -2}, -1.5, -1},
		{"duplicates", []int64{3, 3, 3, 1}, 3, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := make([]float64, len(tc.in))
			for i, v := range tc.in {
				fs[i] = float64(v)
			}
			if got := Median(fs); got != tc.want {
				t.Errorf("Median = %v, want %v", got, tc.want)
			}
			if got := MedianIntFloat(append([]int64(nil), tc.in...)); got != tc.want {
				t.Errorf("MedianIntFloat = %v, want %v", got, tc.want)
			}
			if got := MedianInt(append([]int64(nil), tc.in...)); got != tc.int {
				t.Errorf("MedianInt = %v, want %v", got, tc.int)
			}
		})
	}
}

// A median sorts its slice in place, as its doc says: callers pass a copy
// where the order matters.
func TestMedianSortsInPlace(t *testing.T) {
	xs := []float64{3, math.Inf(1), 1, 2}
	Median(xs)
	for i := 1; i < len(xs); i++ {
		if xs[i-1] > xs[i] {
			t.Fatalf("not sorted: %v", xs)
		}
	}
}

// Beyond 2^53 nanoseconds the float64 mean of the two middle values loses
// precision as the callers' own arithmetic did; the integer median stays
// exact.
func TestMedianIntExactBeyondFloat(t *testing.T) {
	const big = int64(1) << 60
	if got := MedianInt([]int64{big + 1, big + 3}); got != big+2 {
		t.Errorf("MedianInt = %d, want %d", got, big+2)
	}
}

func TestLowerQuantile(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		q    float64
		want float64
	}{
		{[]float64{5}, 0.25, 5},
		{[]float64{4, 1, 3, 2}, 0, 1},
		{[]float64{4, 1, 3, 2}, 0.25, 1},
		{[]float64{4, 1, 3, 2}, 0.5, 2},
		{[]float64{4, 1, 3, 2}, 1, 4},
		{[]float64{9, 7, 8, 6, 5}, 0.25, 6},
	} {
		if got := LowerQuantile(slices.Clone(tc.xs), tc.q); got != tc.want {
			t.Errorf("LowerQuantile(%v, %v) = %v, want %v", tc.xs, tc.q, got, tc.want)
		}
	}
}
