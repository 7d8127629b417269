package agent

import (
	"context"
	"errors"

	"github.com/slowrank/slowrank/agent/localapi"
)

// The agent's side of its local endpoint (package localapi, which owns the
// listeners, their security and the HTTP handlers): what GET /status
// reports and how POST /control's outcomes are classified.

// Controller is what the local endpoint needs of an agent; *Agent
// implements it.
type Controller interface {
	// Status is safe to call from any goroutine.
	Status() Status
	ControlState(ctx context.Context) (ControlState, error)
	Control(ctx context.Context, req ControlRequest) (ControlState, error)
}

// ControlResponse is the body of a /control answer.
type ControlResponse = localapi.ControlResponse[ControlState]

// LocalAPI adapts ctl to the local endpoint: GET /status answers a
// StatusReport carrying version and, when export is not nil, the outputs'
// health; POST /control takes a ControlRequest. Serve it with
// localapi.NewServer or localapi.NewHandler.
func LocalAPI(ctl Controller, version string, export func() ExportHealth) localapi.Backend[ControlRequest, ControlState] {
	return &endpoint{ctl: ctl, version: version, export: export}
}

type endpoint struct {
	ctl     Controller
	version string
	export  func() ExportHealth
}

// Report builds the status report; the control state waits for the agent
// until ctx is done (the handler bounds it).
func (e *endpoint) Report(ctx context.Context) any {
	rep := StatusReport{Status: e.ctl.Status(), Version: e.version}
	if cs, err := e.ctl.ControlState(ctx); err == nil {
		rep.Control = &cs
		if cs.Paused {
			rep.DeviceState = "paused"
		}
	} else {
		rep.ControlError = err.Error()
	}
	if e.export != nil {
		h := e.export()
		rep.Export = &h
	}
	return rep
}

// Control applies req; the errors of Agent.Control that are the client's
// to fix are marked for the endpoint's status codes.
func (e *endpoint) Control(ctx context.Context, req ControlRequest) (ControlState, error) {
	st, err := e.ctl.Control(ctx, req)
	switch {
	case errors.Is(err, ErrInvalidControl):
		err = localapi.Refused(err, localapi.ErrBadRequest)
	case errors.Is(err, ErrSwapInProgress), errors.Is(err, ErrNoDeviceCollection):
		err = localapi.Refused(err, localapi.ErrConflict)
	}
	return st, err
}
