package export

import (
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/slowrank/slowrank/detector"
)

// A rank's placement (detector.Placement, from the job's topology) names it
// as the cluster does, on its train.step spans and on its per-rank metrics.
// The resource describes the exporter (the agent: its host.name and
// process.pid); these describe the rank, which is why they are span and
// data-point attributes and not resource attributes: one agent exports
// every rank of its node.

// Span attributes of a rank's placement: OpenTelemetry semantic-convention
// names where they exist (Kubernetes, container, host, process). Semantic
// conventions have no attribute for a process's GPU (hw.* describe a device
// as the subject of its own metrics) nor for Slurm, so those are slowrank.*.
// slowrank.device.* and not slowrank.gpu.*: slowrank.gpu is the step's
// "had device records" flag.
const (
	AttrK8sPodName       = semconv.K8SPodNameKey
	AttrK8sPodUID        = semconv.K8SPodUIDKey
	AttrK8sNamespace     = semconv.K8SNamespaceNameKey
	AttrK8sContainerName = semconv.K8SContainerNameKey
	AttrContainerID      = semconv.ContainerIDKey
	AttrHostName         = semconv.HostNameKey   // the rank's host (= slowrank.host)
	AttrProcessPID       = semconv.ProcessPIDKey // the rank's PID, as the agent's PID namespace numbers it
	AttrSlurmJobID       = attribute.Key("slowrank.slurm.job_id")
	AttrSlurmStepID      = attribute.Key("slowrank.slurm.step_id")
	AttrDeviceUUID       = attribute.Key("slowrank.device.uuid")
	AttrDeviceIndex      = attribute.Key("slowrank.device.index") // NVML index
	AttrDevicePCIBusID   = attribute.Key("slowrank.device.pci_bus_id")
)

// Metric attributes of a rank's placement: dcgm-exporter's label names and
// value forms, so that PromQL joins its series with slowrank's without
// label_replace (docs/deploy.md): `* on (UUID) group_left ...`. These keep
// their case through the OpenTelemetry-to-Prometheus translation. They
// identify the rank's place, fixed for the life of its process, so they add
// no series beyond the (job, rank, phase) ones; a rank whose GPU NVML finds
// after its first steps starts new histogram series with it.
const (
	KeyUUID      = attribute.Key("UUID")       // GPU UUID
	KeyGPU       = attribute.Key("gpu")        // NVML index, as a string ("3")
	KeyPCIBusID  = attribute.Key("pci_bus_id") // "00000000:3B:00.0"
	KeyHostname  = attribute.Key("Hostname")   // the rank's host (the node name)
	KeyPod       = attribute.Key("pod")
	KeyNamespace = attribute.Key("namespace")
	KeyContainer = attribute.Key("container")
	KeyHPCJob    = attribute.Key("hpc_job") // Slurm job id: dcgm-exporter's HPC job mapping label
)

// rankLabels are the metric attributes of one rank's placement; "" fields
// are left out. Comparable: part of the metric attribute cache's key.
type rankLabels struct {
	uuid, gpu, bus, host, pod, namespace, container, hpcJob string
}

func labelsOf(ri detector.RankInfo) rankLabels {
	l := rankLabels{host: ri.Host, pod: ri.K8s.PodName, namespace: ri.K8s.Namespace,
		container: ri.K8s.ContainerName, hpcJob: ri.Slurm.JobID}
	if g := ri.GPU; g.UUID != "" {
		l.uuid, l.gpu, l.bus = g.UUID, strconv.Itoa(g.Index), g.PCIBusID
	}
	return l
}

// appendTo appends the labels that are set.
func (l rankLabels) appendTo(kv []attribute.KeyValue) []attribute.KeyValue {
	for _, a := range [...]struct {
		k attribute.Key
		v string
	}{{KeyUUID, l.uuid}, {KeyGPU, l.gpu}, {KeyPCIBusID, l.bus}, {KeyHostname, l.host},
		{KeyPod, l.pod}, {KeyNamespace, l.namespace}, {KeyContainer, l.container}, {KeyHPCJob, l.hpcJob}} {
		if a.v != "" {
			kv = append(kv, a.k.String(a.v))
		}
	}
	return kv
}

// placementAttrs appends the span attributes of a rank's placement that
// are known.
func placementAttrs(kv []attribute.KeyValue, ri detector.RankInfo) []attribute.KeyValue {
	for _, a := range [...]struct {
		k attribute.Key
		v string
	}{{AttrK8sPodName, ri.K8s.PodName}, {AttrK8sPodUID, ri.K8s.PodUID}, {AttrK8sNamespace, ri.K8s.Namespace},
		{AttrK8sContainerName, ri.K8s.ContainerName}, {AttrContainerID, ri.ContainerID}, {AttrHostName, ri.Host},
		{AttrSlurmJobID, ri.Slurm.JobID}, {AttrSlurmStepID, ri.Slurm.StepID}} {
		if a.v != "" {
			kv = append(kv, a.k.String(a.v))
		}
	}
	if ri.PID > 0 {
		kv = append(kv, AttrProcessPID.Int(ri.PID))
	}
	if g := ri.GPU; g.UUID != "" {
		kv = append(kv, AttrDeviceUUID.String(g.UUID), AttrDeviceIndex.Int(g.Index))
		if g.PCIBusID != "" {
			kv = append(kv, AttrDevicePCIBusID.String(g.PCIBusID))
		}
	}
	return kv
}

// rankLabelsOf returns the metric labels of (job, rank) from the latest
// topology; zero when the topology does not list the rank.
func (e *Exporter) rankLabelsOf(job string, rank int) rankLabels {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ri, ok := e.topo[job][rank]; ok {
		return labelsOf(ri)
	}
	return rankLabels{}
}

// allRankLabels snapshots the labels of every rank of every job, for the
// gauges' collection (which must not hold e.mu while it observes).
func (e *Exporter) allRankLabels() map[string]map[int]rankLabels {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]map[int]rankLabels, len(e.topo))
	for job, ranks := range e.topo {
		m := make(map[int]rankLabels, len(ranks))
		for r, ri := range ranks {
			m[r] = labelsOf(ri)
		}
		out[job] = m
	}
	return out
}
