package operator

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/webhooks"
)

// ProtectedKindsAnnotation on the webhook configuration lists the declared
// protected kinds (FormatProtectedKind, comma-separated). The operator writes
// and keeps it, so that an auditor who cannot see the manager's flags can
// tell a declared kind from an undeclared one.
const ProtectedKindsAnnotation = "fencekeeper.dev/protected-kinds"

// ParseProtectedKinds parses the --protected-kinds flag: a comma-separated
// list of <resource>.<group>/<version> (<resource>/<version> for the core
// group), e.g. "widgets.example.com/v1,secrets/v1". ConfigMaps are always
// protected and need no entry; fencekeeper's own kinds cannot be declared.
func ParseProtectedKinds(s string) ([]schema.GroupVersionResource, error) {
	var out []schema.GroupVersionResource
	seen := map[schema.GroupVersionResource]bool{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		gvr, err := parseProtectedKind(item)
		if err != nil {
			return nil, err
		}
		if seen[gvr] {
			return nil, fmt.Errorf("protected kind %q is declared twice", item)
		}
		seen[gvr] = true
		out = append(out, gvr)
	}
	return out, nil
}

func parseProtectedKind(item string) (schema.GroupVersionResource, error) {
	bad := func(why string) (schema.GroupVersionResource, error) {
		return schema.GroupVersionResource{}, fmt.Errorf("protected kind %q: %s (want <resource>.<group>/<version>, e.g. widgets.example.com/v1, or <resource>/<version> for the core group)", item, why)
	}
	gr, version, ok := strings.Cut(item, "/")
	if !ok || version == "" {
		return bad("no version")
	}
	resource, group, _ := strings.Cut(gr, ".")
	gvr := schema.GroupVersionResource{Group: group, Version: version, Resource: resource}
	switch {
	case strings.ContainsAny(item, "*") || strings.Contains(version, "/"):
		return bad("wildcards and subresources are not kinds (every subresource is covered)")
	case len(validation.IsDNS1035Label(resource)) > 0:
		return bad("the resource is not a lower-case plural name")
	case group != "" && len(validation.IsDNS1123Subdomain(group)) > 0:
		return bad("the group is not a DNS subdomain")
	case len(validation.IsDNS1035Label(version)) > 0:
		return bad("the version is not a DNS label")
	case group == locksv1.GroupVersion.Group:
		return bad("fencekeeper's own kinds have their own webhooks")
	case isBuiltinProtected(group, resource):
		return bad("ConfigMaps are always protected")
	}
	return gvr, nil
}

// FormatProtectedKind is the flag form of a kind (see ParseProtectedKinds).
func FormatProtectedKind(k schema.GroupVersionResource) string {
	if k.Group == "" {
		return k.Resource + "/" + k.Version
	}
	return k.Resource + "." + k.Group + "/" + k.Version
}

// FormatProtectedKinds is the flag and annotation form of a list of kinds.
func FormatProtectedKinds(kinds []schema.GroupVersionResource) string {
	s := make([]string, len(kinds))
	for i, k := range kinds {
		s[i] = FormatProtectedKind(k)
	}
	return strings.Join(s, ",")
}

// isBuiltinProtected: ConfigMaps are covered by the generated webhook
// manifest (the webhook markers), whatever is declared.
func isBuiltinProtected(group, resource string) bool {
	return group == "" && resource == "configmaps"
}

// ProtectedKindRule is the rule a declared kind adds to both protected
// entries: every write of the kind and of every subresource (/scale changes
// business content and cannot carry a fence; /status of a kind without a
// status subresource is ordinary content).
func ProtectedKindRule(k schema.GroupVersionResource) admissionregistrationv1.RuleWithOperations {
	return admissionregistrationv1.RuleWithOperations{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete},
		Rule: admissionregistrationv1.Rule{
			APIGroups: []string{k.Group}, APIVersions: []string{k.Version}, Resources: []string{k.Resource, k.Resource + "/*"},
		},
	}
}

// IsProtectedEntry says whether w is one of the protected-object webhook's
// entries (vprotected, vprotected-enrolled): those served on ProtectedPath.
func IsProtectedEntry(w *admissionregistrationv1.ValidatingWebhook) bool {
	c := w.ClientConfig
	return c.Service != nil && c.Service.Path != nil && *c.Service.Path == webhooks.ProtectedPath ||
		c.URL != nil && strings.HasSuffix(*c.URL, webhooks.ProtectedPath)
}

// WithProtectedKinds returns the installed webhooks with the rules of the
// protected entries made exactly: the built-in ConfigMaps rules as installed,
// then one ProtectedKindRule per declared kind. Any other rule an installer
// or a JSON patch put there is dropped: the declared list is the one place
// that says what is protected, and the operator's read RBAC and the audit
// follow it.
func WithProtectedKinds(hooks []admissionregistrationv1.ValidatingWebhook, kinds []schema.GroupVersionResource) []admissionregistrationv1.ValidatingWebhook {
	out := make([]admissionregistrationv1.ValidatingWebhook, len(hooks))
	for i := range hooks {
		out[i] = *hooks[i].DeepCopy()
		if !IsProtectedEntry(&out[i]) {
			continue
		}
		var rules []admissionregistrationv1.RuleWithOperations
		for _, r := range out[i].Rules {
			if slices.Contains(r.APIGroups, "") && slices.Contains(r.Resources, "configmaps") {
				rules = append(rules, r)
			}
		}
		for _, k := range kinds {
			rules = append(rules, ProtectedKindRule(k))
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
	return FormatProtectedKind(schema.GroupVersionResource{Group: first(r.APIGroups), Version: first(r.APIVersions), Resource: res})
}
