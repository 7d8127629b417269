package gpu

import (
	"errors"
	"os"
	"testing"
	"time"
)

func TestOpenNVMLWithoutLibrary(t *testing.T) {
	for _, dir := range []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"} {
		if _, err := os.Stat(dir + "/libnvidia-ml.so.1"); err == nil {
			t.Skip("libnvidia-ml.so.1 is installed")
		}
	}
	start := time.Now()
	n, err := OpenNVML()
	if !errors.Is(err, ErrNVMLUnavailable) || n != nil {
		t.Fatalf("OpenNVML = %v, %v; want ErrNVMLUnavailable", n, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("OpenNVML took %v", d)
	}
	t.Log(err)
	// A second attempt fails the same way (no state left behind).
	if _, err := OpenNVML(); !errors.Is(err, ErrNVMLUnavailable) {
		t.Errorf("second OpenNVML: %v", err)
	}
}
