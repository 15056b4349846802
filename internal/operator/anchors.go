package operator

import (
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

const (
	// TrustAnchorPolicyName names the ValidatingAdmissionPolicy (and its
	// binding) that guards the signing key, trust bundle and issuer-epoch record.
	TrustAnchorPolicyName = "fencekeeper-trust-anchors"
	// TrustAnchorResource and TrustAnchorRotateVerb are the break-glass
	// permission of an emergency revocation: a user who may "rotate"
	// trustanchors.locks.fencekeeper.dev in the operator namespace (a
	// SubjectAccessReview the API server makes inside the policy) may raise
	// the trust bundle's revokedBelowEpoch. Revocation only narrows trust, so
	// it may be somebody else's; adding, changing or removing a key widens or
	// breaks it and is the operator's alone (kubectl fence keys rotate asks
	// the operator). It never allows touching the signing key or the epoch
	// record, a delete, a create or lowering an epoch.
	TrustAnchorResource = "trustanchors"
	// TrustAnchorRotateVerb is the break-glass verb on TrustAnchorResource.
	TrustAnchorRotateVerb = "rotate"
)

// TrustAnchorPolicy is the admission policy that keeps the operator's trust
// anchors in namespace its own: only operatorUser creates, changes or deletes
// them (a break-glass rotation may update them; the namespace controller may
// delete them while the namespace terminates, so uninstalling works), and the
// revocation epoch and the issuer epoch only grow, whoever writes. The API
// server evaluates it itself: no webhook has to be up for it to hold.
func TrustAnchorPolicy(namespace, operatorUser string) (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	fail, equivalent, namespaced := admissionregistrationv1.Fail, admissionregistrationv1.Equivalent, admissionregistrationv1.NamespacedScope
	forbidden := metav1.StatusReasonForbidden
	ops := []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete}
	// No resourceNames: a deletecollection is admitted item by item under the
	// collection's empty name, so a rule by name would not match it. The
	// match condition picks the anchors by the object's own name instead.
	rules := []admissionregistrationv1.NamedRuleWithOperations{{
		RuleWithOperations: admissionregistrationv1.RuleWithOperations{Operations: ops, Rule: admissionregistrationv1.Rule{
			APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps", "secrets"}, Scope: &namespaced,
		}},
	}}
	const name = "(object != null ? object : oldObject).metadata.name"
	isAnchor := fmt.Sprintf("(request.resource.resource == 'configmaps' && %[1]s in [%[2]s, %[3]s]) || (request.resource.resource == 'secrets' && %[1]s == %[4]s)",
		name, celString(locksv1.TrustBundleConfigMap), celString(locksv1.IssuerEpochConfigMap), celString(locksv1.SigningKeySecret))
	epochKey := fmt.Sprintf("variables.name == %s ? %s : (variables.name == %s ? %s : '')",
		celString(locksv1.TrustBundleConfigMap), celString(grant.RevokedBelowEpochKey),
		celString(locksv1.IssuerEpochConfigMap), celString(locksv1.IssuerEpochDataKey))
	// A break-glass update of the trust bundle may change revokedBelowEpoch
	// only: every other entry (a key) and every annotation must be as it was.
	keysUnchanged := fmt.Sprintf("request.operation == 'UPDATE' && request.resource.resource == 'configmaps' && variables.name == %[1]s && "+
		"(!has(object.data) || object.data.all(k, k == %[2]s || (has(oldObject.data) && k in oldObject.data && oldObject.data[k] == object.data[k]))) && "+
		"(!has(oldObject.data) || oldObject.data.all(k, k == %[2]s || (has(object.data) && k in object.data))) && "+
		// The annotations carry the retired keys, which still vouch for stored fence state.
		"has(object.metadata.annotations) == has(oldObject.metadata.annotations) && "+
		"(!has(object.metadata.annotations) || object.metadata.annotations == oldObject.metadata.annotations)",
		celString(locksv1.TrustBundleConfigMap), celString(grant.RevokedBelowEpochKey))
	// An absent entry reads as 0; one that is not a plain number as -1, which
	// no update may produce. string() keeps the expressions well typed for
	// Secrets (bytes) too, which never get here (epochKey is empty for them).
	text := func(obj string) string {
		return fmt.Sprintf("variables.epochKey != '' && has(%[1]s.data) && variables.epochKey in %[1]s.data ? string(%[1]s.data[variables.epochKey]).trim() : '0'", obj)
	}
	value := func(textVar string) string {
		return fmt.Sprintf("variables.%[1]s.matches('^[0-9]{1,18}$') ? int(variables.%[1]s) : -1", textVar)
	}
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: TrustAnchorPolicyName, Labels: map[string]string{"app.kubernetes.io/managed-by": "fencekeeper"}},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionregistrationv1.MatchResources{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: namespace}},
				ObjectSelector:    &metav1.LabelSelector{},
				MatchPolicy:       &equivalent,
				ResourceRules:     rules,
			},
			MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "trust-anchor", Expression: isAnchor}},
			Variables: []admissionregistrationv1.Variable{
				{Name: "name", Expression: name},
				{Name: "isOperator", Expression: "request.userInfo.username == " + celString(operatorUser)},
				{Name: "terminating", Expression: "request.operation == 'DELETE' && namespaceObject != null && has(namespaceObject.status) && has(namespaceObject.status.phase) && namespaceObject.status.phase == 'Terminating'"},
				{Name: "keysUnchanged", Expression: keysUnchanged},
				{Name: "rotation", Expression: fmt.Sprintf("request.operation == 'UPDATE' && variables.keysUnchanged && authorizer.group(%s).resource(%s).namespace(%s).name(variables.name).check(%s).allowed()",
					celString(locksv1.GroupVersion.Group), celString(TrustAnchorResource), celString(namespace), celString(TrustAnchorRotateVerb))},
				{Name: "epochKey", Expression: "request.operation == 'UPDATE' ? (" + epochKey + ") : ''"},
				{Name: "epochLabel", Expression: "variables.epochKey == 'epoch' ? 'the issuer epoch' : variables.epochKey"},
				{Name: "oldText", Expression: text("oldObject")},
				{Name: "newText", Expression: text("object")},
				{Name: "oldEpoch", Expression: value("oldText")},
				{Name: "newEpoch", Expression: value("newText")},
			},
			Validations: []admissionregistrationv1.Validation{
				{
					Expression: "variables.isOperator || variables.terminating || variables.rotation",
					MessageExpression: fmt.Sprintf("'only the fencekeeper operator (' + %s + ') may ' + request.operation + ' the trust anchor ' + %s + '/' + variables.name + ', not ' + request.userInfo.username + (request.operation == 'UPDATE' ? ' (keys change only through the operator: kubectl fence keys rotate; verb %s on %s.%s allows raising %s only)' : '')",
						celString(operatorUser), celString(namespace), TrustAnchorRotateVerb, TrustAnchorResource, locksv1.GroupVersion.Group, grant.RevokedBelowEpochKey),
					Reason: &forbidden,
				},
				{
					Expression:        "variables.epochKey == '' || (variables.newEpoch >= 0 && variables.newEpoch >= variables.oldEpoch)",
					MessageExpression: "variables.epochLabel + ' may only grow: ' + variables.oldText + ' -> ' + variables.newText + (variables.newEpoch < 0 ? ' is not a non-negative integer' : '')",
					Reason:            &forbidden,
				},
			},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: TrustAnchorPolicyName, Labels: map[string]string{"app.kubernetes.io/managed-by": "fencekeeper"}},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        TrustAnchorPolicyName,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	return policy, binding
}

// celString quotes s as a CEL string literal.
func celString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// PolicyDrifted reports whether the live policy spec differs from the desired
// one, after the API server's defaults.
func PolicyDrifted(desired, actual admissionregistrationv1.ValidatingAdmissionPolicySpec) bool {
	return !equality.Semantic.DeepEqual(normalizePolicy(desired), normalizePolicy(actual))
}

// BindingDrifted reports whether the live binding spec differs from the desired one.
func BindingDrifted(desired, actual admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec) bool {
	d, a := desired.DeepCopy(), actual.DeepCopy()
	d.MatchResources, a.MatchResources = normalizeMatch(d.MatchResources), normalizeMatch(a.MatchResources)
	return !equality.Semantic.DeepEqual(d, a)
}

func normalizePolicy(in admissionregistrationv1.ValidatingAdmissionPolicySpec) *admissionregistrationv1.ValidatingAdmissionPolicySpec {
	p := in.DeepCopy()
	if p.FailurePolicy == nil {
		f := admissionregistrationv1.Fail
		p.FailurePolicy = &f
	}
	p.MatchConstraints = normalizeMatch(p.MatchConstraints)
	return p
}

// normalizeMatch fills in the API server's defaults; nil reads as "match
// everything the policy matches", the same as an empty MatchResources.
func normalizeMatch(in *admissionregistrationv1.MatchResources) *admissionregistrationv1.MatchResources {
	m := &admissionregistrationv1.MatchResources{}
	if in != nil {
		m = in.DeepCopy()
	}
	if m.MatchPolicy == nil {
		p := admissionregistrationv1.Equivalent
		m.MatchPolicy = &p
	}
	if m.NamespaceSelector == nil {
		m.NamespaceSelector = &metav1.LabelSelector{}
	}
	if m.ObjectSelector == nil {
		m.ObjectSelector = &metav1.LabelSelector{}
	}
	for _, rules := range [][]admissionregistrationv1.NamedRuleWithOperations{m.ResourceRules, m.ExcludeResourceRules} {
		for i := range rules {
			if rules[i].Scope == nil {
				s := admissionregistrationv1.AllScopes
				rules[i].Scope = &s
			}
		}
	}
	return m
}
