package operator

import (
	"reflect"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func installedHooks() []admissionregistrationv1.ValidatingWebhook {
	fail, none := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone
	path := "/validate-fencekeeper-protected"
	return []admissionregistrationv1.ValidatingWebhook{
		{
			Name:                    "vlockgrant.fencekeeper.dev",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: "fencekeeper-system", Name: "fencekeeper-webhook-service", Path: &path}, CABundle: []byte("ca-1")},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{"locks.fencekeeper.dev"}, APIVersions: []string{"v1alpha1"}, Resources: []string{"lockgrants"}},
			}},
		},
		{
			Name:                    "vprotected.fencekeeper.dev",
			ClientConfig:            admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: "fencekeeper-system", Name: "fencekeeper-webhook-service", Path: &path}, CABundle: []byte("ca-1")},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			AdmissionReviewVersions: []string{"v1"},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{"fencekeeper.dev/protected": "true"}},
			Rules: []admissionregistrationv1.RuleWithOperations{
				{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
				},
				{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{"billing.example.com"}, APIVersions: []string{"v1"}, Resources: []string{"invoicebatches"}},
				},
			},
		},
	}
}

// defaulted is what the API server stores for hooks.
func defaulted(hooks []admissionregistrationv1.ValidatingWebhook) []admissionregistrationv1.ValidatingWebhook {
	out := make([]admissionregistrationv1.ValidatingWebhook, len(hooks))
	for i := range hooks {
		out[i] = *normalizeWebhook(&hooks[i])
	}
	return out
}

func TestWebhookDrift(t *testing.T) {
	ignore := admissionregistrationv1.Ignore
	five := int32(5)
	url := "https://attacker.example.com/allow"
	cases := []struct {
		name     string
		manageCA bool
		mutate   func(h []admissionregistrationv1.ValidatingWebhook) []admissionregistrationv1.ValidatingWebhook
		want     []string
	}{
		{name: "as installed", mutate: nil},
		{name: "only the API server's defaults added", mutate: defaulted},
		{name: "reordered", mutate: func(h []admissionregistrationv1.ValidatingWebhook) []admissionregistrationv1.ValidatingWebhook {
			return []admissionregistrationv1.ValidatingWebhook{h[1], h[0]}
		}},
		{name: "failurePolicy Ignore", mutate: func(h []admissionregistrationv1.ValidatingWebhook) []admissionregistrationv1.ValidatingWebhook {
			h[1].FailurePolicy = &ignore
			return h
		}, want: []string{"vprotected.fencekeeper.dev: failurePolicy"}},
		{name: "objectSelector dropped, timeout changed", mutate: func(h []admissionregistrationv1.ValidatingWebhook) []admissionregistrationv1.ValidatingWebhook {
			h[1].ObjectSelector, h[1].TimeoutSeconds = nil, &five
			return h
		}, want: []string{"vprotected.fencekeeper.dev: objectSelector", "vprotected.fencekeeper.dev: timeoutSeconds"}},
		{name: "a rule deleted", mutate: func(h []admissionregistrationv1.ValidatingWebhook) []admissionregistrationv1.ValidatingWebhook {
			h[1].Rules = h[1].Rules[1:]
			return h
		}, want: []string{"vprotected.fencekeeper.dev: rules (restored configmaps/v1)"}},
		{name: "matchCondition false", mutate: func(h []admissionregistrationv1.ValidatingWebhook) []admissionregistrationv1.ValidatingWebhook {
			h[0].MatchConditions = []admissionregistrationv1.MatchCondition{{Name: "off", Expression: "false"}}
			return h
		}, want: []string{"vlockgrant.fencekeeper.dev: matchConditions"}},
		{name: "pointed elsewhere", mutate: func(h []admissionregistrationv1.ValidatingWebhook) []admissionregistrationv1.ValidatingWebhook {
			h[0].ClientConfig.Service, h[0].ClientConfig.URL = nil, &url
			return h
		}, want: []string{"vlockgrant.fencekeeper.dev: clientConfig"}},
		{name: "webhook removed and another added", mutate: func(h []admissionregistrationv1.ValidatingWebhook) []admissionregistrationv1.ValidatingWebhook {
			extra := h[0]
			extra.Name = "zz.example.com"
			return []admissionregistrationv1.ValidatingWebhook{h[0], extra}
		}, want: []string{"vprotected.fencekeeper.dev: webhook removed", "zz.example.com: webhook added"}},
		{name: "caBundle rotated by cert-manager: not ours", mutate: func(h []admissionregistrationv1.ValidatingWebhook) []admissionregistrationv1.ValidatingWebhook {
			h[0].ClientConfig.CABundle = []byte("ca-2")
			return h
		}},
		{name: "caBundle changed while the operator manages it", manageCA: true, mutate: func(h []admissionregistrationv1.ValidatingWebhook) []admissionregistrationv1.ValidatingWebhook {
			h[0].ClientConfig.CABundle = []byte("ca-2")
			return h
		}, want: []string{"vlockgrant.fencekeeper.dev: caBundle"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			actual := installedHooks()
			if c.mutate != nil {
				actual = c.mutate(actual)
			}
			restored, drift := WebhookDrift(installedHooks(), actual, c.manageCA)
			if !reflect.DeepEqual(drift, c.want) {
				t.Fatalf("drift = %q, want %q", drift, c.want)
			}
			if c.want == nil {
				if restored != nil {
					t.Fatalf("nothing drifted, yet %d webhooks would be written", len(restored))
				}
				return
			}
			// Writing back the result ends the drift.
			if again, drift := WebhookDrift(installedHooks(), defaulted(restored), c.manageCA); again != nil {
				t.Fatalf("after restoring, still drifted: %q", drift)
			}
		})
	}
}

func TestWebhookDriftKeepsTheLiveCABundleItDoesNotManage(t *testing.T) {
	ignore := admissionregistrationv1.Ignore
	actual := installedHooks()
	actual[1].FailurePolicy = &ignore
	actual[1].ClientConfig.CABundle = []byte("ca-rotated")
	restored, _ := WebhookDrift(installedHooks(), actual, false)
	if got := string(restored[1].ClientConfig.CABundle); got != "ca-rotated" {
		t.Fatalf("caBundle written back = %q, want the live %q", got, "ca-rotated")
	}
	if *restored[1].FailurePolicy != admissionregistrationv1.Fail {
		t.Fatalf("failurePolicy written back = %s, want Fail", *restored[1].FailurePolicy)
	}
}

func TestTrustAnchorPolicyDrift(t *testing.T) {
	policy, binding := TrustAnchorPolicy(AnchorScope{Namespace: "fencekeeper-system", Operator: "system:serviceaccount:fencekeeper-system:fencekeeper-controller-manager"})
	if PolicyDrifted(policy.Spec, *normalizePolicy(policy.Spec)) {
		t.Fatal("the API server's defaults alone read as drift of the policy")
	}
	bs := binding.Spec
	bs.MatchResources = normalizeMatch(nil)
	if BindingDrifted(binding.Spec, bs) {
		t.Fatal("the API server's defaults alone read as drift of the binding")
	}
	tampered := policy.Spec.DeepCopy()
	tampered.Validations[0].Expression = "true"
	if !PolicyDrifted(policy.Spec, *tampered) {
		t.Fatal("a validation replaced by true was not drift")
	}
	tampered = policy.Spec.DeepCopy()
	tampered.MatchConstraints.ResourceRules[0].Resources = []string{"configmaps"}
	if !PolicyDrifted(policy.Spec, *tampered) {
		t.Fatal("secrets dropped from the rule was not drift")
	}
	tampered = policy.Spec.DeepCopy()
	tampered.MatchConditions[0].Expression = "false"
	if !PolicyDrifted(policy.Spec, *tampered) {
		t.Fatal("a match condition false was not drift")
	}
	audit := binding.Spec.DeepCopy()
	audit.ValidationActions = []admissionregistrationv1.ValidationAction{admissionregistrationv1.Audit}
	if !BindingDrifted(binding.Spec, *audit) {
		t.Fatal("a binding switched from Deny to Audit was not drift")
	}
	if got := celString(`a'b\c`); got != `'a\'b\\c'` {
		t.Fatalf("celString = %s", got)
	}
}
