package detector_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/slowrank/slowrank/detector"
)

func TestDecodeFact(t *testing.T) {
	tests := []struct {
		name, line, wantErr string
	}{
		{"contract step", `{"kind":"step","job":"j1","topo":1,"rank":3,"step":120,"host":"h0","start_ns":1000000,"end_ns":27000000,"phases":{"step":26.0,"compute":21.2,"host":3.1,"sync_wait":18.0,"comm":2.0},"gpu":true,"workload":{"fp":"9f2c01aa","tokens":8192}}`, ""},
		{"contract topology", `{"kind":"topology","job":"j1","version":1,"ranks":[{"rank":0,"host":"h0","local_rank":0,"pid":4242}],"groups":[{"id":"dp0","type":"dp","ranks":[0,1,2,3]}]}`, ""},
		{"unknown fields are accepted", `{"kind":"step","job":"j","rank":0,"step":1,"end_ns":5,"phases":{},"future":[1,2]}`, ""},
		{"unknown kind", `{"kind":"marker","job":"j"}`, "unknown fact kind"},
		{"missing kind", `{"job":"j"}`, `missing field "kind"`},
		{"not json", `hello`, "not a JSON object"},
		{"missing end", `{"kind":"step","job":"j","rank":0,"step":1,"phases":{}}`, `missing field "end_ns"`},
		{"wrong type", `{"kind":"step","job":"j","rank":"zero","step":1,"end_ns":1,"phases":{}}`, `field "rank"`},
		{"negative phase", `{"kind":"step","job":"j","rank":0,"step":1,"end_ns":1,"phases":{"compute":-2}}`, "non-negative"},
		{"end before start", `{"kind":"step","job":"j","rank":0,"step":1,"start_ns":9,"end_ns":1,"phases":{}}`, "before start_ns"},
		{"trailing data", `{"kind":"step","job":"j","rank":0,"step":1,"end_ns":1,"phases":{}} {}`, "after top-level value"},
		{"group without id", `{"kind":"topology","job":"j","version":1,"groups":[{"type":"dp","ranks":[0]}]}`, "without"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := detector.DecodeFact([]byte(tc.line))
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("unexpected error %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
	if _, err := detector.DecodeFact([]byte(`{"kind":"x"}`)); !errors.Is(err, detector.ErrUnknownKind) {
		t.Errorf("unknown kind is not ErrUnknownKind: %v", err)
	}
}

// FuzzDecodeFact checks that no input crashes the decoder and that every
// accepted step can be judged by the detector without error.
func FuzzDecodeFact(f *testing.F) {
	for _, s := range []string{
		`{"kind":"step","job":"j1","topo":1,"rank":3,"step":120,"host":"h0","start_ns":1000000,"end_ns":27000000,"phases":{"compute":21.2},"gpu":true,"workload":{"fp":"9f2c01aa","tokens":8192}}`,
		`{"kind":"topology","job":"j1","version":1,"groups":[{"id":"dp0","type":"dp","ranks":[0,1]}]}`,
		`{"kind":"step","job":"j","rank":0,"step":1,"end_ns":-9223372036854775808,"phases":{"x":1e308}}`,
		`{"kind":"step","job":"j","rank":2147483648,"step":1,"end_ns":1,"phases":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		fact, err := detector.DecodeFact(line)
		if err != nil {
			return
		}
		d, _ := detector.New(detector.DefaultConfig())
		switch v := fact.(type) {
		case *detector.Step:
			if _, err := d.AddStep(*v); err != nil {
				t.Fatalf("decoded step rejected by the detector: %v", err)
			}
			d.Flush()
		case *detector.Topology:
			if err := d.AddTopology(*v); err != nil {
				t.Fatalf("decoded topology rejected: %v", err)
			}
		}
	})
}
