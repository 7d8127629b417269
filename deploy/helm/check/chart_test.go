package check

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// agentCaps is the capability set of agent/privilege/caps.go (CAP_ prefix dropped).
var agentCaps = []corev1.Capability{"BPF", "PERFMON", "SYS_ADMIN", "SYS_PTRACE", "DAC_READ_SEARCH", "DAC_OVERRIDE", "CHECKPOINT_RESTORE"}

const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// rendered is what one rendering of the chart yields, decoded.
type rendered struct {
	ds   appsv1.DaemonSet
	sa   corev1.ServiceAccount
	nps  []networkingv1.NetworkPolicy
	rule *prometheusRule
	svcs []corev1.Service
	sm   *serviceMonitor
}

// serviceMonitor is the Prometheus Operator's ServiceMonitor
// (monitoring.coreos.com/v1), the fields of its CRD the chart sets:
// decoded strictly, an unknown field fails as the CRD's schema would.
type serviceMonitor struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// prometheusRule is the Prometheus Operator's PrometheusRule
// (monitoring.coreos.com/v1), the fields its CRD defines for rule groups:
// decoded strictly, an unknown field fails as the CRD's schema would.
type prometheusRule struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       ruleSpec          `json:"spec"`
}

type ruleSpec struct {
	Groups []struct {
		Name     string `json:"name"`
		Interval string `json:"interval,omitempty"`
		Rules    []struct {
			Alert       string            `json:"alert,omitempty"`
			Record      string            `json:"record,omitempty"`
			Expr        string            `json:"expr"`
			For         string            `json:"for,omitempty"`
			Labels      map[string]string `json:"labels,omitempty"`
			Annotations map[string]string `json:"annotations,omitempty"`
		} `json:"rules"`
	} `json:"groups"`
}

// render renders the chart with vals and decodes every manifest strictly.
func render(t *testing.T, vals map[string]any) (rendered, error) {
	t.Helper()
	out, err := renderFiles(t, "sr", vals)
	if err != nil {
		return rendered{}, err
	}
	var r rendered
	for name, text := range out {
		if !strings.HasSuffix(name, ".yaml") || strings.TrimSpace(text) == "" {
			continue
		}
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(text), &meta); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var into any
		switch meta.Kind {
		case "DaemonSet":
			into = &r.ds
		case "ServiceAccount":
			into = &r.sa
		case "NetworkPolicy":
			r.nps = append(r.nps, networkingv1.NetworkPolicy{})
			into = &r.nps[len(r.nps)-1]
		case "PrometheusRule":
			r.rule = &prometheusRule{}
			into = r.rule
		case "Service":
			r.svcs = append(r.svcs, corev1.Service{})
			into = &r.svcs[len(r.svcs)-1]
		case "ServiceMonitor":
			r.sm = &serviceMonitor{}
			into = r.sm
		default:
			t.Fatalf("%s: unexpected kind %q", name, meta.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(text), into); err != nil {
			t.Fatalf("%s does not match the %s API: %v", name, meta.Kind, err)
		}
	}
	return r, nil
}

// renderFiles renders the chart for release in namespace "slowrank" with
// vals: the text of each template by its name (slowrank/templates/...).
func renderFiles(t *testing.T, release string, vals map[string]any) (map[string]string, error) {
	t.Helper()
	ch, err := loader.Load("../slowrank")
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: release, Namespace: "slowrank"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return engine.Render(ch, rv)
}

func container(t *testing.T, spec corev1.PodSpec, name string, init bool) corev1.Container {
	t.Helper()
	cs := spec.Containers
	if init {
		cs = spec.InitContainers
	}
	for _, c := range cs {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

func TestDefaultsAreLeastPrivilegeAndPrivate(t *testing.T) {
	r, err := render(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := r.ds.Spec.Template.Spec
	agent := container(t, spec, "agent", false)
	sc := agent.SecurityContext
	if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.Capabilities == nil {
		t.Fatalf("agent security context %+v: want unprivileged with capabilities", sc)
	}
	if !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || !slices.Equal(sc.Capabilities.Add, agentCaps) {
		t.Errorf("capabilities %+v, want drop ALL, add %v", sc.Capabilities, agentCaps)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("privilege escalation allowed")
	}
	if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeUnconfined {
		t.Errorf("seccomp %+v: the default profile refuses bpf()", sc.SeccompProfile)
	}
	// /status and /metrics stay off the pod IP.
	for _, a := range agent.Args {
		if strings.HasPrefix(a, "--status-addr") || a == "--status-allow-remote" {
			t.Errorf("agent serves status on the pod IP by default: %q", a)
		}
	}
	if r.rule != nil {
		t.Error("a PrometheusRule by default (it needs the operator's CRD)")
	}
	if len(agent.Ports) != 0 || len(r.nps) != 0 || len(r.svcs) != 0 || r.sm != nil {
		t.Errorf("ports %v, %d network policies, %d services and a ServiceMonitor (%v) with metrics off", agent.Ports, len(r.nps), len(r.svcs), r.sm != nil)
	}
	// tracefs and debugfs are read-only: on Linux 5.8+ uprobes attach
	// through the perf PMU without writing uprobe_events.
	for _, m := range agent.VolumeMounts {
		if (m.Name == "tracefs" || m.Name == "debugfs") && !m.ReadOnly {
			t.Errorf("mount %s is writable", m.Name)
		}
	}
	if agent.LivenessProbe == nil || agent.LivenessProbe.Exec == nil {
		t.Errorf("liveness probe %+v: want an exec probe over the control socket", agent.LivenessProbe)
	}
	if r.sa.AutomountServiceAccountToken == nil || *r.sa.AutomountServiceAccountToken {
		t.Error("service account token mounted")
	}
	// The image that writes the injection library is a release, not latest.
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		if strings.HasSuffix(c.Image, ":latest") || !strings.Contains(c.Image, ":") {
			t.Errorf("container %s image %q is not pinned to a release", c.Name, c.Image)
		}
	}
	ic := container(t, spec, "install-cupti-lib", true).SecurityContext
	if ic == nil || !slices.Equal(ic.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(ic.Capabilities.Add) != 0 {
		t.Errorf("installer security context %+v: want every capability dropped", ic)
	}
}

func TestVariants(t *testing.T) {
	tests := []struct {
		name  string
		vals  map[string]any
		check func(t *testing.T, r rendered)
	}{
		{"metrics on: port behind a network policy", map[string]any{"metrics": map[string]any{"enabled": true}}, func(t *testing.T, r rendered) {
			agent := container(t, r.ds.Spec.Template.Spec, "agent", false)
			if !slices.Contains(agent.Args, "--status-addr=0.0.0.0:9464") || len(agent.Ports) != 1 {
				t.Errorf("args %v ports %v", agent.Args, agent.Ports)
			}
			if len(r.nps) != 1 || len(r.nps[0].Spec.Ingress) != 1 || len(r.nps[0].Spec.Ingress[0].From) == 0 ||
				r.nps[0].Spec.Ingress[0].Ports[0].Port.IntValue() != 9464 {
				t.Fatalf("network policies %+v", r.nps)
			}
			// A tenant can label its own pods, not name a namespace: every
			// peer is held to a namespace by the API server's name label.
			for _, peer := range r.nps[0].Spec.Ingress[0].From {
				if ns := peer.NamespaceSelector; ns == nil || ns.MatchLabels["kubernetes.io/metadata.name"] == "" {
					t.Errorf("ingress peer %+v admits pods of any namespace by labels a tenant can set", peer)
				}
			}
		}},
		{"metrics on: a headless Service over the agents' port", map[string]any{"metrics": map[string]any{"enabled": true}}, func(t *testing.T, r rendered) {
			if len(r.svcs) != 1 {
				t.Fatalf("%d services, want 1", len(r.svcs))
			}
			svc := r.svcs[0]
			if svc.Spec.ClusterIP != corev1.ClusterIPNone || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 9464 ||
				svc.Spec.Ports[0].Name != "metrics" || svc.Spec.Ports[0].TargetPort.String() != "metrics" {
				t.Errorf("service spec %+v", svc.Spec)
			}
			if !selects(svc.Spec.Selector, r.ds.Spec.Template.Labels) {
				t.Errorf("service selector %v does not select the agent pods %v", svc.Spec.Selector, r.ds.Spec.Template.Labels)
			}
			if p := container(t, r.ds.Spec.Template.Spec, "agent", false).Ports; len(p) != 1 || p[0].Name != "metrics" {
				t.Errorf("the agent's ports %v have no port named metrics for the service", p)
			}
			if r.sm != nil {
				t.Error("a ServiceMonitor without serviceMonitor.enabled (it needs the operator's CRD)")
			}
		}},
		{"serviceMonitor on: scrapes the metrics Service", map[string]any{"metrics": map[string]any{"enabled": true},
			"serviceMonitor": map[string]any{"enabled": true, "labels": map[string]any{"release": "kube-prometheus-stack"}}}, func(t *testing.T, r rendered) {
			sm := r.sm
			if sm == nil || len(r.svcs) != 1 {
				t.Fatalf("ServiceMonitor %v, %d services", sm, len(r.svcs))
			}
			if sm.APIVersion != "monitoring.coreos.com/v1" || sm.Metadata.Namespace != "slowrank" || sm.Metadata.Labels["release"] != "kube-prometheus-stack" {
				t.Errorf("ServiceMonitor %+v", sm.Metadata)
			}
			if !selects(sm.Spec.Selector.MatchLabels, r.svcs[0].Labels) || !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{r.svcs[0].Namespace}) {
				t.Errorf("ServiceMonitor selects %v in %v, the service has labels %v in %s", sm.Spec.Selector.MatchLabels,
					sm.Spec.NamespaceSelector.MatchNames, r.svcs[0].Labels, r.svcs[0].Namespace)
			}
			if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != r.svcs[0].Spec.Ports[0].Name || sm.Spec.Endpoints[0].Path != "/metrics" {
				t.Errorf("endpoints %+v", sm.Spec.Endpoints)
			}
		}},
		{"digest pins the image", map[string]any{"image": map[string]any{"tag": "0.2.0", "digest": digest}}, func(t *testing.T, r rendered) {
			for _, c := range append(r.ds.Spec.Template.Spec.InitContainers, r.ds.Spec.Template.Spec.Containers...) {
				if c.Image != "ghcr.io/slowrank/slowrank:0.2.0@"+digest {
					t.Errorf("%s image %q", c.Name, c.Image)
				}
			}
		}},
		{"prometheusRule on: the rules of deploy/prometheus", map[string]any{"prometheusRule": map[string]any{
			"enabled": true, "labels": map[string]any{"release": "kube-prometheus-stack"}}}, func(t *testing.T, r rendered) {
			if r.rule == nil {
				t.Fatal("no PrometheusRule")
			}
			if r.rule.APIVersion != "monitoring.coreos.com/v1" || r.rule.Metadata.Namespace != "slowrank" ||
				r.rule.Metadata.Labels["release"] != "kube-prometheus-stack" {
				t.Errorf("PrometheusRule %+v", r.rule.Metadata)
			}
			b, err := os.ReadFile("../../prometheus/slowrank-rules.yaml")
			if err != nil {
				t.Fatal(err)
			}
			var want ruleSpec
			if err := yaml.UnmarshalStrict(b, &want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(r.rule.Spec, want) {
				t.Errorf("the chart's rules differ from deploy/prometheus/slowrank-rules.yaml: cp it to deploy/helm/slowrank/files/")
			}
			var alerts []string
			for _, g := range r.rule.Spec.Groups {
				for _, rl := range g.Rules {
					alerts = append(alerts, rl.Alert)
				}
			}
			for _, a := range []string{"SlowrankStraggler", "SlowrankVerdictUncertain", "SlowrankDeviceCollectionYielded", "SlowrankRecordsDropped", "SlowrankAgentDown"} {
				if !slices.Contains(alerts, a) {
					t.Errorf("alert %s missing (have %v)", a, alerts)
				}
			}
		}},
		{"privileged fallback", map[string]any{"privileged": true}, func(t *testing.T, r rendered) {
			sc := container(t, r.ds.Spec.Template.Spec, "agent", false).SecurityContext
			if sc.Privileged == nil || !*sc.Privileged || sc.Capabilities != nil {
				t.Errorf("security context %+v", sc)
			}
		}},
		{"legacy kernel adds SYS_RESOURCE", map[string]any{"legacyKernel": true}, func(t *testing.T, r rendered) {
			sc := container(t, r.ds.Spec.Template.Spec, "agent", false).SecurityContext
			if !slices.Equal(sc.Capabilities.Add, append(slices.Clone(agentCaps), "SYS_RESOURCE")) {
				t.Errorf("capabilities %v", sc.Capabilities.Add)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := render(t, tt.vals)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, r)
		})
	}
}

func TestRefusedValues(t *testing.T) {
	for name, vals := range map[string]map[string]any{
		"tag latest":        {"image": map[string]any{"tag": "latest"}},
		"digest not sha256": {"image": map[string]any{"digest": "md5:abc"}},
		"short digest":      {"image": map[string]any{"digest": "sha256:abc"}},
		// Without metrics.enabled there is no /metrics to scrape.
		"serviceMonitor without metrics": {"serviceMonitor": map[string]any{"enabled": true}},
		"serviceMonitor without the service": {"serviceMonitor": map[string]any{"enabled": true},
			"metrics": map[string]any{"enabled": true, "service": map[string]any{"enabled": false}}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := render(t, vals); err == nil {
				t.Fatal("rendered")
			}
		})
	}
}

// selects reports whether every label of sel is in labels.
func selects(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

// TestKubeVersionCoversTheTemplates: the chart emits appArmorProfile, a
// field of Kubernetes 1.30: helm install refuses an older cluster instead of
// the API server dropping the field.
func TestKubeVersionCoversTheTemplates(t *testing.T) {
	ch, err := loader.Load("../slowrank")
	if err != nil {
		t.Fatal(err)
	}
	r, err := render(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sc := container(t, r.ds.Spec.Template.Spec, "agent", false).SecurityContext; sc.AppArmorProfile == nil {
		t.Fatal("no appArmorProfile any more: the kubeVersion of 1.30 may be lowered")
	}
	for v, want := range map[string]bool{"v1.29.9": false, "v1.30.0": true, "v1.30.2-eks-1234": true, "v1.33.1": true} {
		if got := chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, v); got != want {
			t.Errorf("kubeVersion %q admits %s: %v, want %v", ch.Metadata.KubeVersion, v, got, want)
		}
	}
}

// TestPlainManifestsMatchTheAPI decodes deploy/kubernetes strictly, as
// kubectl's server-side field validation would.
func TestPlainManifestsMatchTheAPI(t *testing.T) {
	files, err := filepath.Glob("../../kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range strings.Split(string(data), "\n---\n") {
			var meta struct{ Kind string }
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s #%d: %v", f, i, err)
			}
			var into any
			switch meta.Kind {
			case "Namespace":
				into = &corev1.Namespace{}
			case "ServiceAccount":
				into = &corev1.ServiceAccount{}
			case "Pod":
				into = &corev1.Pod{}
			case "DaemonSet":
				into = &appsv1.DaemonSet{}
			case "Deployment":
				into = &appsv1.Deployment{}
			case "Service":
				into = &corev1.Service{}
			case "Job":
				into = &batchv1.Job{}
			case "NetworkPolicy":
				into = &networkingv1.NetworkPolicy{}
			default:
				t.Fatalf("%s #%d: unexpected kind %q", f, i, meta.Kind)
			}
			if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
				t.Errorf("%s #%d (%s): %v", f, i, meta.Kind, err)
			}
		}
	}
}
