package identity

import (
	"testing"

	"github.com/slowrank/slowrank/detector"
)

func TestPlacement(t *testing.T) {
	const node = "gpu-node-7"
	pod := Cgroup{ContainerID: testCID, PodUID: testUID}
	tests := []struct {
		name string
		env  map[string]string
		cg   Cgroup
		want detector.Placement
	}{
		{"nothing", map[string]string{}, Cgroup{}, detector.Placement{}},
		{"K8S_ names", map[string]string{"K8S_POD_NAME": "a", "K8S_POD_NAMESPACE": "b", "K8S_CONTAINER_NAME": "c", "K8S_POD_UID": testUID},
			Cgroup{}, detector.Placement{K8s: detector.K8sPod{PodName: "a", PodUID: testUID, Namespace: "b", ContainerName: "c"}}},
		{"POD_ names before K8S_ names before OTEL_RESOURCE_ATTRIBUTES",
			map[string]string{"POD_NAME": "a", "K8S_POD_NAME": "x", "K8S_POD_NAMESPACE": "b", "OTEL_RESOURCE_ATTRIBUTES": "k8s.namespace.name=y,k8s.container.name=c"},
			Cgroup{}, detector.Placement{K8s: detector.K8sPod{PodName: "a", Namespace: "b", ContainerName: "c"}}},
		{"HOSTNAME names a pod the cgroup found", map[string]string{"HOSTNAME": "w-0"}, pod,
			detector.Placement{K8s: detector.K8sPod{PodName: "w-0", PodUID: testUID}, ContainerID: testCID}},
		{"HOSTNAME outside a pod names none", map[string]string{"HOSTNAME": "w-0", "POD_UID": testUID}, Cgroup{ContainerID: testCID},
			detector.Placement{K8s: detector.K8sPod{PodUID: testUID}, ContainerID: testCID}},
		{"HOSTNAME of a pod in the host's network is the node's", map[string]string{"HOSTNAME": node}, pod,
			detector.Placement{K8s: detector.K8sPod{PodUID: testUID}, ContainerID: testCID}},
		{"a POD_UID that is no UUID is dropped", map[string]string{"POD_UID": "../../etc"}, Cgroup{}, detector.Placement{}},
		{"names with control characters or too long are dropped",
			map[string]string{"POD_NAME": "a\nb", "K8S_POD_NAME": "ok", "POD_NAMESPACE": string(make([]byte, 300)), "CONTAINER_NAME": "\xff"},
			Cgroup{}, detector.Placement{K8s: detector.K8sPod{PodName: "ok"}}},
		{"blanks around a name are not part of it", map[string]string{"POD_NAME": " p \t"}, Cgroup{},
			detector.Placement{K8s: detector.K8sPod{PodName: "p"}}},
		{"a container name and a namespace without a pod are not Kubernetes's", map[string]string{"CONTAINER_NAME": "c", "POD_NAMESPACE": "b"},
			Cgroup{}, detector.Placement{}},
		{"a container name in a pod the cgroup found", map[string]string{"CONTAINER_NAME": "c"}, pod,
			detector.Placement{K8s: detector.K8sPod{PodUID: testUID, ContainerName: "c"}, ContainerID: testCID}},
		{"slurm", map[string]string{"SLURM_JOB_ID": "12", "SLURM_STEPID": "3"}, Cgroup{},
			detector.Placement{Slurm: detector.SlurmStep{JobID: "12", StepID: "3"}}},
		{"SLURM_STEP_ID before SLURM_STEPID", map[string]string{"SLURM_STEP_ID": "1", "SLURM_STEPID": "3"}, Cgroup{},
			detector.Placement{Slurm: detector.SlurmStep{StepID: "1"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := ParseEnviron(environOf(tc.env), func(k string) bool { return vars[k] })
			id := FromEnv(env)
			id.WithCgroup(tc.cg)
			if got := id.Placement(node); got != tc.want {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// environOf writes env as /proc/PID/environ does, so that the tests also
// hold that ParseEnviron keeps the variables placement reads.
func environOf(env map[string]string) []byte {
	var b []byte
	for k, v := range env {
		b = append(b, k+"="+v+"\x00"...)
	}
	return b
}

func TestParseResourceAttrs(t *testing.T) {
	tests := []struct {
		in   string
		want map[string]string
	}{
		{"", nil},
		{"service.name=x", map[string]string{}},
		{"k8s.pod.name=p%2D1, k8s.namespace.name = ns ,k8s.pod.name=second", map[string]string{"k8s.pod.name": "p-1", "k8s.namespace.name": "ns"}},
		{"k8s.pod.name,k8s.container.name=c,k8s.pod.uid=%zz", map[string]string{"k8s.container.name": "c"}},
	}
	for _, tc := range tests {
		got := parseResourceAttrs(tc.in)
		if len(got) != len(tc.want) || (got == nil) != (tc.want == nil) {
			t.Errorf("%q: got %q, want %q", tc.in, got, tc.want)
			continue
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Errorf("%q: %s = %q, want %q", tc.in, k, got[k], v)
			}
		}
	}
}
