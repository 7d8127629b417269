//go:build !cgo

package gpu

import "fmt"

// NVML is an initialised NVML library. This build has no cgo, hence no NVML.
type NVML struct{}

// OpenNVML fails with ErrNVMLUnavailable: NVML needs cgo.
func OpenNVML() (*NVML, error) {
	return nil, fmt.Errorf("open nvml: built without cgo: %w", ErrNVMLUnavailable)
}

// Close does nothing.
func (n *NVML) Close() error { return nil }

// GPUProcesses fails with ErrNVMLUnavailable.
func (n *NVML) GPUProcesses() (map[int][]Process, error) {
	return nil, fmt.Errorf("nvml processes: %w", ErrNVMLUnavailable)
}

// Sample fails with ErrNVMLUnavailable.
func (n *NVML) Sample(int64) ([]Sample, error) {
	return nil, fmt.Errorf("nvml sample: %w", ErrNVMLUnavailable)
}
