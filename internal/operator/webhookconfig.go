package operator

import (
	"sort"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

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
		if !equality.Semantic.DeepEqual(f.get(w), f.get(g)) {
			drift = append(drift, want.Name+": "+f.name)
		}
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
