package check

import (
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"
)

// aggregatorObjects are the objects of the chart's aggregator templates,
// decoded strictly against the Kubernetes API types.
type aggregatorObjects struct {
	deploy   *appsv1.Deployment
	services []corev1.Service
	np       *networkingv1.NetworkPolicy
}

// renderAggregator renders the chart with vals and decodes the documents of
// templates/aggregator*.yaml.
func renderAggregator(t *testing.T, vals map[string]any) (aggregatorObjects, error) {
	t.Helper()
	return renderAggregatorAs(t, "sr", vals)
}

func renderAggregatorAs(t *testing.T, release string, vals map[string]any) (aggregatorObjects, error) {
	t.Helper()
	out, err := renderFiles(t, release, vals)
	if err != nil {
		return aggregatorObjects{}, err
	}
	var objs aggregatorObjects
	names := slices.Sorted(maps.Keys(out))
	for _, name := range names {
		base := name[strings.LastIndex(name, "/")+1:]
		if strings.HasPrefix(base, "aggregator") && strings.HasSuffix(base, ".yaml") {
			objs.decode(t, name, out[name])
		}
	}
	return objs, nil
}

// decode adds the documents of text (one file, "---" between documents).
func (objs *aggregatorObjects) decode(t *testing.T, name, text string) {
	t.Helper()
	for i, doc := range strings.Split(text, "\n---\n") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s #%d: %v", name, i, err)
		}
		var into any
		switch meta.Kind {
		case "Deployment":
			objs.deploy = &appsv1.Deployment{}
			into = objs.deploy
		case "Service":
			objs.services = append(objs.services, corev1.Service{})
			into = &objs.services[len(objs.services)-1]
		case "NetworkPolicy":
			objs.np = &networkingv1.NetworkPolicy{}
			into = objs.np
		default:
			t.Fatalf("%s #%d: unexpected kind %q", name, i, meta.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
			t.Fatalf("%s #%d does not match the %s API: %v", name, i, meta.Kind, err)
		}
	}
}

func aggregatorOn(extra map[string]any) map[string]any {
	a := map[string]any{"enabled": true}
	for k, v := range extra {
		a[k] = v
	}
	return map[string]any{"aggregator": a}
}

func TestAggregatorOffByDefault(t *testing.T) {
	objs, err := renderAggregator(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if objs.deploy != nil || len(objs.services) != 0 || objs.np != nil {
		t.Errorf("aggregator objects rendered by default: %+v", objs)
	}
}

func TestAggregatorIsNonRootReadOnlyAndFenced(t *testing.T) {
	objs, err := renderAggregator(t, aggregatorOn(nil))
	if err != nil {
		t.Fatal(err)
	}
	d := objs.deploy
	if d == nil {
		t.Fatal("no Deployment")
	}
	spec := d.Spec.Template.Spec
	if spec.HostPID || spec.HostNetwork {
		t.Error("the aggregator shares the node's PID or network namespace")
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("service account token mounted")
	}
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Errorf("pod security context %+v: want a non-root user", psc)
	}
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod seccomp %+v: want RuntimeDefault (the aggregator needs no bpf())", psc)
	}
	agg := container(t, spec, "aggregator", false)
	sc := agg.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("root filesystem writable")
	}
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("privilege escalation allowed")
	}
	if sc == nil || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("capabilities %+v: want every one dropped", sc)
	}
	if sc != nil && sc.Privileged != nil && *sc.Privileged {
		t.Error("privileged")
	}
	if len(agg.Args) == 0 || agg.Args[0] != "aggregate" || !slices.Contains(agg.Args, "--listen=0.0.0.0:4317") {
		t.Errorf("args %v: want `aggregate --listen=0.0.0.0:4317`", agg.Args)
	}
	if len(agg.Ports) != 1 || agg.Ports[0].ContainerPort != 4317 || agg.Ports[0].Name != "otlp" {
		t.Errorf("ports %+v", agg.Ports)
	}
	for name, p := range map[string]*corev1.Probe{"readiness": agg.ReadinessProbe, "liveness": agg.LivenessProbe} {
		if p == nil || p.TCPSocket == nil || p.TCPSocket.Port.String() != "otlp" {
			t.Errorf("%s probe %+v: want a TCP probe of the receiver", name, p)
		}
	}
	if agg.Resources.Limits.Memory().IsZero() {
		t.Error("no memory limit")
	}
	if env := aggregatorEnv(agg, "OTEL_EXPORTER_OTLP_ENDPOINT"); env != "http://$(HOST_IP):4318" {
		t.Errorf("OTLP endpoint %q: want the chart's otlpEndpoint by default", env)
	}
	if !aggregatorFieldEnv(agg, "HOST_IP") {
		t.Error("HOST_IP not set: $(HOST_IP) in the endpoint would stay literal")
	}
	// Its pods must not match the agent's selectors (the agent's
	// NetworkPolicy, `kubectl logs ds/...`), and the reverse.
	if d.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != "slowrank-aggregator" {
		t.Errorf("selector %v", d.Spec.Selector.MatchLabels)
	}
	if d.Spec.Strategy.RollingUpdate == nil || d.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0 {
		t.Errorf("strategy %+v: a rollout must replace one aggregator at a time", d.Spec.Strategy)
	}

	// One ClusterIP Service (a single aggregator) and one headless (the
	// loadbalancing collector's resolver needs every pod's address).
	var clusterIP, headless int
	for _, s := range objs.services {
		if s.Spec.Selector["app.kubernetes.io/name"] != "slowrank-aggregator" || len(s.Spec.Ports) != 1 ||
			s.Spec.Ports[0].Port != 4317 || s.Spec.Ports[0].TargetPort.String() != "otlp" {
			t.Errorf("service %s: selector %v ports %+v", s.Name, s.Spec.Selector, s.Spec.Ports)
		}
		if s.Spec.ClusterIP == corev1.ClusterIPNone {
			headless++
		} else {
			clusterIP++
		}
	}
	if clusterIP != 1 || headless != 1 {
		t.Errorf("%d ClusterIP and %d headless services, want 1 and 1", clusterIP, headless)
	}

	np := objs.np
	if np == nil {
		t.Fatal("no NetworkPolicy")
	}
	if np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] != "slowrank-aggregator" ||
		!slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) ||
		len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].Ports) != 1 || np.Spec.Ingress[0].Ports[0].Port.IntValue() != 4317 {
		t.Fatalf("network policy %+v", np.Spec)
	}
	from := np.Spec.Ingress[0].From
	if len(from) != 2 {
		t.Fatalf("ingress peers %+v: want the release's agents and the collector", from)
	}
	for _, peer := range from {
		if ns := peer.NamespaceSelector; ns == nil || ns.MatchLabels["kubernetes.io/metadata.name"] == "" {
			t.Errorf("ingress peer %+v admits pods of any namespace by labels a tenant can set", peer)
		}
	}
	if from[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "slowrank" ||
		from[0].PodSelector == nil || from[0].PodSelector.MatchLabels["app.kubernetes.io/name"] != "slowrank-agent" {
		t.Errorf("first peer %+v: want this release's agents", from[0])
	}
}

func TestAggregatorVariants(t *testing.T) {
	tests := []struct {
		name  string
		vals  map[string]any
		check func(t *testing.T, objs aggregatorObjects)
	}{
		{"TLS with client certificates and a token", aggregatorOn(map[string]any{
			"tls":   map[string]any{"secretName": "agg-tls", "requireClientCerts": true},
			"token": map[string]any{"secretName": "agg-token", "key": "t"},
		}), func(t *testing.T, objs aggregatorObjects) {
			spec := objs.deploy.Spec.Template.Spec
			agg := container(t, spec, "aggregator", false)
			for _, a := range []string{"--tls-cert=/etc/slowrank/tls/tls.crt", "--tls-key=/etc/slowrank/tls/tls.key",
				"--tls-client-ca=/etc/slowrank/tls/ca.crt", "--token-file=/etc/slowrank/token/t"} {
				if !slices.Contains(agg.Args, a) {
					t.Errorf("args %v lack %s", agg.Args, a)
				}
			}
			secrets := map[string]string{}
			for _, v := range spec.Volumes {
				if v.Secret != nil {
					secrets[v.Name] = v.Secret.SecretName
				}
			}
			if secrets["tls"] != "agg-tls" || secrets["token"] != "agg-token" {
				t.Errorf("secret volumes %v", secrets)
			}
			for _, m := range agg.VolumeMounts {
				if !m.ReadOnly {
					t.Errorf("mount %s is writable", m.Name)
				}
			}
		}},
		{"replicas, endpoint, flags and extra peers", aggregatorOn(map[string]any{
			"replicas": 3, "otlpEndpoint": "http://otel.monitoring:4318", "extraArgs": []any{"--window=10s"},
			"networkPolicy": map[string]any{"from": []any{map[string]any{
				"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "obs"}}}}},
		}), func(t *testing.T, objs aggregatorObjects) {
			if r := objs.deploy.Spec.Replicas; r == nil || *r != 3 {
				t.Errorf("replicas %v", r)
			}
			agg := container(t, objs.deploy.Spec.Template.Spec, "aggregator", false)
			if !slices.Contains(agg.Args, "--window=10s") || aggregatorEnv(agg, "OTEL_EXPORTER_OTLP_ENDPOINT") != "http://otel.monitoring:4318" {
				t.Errorf("args %v env %v", agg.Args, agg.Env)
			}
			if from := objs.np.Spec.Ingress[0].From; len(from) != 2 || from[1].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "obs" {
				t.Errorf("ingress peers %+v", from)
			}
		}},
		{"network policy off", aggregatorOn(map[string]any{"networkPolicy": map[string]any{"enabled": false}}),
			func(t *testing.T, objs aggregatorObjects) {
				if objs.np != nil {
					t.Error("NetworkPolicy rendered")
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := renderAggregator(t, tt.vals)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, objs)
		})
	}
}

// TestAggregatorPlainManifestIsTheChart: deploy/kubernetes/aggregator.yaml
// is what the chart renders by default for release "slowrank", so that the
// two forms cannot drift apart.
func TestAggregatorPlainManifestIsTheChart(t *testing.T) {
	chart, err := renderAggregatorAs(t, "slowrank", aggregatorOn(nil))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("../../kubernetes/aggregator.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var plain aggregatorObjects
	plain.decode(t, "aggregator.yaml", string(b))
	slices.SortFunc(chart.services, func(a, b corev1.Service) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(plain.services, func(a, b corev1.Service) int { return strings.Compare(a.Name, b.Name) })
	if !reflect.DeepEqual(chart.deploy, plain.deploy) {
		t.Errorf("Deployment differs:\nchart %+v\nplain %+v", chart.deploy, plain.deploy)
	}
	if !reflect.DeepEqual(chart.services, plain.services) {
		t.Errorf("Services differ:\nchart %+v\nplain %+v", chart.services, plain.services)
	}
	if !reflect.DeepEqual(chart.np, plain.np) {
		t.Errorf("NetworkPolicy differs:\nchart %+v\nplain %+v", chart.np, plain.np)
	}
}

func TestAggregatorRefusesClientCertsWithoutTLS(t *testing.T) {
	if _, err := renderAggregator(t, aggregatorOn(map[string]any{"tls": map[string]any{"requireClientCerts": true}})); err == nil {
		t.Fatal("rendered client-certificate checks without a certificate")
	}
}

func aggregatorEnv(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func aggregatorFieldEnv(c corev1.Container, name string) bool {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			return true
		}
	}
	return false
}
