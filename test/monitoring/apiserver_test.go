package monitoring

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	admissionmetrics "k8s.io/apiserver/pkg/admission/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"sigs.k8s.io/yaml"
)

const (
	webhooksFile = "../../config/webhook/manifests.yaml"
	// apiserverWebhookPrefix: the API server's metrics of its admission-webhook calls.
	apiserverWebhookPrefix = "apiserver_admission_webhook_"
)

// apiserverWebhookMetrics returns the API server's admission-webhook metric
// names (a histogram's with _bucket, _sum and _count) and their label
// names, from the kube-apiserver's own code (k8s.io/apiserver, the version
// bin/k8s is built from): one call and one rejection are observed so that
// every vector has a series to gather.
func apiserverWebhookMetrics(t *testing.T) map[string][]string {
	t.Helper()
	ctx := context.Background()
	attr := admission.NewAttributesRecord(nil, nil, schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, "ns", "probe",
		schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, "", admission.Create, nil, false, nil)
	admissionmetrics.Metrics.ObserveWebhook(ctx, "probe.example.com", time.Millisecond, true, attr, "validating", 500)
	admissionmetrics.Metrics.ObserveWebhookRejection(ctx, "probe.example.com", "validating", string(admission.Create),
		admissionmetrics.WebhookRejectionCallingWebhookError, 0)
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), apiserverWebhookPrefix) || len(f.GetMetric()) == 0 {
			continue
		}
		var names []string
		for _, l := range f.GetMetric()[0].GetLabel() {
			names = append(names, l.GetName())
		}
		out[f.GetName()] = names
		if f.GetType() == dto.MetricType_HISTOGRAM {
			out[f.GetName()+"_bucket"] = append(slices.Clone(names), "le")
			out[f.GetName()+"_sum"] = names
			out[f.GetName()+"_count"] = names
		}
	}
	for _, want := range []string{"apiserver_admission_webhook_rejection_count", "apiserver_admission_webhook_admission_duration_seconds_bucket"} {
		if out[want] == nil {
			t.Fatalf("k8s.io/apiserver registers no %s (gathered %v)", want, out)
		}
	}
	return out
}

// fencekeeperWebhooks are the webhook names of config/webhook/manifests.yaml
// (the chart and the kustomize install keep them).
func fencekeeperWebhooks(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(webhooksFile)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Webhooks []struct {
			Name string `json:"name"`
		} `json:"webhooks"`
	}
	if err := yaml.Unmarshal([]byte(strings.TrimPrefix(string(data), "---\n")), &cfg); err != nil {
		t.Fatalf("%s: %v", webhooksFile, err)
	}
	var names []string
	for _, w := range cfg.Webhooks {
		names = append(names, w.Name)
	}
	if len(names) == 0 {
		t.Fatalf("%s names no webhook", webhooksFile)
	}
	return names
}

// webhookSelectorProblems checks one selector of an API-server webhook
// metric: its labels exist on the metric, and its name matchers select
// every one of webhooks and no other webhook.
func webhookSelectorProblems(vs *parser.VectorSelector, metricLabels, webhooks []string) []string {
	var out []string
	nameMatched := false
	for _, m := range vs.LabelMatchers {
		if m.Name == model.MetricNameLabel {
			continue
		}
		if !slices.Contains(metricLabels, m.Name) {
			out = append(out, "label "+m.Name+" is not one of "+strings.Join(metricLabels, ", "))
		}
		if m.Name != "name" {
			continue
		}
		nameMatched = true
		for _, w := range webhooks {
			if !m.Matches(w) {
				out = append(out, "name matcher "+m.String()+" misses the webhook "+w)
			}
		}
		for _, other := range []string{"validate.example.com", "vpod.kyverno.svc", "fencekeeper.dev", "vother.fencekeeper.dev"} {
			if m.Matches(other) {
				out = append(out, "name matcher "+m.String()+" also selects "+other)
			}
		}
	}
	if !nameMatched {
		out = append(out, "no name matcher: it would alert on every webhook of the cluster")
	}
	return out
}

// TestAPIServerWebhookAlerts: the alerts on the API server's calls read its
// real metrics and labels, select exactly fencekeeper's webhooks, and count
// calling errors (not the webhooks' own refusals, which are their job).
func TestAPIServerWebhookAlerts(t *testing.T) {
	metrics := apiserverWebhookMetrics(t)
	webhooks := fencekeeperWebhooks(t)
	seen := map[string]bool{}
	for _, r := range rules(t) {
		node, err := promql.ParseExpr(r.Expr)
		if err != nil {
			t.Fatalf("%s: %v", r.Alert, err)
		}
		parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
			vs, ok := n.(*parser.VectorSelector)
			if !ok || !strings.HasPrefix(vs.Name, apiserverWebhookPrefix) {
				return nil
			}
			seen[vs.Name] = true
			for _, p := range webhookSelectorProblems(vs, metrics[vs.Name], webhooks) {
				t.Errorf("%s: %s: %s", r.Alert, vs, p)
			}
			if vs.Name == "apiserver_admission_webhook_rejection_count" &&
				!slices.ContainsFunc(vs.LabelMatchers, func(m *labels.Matcher) bool {
					return m.Name == "error_type" && m.Type == labels.MatchEqual && m.Value == string(admissionmetrics.WebhookRejectionCallingWebhookError)
				}) {
				t.Errorf("%s: %s: counts every rejection; want error_type=%q", r.Alert, vs, admissionmetrics.WebhookRejectionCallingWebhookError)
			}
			return nil
		})
	}
	for _, want := range []string{"apiserver_admission_webhook_rejection_count", "apiserver_admission_webhook_admission_duration_seconds_bucket"} {
		if !seen[want] {
			t.Errorf("no alert reads %s", want)
		}
	}
}

// TestWebhookSelectorProblemsFindsMistakes: the check refuses a selector
// that misses a webhook, selects others, or names a label the metric lacks.
func TestWebhookSelectorProblemsFindsMistakes(t *testing.T) {
	webhooks := []string{"va.fencekeeper.dev", "vb.fencekeeper.dev"}
	metricLabels := []string{"name", "type", "operation", "error_type", "rejection_code"}
	for expr, want := range map[string]string{
		`m{name=~"v(a|b)[.]fencekeeper[.]dev"}`:             "",
		`m{name=~"va[.]fencekeeper[.]dev"}`:                 "misses the webhook vb.fencekeeper.dev",
		`m{name=~".*fencekeeper.*"}`:                        "also selects",
		`m{webhook=~"v(a|b)[.]fencekeeper[.]dev"}`:          "label webhook is not one of",
		`m{error_type="calling_webhook_error"}`:             "no name matcher",
		`m{name=~"v(a|b)[.]fencekeeper[.]dev", code="500"}`: "label code is not one of",
	} {
		vs, err := promql.ParseExpr(expr)
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Join(webhookSelectorProblems(vs.(*parser.VectorSelector), metricLabels, webhooks), "; ")
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("%s: problems %q, want %q", expr, got, want)
		}
	}
}
