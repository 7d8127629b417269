package identity

import (
	"bytes"
	"path"
	"regexp"
	"strconv"
	"strings"
)

// InjectionLibraryName is the file name of slowrank's CUPTI injection
// library: Identity.Injected says whether CUDA_INJECTION64_PATH names it.
const InjectionLibraryName = "libslowrank_cupti.so"

// Unknown is the value of an Identity number that the environment did not give.
const Unknown = -1

// Identity is what a training process's environment says about its place in the job. Numbers
// the environment does not give (or gives unparsable) are Unknown, never 0.
type Identity struct {
	Rank           int    // global rank
	LocalRank      int    // rank on this host
	WorldSize      int    // number of ranks
	GroupRank      int    // torchelastic node (agent group) rank
	LocalWorldSize int    // ranks on this host
	RankSource     string // variable Rank came from: RANK, OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID

	RunID      string // TORCHELASTIC_RUN_ID (torchrun --rdzv-id; "none" when not given)
	MasterAddr string // MASTER_ADDR
	MasterPort string // MASTER_PORT

	// JobID names the job so that every rank on every host gets the same string; JobIDSource
	// says which variable gave it (see jobIDSources for the precedence), "MASTER_ADDR:MASTER_PORT"
	// for the fallback, "" when nothing did (JobID is then "").
	JobID       string
	JobIDSource string

	// VisibleDevices is CUDA_VISIBLE_DEVICES as given ("" when unset).
	VisibleDevices string
	// InjectionPath is CUDA_INJECTION64_PATH; Injected is true when its basename is
	// libslowrank_cupti.so, that is when CUDA will load our injection library.
	InjectionPath string
	Injected      bool
	// ProfilerPlugin is NCCL_PROFILER_PLUGIN as given ("" when unset, which
	// NCCL takes as libnccl-profiler.so): which NCCL profiler plugin, if
	// any, the process's NCCL loads (doctor's capture path).
	ProfilerPlugin string

	// Where the process runs as the cluster names it (placement.go), ""
	// when not known. The names come from the downward-API environment
	// (podVars) and are the process's own claim; PodUID and ContainerID
	// come from its cgroup where it names them (cgroup.go), which the
	// process cannot choose, and else PodUID from the environment.
	PodName, PodUID, Namespace, ContainerName string
	ContainerID                               string
	// Hostname is HOSTNAME: in a pod the pod's name unless the pod sets
	// spec.hostname or runs in the host's network.
	Hostname string
	// SlurmJobID and SlurmStepID are SLURM_JOB_ID and SLURM_STEP_ID.
	SlurmJobID, SlurmStepID string
	// inPod: the cgroup named a pod (PodUID is then the cgroup's).
	inPod bool
}

// jobIDSources is the job id precedence, first wins:
//
//  1. SLOWRANK_JOB_ID: set by the operator, overrides everything.
//  2. TORCHELASTIC_RUN_ID: torchrun's rendezvous id, shared by exactly the ranks of one run
//     on every node and kept across elastic restarts; ignored when "none" (torchrun's default
//     when --rdzv-id is not given).
//  3. TORCHX_JOB_ID: the TorchX application handle.
//  4. JOBSET_NAME: Kubernetes JobSet (Kubeflow Trainer v2 TrainJob).
//  5. the PyTorchJob/MPIJob name: the pod hostname "<job>-master-N" or "<job>-worker-N"
//     (Kubeflow Training Operator v1), only inside Kubernetes (KUBERNETES_SERVICE_HOST set).
//  6. JOB_NAME: a generic job name that several launchers set.
//  7. SLURM_JOB_ID, then LSB_JOBID (LSF), then PBS_JOBID (PBS/Torque).
//  8. MASTER_ADDR:MASTER_PORT, the rendezvous endpoint shared by all ranks.
//
// Rendezvous and launcher ids come before batch job ids because one batch allocation may run
// several training runs (several srun steps, a sweep).
var jobIDSources = []string{
	"SLOWRANK_JOB_ID",
	"TORCHELASTIC_RUN_ID",
	"TORCHX_JOB_ID",
	"JOBSET_NAME",
	"HOSTNAME",
	"JOB_NAME",
	"SLURM_JOB_ID",
	"LSB_JOBID",
	"PBS_JOBID",
}

// Rank variables by precedence; the others are fallbacks of launchers that do not set RANK.
var (
	rankVars           = []string{"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}
	localRankVars      = []string{"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}
	worldSizeVars      = []string{"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}
	localWorldSizeVars = []string{"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}
	groupRankVars      = []string{"GROUP_RANK"}
)

// vars is every variable FromEnv reads; ParseEnviron keeps only these (and the
// selector's key), so that no other part of a process's environment, secrets included, is kept.
var vars = func() map[string]bool {
	m := map[string]bool{
		"MASTER_ADDR": true, "MASTER_PORT": true, "CUDA_VISIBLE_DEVICES": true,
		"CUDA_INJECTION64_PATH": true, "KUBERNETES_SERVICE_HOST": true, "NCCL_PROFILER_PLUGIN": true,
	}
	for _, l := range [][]string{jobIDSources, rankVars, localRankVars, worldSizeVars, localWorldSizeVars, groupRankVars,
		podNameVars, podNamespaceVars, podUIDVars, containerNameVars, slurmStepVars, {otelResourceVar}} {
		for _, k := range l {
			m[k] = true
		}
	}
	return m
}()

// IsVar reports whether FromEnv reads key: Discover keeps only these
// variables of a process's environment (and the selector's key).
func IsVar(key string) bool { return vars[key] }

// ParseEnviron parses the content of /proc/PID/environ (NUL-separated KEY=VALUE entries) and
// returns the entries whose key keep accepts. The first entry of a key wins, as getenv(3) does;
// entries without "=" or with an empty key are skipped; bytes are kept as they are (values are
// not required to be UTF-8). A missing final NUL (environ truncated) is accepted.
func ParseEnviron(data []byte, keep func(key string) bool) map[string]string {
	env := make(map[string]string)
	for len(data) > 0 {
		entry := data
		if i := bytes.IndexByte(data, 0); i >= 0 {
			entry, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		k, v, ok := bytes.Cut(entry, []byte{'='})
		if !ok || len(k) == 0 || !keep(string(k)) {
			continue
		}
		if _, dup := env[string(k)]; dup {
			continue
		}
		env[string(k)] = string(v)
	}
	return env
}

// pytorchJobPod matches the pod names of Kubeflow PyTorchJob and MPIJob replicas.
var pytorchJobPod = regexp.MustCompile(`^(.+)-(?:master|worker|launcher)(?:-[0-9]+)?$`)

// FromEnv derives an Identity from environment variables.
func FromEnv(env map[string]string) Identity {
	id := Identity{
		MasterAddr:     env["MASTER_ADDR"],
		MasterPort:     env["MASTER_PORT"],
		RunID:          env["TORCHELASTIC_RUN_ID"],
		VisibleDevices: env["CUDA_VISIBLE_DEVICES"],
		InjectionPath:  env["CUDA_INJECTION64_PATH"],
		ProfilerPlugin: env["NCCL_PROFILER_PLUGIN"],
	}
	id.Rank, id.RankSource = firstInt(env, rankVars)
	id.LocalRank, _ = firstInt(env, localRankVars)
	id.WorldSize, _ = firstInt(env, worldSizeVars)
	id.LocalWorldSize, _ = firstInt(env, localWorldSizeVars)
	id.GroupRank, _ = firstInt(env, groupRankVars)
	id.Injected = id.InjectionPath != "" && path.Base(id.InjectionPath) == InjectionLibraryName
	id.JobID, id.JobIDSource = jobID(env)
	placementFromEnv(&id, env)
	return id
}

func jobID(env map[string]string) (id, source string) {
	for _, k := range jobIDSources {
		v := strings.TrimSpace(env[k])
		switch {
		case v == "":
			continue
		case k == "TORCHELASTIC_RUN_ID" && v == "none":
			continue
		case k == "HOSTNAME":
			if env["KUBERNETES_SERVICE_HOST"] == "" {
				continue
			}
			m := pytorchJobPod.FindStringSubmatch(v)
			if m == nil {
				continue
			}
			v = m[1]
		}
		return v, k
	}
	if a, p := env["MASTER_ADDR"], env["MASTER_PORT"]; a != "" && p != "" {
		return a + ":" + p, "MASTER_ADDR:MASTER_PORT"
	}
	return "", ""
}

// firstInt returns the first of vars that is set, parsed as a non-negative int, and its name;
// Unknown and "" when none is. A variable that is set but does not parse counts as not set.
func firstInt(env map[string]string, vars []string) (int, string) {
	for _, k := range vars {
		v, ok := env[k]
		if !ok {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 {
			continue
		}
		return n, k
	}
	return Unknown, ""
}
