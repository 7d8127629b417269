package admission

import (
	"encoding/json"
	"errors"
	"fmt"
)

// decodePod reads the fields the patch depends on from a Pod's JSON. It
// matches keys exactly, as the API server's decoder does (encoding/json
// would also take "Spec" for "spec", and a patch built from a field the API
// server ignores would not apply); a field of the wrong type is an error.
func decodePod(raw []byte) (*pod, error) {
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("decoding the pod: %w", err)
	}
	if obj == nil {
		return nil, errors.New("decoding the pod: no object")
	}
	p := new(pod)
	meta, err := object(obj, "metadata")
	if err != nil {
		return nil, err
	}
	if p.Metadata.Name, err = str(meta, "name"); err != nil {
		return nil, err
	}
	if p.Metadata.GenerateName, err = str(meta, "generateName"); err != nil {
		return nil, err
	}
	labels, err := object(meta, "labels")
	if err != nil {
		return nil, err
	}
	if len(labels) > 0 {
		p.Metadata.Labels = make(map[string]string, len(labels))
		for k := range labels {
			if p.Metadata.Labels[k], err = str(labels, k); err != nil {
				return nil, err
			}
		}
	}
	spec, ok := obj["spec"].(map[string]any)
	if !ok {
		// The patch adds under /spec: without it, nothing can be added.
		return nil, errors.New("decoding the pod: spec is not an object")
	}
	vols, err := array(spec, "volumes")
	if err != nil {
		return nil, err
	}
	for _, v := range vols {
		name, err := str(v, "name")
		if err != nil {
			return nil, err
		}
		p.Spec.Volumes = append(p.Spec.Volumes, named{Name: name})
	}
	cs, err := array(spec, "containers")
	if err != nil {
		return nil, err
	}
	for _, c := range cs {
		ct, err := decodeContainer(c)
		if err != nil {
			return nil, err
		}
		p.Spec.Containers = append(p.Spec.Containers, ct)
	}
	return p, nil
}

func decodeContainer(c map[string]any) (container, error) {
	var ct container
	var err error
	if ct.Name, err = str(c, "name"); err != nil {
		return ct, err
	}
	env, err := array(c, "env")
	if err != nil {
		return ct, err
	}
	for _, e := range env {
		var v envVar
		if v.Name, err = str(e, "name"); err != nil {
			return ct, err
		}
		if v.Value, err = str(e, "value"); err != nil {
			return ct, err
		}
		ct.Env = append(ct.Env, v)
	}
	from, err := array(c, "envFrom")
	if err != nil {
		return ct, err
	}
	ct.HasEnvFrom = len(from) > 0
	mounts, err := array(c, "volumeMounts")
	if err != nil {
		return ct, err
	}
	for _, m := range mounts {
		var v mount
		if v.Name, err = str(m, "name"); err != nil {
			return ct, err
		}
		if v.MountPath, err = str(m, "mountPath"); err != nil {
			return ct, err
		}
		ct.VolumeMounts = append(ct.VolumeMounts, v)
	}
	return ct, nil
}

// object returns m[key] as an object; absent or null is an empty one.
func object(m map[string]any, key string) (map[string]any, error) {
	switch v := m[key].(type) {
	case nil:
		return nil, nil
	case map[string]any:
		return v, nil
	default:
		return nil, fmt.Errorf("decoding the pod: %s is a %T, not an object", key, v)
	}
}

// array returns m[key] as an array of objects; absent or null is empty.
func array(m map[string]any, key string) ([]map[string]any, error) {
	switch v := m[key].(type) {
	case nil:
		return nil, nil
	case []any:
		out := make([]map[string]any, len(v))
		for i, e := range v {
			o, ok := e.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("decoding the pod: %s[%d] is a %T, not an object", key, i, e)
			}
			out[i] = o
		}
		return out, nil
	default:
		return nil, fmt.Errorf("decoding the pod: %s is a %T, not an array", key, v)
	}
}

// str returns m[key] as a string; absent or null is "".
func str(m map[string]any, key string) (string, error) {
	switch v := m[key].(type) {
	case nil:
		return "", nil
	case string:
		return v, nil
	default:
		return "", fmt.Errorf("decoding the pod: %s is a %T, not a string", key, v)
	}
}
