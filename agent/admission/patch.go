package admission

import (
	"fmt"
	"path"
	"strconv"
)

const (
	// InjectLabel opts a pod in: the value "true" (any other value, or none,
	// leaves the pod alone).
	InjectLabel = "slowrank.dev/inject"
	// VolumeName is the name of the hostPath volume added to a pod.
	VolumeName = "slowrank-lib"
	// LibName is the injection library's file in the library directory.
	LibName = "libslowrank_cupti.so"
	// EnvInjection is CUDA's variable naming the injection library.
	EnvInjection = "CUDA_INJECTION64_PATH"
	// EnvNCCLPlugin is NCCL's variable naming its profiler plugin (the same
	// file: docs/nccl-profiler-plugin.md).
	EnvNCCLPlugin = "NCCL_PROFILER_PLUGIN"
)

// Options says what a patch adds.
type Options struct {
	// LibDir is the node's library directory (the chart's libDir), mounted
	// at the same path in the containers.
	LibDir string
	// NCCLPlugin also sets NCCL_PROFILER_PLUGIN to the library.
	NCCLPlugin bool
}

// pod holds the fields of a v1 Pod that the patch depends on (decodePod
// reads them); the rest of the object is ignored.
type pod struct {
	Metadata struct {
		Name         string
		GenerateName string
		Labels       map[string]string
	}
	Spec struct {
		Volumes    []named
		Containers []container
	}
}

type named struct {
	Name string `json:"name"`
}

type container struct {
	Name         string
	Env          []envVar
	HasEnvFrom   bool // envFrom is not empty
	VolumeMounts []mount
}

// envVar is a container's variable; Value is empty for one set from a
// source (valueFrom), which is kept all the same.
type envVar struct {
	Name  string `json:"name"`
	Value string `json:"value,omitempty"`
}

type mount struct {
	Name      string `json:"name"`
	MountPath string `json:"mountPath"`
	ReadOnly  bool   `json:"readOnly,omitempty"`
}

type hostPathVolume struct {
	Name     string `json:"name"`
	HostPath struct {
		Path string `json:"path"`
		Type string `json:"type"`
	} `json:"hostPath"`
}

// Op is one RFC 6902 JSON patch operation (only "add" is ever built).
type Op struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// optedIn reports whether the pod asks for the injection.
func (p *pod) optedIn() bool { return p.Metadata.Labels[InjectLabel] == "true" }

// plan returns the patch that gives p the library, a warning for every
// user value it kept or may override, and how many values it kept. An empty patch means p already has
// everything (a pod patched before, or set up by hand).
func plan(p *pod, o Options) (ops []Op, warns []string, kept int) {
	lib := path.Join(o.LibDir, LibName)
	want := []envVar{{Name: EnvInjection, Value: lib}}
	if o.NCCLPlugin {
		want = append(want, envVar{Name: EnvNCCLPlugin, Value: lib})
	}
	mountName := VolumeName
	if !hasVolume(p.Spec.Volumes, VolumeName) {
		v := hostPathVolume{Name: VolumeName}
		// Directory: on a node without the agent the pod does not start,
		// rather than train with a variable naming a missing file
		// (docs/deploy.md section 2.2).
		v.HostPath.Path, v.HostPath.Type = o.LibDir, "Directory"
		ops = append(ops, addTo("/spec/volumes", len(p.Spec.Volumes), v))
	}
	for i, c := range p.Spec.Containers {
		base := "/spec/containers/" + strconv.Itoa(i)
		if !mountsAt(c.VolumeMounts, o.LibDir) {
			ops = append(ops, addTo(base+"/volumeMounts", len(c.VolumeMounts), mount{Name: mountName, MountPath: o.LibDir, ReadOnly: true}))
		}
		n := len(c.Env)
		for _, e := range want {
			if have, ok := lookup(c.Env, e.Name); ok {
				if have.Value != e.Value {
					kept++
					warns = append(warns, fmt.Sprintf("slowrank: container %q sets %s; its value is kept", truncate(c.Name, 63), e.Name))
				}
				continue
			}
			if c.HasEnvFrom {
				warns = append(warns, fmt.Sprintf("slowrank: container %q has envFrom; the %s added takes precedence over one it may define", truncate(c.Name, 63), e.Name))
			}
			ops = append(ops, addTo(base+"/env", n, e))
			n++
		}
	}
	return ops, warns, kept
}

// addTo appends v to the array at arr, which holds n elements: a JSON patch
// cannot append to an array that is absent, so the first element adds the
// whole array.
func addTo(arr string, n int, v any) Op {
	if n == 0 {
		return Op{Op: "add", Path: arr, Value: []any{v}}
	}
	return Op{Op: "add", Path: arr + "/-", Value: v}
}

func hasVolume(vs []named, name string) bool {
	for _, v := range vs {
		if v.Name == name {
			return true
		}
	}
	return false
}

func mountsAt(ms []mount, dir string) bool {
	for _, m := range ms {
		if path.Clean(m.MountPath) == path.Clean(dir) {
			return true
		}
	}
	return false
}

func lookup(env []envVar, name string) (envVar, bool) {
	for _, e := range env {
		if e.Name == name {
			return e, true
		}
	}
	return envVar{}, false
}
