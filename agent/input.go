package agent

import "github.com/slowrank/slowrank/correlate"

// input is one record from the reader goroutine to the pipeline. Host calls
// and device intervals, the records that come by the hundred thousand per
// second, travel inline: boxing each in an interface allocated per record,
// and that allocation and its garbage were most of the agent's CPU.
// Everything else is boxed in other.
type input struct {
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

func hostInput(h correlate.HostCall) input         { return input{kind: inputHost, host: h} }
func deviceInput(d correlate.DeviceInterval) input { return input{kind: inputDevice, dev: d} }
func otherInput(v any) input                       { return input{other: v} }

// value returns the record boxed (for the event dump and tests).
func (in input) value() any {
	switch in.kind {
	case inputHost:
		return in.host
	case inputDevice:
		return in.dev
	}
	return in.other
}

// batchPool recycles full input batches between the reader goroutine and
// the main goroutine, so that steady high rates allocate none.
type batchPool chan []input

func newBatchPool() batchPool { return make(batchPool, 16) }

// get returns an empty batch of capacity inputBatch.
func (p batchPool) get() []input {
	select {
	case b := <-p:
		return b[:0]
	default:
		return make([]input, 0, inputBatch)
	}
}

// put takes back a batch that get made; smaller ones are left to the GC.
func (p batchPool) put(b []input) {
	if cap(b) != inputBatch {
		return
	}
	clear(b) // release the strings and boxed records it points to
	select {
	case p <- b[:0]:
	default:
	}
}
