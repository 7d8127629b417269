package export

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test shuts its exporters and writers down: no goroutine may outlive
// the package's tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
