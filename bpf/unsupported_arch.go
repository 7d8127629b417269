//go:build !386 && !amd64

package bpf

import (
	"fmt"

	"github.com/cilium/ebpf"
)

// The probes read arguments per the x86-64 SysV ABI; other architectures
// build (so the agent compiles everywhere) but Load reports ErrNotSupported.
func loadSlowrank() (*ebpf.CollectionSpec, error) {
	return nil, fmt.Errorf("slowrank probes support x86-64 only: %w", ErrNotSupported)
}
