package identity

import (
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/slowrank/slowrank/detector"
)

// A rank's placement is where it runs as the cluster names it: pod and
// container (Kubernetes), job step (Slurm), GPU (NVML). It reaches the
// topology fact through correlate.RankInfo, and from there the spans and
// metrics (otel) that carry it, so that they join with what the cluster's
// other tools report.
//
// The Kubernetes API is not asked: the agent has no service account token
// (docs/deploy.md), and an informer would cost a watch of every pod of the
// node for names that the pod's own environment can carry. The pod template
// sets them through the downward API (docs/deploy.md section 2.2).

// Variables that carry a pod's names, first set wins; after them come the
// semantic-convention keys of OTEL_RESOURCE_ATTRIBUTES (which the
// OpenTelemetry operator's injection sets).
var (
	podNameVars       = []string{"POD_NAME", "K8S_POD_NAME"}
	podNamespaceVars  = []string{"POD_NAMESPACE", "K8S_POD_NAMESPACE"}
	podUIDVars        = []string{"POD_UID", "K8S_POD_UID"}
	containerNameVars = []string{"CONTAINER_NAME", "K8S_CONTAINER_NAME"}
	// SLURM_STEPID is the older name of SLURM_STEP_ID.
	slurmStepVars = []string{"SLURM_STEP_ID", "SLURM_STEPID"}
)

const otelResourceVar = "OTEL_RESOURCE_ATTRIBUTES"

// maxNameLen bounds a name taken from a process: a Kubernetes object name
// (a DNS subdomain) has at most 253 bytes, and the aggregator refuses a
// topology with a string over 256.
const maxNameLen = 253

// placementFromEnv fills the names of id that the environment gives.
func placementFromEnv(id *Identity, env map[string]string) {
	res := parseResourceAttrs(env[otelResourceVar])
	id.PodName = firstName(env, podNameVars, res["k8s.pod.name"])
	id.Namespace = firstName(env, podNamespaceVars, res["k8s.namespace.name"])
	id.PodUID = firstName(env, podUIDVars, res["k8s.pod.uid"])
	if !isUUID(id.PodUID) {
		id.PodUID = ""
	}
	id.ContainerName = firstName(env, containerNameVars, res["k8s.container.name"])
	id.Hostname = CleanName(env["HOSTNAME"])
	id.SlurmJobID = CleanName(env["SLURM_JOB_ID"])
	id.SlurmStepID = firstName(env, slurmStepVars, "")
}

// WithCgroup takes the container id and pod UID from the process's cgroup,
// which the runtime named: the cgroup's pod UID wins over the environment's.
func (id *Identity) WithCgroup(cg Cgroup) {
	id.ContainerID = cg.ContainerID
	if cg.PodUID != "" {
		id.PodUID, id.inPod = cg.PodUID, true
	}
}

// Placement is what the topology carries of id. host is the node's name
// (the agent's HostName): HOSTNAME names the pod only in a pod (its cgroup
// named one: the environment alone could be anywhere), when no variable
// named it, and when it is not the node's name (a pod in the host's network
// has the node's HOSTNAME).
func (id Identity) Placement(host string) detector.Placement {
	p := detector.Placement{
		K8s:         detector.K8sPod{PodName: id.PodName, PodUID: id.PodUID, Namespace: id.Namespace, ContainerName: id.ContainerName},
		ContainerID: id.ContainerID,
		Slurm:       detector.SlurmStep{JobID: id.SlurmJobID, StepID: id.SlurmStepID},
	}
	if p.K8s.PodName == "" && id.inPod && id.Hostname != "" && id.Hostname != host {
		p.K8s.PodName = id.Hostname
	}
	if !id.inPod && p.K8s.PodName == "" && p.K8s.PodUID == "" {
		// A namespace or container name and no pod at all: not
		// Kubernetes's (CONTAINER_NAME is a common variable elsewhere).
		p.K8s = detector.K8sPod{}
	}
	return p
}

// firstName returns the first of vars that holds a usable name, else
// fallback if usable, else "".
func firstName(env map[string]string, vars []string, fallback string) string {
	for _, k := range vars {
		if v := CleanName(env[k]); v != "" {
			return v
		}
	}
	return CleanName(fallback)
}

// CleanName returns s without surrounding blanks when it is a usable name:
// valid UTF-8, no control characters, at most maxNameLen bytes; else "".
// The environment is the process's, any bytes it likes.
func CleanName(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > maxNameLen || !utf8.ValidString(s) {
		return ""
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return ""
		}
	}
	return s
}

// parseResourceAttrs returns the k8s.* pairs of an OTEL_RESOURCE_ATTRIBUTES
// value: comma-separated key=value, values percent-encoded (the
// OpenTelemetry SDK's format). Malformed pairs are skipped; the first of a
// key wins.
func parseResourceAttrs(s string) map[string]string {
	if s == "" {
		return nil
	}
	m := map[string]string{}
	for pair := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(pair, "=")
		k = strings.TrimSpace(k)
		if !ok || !strings.HasPrefix(k, "k8s.") {
			continue
		}
		if _, dup := m[k]; dup {
			continue
		}
		if u, err := url.PathUnescape(strings.TrimSpace(v)); err == nil {
			m[k] = u
		}
	}
	return m
}
