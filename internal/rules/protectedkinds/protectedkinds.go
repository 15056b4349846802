// Package protectedkinds is the one home of the declared protected kinds:
// their flag form, the webhook rule each one adds, and the question the
// FencedResource webhook, the admission guard and kubectl fence audit all
// ask — does the acceptance webhook see every write of this kind? A
// FencedResource for a kind it does not see would promise a protection that
// nothing gives, so that answer decides whether one may be created.
package protectedkinds

import (
	"fmt"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// Parse parses the --protected-kinds flag: a comma-separated list of
// <resource>.<group>/<version> (<resource>/<version> for the core group),
// e.g. "widgets.example.com/v1,secrets/v1". ConfigMaps are always protected
// and need no entry; fencekeeper's own kinds cannot be declared.
func Parse(s string) ([]schema.GroupVersionResource, error) {
	var out []schema.GroupVersionResource
	seen := map[schema.GroupVersionResource]bool{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		gvr, err := parseOne(item)
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

func parseOne(item string) (schema.GroupVersionResource, error) {
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
	case IsBuiltin(gvr):
		return bad("ConfigMaps are always protected")
	}
	return gvr, nil
}

// Format is the flag and annotation form of a kind (see Parse).
func Format(k schema.GroupVersionResource) string {
	if k.Group == "" {
		return k.Resource + "/" + k.Version
	}
	return k.Resource + "." + k.Group + "/" + k.Version
}

// FormatList is the flag and annotation form of a list of kinds.
func FormatList(kinds []schema.GroupVersionResource) string {
	s := make([]string, len(kinds))
	for i, k := range kinds {
		s[i] = Format(k)
	}
	return strings.Join(s, ",")
}

// IsBuiltin says whether k is built in: ConfigMaps are covered by the generated webhook manifest (the
// webhook markers), whatever is declared.
func IsBuiltin(k schema.GroupVersionResource) bool {
	return k.Group == "" && k.Resource == "configmaps"
}

// Rule is the rule a declared kind adds to both protected entries: every
// write of the kind and of every subresource (/scale changes business
// content and cannot carry a fence; /status of a kind without a status
// subresource is ordinary content).
func Rule(k schema.GroupVersionResource) admissionregistrationv1.RuleWithOperations {
	return admissionregistrationv1.RuleWithOperations{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete},
		Rule: admissionregistrationv1.Rule{
			APIGroups: []string{k.Group}, APIVersions: []string{k.Version}, Resources: []string{k.Resource, k.Resource + "/*"},
		},
	}
}

// IsProtectedEntry says whether w is one of the protected-object webhook's
// entries (vprotected, vprotected-enrolled): those served on
// ProtectedWebhookPath.
func IsProtectedEntry(w *admissionregistrationv1.ValidatingWebhook) bool {
	c := w.ClientConfig
	return c.Service != nil && c.Service.Path != nil && *c.Service.Path == locksv1.ProtectedWebhookPath ||
		c.URL != nil && strings.HasSuffix(*c.URL, locksv1.ProtectedWebhookPath)
}

// Declared adds the kinds of an annotation value (FormatList) to set.
func Declared(set map[string]bool, list string) map[string]bool {
	if set == nil {
		set = map[string]bool{}
	}
	for _, k := range strings.Split(list, ",") {
		if k = strings.TrimSpace(k); k != "" {
			set[k] = true
		}
	}
	return set
}

// RulesCover says whether rules send CREATE, UPDATE and DELETE of res to the
// webhook.
func RulesCover(rules []admissionregistrationv1.RuleWithOperations, res schema.GroupVersionResource) bool {
	need := []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete}
	covered := map[admissionregistrationv1.OperationType]bool{}
	match := func(list []string, v string) bool { return slices.Contains(list, v) || slices.Contains(list, "*") }
	matchResource := func(list []string, v string) bool {
		if parent, _, sub := strings.Cut(v, "/"); sub {
			return slices.Contains(list, v) || slices.Contains(list, parent+"/*") || slices.Contains(list, "*/*")
		}
		return match(list, v)
	}
	for _, r := range rules {
		if !match(r.APIGroups, res.Group) || !match(r.APIVersions, res.Version) || !matchResource(r.Resources, res.Resource) {
			continue
		}
		for _, op := range r.Operations {
			if op == admissionregistrationv1.OperationAll {
				return true
			}
			covered[op] = true
		}
	}
	for _, op := range need {
		if !covered[op] {
			return false
		}
	}
	return true
}

// UndeclaredGap names the gap of a kind the operator was not told to protect,
// or "" when it is declared (or built in). Rules for an undeclared kind do
// not last: the operator removes them, and it has no read access for it.
func UndeclaredGap(declared map[string]bool, res schema.GroupVersionResource) string {
	if IsBuiltin(res) || declared[Format(res)] {
		return ""
	}
	return fmt.Sprintf("%s is not a declared protected kind (fix: add it to the manager's --protected-kinds, or the chart value protectedKinds, and grant the operator get on it; docs/protecting-objects.md)",
		Format(res))
}

// EntryGap names why the protected entry w does not see every write of res
// (the kind and, for a kind of an API group, its subresources), or "" when
// it does.
func EntryGap(w *admissionregistrationv1.ValidatingWebhook, res schema.GroupVersionResource) string {
	switch {
	case !RulesCover(w.Rules, res):
		return fmt.Sprintf("webhook %s does not cover %s (fix: declare it, --protected-kinds=%s or the chart value protectedKinds; docs/protecting-objects.md)",
			w.Name, res.GroupResource(), Format(res))
	case res.Group != "" && !RulesCover(w.Rules, res.GroupVersion().WithResource(res.Resource+"/*")):
		return fmt.Sprintf("webhook %s does not cover the subresources of %s: /scale can change its content unfenced (fix: add %s/* to its rules)",
			w.Name, res.GroupResource(), res.Resource)
	case w.FailurePolicy != nil && *w.FailurePolicy == admissionregistrationv1.Ignore:
		return fmt.Sprintf("webhook %s has failurePolicy Ignore: writes pass unchecked when it is down (fix: failurePolicy Fail)", w.Name)
	}
	return ""
}

// ConfigurationGaps says why the installation's webhook configuration cfg
// does not make res protectable: the kind is not declared (when the operator
// recorded its list), there is no protected entry, or an entry misses some
// of its writes. None means every protected entry sees every write of res.
func ConfigurationGaps(cfg *admissionregistrationv1.ValidatingWebhookConfiguration, res schema.GroupVersionResource) []string {
	var gaps []string
	if list, ok := cfg.Annotations[locksv1.AnnotationProtectedKinds]; ok {
		if g := UndeclaredGap(Declared(nil, list), res); g != "" {
			gaps = append(gaps, g)
		}
	}
	entries := 0
	for i := range cfg.Webhooks {
		w := &cfg.Webhooks[i]
		if !IsProtectedEntry(w) {
			continue
		}
		entries++
		if g := EntryGap(w, res); g != "" {
			gaps = append(gaps, g)
		}
	}
	if entries == 0 {
		gaps = append(gaps, fmt.Sprintf("%s has no protected-object webhook entry", cfg.Name))
	}
	return gaps
}
