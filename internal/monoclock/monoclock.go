// Package monoclock reads CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns
// and so of every fact's *_ns, and maps it onto wall-clock time for what
// leaves the process with a wall-clock timestamp (spans, log records). It
// imports no slowrank package.
package monoclock

import (
	"time"

	"golang.org/x/sys/unix"
)

// Now reads CLOCK_MONOTONIC (wall-clock ns in the impossible case that the
// clock cannot be read).
func Now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return time.Now().UnixNano()
	}
	return ts.Nano()
}

// WallMapper maps CLOCK_MONOTONIC onto wall-clock time with the offset
// between the two clocks now.
func WallMapper() func(int64) time.Time {
	mono := Now()
	wall := time.Now().UnixNano()
	off := wall - mono
	return func(ns int64) time.Time { return time.Unix(0, ns+off) }
}
