package detector_test

import (
	"encoding/json"
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

// The placement of a rank sits flat in its topology entry and is absent when
// unknown, so that a topology without one encodes exactly as before.
func TestRankPlacementJSON(t *testing.T) {
	bare := detector.RankInfo{Rank: 1, Host: "h0", LocalRank: 1, PID: 42}
	placed := bare
	placed.Placement = detector.Placement{
		K8s:         detector.K8sPod{PodName: "p-1", PodUID: "6f1c0e4a-2b8d-4c7e-9a51-3d2f8b7e1c90", Namespace: "ns", ContainerName: "c"},
		ContainerID: "ab12",
		Slurm:       detector.SlurmStep{JobID: "77", StepID: "0"},
		GPU:         detector.RankGPU{Index: 0, UUID: "GPU-1", PCIBusID: "00000000:18:00.0"},
	}
	tests := []struct {
		name string
		info detector.RankInfo
		want string
	}{
		{"without placement", bare, `{"rank":1,"host":"h0","local_rank":1,"pid":42}`},
		{"with placement", placed, `{"rank":1,"host":"h0","local_rank":1,"pid":42,` +
			`"k8s":{"pod_name":"p-1","pod_uid":"6f1c0e4a-2b8d-4c7e-9a51-3d2f8b7e1c90","namespace":"ns","container_name":"c"},` +
			`"container_id":"ab12","slurm":{"job_id":"77","step_id":"0"},"gpu":{"index":0,"uuid":"GPU-1","pci_bus_id":"00000000:18:00.0"}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			topo := detector.Topology{Kind: detector.KindTopology, Job: "j", Version: 1, Ranks: []detector.RankInfo{tc.info}}
			line, err := json.Marshal(topo)
			if err != nil {
				t.Fatal(err)
			}
			want := `{"kind":"topology","job":"j","version":1,"ranks":[` + tc.want + `]}`
			if string(line) != want {
				t.Fatalf("encoded\n%s\nwant\n%s", line, want)
			}
			got, err := detector.DecodeFact(line)
			if err != nil {
				t.Fatal(err)
			}
			if r := got.(*detector.Topology).Ranks[0]; r != tc.info {
				t.Fatalf("decoded %+v, want %+v", r, tc.info)
			}
		})
	}
}
