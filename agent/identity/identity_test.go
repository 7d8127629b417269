package identity

import (
	"reflect"
	"testing"
)

func TestParseEnviron(t *testing.T) {
	all := func(string) bool { return true }
	tests := []struct {
		name string
		data string
		keep func(string) bool
		want map[string]string
	}{
		{"empty", "", all, map[string]string{}},
		{"plain", "A=1\x00B=two\x00", all, map[string]string{"A": "1", "B": "two"}},
		{"no final NUL", "A=1\x00B=2", all, map[string]string{"A": "1", "B": "2"}},
		{"first wins", "A=1\x00A=2\x00", all, map[string]string{"A": "1"}},
		{"equals in value", "A=x=y==\x00", all, map[string]string{"A": "x=y=="}},
		{"empty value", "A=\x00", all, map[string]string{"A": ""}},
		{"no equals, empty key, empty entries", "NOEQ\x00=v\x00\x00\x00B=1\x00", all, map[string]string{"B": "1"}},
		{"odd bytes kept", "A=\xff\xfe\x01\n\x00\xc3\x28=\x80\x00", all, map[string]string{"A": "\xff\xfe\x01\n", "\xc3\x28": "\x80"}},
		{"filter", "SECRET=x\x00RANK=3\x00", func(k string) bool { return k == "RANK" }, map[string]string{"RANK": "3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ParseEnviron([]byte(tt.data), tt.keep); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestIdentityFromEnv(t *testing.T) {
	unknown := Identity{Rank: Unknown, LocalRank: Unknown, WorldSize: Unknown, GroupRank: Unknown, LocalWorldSize: Unknown}
	with := func(f func(*Identity)) Identity { id := unknown; f(&id); return id }
	tests := []struct {
		name string
		env  map[string]string
		want Identity
	}{
		{"nothing", map[string]string{}, unknown},
		{
			name: "torchrun",
			env: map[string]string{"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "GROUP_RANK": "1",
				"LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "j1", "MASTER_ADDR": "h0", "MASTER_PORT": "29500",
				"SLURM_JOB_ID": "99", "SLURM_PROCID": "0", "CUDA_VISIBLE_DEVICES": "1"},
			want: Identity{Rank: 3, LocalRank: 1, WorldSize: 4, GroupRank: 1, LocalWorldSize: 2, RankSource: "RANK",
				RunID: "j1", MasterAddr: "h0", MasterPort: "29500", JobID: "j1", JobIDSource: "TORCHELASTIC_RUN_ID",
				VisibleDevices: "1", SlurmJobID: "99"},
		},
		{
			name: "run id none falls through to slurm",
			env:  map[string]string{"RANK": "0", "TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "12345"},
			want: with(func(id *Identity) {
				id.Rank, id.RankSource, id.RunID, id.JobID, id.JobIDSource = 0, "RANK", "none", "12345", "SLURM_JOB_ID"
				id.SlurmJobID = "12345"
			}),
		},
		{
			name: "operator override",
			env:  map[string]string{"SLOWRANK_JOB_ID": "llama-70b", "TORCHELASTIC_RUN_ID": "j1"},
			want: with(func(id *Identity) { id.RunID, id.JobID, id.JobIDSource = "j1", "llama-70b", "SLOWRANK_JOB_ID" }),
		},
		{
			name: "slurm without RANK",
			env:  map[string]string{"SLURM_PROCID": "7", "SLURM_LOCALID": "3", "SLURM_NTASKS": "16", "SLURM_JOB_ID": "5"},
			want: with(func(id *Identity) {
				id.Rank, id.RankSource, id.LocalRank, id.WorldSize, id.JobID, id.JobIDSource = 7, "SLURM_PROCID", 3, 16, "5", "SLURM_JOB_ID"
				id.SlurmJobID = "5"
			}),
		},
		{
			name: "open mpi before slurm",
			env: map[string]string{"OMPI_COMM_WORLD_RANK": "2", "SLURM_PROCID": "9", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
				"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
			want: with(func(id *Identity) {
				id.Rank, id.RankSource, id.LocalRank, id.WorldSize, id.LocalWorldSize = 2, "OMPI_COMM_WORLD_RANK", 0, 4, 2
			}),
		},
		{
			name: "pmi",
			env:  map[string]string{"PMI_RANK": "1", "PMI_SIZE": "2"},
			want: with(func(id *Identity) { id.Rank, id.RankSource, id.WorldSize = 1, "PMI_RANK", 2 }),
		},
		{
			name: "unparsable RANK falls back",
			env:  map[string]string{"RANK": "x", "PMI_RANK": "4", "WORLD_SIZE": "-1"},
			want: with(func(id *Identity) { id.Rank, id.RankSource = 4, "PMI_RANK" }),
		},
		{
			name: "kubeflow pytorchjob pod name",
			env: map[string]string{"RANK": "1", "HOSTNAME": "bert-large-worker-0", "KUBERNETES_SERVICE_HOST": "10.96.0.1",
				"MASTER_ADDR": "bert-large-master-0", "MASTER_PORT": "23456"},
			want: with(func(id *Identity) {
				id.Rank, id.RankSource, id.MasterAddr, id.MasterPort, id.JobID, id.JobIDSource = 1, "RANK", "bert-large-master-0", "23456", "bert-large", "HOSTNAME"
				id.Hostname = "bert-large-worker-0"
			}),
		},
		{
			name: "hostname outside kubernetes is no job",
			env:  map[string]string{"HOSTNAME": "node-worker-3", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"},
			want: with(func(id *Identity) {
				id.MasterAddr, id.MasterPort, id.JobID, id.JobIDSource = "10.0.0.1", "29500", "10.0.0.1:29500", "MASTER_ADDR:MASTER_PORT"
				id.Hostname = "node-worker-3"
			}),
		},
		{
			name: "jobset before hostname",
			env:  map[string]string{"JOBSET_NAME": "trainjob-a", "HOSTNAME": "x-worker-0", "KUBERNETES_SERVICE_HOST": "h"},
			want: with(func(id *Identity) { id.JobID, id.JobIDSource, id.Hostname = "trainjob-a", "JOBSET_NAME", "x-worker-0" }),
		},
		{
			name: "torchx",
			env:  map[string]string{"TORCHX_JOB_ID": "kubernetes://session/app-123", "JOB_NAME": "n"},
			want: with(func(id *Identity) { id.JobID, id.JobIDSource = "kubernetes://session/app-123", "TORCHX_JOB_ID" }),
		},
		{
			name: "lsf",
			env:  map[string]string{"LSB_JOBID": "4711", "PBS_JOBID": "1.pbs"},
			want: with(func(id *Identity) { id.JobID, id.JobIDSource = "4711", "LSB_JOBID" }),
		},
		{
			name: "our injection library",
			env:  map[string]string{"CUDA_INJECTION64_PATH": "/opt/slowrank/lib/libslowrank_cupti.so"},
			want: with(func(id *Identity) { id.InjectionPath, id.Injected = "/opt/slowrank/lib/libslowrank_cupti.so", true }),
		},
		{
			name: "another injection library",
			env:  map[string]string{"CUDA_INJECTION64_PATH": "/usr/lib/libnsys_inject.so"},
			want: with(func(id *Identity) { id.InjectionPath = "/usr/lib/libnsys_inject.so" }),
		},
		{
			name: "the NCCL profiler plugin is kept as given",
			env:  map[string]string{"NCCL_PROFILER_PLUGIN": "inspector"},
			want: with(func(id *Identity) { id.ProfilerPlugin = "inspector" }),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := FromEnv(tt.env); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}
