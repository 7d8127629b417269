package check

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// renderAgents renders the chart with vals (release "sr", namespace
// "slowrank") and decodes the agents' DaemonSet strictly; it also returns
// the install notes.
func renderAgents(t *testing.T, vals map[string]any) (*appsv1.DaemonSet, string, error) {
	t.Helper()
	out, err := renderFiles(t, "sr", vals)
	if err != nil {
		return nil, "", err
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict([]byte(out["slowrank/templates/daemonset.yaml"]), &ds); err != nil {
		t.Fatalf("daemonset.yaml does not match the DaemonSet API: %v", err)
	}
	return &ds, out["slowrank/templates/NOTES.txt"], nil
}

// forwarding is what the agent container is told about the aggregator:
// its environment and the files its secret volumes give.
type forwarding struct {
	address, tokenFile, caFile string
	secrets                    map[string]string // mount path/file -> secret/key
}

func forwardingOf(t *testing.T, ds *appsv1.DaemonSet) forwarding {
	t.Helper()
	spec := ds.Spec.Template.Spec
	agent := container(t, spec, "agent", false)
	f := forwarding{
		address:   aggregatorEnv(agent, "SLOWRANK_AGGREGATOR"),
		tokenFile: aggregatorEnv(agent, "SLOWRANK_AGGREGATOR_TOKEN_FILE"),
		caFile:    aggregatorEnv(agent, "SLOWRANK_AGGREGATOR_CA"),
		secrets:   map[string]string{},
	}
	vols := map[string]*corev1.SecretVolumeSource{}
	for _, v := range spec.Volumes {
		if v.Secret != nil {
			vols[v.Name] = v.Secret
		}
	}
	for _, m := range agent.VolumeMounts {
		s, ok := vols[m.Name]
		if !ok {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("secret mount %s is writable", m.Name)
		}
		for _, it := range s.Items {
			f.secrets[m.MountPath+"/"+it.Path] = s.SecretName + "/" + it.Key
		}
	}
	if len(f.secrets) != len(vols) {
		t.Errorf("secret volumes %v, mounted files %v: each volume is mounted with one file", vols, f.secrets)
	}
	return f
}

func TestAgentsForwardToTheAggregator(t *testing.T) {
	token := map[string]any{"secretName": "agg-token", "key": "t"}
	tests := []struct {
		name string
		vals map[string]any
		want forwarding
	}{
		{"no aggregator: no forwarding", nil, forwarding{}},
		{"this release's aggregator, plaintext", aggregatorOn(nil),
			forwarding{address: "grpc://sr-aggregator.slowrank.svc:4317"}},
		{"its token goes with it", aggregatorOn(map[string]any{"token": token}), forwarding{
			address:   "grpc://sr-aggregator.slowrank.svc:4317",
			tokenFile: "/etc/slowrank/aggregator-token/t",
			secrets:   map[string]string{"/etc/slowrank/aggregator-token/t": "agg-token/t"},
		}},
		{"TLS: grpcs, the CA named", map[string]any{
			"aggregator": map[string]any{"enabled": true, "port": 4443, "tls": map[string]any{"secretName": "agg-tls"}},
			"forward":    map[string]any{"ca": map[string]any{"secretName": "agg-tls"}},
		}, forwarding{
			address: "grpcs://sr-aggregator.slowrank.svc:4443",
			caFile:  "/etc/slowrank/aggregator-ca/ca.crt",
			secrets: map[string]string{"/etc/slowrank/aggregator-ca/ca.crt": "agg-tls/ca.crt"},
		}},
		{"several replicas behind the loadbalancing collector, its own token", map[string]any{
			"aggregator": map[string]any{"enabled": true, "replicas": 3, "token": token},
			"forward": map[string]any{"address": "grpc://otel-lb.monitoring:4317",
				"token": map[string]any{"secretName": "lb-token", "key": "token"}},
		}, forwarding{
			address:   "grpc://otel-lb.monitoring:4317",
			tokenFile: "/etc/slowrank/aggregator-token/token",
			secrets:   map[string]string{"/etc/slowrank/aggregator-token/token": "lb-token/token"},
		}},
		{"an address elsewhere does not take this release's token", map[string]any{
			"aggregator": map[string]any{"enabled": true, "token": token},
			"forward":    map[string]any{"address": "https://agg.example:4318"},
		}, forwarding{address: "https://agg.example:4318"}},
		{"no Service by default over several replicas: one job must reach one aggregator",
			aggregatorOn(map[string]any{"replicas": 2, "token": token}), forwarding{}},
		{"no Service by default where it wants client certificates", aggregatorOn(map[string]any{
			"tls": map[string]any{"secretName": "agg-tls", "requireClientCerts": true}}), forwarding{}},
		{"extraArgs that forward themselves are left alone", map[string]any{
			"aggregator": map[string]any{"enabled": true, "token": token},
			"extraArgs":  []any{"--aggregator=grpc://otel-lb.monitoring:4317"},
		}, forwarding{}},
		{"off", map[string]any{
			"aggregator": map[string]any{"enabled": true, "token": token},
			"forward":    map[string]any{"address": "off"},
		}, forwarding{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ds, notes, err := renderAgents(t, tt.vals)
			if err != nil {
				t.Fatal(err)
			}
			if tt.want.address != "" && !strings.Contains(notes, "forward their facts to "+tt.want.address) {
				t.Errorf("the notes do not say where the facts go:\n%s", notes)
			}
			got := forwardingOf(t, ds)
			if tt.want.secrets == nil {
				tt.want.secrets = map[string]string{}
			}
			if got.address != tt.want.address || got.tokenFile != tt.want.tokenFile || got.caFile != tt.want.caFile ||
				len(got.secrets) != len(tt.want.secrets) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
			for k, v := range tt.want.secrets {
				if got.secrets[k] != v {
					t.Errorf("%s from %q, want %q", k, got.secrets[k], v)
				}
			}
		})
	}
}
