package pipeline

import "github.com/slowrank/slowrank/correlate"

// Input is one record from the agent's reader goroutine to the pipeline.
// Host calls and device intervals, the records that come by the hundred
// thousand per second, travel inline: boxing each in an interface allocated
// per record, and that allocation and its garbage were most of the agent's
// CPU. Everything else is boxed in other.
type Input struct {
	kind  inputKind
	host  correlate.HostCall
	dev   correlate.DeviceInterval
	other any
}

type inputKind uint8

const (
	inputOther inputKind = iota
	inputHost
	inputDevice
)

// HostInput carries a host call.
func HostInput(h correlate.HostCall) Input { return Input{kind: inputHost, host: h} }

// DeviceInput carries a device interval.
func DeviceInput(d correlate.DeviceInterval) Input { return Input{kind: inputDevice, dev: d} }

// OtherInput carries any other record: correlate.CommInit, CommDestroy,
// CollKernel, Coverage, Drop, RankInfo, a PluginPath, or a record of the agent's own
// that it takes out of the batch before feeding it (Other).
func OtherInput(v any) Input { return Input{other: v} }

// HostCall returns the host call an input carries, if it carries one.
func (in Input) HostCall() (correlate.HostCall, bool) { return in.host, in.kind == inputHost }

// Device returns the device interval an input carries, if it carries one.
func (in Input) Device() (correlate.DeviceInterval, bool) { return in.dev, in.kind == inputDevice }

// Other returns the boxed record of an OtherInput, nil for the inline kinds
// (without boxing them: the agent looks at every input on its hot path).
func (in Input) Other() any { return in.other }

// value returns the record boxed (for the event dump and tests).
func (in Input) value() any {
	switch in.kind {
	case inputHost:
		return in.host
	case inputDevice:
		return in.dev
	}
	return in.other
}

// PluginPath tells the pipeline that a process's collectives come from the
// NCCL plugin from now on: its inputs are reordered (reorder.go). The
// agent's converter sends it, in order with the records, when it switches
// the process from the uprobes to the plugin.
type PluginPath struct{ PID uint32 }

// forget is what the event dump shows of Pipeline.Forget.
type forget struct {
	pid  uint32
	rank int
}
