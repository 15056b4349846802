package install

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// profile is a values file of testdata/values: one way a platform team runs
// the chart, and what it must render.
type profile struct {
	name, file string
	check      func(t *testing.T, objs []object)
}

// profiles: default, HA, cert-manager vs self-signed, monitoring on (with
// and without cert-manager), exemptions, extra values. TestChartLint lints
// each, TestChartProfiles checks what each renders, TestServerSideDryRun has
// the API server validate each.
var profiles = []profile{
	{"default", "", checkDefaultProfile},
	{"HA", "ha.yaml", checkHAProfile},
	{"cert-manager", "cert-manager.yaml", checkCertManagerProfile},
	{"self-signed", "self-signed.yaml", checkSelfSignedProfile},
	{"monitoring", "monitoring.yaml", checkMonitoringProfile},
	{"monitoring without cert-manager", "monitoring-self-signed.yaml", checkMonitoringSelfSignedProfile},
	{"exemptions", "exemptions.yaml", checkExemptionsProfile},
	{"extra values", "extra.yaml", checkExtraProfile},
}

func (p profile) files(root string) []string {
	if p.file == "" {
		return nil
	}
	return []string{filepath.Join(root, "test", "install", "testdata", "values", p.file)}
}

// TestChartLint: helm lint --strict passes with the defaults and with every
// profile (the values are checked against values.schema.json too).
func TestChartLint(t *testing.T) {
	root := repoRoot(t)
	for _, p := range profiles {
		t.Run(p.name, func(t *testing.T) {
			args := []string{"lint", "--strict", filepath.Join(root, "dist", "chart"), "--kube-version", helmKubeVersion}
			for _, f := range p.files(root) {
				args = append(args, "-f", f)
			}
			out := run(t, nil, helm(t, root), args...)
			if !strings.Contains(string(out), "1 chart(s) linted, 0 chart(s) failed") || strings.Contains(string(out), "[WARNING]") {
				t.Errorf("helm %s:\n%s", strings.Join(args, " "), out)
			}
		})
	}
}

func TestChartProfiles(t *testing.T) {
	root := repoRoot(t)
	for _, p := range profiles {
		t.Run(p.name, func(t *testing.T) {
			p.check(t, parse(t, renderChartFiles(t, root, p.files(root))))
		})
	}
}

// TestChartSchemaRefuses: values.schema.json refuses a misspelt key at any
// level and a value of the wrong type or out of range, and the error names
// the key; the templates refuse what a schema cannot say.
func TestChartSchemaRefuses(t *testing.T) {
	root := repoRoot(t)
	for _, c := range []struct {
		set  []string
		want []string // every one in the error
	}{
		{[]string{"replica=5"}, []string{"at ''", "additional properties 'replica' not allowed"}},
		{[]string{"serviceMonitor.enable=true"}, []string{"at '/serviceMonitor'", "additional properties 'enable' not allowed"}},
		{[]string{"image.tags=v1"}, []string{"at '/image'", "'tags'"}},
		{[]string{"serviceMonitor.authorization.secret=x"}, []string{"at '/serviceMonitor/authorization'", "'secret'"}},
		{[]string{"replicas=two"}, []string{"at '/replicas'", "got string, want integer"}},
		{[]string{"replicas=0"}, []string{"at '/replicas'", "minimum"}},
		{[]string{"crds.keep=maybe"}, []string{"at '/crds/keep'", "want boolean"}},
		{[]string{"certificates.mode=vault"}, []string{"at '/certificates/mode'", "cert-manager"}},
		{[]string{"logLevel=verbose"}, []string{"at '/logLevel'"}},
		{[]string{"exemptNamespaces={Bad_NS}"}, []string{"at '/exemptNamespaces/0'", "'Bad_NS'"}},
		{[]string{"extraArgs={zap-log-level=debug}"}, []string{"at '/extraArgs/0'"}},
		{[]string{"endedGrantRetention=1day"}, []string{"at '/endedGrantRetention'"}},
		{[]string{"tolerations[0].operator=Maybe"}, []string{"at '/tolerations/0/operator'"}},
		{[]string{"docsBaseURL=https://example.com/docs"}, []string{"at '/docsBaseURL'"}},
		{[]string{"image.digest=latest"}, []string{"at '/image/digest'"}},
		{[]string{"podLabels.control-plane=x"}, []string{"podLabels.control-plane", "selector"}},
		{[]string{"serviceMonitor.enabled=true", "certificates.mode=self-signed"}, []string{"metrics.certSecret"}},
	} {
		_, err := tryRenderChart(t, root, c.set...)
		if err == nil {
			t.Errorf("--set %v rendered; want a refusal", c.set)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("--set %v: the error does not say %q:\n%v", c.set, w, err)
			}
		}
	}
}

// TestChartCRDsAreConfigBases: the chart's CRDs are config/crd/bases, field
// for field, plus the chart's labels and (crds.keep) the keep policy; off
// with crds.enabled=false.
func TestChartCRDsAreConfigBases(t *testing.T) {
	root := repoRoot(t)
	files, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in config/crd/bases (%v)", err)
	}
	var want []object
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, parse(t, data)...)
	}
	crds := func(objs []object) []object {
		var out []object
		for _, o := range objs {
			if o["kind"] == "CustomResourceDefinition" {
				out = append(out, o)
			}
		}
		return out
	}
	got := crds(parse(t, renderChart(t, root)))
	for _, o := range got {
		if a := annotations(o); a["helm.sh/resource-policy"] != "keep" {
			t.Errorf("%s: annotations %v lack helm.sh/resource-policy: keep (crds.keep defaults to true)", key(o), a)
		}
	}
	compare(t, "config/crd/bases", want, "dist/chart", got)
	for _, o := range crds(parse(t, renderChart(t, root, "crds.keep=false"))) {
		if _, ok := annotations(o)["helm.sh/resource-policy"]; ok {
			t.Errorf("crds.keep=false: %s still has the keep policy", key(o))
		}
	}
	if n := len(crds(parse(t, renderChart(t, root, "crds.enabled=false")))); n != 0 {
		t.Errorf("crds.enabled=false rendered %d CRDs", n)
	}
}

func annotations(o object) map[string]any {
	a, _ := o["metadata"].(map[string]any)["annotations"].(map[string]any)
	return a
}

// args returns the manager's arguments.
func args(t *testing.T, objs []object) []string {
	t.Helper()
	_, c := managerSpec(t, objs)
	return toStrings(c["args"])
}

// flagValues returns the values of every --name=value among args.
func flagValues(args []string, name string) []string {
	var out []string
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			out = append(out, v)
		}
	}
	return out
}

// at walks nested maps and lists: at(o, "spec", "template", 0, ...).
func at(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			l, _ := v.([]any)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func checkDefaultProfile(t *testing.T, objs []object) {
	pod, _ := managerSpec(t, objs)
	if pod["priorityClassName"] != "system-cluster-critical" {
		t.Errorf("priorityClassName %v, want system-cluster-critical", pod["priorityClassName"])
	}
	a := args(t, objs)
	for _, flag := range []string{"zap-log-level", "exempt-namespaces", "metrics-cert-dir"} {
		if v := flagValues(a, flag); v != nil {
			t.Errorf("default values pass --%s=%v", flag, v)
		}
	}
	for _, k := range []string{"CustomResourceDefinition /fencedresources.locks.fencekeeper.dev", "CustomResourceDefinition /lockgrants.locks.fencekeeper.dev"} {
		if !has(objs, k) {
			t.Errorf("default values do not render %s", k)
		}
	}
}

func checkHAProfile(t *testing.T, objs []object) {
	d := find(t, objs, "Deployment fencekeeper-system/fencekeeper-controller-manager")
	if r := at(d, "spec", "replicas"); r != float64(3) {
		t.Errorf("replicas %v, want 3", r)
	}
	pod, c := managerSpec(t, objs)
	tsc := pod["topologySpreadConstraints"].([]any)
	if len(tsc) != 1 || at(tsc[0], "whenUnsatisfiable") != "DoNotSchedule" {
		t.Errorf("topologySpreadConstraints %v: want only the profile's (DoNotSchedule by zone)", tsc)
	}
	if at(pod, "affinity", "podAntiAffinity", "requiredDuringSchedulingIgnoredDuringExecution") == nil ||
		at(pod, "affinity", "podAntiAffinity", "preferredDuringSchedulingIgnoredDuringExecution") != nil {
		t.Errorf("affinity %v: want the profile's required anti-affinity in place of the default", pod["affinity"])
	}
	if at(pod, "nodeSelector", "node-role.example.com/platform") != "true" || at(pod, "tolerations", 0, "key") != "node-role.example.com/platform" {
		t.Errorf("nodeSelector %v, tolerations %v", pod["nodeSelector"], pod["tolerations"])
	}
	if at(c, "resources", "limits", "memory") != "2Gi" || at(c, "resources", "requests", "cpu") != "500m" {
		t.Errorf("resources %v", c["resources"])
	}
	pdb := find(t, objs, "PodDisruptionBudget fencekeeper-system/fencekeeper-controller-manager")
	if at(pdb, "spec", "minAvailable") != float64(2) {
		t.Errorf("PDB %v, want minAvailable 2", pdb["spec"])
	}
}

func checkCertManagerProfile(t *testing.T, objs []object) {
	for _, k := range []string{"Certificate fencekeeper-system/fencekeeper-serving-cert", "Issuer fencekeeper-system/fencekeeper-selfsigned-issuer"} {
		if !has(objs, k) {
			t.Errorf("cert-manager mode renders no %s", k)
		}
	}
	if v := flagValues(args(t, objs), "cert-manager-username"); !slices.Equal(v, []string{"system:serviceaccount:certs:cert-manager-controller"}) {
		t.Errorf("--cert-manager-username=%v", v)
	}
	cfg := find(t, objs, "ValidatingWebhookConfiguration /fencekeeper-validating-webhook-configuration")
	if at(cfg, "metadata", "annotations", "cert-manager.io/inject-ca-from") != "fencekeeper-system/fencekeeper-serving-cert" {
		t.Errorf("webhook configuration annotations %v: no CA injection", at(cfg, "metadata", "annotations"))
	}
}

func checkSelfSignedProfile(t *testing.T, objs []object) {
	if has(objs, "Certificate fencekeeper-system/fencekeeper-serving-cert") || has(objs, "Issuer fencekeeper-system/fencekeeper-selfsigned-issuer") {
		t.Errorf("self-signed mode renders cert-manager objects")
	}
	if !slices.Contains(args(t, objs), "--self-signed-certs") {
		t.Errorf("manager args %v lack --self-signed-certs", args(t, objs))
	}
	if pod, _ := managerSpec(t, objs); pod["volumes"] != nil {
		t.Errorf("self-signed mode mounts %v", pod["volumes"])
	}
}

// checkScrape checks the ServiceMonitor's endpoint: Bearer credentials from
// secret/key, the CA from caSecret, the metrics Service's name; no
// deprecated or unverified settings.
func checkScrape(t *testing.T, objs []object, secret, key, caSecret string) {
	t.Helper()
	sm := find(t, objs, "ServiceMonitor fencekeeper-system/fencekeeper-metrics")
	ep := at(sm, "spec", "endpoints", 0).(map[string]any)
	if ep["scheme"] != "https" {
		t.Errorf("scheme %v, want https", ep["scheme"])
	}
	for _, deprecated := range []string{"bearerTokenFile", "bearerTokenSecret"} {
		if _, ok := ep[deprecated]; ok {
			t.Errorf("the ServiceMonitor uses the deprecated %s", deprecated)
		}
	}
	if at(ep, "authorization", "type") != "Bearer" || at(ep, "authorization", "credentials", "name") != secret || at(ep, "authorization", "credentials", "key") != key {
		t.Errorf("authorization %v, want Bearer from Secret %s key %s", ep["authorization"], secret, key)
	}
	tls, _ := ep["tlsConfig"].(map[string]any)
	if tls["insecureSkipVerify"] == true || at(tls, "ca", "secret", "name") != caSecret || at(tls, "ca", "secret", "key") != "ca.crt" ||
		tls["serverName"] != "fencekeeper-metrics.fencekeeper-system.svc" {
		t.Errorf("tlsConfig %v: want the CA of Secret %s (ca.crt) and serverName fencekeeper-metrics.fencekeeper-system.svc", tls, caSecret)
	}
	// The manager serves the certificate whose CA the scrape trusts.
	pod, c := managerSpec(t, objs)
	if v := flagValues(toStrings(c["args"]), "metrics-cert-dir"); len(v) != 1 {
		t.Fatalf("--metrics-cert-dir=%v: the manager would serve a generated certificate", v)
	}
	mounted := ""
	for _, m := range c["volumeMounts"].([]any) {
		if at(m, "mountPath") == flagValues(toStrings(c["args"]), "metrics-cert-dir")[0] {
			mounted = at(m, "name").(string)
		}
	}
	for _, v := range pod["volumes"].([]any) {
		if at(v, "name") == mounted && at(v, "secret", "secretName") == caSecret {
			return
		}
	}
	t.Errorf("--metrics-cert-dir is not Secret %s mounted (volumes %v)", caSecret, pod["volumes"])
}

func checkMonitoringProfile(t *testing.T, objs []object) {
	checkScrape(t, objs, "fencekeeper-metrics-scraper-token", "token", "fencekeeper-metrics-server-cert")
	cert := find(t, objs, "Certificate fencekeeper-system/fencekeeper-metrics-cert")
	if at(cert, "spec", "secretName") != "fencekeeper-metrics-server-cert" || !slices.Contains(toStrings(at(cert, "spec", "dnsNames")), "fencekeeper-metrics.fencekeeper-system.svc") {
		t.Errorf("metrics Certificate %v", cert["spec"])
	}
	token := find(t, objs, "Secret fencekeeper-system/fencekeeper-metrics-scraper-token")
	if token["type"] != "kubernetes.io/service-account-token" || at(token, "metadata", "annotations", "kubernetes.io/service-account.name") != "fencekeeper-metrics-scraper" {
		t.Errorf("token Secret %v", token)
	}
	crb := find(t, objs, "ClusterRoleBinding /fencekeeper-metrics-scraper")
	if at(crb, "roleRef", "name") != "fencekeeper-metrics-reader" || at(crb, "subjects", 0, "name") != "fencekeeper-metrics-scraper" {
		t.Errorf("scraper binding %v", crb)
	}
	rule := find(t, objs, "PrometheusRule fencekeeper-system/fencekeeper")
	n := 0
	for _, g := range at(rule, "spec", "groups").([]any) {
		for _, r := range at(g, "rules").([]any) {
			u, _ := at(r, "annotations", "runbook_url").(string)
			if !strings.HasPrefix(u, "https://docs.example.com/fencekeeper/v0.1.0/") {
				t.Errorf("alert %v: runbook_url %q is not under docsBaseURL", at(r, "alert"), u)
			}
			n++
		}
	}
	if n == 0 {
		t.Errorf("the PrometheusRule has no rules")
	}
	for _, k := range []string{"ConfigMap fencekeeper-system/fencekeeper-grafana-dashboard", "NetworkPolicy fencekeeper-system/fencekeeper-controller-manager"} {
		if !has(objs, k) {
			t.Errorf("no %s", k)
		}
	}
}

func checkMonitoringSelfSignedProfile(t *testing.T, objs []object) {
	checkScrape(t, objs, "prometheus-scrape-token", "bearer", "fencekeeper-metrics-tls")
	for _, k := range []string{"Certificate fencekeeper-system/fencekeeper-metrics-cert", "Secret fencekeeper-system/fencekeeper-metrics-scraper-token",
		"ServiceAccount fencekeeper-system/fencekeeper-metrics-scraper"} {
		if has(objs, k) {
			t.Errorf("the installer named its own Secrets, yet the chart renders %s", k)
		}
	}
	if !slices.Contains(args(t, objs), "--self-signed-certs") {
		t.Errorf("manager args lack --self-signed-certs")
	}
}

func checkExemptionsProfile(t *testing.T, objs []object) {
	if v := flagValues(args(t, objs), "exempt-namespaces"); !slices.Equal(v, []string{"monitoring,kube-node-lease"}) {
		t.Errorf("--exempt-namespaces=%v, want [monitoring,kube-node-lease]", v)
	}
	// The configuration lists them as the operator keeps it, or a GitOps
	// tool and the operator would rewrite each other's selector.
	cfg := find(t, objs, "ValidatingWebhookConfiguration /fencekeeper-validating-webhook-configuration")
	excluded := 0
	for _, w := range at(cfg, "webhooks").([]any) {
		for _, e := range asList(at(w, "namespaceSelector", "matchExpressions")) {
			if at(e, "key") != "kubernetes.io/metadata.name" {
				continue
			}
			excluded++
			values := fmt.Sprint(at(e, "values"))
			if values != "[fencekeeper-system kube-public kube-system monitoring kube-node-lease]" {
				t.Errorf("webhook %v excludes namespaces %s, want the operator's, kube-public, kube-system, then the exempt ones", at(w, "name"), values)
			}
		}
	}
	if excluded == 0 {
		t.Error("no webhook excludes namespaces by name")
	}
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

func checkExtraProfile(t *testing.T, objs []object) {
	pod, c := managerSpec(t, objs)
	d := find(t, objs, "Deployment fencekeeper-system/fencekeeper-controller-manager")
	if at(d, "spec", "template", "metadata", "annotations", "cluster-autoscaler.kubernetes.io/safe-to-evict") != "false" {
		t.Errorf("pod annotations %v", at(d, "spec", "template", "metadata", "annotations"))
	}
	if at(d, "spec", "template", "metadata", "labels", "team") != "platform" || at(d, "spec", "selector", "matchLabels", "team") != nil {
		t.Errorf("pod labels %v, selector %v: want team=platform on the pod only",
			at(d, "spec", "template", "metadata", "labels"), at(d, "spec", "selector"))
	}
	if at(pod, "imagePullSecrets", 0, "name") != "registry-credentials" || pod["priorityClassName"] != "platform-critical" {
		t.Errorf("imagePullSecrets %v, priorityClassName %v", pod["imagePullSecrets"], pod["priorityClassName"])
	}
	if c["image"] != "registry.example.com/fencekeeper/manager:v0.1.0-patched" || c["imagePullPolicy"] != "IfNotPresent" {
		t.Errorf("image %v, pull policy %v", c["image"], c["imagePullPolicy"])
	}
	a := toStrings(c["args"])
	if v := flagValues(a, "zap-log-level"); !slices.Equal(v, []string{"debug"}) {
		t.Errorf("--zap-log-level=%v, want debug", v)
	}
	// Extra flags come last, so that they win over the chart's.
	if n := len(a); n < 2 || a[n-2] != "--zap-encoder=console" || a[n-1] != "--max-concurrent-reconciles=8" {
		t.Errorf("args %v do not end with the extraArgs", a)
	}
	if v := flagValues(a, "ended-grant-retention"); !slices.Equal(v, []string{"24h"}) {
		t.Errorf("--ended-grant-retention=%v", v)
	}
	for _, o := range objs {
		if o["kind"] == "CustomResourceDefinition" {
			t.Errorf("crds.enabled=false renders %s", key(o))
		}
	}
}

// notesLink is a docs link of NOTES.txt: {{ $docs }}<file>[#anchor].
var notesLink = regexp.MustCompile(`\{\{ \$docs \}\}([\w./-]+\.md)(?:#([\w-]+))?`)

// TestNotesLinksResolve: every page NOTES.txt sends the installer to exists
// under docs/, with the heading it names.
func TestNotesLinksResolve(t *testing.T) {
	root := repoRoot(t)
	notes, err := os.ReadFile(filepath.Join(root, "dist", "chart", "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	links := notesLink.FindAllStringSubmatch(string(notes), -1)
	if len(links) == 0 {
		t.Fatal("NOTES.txt links no page under {{ $docs }}")
	}
	for _, l := range links {
		data, err := os.ReadFile(filepath.Join(root, "docs", l[1]))
		if err != nil {
			t.Errorf("NOTES.txt links %s: %v", l[1], err)
			continue
		}
		if l[2] == "" {
			continue
		}
		found := false
		for _, line := range strings.Split(string(data), "\n") {
			if h, ok := strings.CutPrefix(line, "#"); ok && headingAnchor(strings.TrimLeft(h, "#")) == l[2] {
				found = true
			}
		}
		if !found {
			t.Errorf("NOTES.txt links %s#%s: no such heading", l[1], l[2])
		}
	}
}

// headingAnchor is GitHub's anchor of a plain heading: lower case,
// punctuation dropped, spaces to dashes.
func headingAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
