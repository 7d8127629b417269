package pipeline

import (
	"testing"

	"github.com/slowrank/slowrank/correlate"
)

// counts is a Config.Count that tests read back.
type counts map[string]int64

func (c counts) add(name string, n int64) { c[name] += n }

func TestInputCarriesItsRecordInlineOrBoxed(t *testing.T) {
	h := correlate.HostCall{PID: 1, Op: "allreduce"}
	d := correlate.DeviceInterval{PID: 2, Name: "k"}
	o := correlate.CommInit{PID: 3}
	tests := []struct {
		name      string
		in        Input
		want      any
		host, dev bool
	}{
		{"host call", HostInput(h), h, true, false},
		{"device interval", DeviceInput(d), d, false, true},
		{"other record", OtherInput(o), o, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.in.value(); got != tt.want {
				t.Errorf("value() = %#v, want %#v", got, tt.want)
			}
			if _, ok := tt.in.HostCall(); ok != tt.host {
				t.Errorf("HostCall ok = %v", ok)
			}
			if _, ok := tt.in.Device(); ok != tt.dev {
				t.Errorf("Device ok = %v", ok)
			}
			if got := tt.in.Other(); (got != nil) != (!tt.host && !tt.dev) {
				t.Errorf("Other() = %#v", got)
			}
		})
	}
}
