package admission

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
)

const libDir = "/opt/slowrank/lib"

// The pods of the table, as the API server would send them.
const (
	bare = `{"metadata":{"name":"p","labels":{"slowrank.dev/inject":"true"}},
		"spec":{"containers":[{"name":"trainer"}]}}`
	twoContainers = `{"metadata":{"name":"p","labels":{"slowrank.dev/inject":"true"}},
		"spec":{"volumes":[{"name":"data","emptyDir":{}}],
		"containers":[{"name":"trainer","env":[{"name":"RANK","value":"0"}],"volumeMounts":[{"name":"data","mountPath":"/data"}]},
		{"name":"sidecar"}]}}`
	userValue = `{"metadata":{"name":"p","labels":{"slowrank.dev/inject":"true"}},
		"spec":{"containers":[{"name":"nsys","env":[{"name":"CUDA_INJECTION64_PATH","value":"/opt/nsys/libToolsInjection64.so"}]}]}}`
	valueFrom = `{"metadata":{"name":"p","labels":{"slowrank.dev/inject":"true"}},
		"spec":{"containers":[{"name":"t","env":[{"name":"NCCL_PROFILER_PLUGIN","valueFrom":{"configMapKeyRef":{"name":"c","key":"k"}}}]}]}}`
	envFrom = `{"metadata":{"name":"p","labels":{"slowrank.dev/inject":"true"}},
		"spec":{"containers":[{"name":"t","envFrom":[{"configMapRef":{"name":"c"}}]}]}}`
	byHand = `{"metadata":{"name":"p","labels":{"slowrank.dev/inject":"true"}},
		"spec":{"volumes":[{"name":"slowrank-lib","hostPath":{"path":"/opt/slowrank/lib","type":"Directory"}}],
		"containers":[{"name":"t","env":[{"name":"CUDA_INJECTION64_PATH","value":"/opt/slowrank/lib/libslowrank_cupti.so"}],
		"volumeMounts":[{"name":"slowrank-lib","mountPath":"/opt/slowrank/lib/","readOnly":true}]}]}}`
	withInit = `{"metadata":{"name":"p","labels":{"slowrank.dev/inject":"true"}},
		"spec":{"initContainers":[{"name":"fetch"}],"containers":[{"name":"trainer"}]}}`
)

// patched is what every container of a patched pod has.
type patched struct {
	mounts []mount
	env    []envVar
}

func TestPlan(t *testing.T) {
	lib := libDir + "/" + LibName
	libMount := mount{Name: VolumeName, MountPath: libDir, ReadOnly: true}
	tests := []struct {
		name   string
		pod    string
		nccl   bool
		want   map[string]patched // by container name, after the patch
		warns  []string
		kept   int
		noOps  bool
		volume bool // the pod ends with the library volume
	}{
		{name: "a container without env or mounts gets both", pod: bare,
			want:   map[string]patched{"trainer": {[]mount{libMount}, []envVar{{EnvInjection, lib}}}},
			volume: true},
		{name: "the NCCL plugin variable when chosen", pod: bare, nccl: true,
			want:   map[string]patched{"trainer": {[]mount{libMount}, []envVar{{EnvInjection, lib}, {EnvNCCLPlugin, lib}}}},
			volume: true},
		{name: "every container, after what it has", pod: twoContainers,
			want: map[string]patched{
				"trainer": {[]mount{{Name: "data", MountPath: "/data"}, libMount}, []envVar{{"RANK", "0"}, {EnvInjection, lib}}},
				"sidecar": {[]mount{libMount}, []envVar{{EnvInjection, lib}}},
			}, volume: true},
		{name: "a user's value is kept, with a warning", pod: userValue,
			want:   map[string]patched{"nsys": {[]mount{libMount}, []envVar{{EnvInjection, "/opt/nsys/libToolsInjection64.so"}}}},
			warns:  []string{`slowrank: container "nsys" sets CUDA_INJECTION64_PATH; its value is kept`},
			kept:   1,
			volume: true},
		{name: "a variable set from a source is kept", pod: valueFrom, nccl: true,
			want:   map[string]patched{"t": {[]mount{libMount}, []envVar{{Name: EnvNCCLPlugin}, {EnvInjection, lib}}}},
			warns:  []string{`slowrank: container "t" sets NCCL_PROFILER_PLUGIN; its value is kept`},
			kept:   1,
			volume: true},
		{name: "envFrom: added, with a warning that it takes precedence", pod: envFrom,
			want:   map[string]patched{"t": {[]mount{libMount}, []envVar{{EnvInjection, lib}}}},
			warns:  []string{`slowrank: container "t" has envFrom; the CUDA_INJECTION64_PATH added takes precedence over one it may define`},
			volume: true},
		{name: "a pod set up by hand is left alone", pod: byHand, noOps: true,
			want:   map[string]patched{"t": {[]mount{{Name: VolumeName, MountPath: libDir + "/", ReadOnly: true}}, []envVar{{EnvInjection, lib}}}},
			volume: true},
		{name: "init containers are not patched", pod: withInit,
			want:   map[string]patched{"trainer": {[]mount{libMount}, []envVar{{EnvInjection, lib}}}},
			volume: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustDecode(t, tt.pod)
			o := Options{LibDir: libDir, NCCLPlugin: tt.nccl}
			ops, warns, kept := plan(p, o)
			if tt.noOps != (len(ops) == 0) {
				t.Fatalf("ops = %+v", ops)
			}
			if !reflect.DeepEqual(warns, tt.warns) || kept != tt.kept {
				t.Errorf("warnings = %q, kept %d; want %q, %d", warns, kept, tt.warns, tt.kept)
			}
			after := applyPatch(t, tt.pod, ops)
			var q testPod
			if err := json.Unmarshal(after, &q); err != nil {
				t.Fatal(err)
			}
			for _, c := range q.Spec.Containers {
				if !reflect.DeepEqual(c.VolumeMounts, tt.want[c.Name].mounts) || !reflect.DeepEqual(c.Env, tt.want[c.Name].env) {
					t.Errorf("container %s: mounts %+v env %+v; want %+v", c.Name, c.VolumeMounts, c.Env, tt.want[c.Name])
				}
			}
			if got := slices.ContainsFunc(q.Spec.Volumes, func(v hostPathVolume) bool { return v.Name == VolumeName }); got != tt.volume {
				t.Errorf("library volume = %v", got)
			}
			if strings.Contains(string(after), `"initContainers":[{"name":"fetch"}]`) != (tt.pod == withInit) {
				t.Errorf("init containers changed: %s", after)
			}
			// Idempotent: the patched pod needs nothing more.
			if again, _, _ := plan(mustDecode(t, string(after)), o); len(again) != 0 {
				t.Errorf("second patch = %+v", again)
			}
		})
	}
}

func TestPlanVolume(t *testing.T) {
	ops, _, _ := plan(mustDecode(t, bare), Options{LibDir: libDir})
	var q testPod
	if err := json.Unmarshal(applyPatch(t, bare, ops), &q); err != nil {
		t.Fatal(err)
	}
	want := hostPathVolume{Name: VolumeName}
	want.HostPath.Path, want.HostPath.Type = libDir, "Directory"
	if len(q.Spec.Volumes) != 1 || q.Spec.Volumes[0] != want {
		t.Errorf("volumes = %+v, want [%+v]", q.Spec.Volumes, want)
	}
}

func TestOptedIn(t *testing.T) {
	for _, tt := range []struct {
		labels string
		want   bool
	}{
		{`{"slowrank.dev/inject":"true"}`, true},
		{`{"slowrank.dev/inject":"false"}`, false},
		{`{"slowrank.dev/inject":"yes"}`, false},
		{`{"app":"x"}`, false},
		{`null`, false},
	} {
		p := mustDecode(t, `{"metadata":{"labels":`+tt.labels+`},"spec":{}}`)
		if got := p.optedIn(); got != tt.want {
			t.Errorf("labels %s: opted in = %v, want %v", tt.labels, got, tt.want)
		}
	}
}

// applyPatch applies the patch to doc with the JSON patch library and
// version that the API server uses (k8s.io/apiserver's mutating webhook
// dispatcher, Kubernetes 1.37), so that the tests check the pod that results.
func applyPatch(t testing.TB, doc string, ops []Op) []byte {
	t.Helper()
	if len(ops) == 0 {
		return []byte(doc)
	}
	raw, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatch.DecodePatch(raw)
	if err != nil {
		t.Fatalf("patch %s: %v", raw, err)
	}
	out, err := patch.Apply([]byte(doc))
	if err != nil {
		t.Fatalf("patch %s does not apply: %v", raw, err)
	}
	return out
}

// testPod is a pod as the tests read it back after the patch: every field
// the patch writes.
type testPod struct {
	Spec struct {
		Volumes    []hostPathVolume `json:"volumes"`
		Containers []struct {
			Name         string   `json:"name"`
			Env          []envVar `json:"env"`
			VolumeMounts []mount  `json:"volumeMounts"`
		} `json:"containers"`
	} `json:"spec"`
}

func mustDecode(t testing.TB, doc string) *pod {
	t.Helper()
	p, err := decodePod([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return p
}
