package admission

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"reflect"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestExampleJobsAgree: deploy/kubernetes/training-pod-example.yaml shows a
// Job edited by hand (docs/deploy.md section 2.2) and the same Job with only
// the webhook's label (section 2.3). Patched, the labelled one must have
// what the hand-edited one has: the volume, the mount and the variable.
func TestExampleJobsAgree(t *testing.T) {
	f, err := os.Open("../../deploy/kubernetes/training-pod-example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }() // read only
	var templates []json.RawMessage
	dec := yaml.NewDecoder(f)
	for {
		var job struct {
			Spec struct {
				Template map[string]any `yaml:"template"`
			} `yaml:"spec"`
		}
		if err := dec.Decode(&job); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		raw, err := json.Marshal(job.Spec.Template)
		if err != nil {
			t.Fatal(err)
		}
		templates = append(templates, raw)
	}
	if len(templates) != 2 {
		t.Fatalf("%d Jobs in the example, want the hand-edited one and the labelled one", len(templates))
	}
	p := mustDecode(t, string(templates[1]))
	if !p.optedIn() {
		t.Fatalf("the second Job lacks the label %s: \"true\"", InjectLabel)
	}
	ops, warns, _ := plan(p, Options{LibDir: libDir})
	if len(warns) != 0 {
		t.Errorf("warnings %q", warns)
	}
	var byHand, labelled testPod
	if err := json.Unmarshal(templates[0], &byHand); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(applyPatch(t, string(templates[1]), ops), &labelled); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(labelled.Spec.Volumes, byHand.Spec.Volumes) {
		t.Errorf("patched volumes %+v, by hand %+v", labelled.Spec.Volumes, byHand.Spec.Volumes)
	}
	if len(byHand.Spec.Containers) != 1 || len(labelled.Spec.Containers) != 1 {
		t.Fatalf("containers: %d by hand, %d labelled, want one each", len(byHand.Spec.Containers), len(labelled.Spec.Containers))
	}
	hc, lc := byHand.Spec.Containers[0], labelled.Spec.Containers[0]
	if !reflect.DeepEqual(hc.VolumeMounts, lc.VolumeMounts) {
		t.Errorf("patched mounts %+v, by hand %+v", lc.VolumeMounts, hc.VolumeMounts)
	}
	want, _ := lookup(hc.Env, EnvInjection)
	if got, ok := lookup(lc.Env, EnvInjection); !ok || got != want {
		t.Errorf("patched %s = %+v, by hand %+v", EnvInjection, got, want)
	}
}
