package operator

import (
	"slices"
	"sort"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/fencekeeper/fencekeeper/internal/rules/protectedkinds"
)

// WithProtectedKinds returns the installed webhooks with the rules of the
// protected entries made exactly: the built-in ConfigMaps rules as installed,
// then one protectedkinds.Rule per declared kind. Any other rule an installer
// or a JSON patch put there is dropped: the declared list is the one place
// that says what is protected, and the operator's read RBAC and the audit
// follow it.
func WithProtectedKinds(hooks []admissionregistrationv1.ValidatingWebhook, kinds []schema.GroupVersionResource) []admissionregistrationv1.ValidatingWebhook {
	out := make([]admissionregistrationv1.ValidatingWebhook, len(hooks))
	for i := range hooks {
		out[i] = *hooks[i].DeepCopy()
		if !protectedkinds.IsProtectedEntry(&out[i]) {
			continue
		}
		var rules []admissionregistrationv1.RuleWithOperations
		for _, r := range out[i].Rules {
			if slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, "configmaps") {
				rules = append(rules, r)
			}
		}
		for _, k := range kinds {
			rules = append(rules, protectedkinds.Rule(k))
		}
		out[i].Rules = rules
	}
	return out
}

// webhookField is one part of a webhook the operator keeps as installed.
type webhookField struct {
	name string
	get  func(w *admissionregistrationv1.ValidatingWebhook) any
}

// webhookFields are compared after API defaulting (see normalizeWebhook), so
// a field left out of the desired shape and defaulted by the API server is
// not drift. The caBundle is compared separately: it is ours only when the
// operator manages the serving certificate (cert-manager rotates it otherwise).
var webhookFields = []webhookField{
	{"failurePolicy", func(w *admissionregistrationv1.ValidatingWebhook) any { return w.FailurePolicy }},
	{"matchPolicy", func(w *admissionregistrationv1.ValidatingWebhook) any { return w.MatchPolicy }},
	{"namespaceSelector", func(w *admissionregistrationv1.ValidatingWebhook) any { return w.NamespaceSelector }},
	{"objectSelector", func(w *admissionregistrationv1.ValidatingWebhook) any { return w.ObjectSelector }},
	{"rules", func(w *admissionregistrationv1.ValidatingWebhook) any { return w.Rules }},
	{"sideEffects", func(w *admissionregistrationv1.ValidatingWebhook) any { return w.SideEffects }},
	{"timeoutSeconds", func(w *admissionregistrationv1.ValidatingWebhook) any { return w.TimeoutSeconds }},
	// A matchCondition "false" switches a webhook off as surely as a missing rule.
	{"matchConditions", func(w *admissionregistrationv1.ValidatingWebhook) any { return w.MatchConditions }},
	{"admissionReviewVersions", func(w *admissionregistrationv1.ValidatingWebhook) any { return w.AdmissionReviewVersions }},
	// Pointing the webhook elsewhere would let another server decide (and read every request).
	{"clientConfig", func(w *admissionregistrationv1.ValidatingWebhook) any {
		c := w.ClientConfig
		c.CABundle = nil
		return c
	}},
}

// WebhookDrift compares the installed webhooks with the live ones and returns
// the webhooks to write back plus what they restore ("<webhook>: <field>"),
// or nil and nil when nothing drifted. With manageCABundle the desired
// caBundle is restored too; without, each webhook keeps its live caBundle.
// Webhooks added by someone else are removed; the order does not matter.
func WebhookDrift(desired, actual []admissionregistrationv1.ValidatingWebhook, manageCABundle bool) ([]admissionregistrationv1.ValidatingWebhook, []string) {
	live := map[string]*admissionregistrationv1.ValidatingWebhook{}
	for i := range actual {
		live[actual[i].Name] = &actual[i]
	}
	var drift []string
	out := make([]admissionregistrationv1.ValidatingWebhook, 0, len(desired))
	for i := range desired {
		want := desired[i].DeepCopy()
		got, ok := live[want.Name]
		delete(live, want.Name)
		switch {
		case !ok:
			drift = append(drift, want.Name+": webhook removed")
		case !manageCABundle:
			want.ClientConfig.CABundle = got.ClientConfig.CABundle
		}
		if ok {
			drift = append(drift, webhookFieldDrift(want, got)...)
		}
		out = append(out, *want)
	}
	var added []string
	for name := range live {
		added = append(added, name+": webhook added")
	}
	sort.Strings(added)
	drift = append(drift, added...)
	if len(drift) == 0 {
		return nil, nil
	}
	return out, drift
}

// webhookFieldDrift names the fields of got that differ from want.
func webhookFieldDrift(want, got *admissionregistrationv1.ValidatingWebhook) []string {
	w, g := normalizeWebhook(want), normalizeWebhook(got)
	var drift []string
	for _, f := range webhookFields {
		if equality.Semantic.DeepEqual(f.get(w), f.get(g)) {
			continue
		}
		if f.name == "rules" {
			drift = append(drift, want.Name+": rules"+ruleDrift(w.Rules, g.Rules))
			continue
		}
		drift = append(drift, want.Name+": "+f.name)
	}
	if string(w.ClientConfig.CABundle) != string(g.ClientConfig.CABundle) {
		drift = append(drift, want.Name+": caBundle")
	}
	return drift
}

// normalizeWebhook returns a copy with the API server's defaults filled in
// (admissionregistration/v1 SetDefaults_ValidatingWebhook), so that a desired
// shape written without them compares equal to what the server stores.
func normalizeWebhook(in *admissionregistrationv1.ValidatingWebhook) *admissionregistrationv1.ValidatingWebhook {
	w := in.DeepCopy()
	if w.FailurePolicy == nil {
		p := admissionregistrationv1.Fail
		w.FailurePolicy = &p
	}
	if w.MatchPolicy == nil {
		p := admissionregistrationv1.Equivalent
		w.MatchPolicy = &p
	}
	if w.NamespaceSelector == nil {
		w.NamespaceSelector = &metav1.LabelSelector{}
	}
	if w.ObjectSelector == nil {
		w.ObjectSelector = &metav1.LabelSelector{}
	}
	// The values of a set expression are a set: another order is no drift
	// (a GitOps tool or chart may list the exempt namespaces differently).
	for _, sel := range []*metav1.LabelSelector{w.NamespaceSelector, w.ObjectSelector} {
		for i := range sel.MatchExpressions {
			slices.Sort(sel.MatchExpressions[i].Values)
		}
	}
	if w.TimeoutSeconds == nil {
		t := int32(10)
		w.TimeoutSeconds = &t
	}
	for i := range w.Rules {
		if w.Rules[i].Scope == nil {
			s := admissionregistrationv1.AllScopes
			w.Rules[i].Scope = &s
		}
	}
	if s := w.ClientConfig.Service; s != nil && s.Port == nil {
		p := int32(443)
		s.Port = &p
	}
	return w
}

// ruleDrift says which rules a restore puts back ("restored declared
// widgets.example.com/v1") and which it drops ("removed undeclared
// deployments.apps/v1"), or "" when only their details changed.
func ruleDrift(want, got []admissionregistrationv1.RuleWithOperations) string {
	var parts []string
	has := func(list []admissionregistrationv1.RuleWithOperations, r admissionregistrationv1.RuleWithOperations) bool {
		return slices.ContainsFunc(list, func(x admissionregistrationv1.RuleWithOperations) bool { return equality.Semantic.DeepEqual(x, r) })
	}
	for _, r := range want {
		switch {
		case has(got, r):
		case slices.ContainsFunc(r.Resources, func(res string) bool { return strings.HasSuffix(res, "/*") }):
			parts = append(parts, "restored declared "+ruleName(r))
		default:
			parts = append(parts, "restored "+ruleName(r))
		}
	}
	for _, r := range got {
		if !has(want, r) {
			parts = append(parts, "removed undeclared "+ruleName(r))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// ruleName names a rule by its first group, version and resource, in the
// --protected-kinds form.
func ruleName(r admissionregistrationv1.RuleWithOperations) string {
	first := func(l []string) string {
		if len(l) == 0 {
			return ""
		}
		return l[0]
	}
	res, _, _ := strings.Cut(first(r.Resources), "/")
	return protectedkinds.Format(schema.GroupVersionResource{Group: first(r.APIGroups), Version: first(r.APIVersions), Resource: res})
}
