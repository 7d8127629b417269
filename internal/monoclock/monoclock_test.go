package monoclock

import (
	"testing"
	"time"
)

func TestNowAdvancesAndMapsToWallTime(t *testing.T) {
	a := Now()
	time.Sleep(time.Millisecond)
	b := Now()
	if b <= a {
		t.Fatalf("CLOCK_MONOTONIC went from %d to %d", a, b)
	}
	wall := WallMapper()(Now())
	if d := time.Since(wall); d < -time.Second || d > time.Second {
		t.Fatalf("now mapped to %v, %v off the wall clock", wall, d)
	}
}
