package admission

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
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
			var p pod
			if err := json.Unmarshal([]byte(tt.pod), &p); err != nil {
				t.Fatal(err)
			}
			o := Options{LibDir: libDir, NCCLPlugin: tt.nccl}
			ops, warns, kept := plan(&p, o)
			if tt.noOps != (len(ops) == 0) {
				t.Fatalf("ops = %+v", ops)
			}
			if !reflect.DeepEqual(warns, tt.warns) || kept != tt.kept {
				t.Errorf("warnings = %q, kept %d; want %q, %d", warns, kept, tt.warns, tt.kept)
			}
			after := applyPatch(t, tt.pod, ops)
			var q pod
			if err := json.Unmarshal(after, &q); err != nil {
				t.Fatal(err)
			}
			for _, c := range q.Spec.Containers {
				if !reflect.DeepEqual(c.VolumeMounts, tt.want[c.Name].mounts) || !reflect.DeepEqual(c.Env, tt.want[c.Name].env) {
					t.Errorf("container %s: mounts %+v env %+v; want %+v", c.Name, c.VolumeMounts, c.Env, tt.want[c.Name])
				}
			}
			if got := hasVolume(q.Spec.Volumes, VolumeName); got != tt.volume {
				t.Errorf("library volume = %v", got)
			}
			if strings.Contains(string(after), `"initContainers":[{"name":"fetch"}]`) != (tt.pod == withInit) {
				t.Errorf("init containers changed: %s", after)
			}
			// Idempotent: the patched pod needs nothing more.
			if again, _, _ := plan(&q, o); len(again) != 0 {
				t.Errorf("second patch = %+v", again)
			}
		})
	}
}

func TestPlanVolume(t *testing.T) {
	var p pod
	if err := json.Unmarshal([]byte(bare), &p); err != nil {
		t.Fatal(err)
	}
	ops, _, _ := plan(&p, Options{LibDir: libDir})
	after := applyPatch(t, bare, ops)
	var q struct {
		Spec struct {
			Volumes []hostPathVolume `json:"volumes"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(after, &q); err != nil {
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
		var p pod
		if err := json.Unmarshal([]byte(`{"metadata":{"labels":`+tt.labels+`}}`), &p); err != nil {
			t.Fatal(err)
		}
		if got := p.optedIn(); got != tt.want {
			t.Errorf("labels %s: opted in = %v, want %v", tt.labels, got, tt.want)
		}
	}
}

// applyPatch applies "add" operations (RFC 6902) to doc, as the API server
// does, so that the tests check the pod that results, not the patch's text.
func applyPatch(t *testing.T, doc string, ops []Op) []byte {
	t.Helper()
	var root any
	if err := json.Unmarshal([]byte(doc), &root); err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		if op.Op != "add" {
			t.Fatalf("unexpected op %+v", op)
		}
		// Round-trip the value so that it is made of maps and slices.
		raw, err := json.Marshal(op.Value)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatal(err)
		}
		root = addAt(t, root, strings.Split(op.Path, "/")[1:], v)
	}
	out, err := json.Marshal(root)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func addAt(t *testing.T, node any, path []string, v any) any {
	t.Helper()
	key := strings.ReplaceAll(strings.ReplaceAll(path[0], "~1", "/"), "~0", "~")
	switch n := node.(type) {
	case map[string]any:
		if len(path) == 1 {
			n[key] = v
			return n
		}
		child, ok := n[key]
		if !ok {
			t.Fatalf("patch path through missing member %q", key)
		}
		n[key] = addAt(t, child, path[1:], v)
		return n
	case []any:
		if len(path) == 1 && key == "-" {
			return append(n, v)
		}
		i, err := strconv.Atoi(key)
		if err != nil || i < 0 || i >= len(n) || len(path) == 1 {
			t.Fatalf("bad array index %q in patch", key)
		}
		n[i] = addAt(t, n[i], path[1:], v)
		return n
	}
	t.Fatalf("patch path through a scalar at %q", key)
	return nil
}
