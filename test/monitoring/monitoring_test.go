package monitoring

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	// The operator's packages, as cmd/manager links them: their init
	// functions register every metric the manager serves.
	_ "github.com/fencekeeper/fencekeeper/controllers"
	_ "github.com/fencekeeper/fencekeeper/internal/operator"
	_ "github.com/fencekeeper/fencekeeper/webhooks"
)

const (
	rulesFile     = "../../config/prometheus/rules.yaml"
	dashboardFile = "../../config/grafana/fencekeeper.json"
)

var promql = parser.NewParser(parser.Options{})

// registered lists the metric names the operator's registry serves, read
// from the descriptors of every registered collector (a vector with no
// series yet is described too, though a scrape would not show it). A
// histogram's or summary's series add _bucket, _sum and _count.
func registered(t *testing.T) map[string]bool {
	t.Helper()
	c, ok := metrics.Registry.(prometheus.Collector)
	if !ok {
		t.Fatalf("controller-runtime's metrics.Registry is a %T, which cannot describe its collectors", metrics.Registry)
	}
	descs := make(chan *prometheus.Desc)
	go func() { c.Describe(descs); close(descs) }()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	names := map[string]bool{}
	for d := range descs {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("no fqName in descriptor %s", d)
		}
		for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
			names[m[1]+suffix] = true
		}
	}
	if !names["fencekeeper_build_info"] || !names["controller_runtime_webhook_requests_total"] {
		t.Fatalf("the registry lacks metrics the operator always has; read %d names", len(names))
	}
	return names
}

// metricNames returns the metric names an expression selects.
func metricNames(expr string) ([]string, error) {
	node, err := promql.ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var names []string
	var missing error
	parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		if vs.Name == "" {
			missing = fmt.Errorf("selector %s names no metric: cannot be checked", vs)
		}
		names = append(names, vs.Name)
		return nil
	})
	return names, missing
}

// unknown lists, for each expression, the metric names not in known.
func unknown(exprs map[string]string, known map[string]bool) []string {
	var out []string
	for where, expr := range exprs {
		names, err := metricNames(expr)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", where, err))
			continue
		}
		for _, n := range names {
			if !known[n] {
				out = append(out, fmt.Sprintf("%s: metric %s is not registered by the operator", where, n))
			}
		}
	}
	slices.Sort(out)
	return out
}

// ruleGroups parses the rule file as Prometheus (and promtool) do.
func ruleGroups(t *testing.T) []rulefmt.RuleGroup {
	t.Helper()
	groups, errs := rulefmt.ParseFile(rulesFile, false, model.UTF8Validation, promql, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, err := range errs {
		t.Errorf("rule file: %v", err)
	}
	if groups == nil || t.Failed() {
		t.FailNow()
	}
	return groups.Groups
}

// rules are the rule file's rules, every group's.
func rules(t *testing.T) []rulefmt.Rule {
	t.Helper()
	var out []rulefmt.Rule
	for _, g := range ruleGroups(t) {
		out = append(out, g.Rules...)
	}
	return out
}

// ruleExprs returns every rule's expression by group and alert or record
// name; an alert needs a severity, a summary and a runbook_url (Alertmanager
// and Grafana link the runbook_url annotation; TestRunbookURLsResolve
// checks where it points).
func ruleExprs(t *testing.T) map[string]string {
	t.Helper()
	exprs := map[string]string{}
	for _, g := range ruleGroups(t) {
		for _, r := range g.Rules {
			name := r.Alert + r.Record
			if r.Alert != "" && (r.Labels["severity"] == "" || r.Annotations["runbook_url"] == "" || r.Annotations["summary"] == "") {
				t.Errorf("alert %s: needs a severity label and summary and runbook_url annotations", name)
			}
			if _, ok := r.Annotations["runbook"]; ok {
				t.Errorf("alert %s: the annotation is runbook_url, not runbook", name)
			}
			exprs[g.Name+"/"+name] = r.Expr
		}
	}
	return exprs
}

// grafanaVars stand in for the dashboard's variables, so that its queries parse as PromQL.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h", `"$job"`, `".*"`)

// labelValues is Grafana's label_values(metric, label) variable query.
var labelValues = regexp.MustCompile(`^label_values\((\w+),\s*\w+\)$`)

// dashboardExprs returns every PromQL query of the dashboard: panel targets
// and variable queries.
func dashboardExprs(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	exprs := map[string]string{}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for i, tg := range p.Targets {
			exprs[fmt.Sprintf("panel %q target %d", p.Title, i)] = grafanaVars.Replace(tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)
		s, _ := q["query"].(string)
		m := labelValues.FindStringSubmatch(s)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(metric, label)", v.Name, s)
			continue
		}
		exprs["variable "+v.Name] = m[1]
	}
	if len(exprs) == 0 {
		t.Fatalf("%s: no queries", dashboardFile)
	}
	return exprs
}

func TestRulesParseAndUseRegisteredMetrics(t *testing.T) {
	known := registered(t)
	// The API server's admission-webhook metrics: the alerts on its calls to
	// fencekeeper's webhooks (TestAPIServerWebhookAlerts checks their labels).
	for name := range apiserverWebhookMetrics(t) {
		known[name] = true
	}
	exprs := ruleExprs(t)
	for _, want := range []string{"FencekeeperFenceRegression", "FencekeeperUnresolvedMutationsOverdue", "FencekeeperWebhookErrors",
		"FencekeeperWebhookSlow", "FencekeeperEnforceDenialSpike", "FencekeeperWebhookConfigurationDrift",
		"FencekeeperWebhookCallsFailing", "FencekeeperWebhookSlowAtAPIServer"} {
		if !slices.ContainsFunc(slices.Collect(maps.Keys(exprs)), func(k string) bool { return strings.HasSuffix(k, "/"+want) }) {
			t.Errorf("no alert %s in %s", want, rulesFile)
		}
	}
	for _, u := range unknown(exprs, known) {
		t.Error(u)
	}
}

func TestDashboardUsesRegisteredMetrics(t *testing.T) {
	for _, u := range unknown(dashboardExprs(t), registered(t)) {
		t.Error(u)
	}
}

// TestUnknownMetricIsReported: the check finds a misspelt or removed metric,
// also one nested in a function, and a selector without a metric name.
func TestUnknownMetricIsReported(t *testing.T) {
	known := map[string]bool{"fencekeeper_build_info": true}
	got := unknown(map[string]string{
		"ok":       `max(fencekeeper_build_info)`,
		"misspelt": `rate(fencekeeper_grants_isued_total[5m]) > 0 and on() fencekeeper_build_info`,
		"nameless": `{job="fencekeeper"}`,
		"broken":   `rate(fencekeeper_build_info[5m]`,
	}, known)
	if len(got) != 3 || !strings.Contains(got[1], "misspelt: metric fencekeeper_grants_isued_total") ||
		!strings.HasPrefix(got[0], "broken:") || !strings.HasPrefix(got[2], "nameless:") {
		t.Errorf("unknown reported %q", got)
	}
}
