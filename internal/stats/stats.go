// Package stats holds the order statistics that several packages compute
// alike (the medians of detector's windows, of correlate's arrival lags and
// of the duty cycle's steps, and the duty cycle's quantiles), so that one
// definition serves them all. It is pure arithmetic on
// the caller's slices: no state, no I/O, no other slowrank package, so
// that the pure packages (detector, correlate) may import it.
package stats

import "slices"

// Median sorts xs in place and returns its median: the middle value, or
// the mean of the two middle values. xs must not be empty.
func Median(xs []float64) float64 {
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// MedianInt sorts xs in place and returns its median in integers: the
// middle value, or the mean of the two middle values truncated toward
// zero. xs must not be empty.
func MedianInt(xs []int64) int64 {
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// MedianIntFloat sorts xs in place and returns its median as a float64:
// the mean of the two middle values is not truncated (nanosecond lags
// reported in milliseconds). xs must not be empty.
func MedianIntFloat(xs []int64) float64 {
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return float64(xs[n/2])
	}
	return (float64(xs[n/2-1]) + float64(xs[n/2])) / 2
}

// LowerQuantile sorts xs in place and returns its q-quantile, q in [0, 1]:
// the lower of the two values around it (no interpolation, so the result
// is one of the samples). xs must not be empty.
func LowerQuantile(xs []float64, q float64) float64 {
	slices.Sort(xs)
	return xs[int(q*float64(len(xs)-1))]
}
