package forward

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test closes its forwarders: no goroutine may outlive the package's
// tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
