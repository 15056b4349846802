// Package install checks the release artifacts: dist/install.yaml is
// config/default rendered for the release image, the Helm chart in
// dist/chart renders the same objects by default, its values change what
// they say, and every object passes server-side dry-run on a real API server.
package install

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fencekeeper/fencekeeper/internal/localcp"
)

// TestInstallYAMLIsCurrent: the committed dist/install.yaml and the chart's
// copies of generated files are what make build-installer writes today.
func TestInstallYAMLIsCurrent(t *testing.T) {
	root := repoRoot(t)
	img := "ghcr.io/fencekeeper/manager:" + release(t, root)
	committed, err := os.ReadFile(filepath.Join(root, "dist", "install.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	compare(t, "config/default for "+img, parse(t, renderKustomize(t, root, img, "")), "dist/install.yaml", parse(t, committed))
	copies := map[string]string{
		"config/webhook/manifests.yaml":   "dist/chart/files/webhooks.yaml",
		"config/prometheus/rules.yaml":    "dist/chart/files/prometheus-rules.yaml",
		"config/grafana/fencekeeper.json": "dist/chart/files/grafana-dashboard.json",
	}
	for _, f := range []string{"role.yaml", "leader_election_role.yaml", "lockgrant_requester_role.yaml", "fencedresource_admin_role.yaml", "metrics_reader_role.yaml"} {
		copies["config/rbac/"+f] = "dist/chart/files/rbac/" + f
	}
	crds, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	if err != nil || len(crds) == 0 {
		t.Fatalf("no CRDs in config/crd/bases (%v)", err)
	}
	for _, c := range crds {
		copies["config/crd/bases/"+filepath.Base(c)] = "dist/chart/files/crds/" + filepath.Base(c)
	}
	for src, dst := range copies {
		a, errA := os.ReadFile(filepath.Join(root, src))
		b, errB := os.ReadFile(filepath.Join(root, dst))
		if errA != nil || errB != nil || !bytes.Equal(a, b) {
			t.Errorf("%s is not a copy of %s (%v, %v): run make build-installer and commit dist/", dst, src, errA, errB)
		}
	}
	if t.Failed() {
		t.Log("dist/ is stale: run `make build-installer` and commit dist/")
	}
}

// TestChartMatchesKustomize: by default the chart renders the objects of
// config/default, field for field, except the labels in chartOnlyLabels.
func TestChartMatchesKustomize(t *testing.T) {
	root := repoRoot(t)
	img := "ghcr.io/fencekeeper/manager:" + release(t, root)
	// The uninstall cleanup's hook objects are the chart's own (cleanup_test.go).
	compare(t, "config/default", parse(t, renderKustomize(t, root, img, "")), "dist/chart", withoutHooks(parse(t, renderChart(t, root))))

	// Another namespace: the same objects again, and no fencekeeper-system left.
	ns := "locks-ops"
	chart := renderChart(t, root, "namespace.name="+ns)
	kustomized := renderKustomize(t, root, img, ns)
	compare(t, "config/default in "+ns, parse(t, kustomized), "dist/chart in "+ns, withoutHooks(parse(t, chart)))
	for name, out := range map[string][]byte{"dist/chart with namespace.name=" + ns: chart, "config/default with namespace: " + ns: kustomized} {
		if i := bytes.Index(out, []byte("fencekeeper-system")); i >= 0 {
			t.Errorf("%s still names fencekeeper-system: …%s…", name, out[max(0, i-200):min(len(out), i+40)])
		}
	}
}

// find returns the rendered object with that key, failing if there is none.
func find(t *testing.T, objs []object, k string) object {
	t.Helper()
	o, ok := byKey(t, objs)[k]
	if !ok {
		t.Fatalf("no %s rendered", k)
	}
	return o
}

func has(objs []object, k string) bool {
	for _, o := range objs {
		if key(o) == k {
			return true
		}
	}
	return false
}

func managerSpec(t *testing.T, objs []object) (pod, container map[string]any) {
	t.Helper()
	d := find(t, objs, "Deployment fencekeeper-system/fencekeeper-controller-manager")
	pod = d["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	return pod, pod["containers"].([]any)[0].(map[string]any)
}

func TestChartValues(t *testing.T) {
	root := repoRoot(t)
	for _, c := range []struct {
		name string
		test func(t *testing.T, root string)
	}{
		{"self-signed certificates: replicas share one Secret", chartSelfSignedCerts},
		{"cert-manager's user reaches the manager", chartCertManagerUsername},
		{"protected kinds reach both protected entries and the operator's RBAC", chartProtectedKinds},
		{"replicas, resources, priority class, PDB and spread toggles", chartReplicasAndScheduling},
		{"monitoring objects and NetworkPolicy are off by default and on by value", chartOptionalObjects},
	} {
		t.Run(c.name, func(t *testing.T) { c.test(t, root) })
	}
}

// chartSelfSignedCerts: with self-signed certificates the replicas share one
// Secret: no cert-manager objects, a PodDisruptionBudget, the manager flags,
// no mounted certificate and no CA injection.
func chartSelfSignedCerts(t *testing.T, root string) {
	objs := parse(t, renderChart(t, root, "certificates.mode=self-signed"))
	for _, k := range []string{"Certificate fencekeeper-system/fencekeeper-serving-cert", "Issuer fencekeeper-system/fencekeeper-selfsigned-issuer"} {
		if has(objs, k) {
			t.Errorf("self-signed rendered %s", k)
		}
	}
	if !has(objs, "PodDisruptionBudget fencekeeper-system/fencekeeper-controller-manager") {
		t.Errorf("self-signed with 2 replicas rendered no PodDisruptionBudget")
	}
	pod, c := managerSpec(t, objs)
	args := strings.Join(toStrings(c["args"]), " ")
	for _, want := range []string{"--self-signed-certs", "--webhook-hosts=fencekeeper-webhook-service.fencekeeper-system.svc,",
		"--webhook-configuration=fencekeeper-validating-webhook-configuration", "--cert-manager-username= "} {
		if !strings.Contains(args+" ", want) {
			t.Errorf("manager args %q lack %q", args, want)
		}
	}
	if v, ok := pod["volumes"]; ok {
		t.Errorf("self-signed: the replicas read the shared Secret, yet the pod mounts %v", v)
	}
	cfg := find(t, objs, "ValidatingWebhookConfiguration /fencekeeper-validating-webhook-configuration")
	if _, ok := cfg["metadata"].(map[string]any)["annotations"]; ok {
		t.Errorf("self-signed: the webhook configuration still asks cert-manager to inject a CA")
	}
}

// chartCertManagerUsername: cert-manager's user reaches the manager's flags.
func chartCertManagerUsername(t *testing.T, root string) {
	_, c := managerSpec(t, parse(t, renderChart(t, root, "certificates.certManagerUsername=system:serviceaccount:certs:cm")))
	if args := strings.Join(toStrings(c["args"]), " "); !strings.Contains(args, "--cert-manager-username=system:serviceaccount:certs:cm") {
		t.Errorf("manager args %q lack the cert-manager user", args)
	}
}

// chartProtectedKinds: a protected kind reaches both protected webhook
// entries, the operator's RBAC and the manager's flags; one without a
// version is refused.
func chartProtectedKinds(t *testing.T, root string) {
	objs := parse(t, renderChart(t, root, "protectedKinds[0].group=apps", "protectedKinds[0].version=v1", "protectedKinds[0].resource=deployments"))
	cfg := find(t, objs, "ValidatingWebhookConfiguration /fencekeeper-validating-webhook-configuration")
	protected := 0
	for _, w := range cfg["webhooks"].([]any) {
		w := w.(map[string]any)
		name := w["name"].(string)
		found := false
		for _, r := range w["rules"].([]any) {
			r := r.(map[string]any)
			if strings.Join(toStrings(r["apiGroups"]), ",") == "apps" && strings.Join(toStrings(r["resources"]), ",") == "deployments,deployments/*" {
				found = true
			}
		}
		isProtected := name == localcp.ProtectedWebhook || name == localcp.EnrolledWebhook
		if isProtected {
			protected++
		}
		if found != isProtected {
			t.Errorf("webhook %s: has the deployments rule %v, want %v", name, found, isProtected)
		}
	}
	if protected != 2 {
		t.Errorf("found %d protected webhook entries, want 2 (%s, %s)", protected, localcp.ProtectedWebhook, localcp.EnrolledWebhook)
	}
	role := find(t, objs, "ClusterRole /fencekeeper-protected-kind-deployments.apps")
	if l := role["metadata"].(map[string]any)["labels"].(map[string]any); l["fencekeeper.dev/aggregate-to-manager"] != "true" {
		t.Errorf("per-kind role labels %v lack the aggregation label", l)
	}
	rule := role["rules"].([]any)[0].(map[string]any)
	if toStrings(rule["resources"])[0] != "deployments" || strings.Join(toStrings(rule["verbs"]), ",") != "get,list,watch" {
		t.Errorf("per-kind reader rule %v, want get, list, watch on apps/deployments", rule)
	}
	if _, c := managerSpec(t, objs); !strings.Contains(fmt.Sprint(c["args"]), "--protected-kinds=deployments.apps/v1") {
		t.Errorf("manager args %v lack --protected-kinds=deployments.apps/v1", c["args"])
	}
	if _, err := tryRenderChart(t, root, "protectedKinds[0].group=apps", "protectedKinds[0].resource=deployments"); err == nil || !strings.Contains(err.Error(), "/protectedKinds/0") || !strings.Contains(err.Error(), "'version'") {
		t.Errorf("a protected kind without a version rendered (err %v); want a refusal", err)
	}
}

// chartReplicasAndScheduling: replicas, resources, priority class, PDB and
// spread toggles reach the Deployment and the PDB.
func chartReplicasAndScheduling(t *testing.T, root string) {
	if pod, _ := managerSpec(t, parse(t, renderChart(t, root))); pod["priorityClassName"] != "system-cluster-critical" {
		t.Errorf("default priorityClassName %v, want system-cluster-critical (the webhooks fail closed)", pod["priorityClassName"])
	}
	objs := parse(t, renderChart(t, root, "replicas=3", "resources.limits.memory=2Gi", "priorityClassName=fencekeeper-critical",
		"topologySpread.enabled=false", "podDisruptionBudget.minAvailable=2"))
	pod, c := managerSpec(t, objs)
	d := find(t, objs, "Deployment fencekeeper-system/fencekeeper-controller-manager")
	if r := d["spec"].(map[string]any)["replicas"]; r != float64(3) {
		t.Errorf("replicas %v, want 3", r)
	}
	if m := c["resources"].(map[string]any)["limits"].(map[string]any)["memory"]; m != "2Gi" {
		t.Errorf("memory limit %v, want 2Gi", m)
	}
	if _, ok := c["resources"].(map[string]any)["limits"].(map[string]any)["cpu"]; ok {
		t.Errorf("the chart sets a CPU limit")
	}
	if pod["priorityClassName"] != "fencekeeper-critical" {
		t.Errorf("priorityClassName %v", pod["priorityClassName"])
	}
	if _, ok := pod["topologySpreadConstraints"]; ok {
		t.Errorf("topologySpread.enabled=false still spreads")
	}
	if _, ok := pod["affinity"]; ok {
		t.Errorf("topologySpread.enabled=false still sets anti-affinity")
	}
	pdb := find(t, objs, "PodDisruptionBudget fencekeeper-system/fencekeeper-controller-manager")
	if pdb["spec"].(map[string]any)["minAvailable"] != float64(2) {
		t.Errorf("PDB %v, want minAvailable 2", pdb["spec"])
	}
	if has(parse(t, renderChart(t, root, "podDisruptionBudget.enabled=false")), "PodDisruptionBudget fencekeeper-system/fencekeeper-controller-manager") {
		t.Errorf("podDisruptionBudget.enabled=false still renders the PDB")
	}
}

// chartOptionalObjects: monitoring objects and the NetworkPolicy are off by
// default and on by value; the metrics Service is always there.
func chartOptionalObjects(t *testing.T, root string) {
	defaults := parse(t, renderChart(t, root))
	on := parse(t, renderChart(t, root, "serviceMonitor.enabled=true", "networkPolicy.enabled=true",
		"prometheusRule.enabled=true", "grafanaDashboard.enabled=true",
		"serviceMonitor.prometheusServiceAccount.name=prometheus", "serviceMonitor.prometheusServiceAccount.namespace=monitoring"))
	for _, k := range []string{"ServiceMonitor fencekeeper-system/fencekeeper-metrics",
		"NetworkPolicy fencekeeper-system/fencekeeper-controller-manager", "PrometheusRule fencekeeper-system/fencekeeper",
		"ConfigMap fencekeeper-system/fencekeeper-grafana-dashboard", "ClusterRoleBinding /fencekeeper-metrics-reader"} {
		if has(defaults, k) {
			t.Errorf("default values render %s", k)
		}
		if !has(on, k) {
			t.Errorf("enabled values do not render %s", k)
		}
	}
	// The metrics Service is part of every install (config/default has it too).
	for _, k := range []string{"Service fencekeeper-system/fencekeeper-metrics", "ClusterRole /fencekeeper-metrics-reader"} {
		if !has(defaults, k) {
			t.Errorf("default values do not render %s", k)
		}
	}
}

func toStrings(v any) []string {
	var out []string
	for _, s := range v.([]any) {
		out = append(out, s.(string))
	}
	return out
}

// TestServerSideDryRun applies every rendered object with
// `kubectl apply --dry-run=server` to the embedded control plane: the API
// server validates each against its schema (strict field validation) and
// admission, without persisting. cert-manager's Certificate and Issuer and
// the Prometheus Operator's ServiceMonitor and PrometheusRule are stand-in CRDs from testdata
// (their names and kinds are checked, not their specs).
func TestServerSideDryRun(t *testing.T) {
	root := repoRoot(t)
	img := "ghcr.io/fencekeeper/manager:" + release(t, root)
	// Render first: helm's first build must not eat the control plane's time.
	installYAML, err := os.ReadFile(filepath.Join(root, "dist", "install.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	renders := []struct {
		name, namespace string
		data            []byte
	}{
		{"dist/install.yaml", "", installYAML},
		{"dist/chart (defaults)", "", renderChart(t, root)},
		{"config/default in locks-ops", "locks-ops", renderKustomize(t, root, img, "locks-ops")},
		{"dist/chart with every option in chart-ops", "chart-ops", renderChart(t, root, "namespace.name=chart-ops", "namespace.create=false",
			"serviceMonitor.enabled=true", "networkPolicy.enabled=true", "networkPolicy.metricsFrom[0].podSelector.matchLabels.app=prometheus",
			"protectedKinds[0].group=apps", "protectedKinds[0].version=v1", "protectedKinds[0].resource=deployments", "priorityClassName=system-cluster-critical",
			"prometheusRule.enabled=true", "grafanaDashboard.enabled=true",
			"serviceMonitor.prometheusServiceAccount.name=prometheus", "serviceMonitor.prometheusServiceAccount.namespace=chart-ops")},
		{"dist/chart self-signed", "", renderChart(t, root, "certificates.mode=self-signed")},
	}
	for _, p := range profiles[1:] { // (the defaults are above)
		renders = append(renders, struct {
			name, namespace string
			data            []byte
		}{"dist/chart profile " + p.file, "", renderChartFiles(t, root, p.files(root))})
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	cp, err := localcp.Start(ctx, localcp.Options{Root: root, CRDDirs: []string{filepath.Join(root, "test", "install", "testdata", "crds")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	t.Logf("control plane up in %s", time.Since(start).Round(time.Millisecond))
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, cp.Env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	admin, err := cp.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range renders {
		t.Run(r.name, func(t *testing.T) {
			if r.namespace != "" {
				// A dry-run creates nothing, so the namespaced objects need their namespace for real.
				if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.namespace}}); err != nil {
					t.Fatal(err)
				}
			}
			n := len(parse(t, r.data))
			out := run(t, r.data, "kubectl", "--kubeconfig", kubeconfig, "apply", "--dry-run=server", "--validate=strict", "-f", "-")
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			if len(lines) != n {
				t.Fatalf("kubectl applied %d objects of %d:\n%s", len(lines), n, out)
			}
			for _, l := range lines {
				if !strings.HasSuffix(l, "(server dry run)") {
					t.Errorf("not a server dry run: %s", l)
				}
			}
		})
	}
}
