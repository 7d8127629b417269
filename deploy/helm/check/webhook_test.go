package check

import (
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// injectLabel is agent/admission.InjectLabel: the label the webhook checks
// and the objectSelector matches must be one.
const injectLabel = "slowrank.dev/inject"

// webhookObjects is every object the chart renders, by kind, decoded
// strictly against its API type; cert-manager's kinds against the fields of
// its CRDs that the chart uses.
type webhookObjects struct {
	deploys  []appsv1.Deployment
	services []corev1.Service
	sas      []corev1.ServiceAccount
	mwcs     []admissionv1.MutatingWebhookConfiguration
	certs    []certificate
	issuers  []issuer
	pdbs     []policyv1.PodDisruptionBudget
}

// certificate is cert-manager.io/v1 Certificate, the fields the chart sets.
type certificate struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		SecretName string    `json:"secretName"`
		DNSNames   []string  `json:"dnsNames"`
		IssuerRef  issuerRef `json:"issuerRef"`
		PrivateKey struct {
			RotationPolicy string `json:"rotationPolicy"`
		} `json:"privateKey"`
	} `json:"spec"`
}

type issuerRef struct {
	Name  string `json:"name"`
	Kind  string `json:"kind"`
	Group string `json:"group"`
}

// issuer is cert-manager.io/v1 Issuer, self-signed.
type issuer struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		SelfSigned *struct{} `json:"selfSigned"`
	} `json:"spec"`
}

// renderWebhook renders the chart and decodes the webhook's objects (the
// agent's are checked by chart_test.go).
func renderWebhook(t *testing.T, webhook map[string]any) (webhookObjects, error) {
	t.Helper()
	vals := map[string]any{"image": map[string]any{"tag": "0.1.0", "digest": digest}, "webhook": webhook}
	out, err := renderFiles(t, "sr", vals)
	if err != nil {
		return webhookObjects{}, err
	}
	var o webhookObjects
	for name, text := range out {
		if !strings.HasSuffix(name, "/webhook.yaml") {
			continue
		}
		for _, doc := range strings.Split(text, "\n---\n") {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			var meta struct{ Kind string }
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			var into any
			switch meta.Kind {
			case "Deployment":
				o.deploys = append(o.deploys, appsv1.Deployment{})
				into = &o.deploys[len(o.deploys)-1]
			case "Service":
				o.services = append(o.services, corev1.Service{})
				into = &o.services[len(o.services)-1]
			case "ServiceAccount":
				o.sas = append(o.sas, corev1.ServiceAccount{})
				into = &o.sas[len(o.sas)-1]
			case "MutatingWebhookConfiguration":
				o.mwcs = append(o.mwcs, admissionv1.MutatingWebhookConfiguration{})
				into = &o.mwcs[len(o.mwcs)-1]
			case "Certificate":
				o.certs = append(o.certs, certificate{})
				into = &o.certs[len(o.certs)-1]
			case "Issuer":
				o.issuers = append(o.issuers, issuer{})
				into = &o.issuers[len(o.issuers)-1]
			case "PodDisruptionBudget":
				o.pdbs = append(o.pdbs, policyv1.PodDisruptionBudget{})
				into = &o.pdbs[len(o.pdbs)-1]
			default:
				t.Fatalf("%s: unexpected kind %q", name, meta.Kind)
			}
			if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
				t.Fatalf("%s does not match the %s API: %v", name, meta.Kind, err)
			}
		}
	}
	return o, nil
}

func TestWebhookOffByDefault(t *testing.T) {
	o, err := renderWebhook(t, map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.deploys)+len(o.services)+len(o.sas)+len(o.mwcs)+len(o.certs)+len(o.issuers) != 0 {
		t.Errorf("webhook objects rendered by default: %+v", o)
	}
}

// TestWebhookFailsOpenAndRunsUnprivileged: the promises of docs/deploy.md
// section 2.3 — a webhook outage never blocks a pod, only opted-in pods are
// sent, the webhook runs without privileges — with cert-manager (default).
func TestWebhookFailsOpenAndRunsUnprivileged(t *testing.T) {
	o, err := renderWebhook(t, map[string]any{"enabled": true})
	if err != nil {
		t.Fatal(err)
	}
	if len(o.deploys) != 1 || len(o.services) != 1 || len(o.sas) != 1 || len(o.mwcs) != 1 || len(o.certs) != 1 || len(o.issuers) != 1 {
		t.Fatalf("rendered %d deployments, %d services, %d service accounts, %d webhook configurations, %d certificates, %d issuers",
			len(o.deploys), len(o.services), len(o.sas), len(o.mwcs), len(o.certs), len(o.issuers))
	}
	d, svc, mwc, cert := o.deploys[0], o.services[0], o.mwcs[0], o.certs[0]

	// The webhook configuration.
	if len(mwc.Webhooks) != 1 {
		t.Fatalf("%d webhooks", len(mwc.Webhooks))
	}
	wh := mwc.Webhooks[0]
	if wh.FailurePolicy == nil || *wh.FailurePolicy != admissionv1.Ignore {
		t.Error("failurePolicy is not Ignore: a webhook outage would block pods")
	}
	if wh.TimeoutSeconds == nil || *wh.TimeoutSeconds > 5 {
		t.Errorf("timeoutSeconds %v, want at most 5", wh.TimeoutSeconds)
	}
	if wh.SideEffects == nil || *wh.SideEffects != admissionv1.SideEffectClassNone {
		t.Error("sideEffects is not None")
	}
	if wh.ReinvocationPolicy == nil || *wh.ReinvocationPolicy != admissionv1.IfNeededReinvocationPolicy {
		t.Error("reinvocationPolicy is not IfNeeded: containers added by a later webhook would lack the library")
	}
	if !slices.Equal(wh.AdmissionReviewVersions, []string{"v1"}) {
		t.Errorf("admissionReviewVersions %v, want [v1] (the only one the webhook decodes)", wh.AdmissionReviewVersions)
	}
	if len(wh.Rules) != 1 || !slices.Equal(wh.Rules[0].Operations, []admissionv1.OperationType{admissionv1.Create}) ||
		!slices.Equal(wh.Rules[0].Resources, []string{"pods"}) || !slices.Equal(wh.Rules[0].APIGroups, []string{""}) {
		t.Errorf("rules %+v, want CREATE of core pods only", wh.Rules)
	}
	if wh.ObjectSelector == nil || wh.ObjectSelector.MatchLabels[injectLabel] != "true" || len(wh.ObjectSelector.MatchExpressions) != 0 {
		t.Errorf("objectSelector %+v, want %s=true", wh.ObjectSelector, injectLabel)
	}
	if wh.NamespaceSelector == nil || len(wh.NamespaceSelector.MatchExpressions) != 1 ||
		wh.NamespaceSelector.MatchExpressions[0].Operator != metav1.LabelSelectorOpNotIn ||
		!slices.Contains(wh.NamespaceSelector.MatchExpressions[0].Values, "kube-system") ||
		!slices.Contains(wh.NamespaceSelector.MatchExpressions[0].Values, "slowrank") {
		t.Errorf("namespaceSelector %+v, want kube-system and the release's namespace excluded", wh.NamespaceSelector)
	}

	// The Service the API server calls, and the Deployment behind it.
	ref := wh.ClientConfig.Service
	if ref == nil || ref.Name != svc.Name || ref.Namespace != svc.Namespace || ref.Path == nil || *ref.Path != "/mutate" ||
		ref.Port == nil || *ref.Port != svc.Spec.Ports[0].Port {
		t.Errorf("clientConfig.service %+v does not name the Service %s/%s port %d at /mutate", ref, svc.Namespace, svc.Name, svc.Spec.Ports[0].Port)
	}
	for k, v := range svc.Spec.Selector {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("the Service selects %s=%s, which the webhook's pods lack", k, v)
		}
	}
	c := d.Spec.Template.Spec.Containers[0]
	if len(c.Ports) != 1 || svc.Spec.Ports[0].TargetPort.StrVal != c.Ports[0].Name || !slices.Contains(c.Args, "--listen=:8443") ||
		c.Ports[0].ContainerPort != 8443 {
		t.Errorf("the Service targets %v, the container listens on %v (args %v)", svc.Spec.Ports[0].TargetPort, c.Ports, c.Args)
	}
	if !slices.Contains(c.Args, "--lib-dir=/opt/slowrank/lib") || slices.Contains(c.Args, "--nccl-plugin") {
		t.Errorf("args %v: want the chart's libDir, no --nccl-plugin by default", c.Args)
	}
	ps, sc := d.Spec.Template.Spec.SecurityContext, c.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil || *ps.RunAsUser == 0 ||
		ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context %+v: want non-root with the runtime's seccomp profile", ps)
	}
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil ||
		*sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		len(sc.Capabilities.Add) != 0 || sc.Privileged != nil && *sc.Privileged {
		t.Errorf("container security context %+v: want read-only root, no escalation, no capabilities", sc)
	}
	spec := d.Spec.Template.Spec
	if spec.HostPID || spec.HostNetwork || spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("the webhook pod shares the host's namespaces or mounts an API token")
	}
	for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS || p.HTTPGet.Path != "/healthz" {
			t.Errorf("probe %+v, want HTTPS /healthz", p)
		}
	}

	// cert-manager: the Certificate names the Service, its Secret is the
	// one mounted, and the CA is injected from it.
	if got := mwc.Annotations["cert-manager.io/inject-ca-from"]; got != cert.Metadata.Namespace+"/"+cert.Metadata.Name {
		t.Errorf("inject-ca-from %q, want the Certificate %s/%s", got, cert.Metadata.Namespace, cert.Metadata.Name)
	}
	if len(wh.ClientConfig.CABundle) != 0 {
		t.Error("a caBundle is set although cert-manager injects it")
	}
	if !slices.Contains(cert.Spec.DNSNames, svc.Name+"."+svc.Namespace+".svc") {
		t.Errorf("the certificate names %v, not the Service %s.%s.svc", cert.Spec.DNSNames, svc.Name, svc.Namespace)
	}
	if v := spec.Volumes; len(v) != 1 || v[0].Secret == nil || v[0].Secret.SecretName != cert.Spec.SecretName {
		t.Errorf("volumes %+v, want the Certificate's Secret %s", v, cert.Spec.SecretName)
	}
	if cert.Spec.IssuerRef.Name != o.issuers[0].Metadata.Name || cert.Spec.IssuerRef.Kind != "Issuer" || o.issuers[0].Spec.SelfSigned == nil {
		t.Errorf("issuerRef %+v, want the chart's self-signed Issuer", cert.Spec.IssuerRef)
	}
}

func TestWebhookVariants(t *testing.T) {
	t.Run("a user's Secret and CA bundle, no cert-manager", func(t *testing.T) {
		o, err := renderWebhook(t, map[string]any{"enabled": true, "certManager": map[string]any{"enabled": false},
			"tls": map[string]any{"secretName": "my-tls", "caBundle": "Y2EK"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(o.certs)+len(o.issuers) != 0 || len(o.mwcs[0].Annotations) != 0 {
			t.Error("cert-manager objects or annotation rendered without cert-manager")
		}
		if string(o.mwcs[0].Webhooks[0].ClientConfig.CABundle) != "ca\n" {
			t.Errorf("caBundle %q", o.mwcs[0].Webhooks[0].ClientConfig.CABundle)
		}
		if s := o.deploys[0].Spec.Template.Spec.Volumes[0].Secret; s == nil || s.SecretName != "my-tls" {
			t.Errorf("volume %+v, want the Secret my-tls", s)
		}
	})
	t.Run("two replicas: spread over nodes, evicted one at a time", func(t *testing.T) {
		o, err := renderWebhook(t, map[string]any{"enabled": true})
		if err != nil {
			t.Fatal(err)
		}
		labels := o.deploys[0].Spec.Template.Labels
		if len(o.pdbs) != 1 || o.pdbs[0].Spec.MaxUnavailable == nil || o.pdbs[0].Spec.MaxUnavailable.IntValue() != 1 ||
			o.pdbs[0].Spec.MinAvailable != nil || !selects(o.pdbs[0].Spec.Selector.MatchLabels, labels) {
			t.Fatalf("disruption budgets %+v, want one taking one webhook pod at a time", o.pdbs)
		}
		spread := o.deploys[0].Spec.Template.Spec.TopologySpreadConstraints
		if len(spread) != 1 || spread[0].TopologyKey != "kubernetes.io/hostname" || spread[0].WhenUnsatisfiable != corev1.ScheduleAnyway ||
			!selects(spread[0].LabelSelector.MatchLabels, labels) {
			t.Errorf("spread %+v, want the replicas on different nodes where they can be", spread)
		}
	})
	t.Run("one replica: no budget that would block a drain", func(t *testing.T) {
		o, err := renderWebhook(t, map[string]any{"enabled": true, "replicas": 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(o.pdbs) != 0 || len(o.deploys[0].Spec.Template.Spec.TopologySpreadConstraints) != 0 {
			t.Errorf("budgets %+v, spread %+v", o.pdbs, o.deploys[0].Spec.Template.Spec.TopologySpreadConstraints)
		}
	})
	t.Run("an existing ClusterIssuer", func(t *testing.T) {
		o, err := renderWebhook(t, map[string]any{"enabled": true, "certManager": map[string]any{"issuerRef": map[string]any{"name": "ca", "kind": "ClusterIssuer"}}})
		if err != nil {
			t.Fatal(err)
		}
		if len(o.issuers) != 0 || o.certs[0].Spec.IssuerRef != (issuerRef{Name: "ca", Kind: "ClusterIssuer", Group: "cert-manager.io"}) {
			t.Errorf("issuers %d, issuerRef %+v", len(o.issuers), o.certs[0].Spec.IssuerRef)
		}
	})
	t.Run("the NCCL plugin, more namespaces left alone, another port", func(t *testing.T) {
		o, err := renderWebhook(t, map[string]any{"enabled": true, "ncclPlugin": true, "excludeNamespaces": []any{"batch-system"}, "port": 9443})
		if err != nil {
			t.Fatal(err)
		}
		c := o.deploys[0].Spec.Template.Spec.Containers[0]
		if !slices.Contains(c.Args, "--nccl-plugin") || !slices.Contains(c.Args, "--listen=:9443") || c.Ports[0].ContainerPort != 9443 {
			t.Errorf("args %v ports %v", c.Args, c.Ports)
		}
		if !slices.Contains(o.mwcs[0].Webhooks[0].NamespaceSelector.MatchExpressions[0].Values, "batch-system") {
			t.Errorf("namespaceSelector %+v", o.mwcs[0].Webhooks[0].NamespaceSelector)
		}
	})
	for _, tc := range []struct {
		name    string
		webhook map[string]any
		msg     string
	}{
		{"no cert-manager and no Secret", map[string]any{"enabled": true, "certManager": map[string]any{"enabled": false}}, "webhook.tls.secretName"},
		{"a Secret without its CA", map[string]any{"enabled": true, "certManager": map[string]any{"enabled": false}, "tls": map[string]any{"secretName": "x"}}, "caBundle"},
		{"a timeout the API server refuses", map[string]any{"enabled": true, "timeoutSeconds": 31}, "timeoutSeconds must be 1-30"},
		{"no timeout", map[string]any{"enabled": true, "timeoutSeconds": 0}, "timeoutSeconds must be 1-30"},
	} {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			_, err := renderWebhook(t, tc.webhook)
			if err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %v, want one naming %s", err, tc.msg)
			}
		})
	}
}
