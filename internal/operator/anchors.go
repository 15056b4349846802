package operator

import (
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

const (
	// TrustAnchorPolicyName names the ValidatingAdmissionPolicy (and its
	// binding) that guards the trust anchors and everything else the
	// operator keeps in its namespace (see TrustAnchorPolicy).
	TrustAnchorPolicyName = "fencekeeper-trust-anchors"
	// TrustAnchorResource and TrustAnchorRotateVerb are the break-glass
	// permission of an emergency revocation: a user who may "rotate"
	// trustanchors.locks.fencekeeper.dev in the operator namespace (a
	// SubjectAccessReview the API server makes inside the policy), by the
	// name of the trust bundle, may raise its revokedBelowEpoch. Revocation
	// only narrows trust, so it may be somebody else's; adding, changing or
	// removing a key widens or breaks it and is the operator's alone. By the
	// name of the key-rotation request, it allows asking the operator for a
	// rotation (kubectl fence keys rotate). It never allows touching the
	// signing key or the epoch record, deleting or creating an anchor, or
	// lowering an epoch.
	TrustAnchorResource = "trustanchors"
	// TrustAnchorRotateVerb is the break-glass verb on TrustAnchorResource.
	TrustAnchorRotateVerb = "rotate"
)

// AnchorScope is what the trust-anchor policy of one installation names:
// where the operator lives, who it is, and who else writes one of the
// objects it keeps there.
type AnchorScope struct {
	// Namespace is the operator namespace.
	Namespace string
	// Operator is the operator's user name (from a SelfSubjectReview).
	Operator string
	// CertSecret is the Secret of the operator's own webhook serving
	// certificate (--self-signed-certs); empty: locksv1.SelfSignedCertSecret.
	CertSecret string
	// CertManager is the user cert-manager writes locksv1.CertManagerCertSecret
	// as; empty: nobody but the operator writes that Secret.
	CertManager string
}

// TrustAnchorPolicy is the admission policy that keeps what the operator
// keeps in its namespace its own. Only the operator creates, changes or
// deletes:
//   - the trust anchors (signing key, trust bundle, issuer-epoch record):
//     whoever changes them forges grants or lifts a revocation;
//   - the webhook serving certificate Secrets: its CA becomes the webhook
//     configuration's caBundle (cert-manager may write its own);
//   - the verifier Leases, whose reports a key rotation waits on (a forged
//     one stalls it, a deleted one lets it pass a lagging replica), the
//     target claims, which decide which entry protects an object, and the
//     leader-election Lease, whose holder is the only issuer;
//   - the key-rotation request, which a user RBAC-authorized for verb
//     rotate may write too, except the operator's report in it.
//
// A break-glass rotation may raise the trust bundle's revokedBelowEpoch; the
// namespace controller may delete everything while the namespace terminates,
// so uninstalling works; the revocation epoch and the issuer epoch only grow,
// whoever writes. The API server evaluates it itself: no webhook has to be up
// for it to hold.
func TrustAnchorPolicy(scope AnchorScope) (*admissionregistrationv1.ValidatingAdmissionPolicy, *admissionregistrationv1.ValidatingAdmissionPolicyBinding) {
	if scope.CertSecret == "" {
		scope.CertSecret = locksv1.SelfSignedCertSecret
	}
	fail, equivalent := admissionregistrationv1.Fail, admissionregistrationv1.Equivalent
	forbidden := metav1.StatusReasonForbidden
	labels := map[string]string{"app.kubernetes.io/managed-by": "fencekeeper"}
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: TrustAnchorPolicyName, Labels: labels},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionregistrationv1.MatchResources{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: scope.Namespace}},
				ObjectSelector:    &metav1.LabelSelector{},
				MatchPolicy:       &equivalent,
				ResourceRules:     guardedRules(),
			},
			MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "trust-anchor", Expression: guardedObject(scope)}},
			Variables:       policyVariables(scope),
			Validations: []admissionregistrationv1.Validation{
				{
					Expression:        "variables.isOperator || variables.terminating || variables.rotation || variables.rotationRequest || variables.certManager",
					MessageExpression: fmt.Sprintf("'only the fencekeeper operator (' + %s + ') may ' + request.operation + ' the ' + variables.what + ' ' + %s + '/' + variables.name + ', not ' + request.userInfo.username + variables.hint", celString(scope.Operator), celString(scope.Namespace)),
					Reason:            &forbidden,
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
		ObjectMeta: metav1.ObjectMeta{Name: TrustAnchorPolicyName, Labels: labels},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        TrustAnchorPolicyName,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	return policy, binding
}

// guardedRules match every write of ConfigMaps, Secrets and Leases. No
// resourceNames: a deletecollection is admitted item by item under the
// collection's empty name, so a rule by name would not match it. The match
// condition picks the guarded objects by the object's own name instead.
func guardedRules() []admissionregistrationv1.NamedRuleWithOperations {
	namespaced := admissionregistrationv1.NamespacedScope
	ops := []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete}
	rule := func(group string, resources ...string) admissionregistrationv1.NamedRuleWithOperations {
		return admissionregistrationv1.NamedRuleWithOperations{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
			Operations: ops, Rule: admissionregistrationv1.Rule{APIGroups: []string{group}, APIVersions: []string{"v1"}, Resources: resources, Scope: &namespaced},
		}}
	}
	return []admissionregistrationv1.NamedRuleWithOperations{rule("", "configmaps", "secrets"), rule(coordinationv1.GroupName, "leases")}
}

// objectName is the name of the object written (the old one for a delete).
const objectName = "(object != null ? object : oldObject).metadata.name"

// hasComponent says whether obj (which may be null) carries the operator's
// component label with one of values.
func hasComponent(obj string, values ...string) string {
	quoted := make([]string, len(values))
	for i, v := range values {
		quoted[i] = celString(v)
	}
	return fmt.Sprintf("(%[1]s != null && has(%[1]s.metadata.labels) && %[2]s in %[1]s.metadata.labels && %[1]s.metadata.labels[%[2]s] in [%[3]s])",
		obj, celString(locksv1.LabelComponent), strings.Join(quoted, ", "))
}

// guardedObject is the match condition: the object is one the operator
// keeps. A Lease is the operator's by its name or by its component label,
// old or new, so that nobody plants or strips either.
func guardedObject(scope AnchorScope) string {
	lease := fmt.Sprintf("%[1]s == %[2]s || %[1]s.startsWith(%[3]s) || %[1]s.startsWith(%[4]s) || %[5]s || %[6]s",
		objectName, celString(locksv1.LeaderElectionID), celString(locksv1.VerifierLeasePrefix), celString(locksv1.TargetClaimPrefix),
		hasComponent("object", locksv1.ComponentVerifier, locksv1.ComponentTargetClaim),
		hasComponent("oldObject", locksv1.ComponentVerifier, locksv1.ComponentTargetClaim))
	return fmt.Sprintf("(request.resource.resource == 'configmaps' && %[1]s in [%[2]s, %[3]s, %[4]s]) || "+
		"(request.resource.resource == 'secrets' && %[1]s in [%[5]s, %[6]s, %[7]s]) || "+
		"(request.resource.resource == 'leases' && (%[8]s))",
		objectName, celString(locksv1.TrustBundleConfigMap), celString(locksv1.IssuerEpochConfigMap), celString(locksv1.KeyRotationConfigMap),
		celString(locksv1.SigningKeySecret), celString(scope.CertSecret), celString(locksv1.CertManagerCertSecret), lease)
}

// whatExpr names the kind of guarded object, for the refusal.
func whatExpr() string {
	return fmt.Sprintf("request.resource.resource == 'configmaps' ? (variables.name == %[1]s ? 'key-rotation request' : 'trust anchor') : "+
		"request.resource.resource == 'secrets' ? (variables.name == %[2]s ? 'trust anchor' : 'webhook serving certificate') : "+
		"variables.name == %[3]s ? 'leader-election Lease' : "+
		"(variables.name.startsWith(%[4]s) || (!variables.name.startsWith(%[5]s) && (%[6]s || %[7]s))) ? 'target claim' : 'verifier Lease'",
		celString(locksv1.KeyRotationConfigMap), celString(locksv1.SigningKeySecret), celString(locksv1.LeaderElectionID),
		celString(locksv1.TargetClaimPrefix), celString(locksv1.VerifierLeasePrefix),
		hasComponent("object", locksv1.ComponentTargetClaim), hasComponent("oldObject", locksv1.ComponentTargetClaim))
}

// hintExpr says, after a refusal, who else may make that write and how.
func hintExpr(scope AnchorScope) string {
	certManager := "''"
	if scope.CertManager != "" {
		certManager = fmt.Sprintf("' (cert-manager writes it as ' + %s + ')'", celString(scope.CertManager))
	}
	return fmt.Sprintf("variables.what == 'trust anchor' && request.operation == 'UPDATE' ? ' (keys change only through the operator: kubectl fence keys rotate; verb %[1]s on %[2]s.%[3]s allows raising %[4]s only)' : "+
		"variables.what == 'key-rotation request' ? ' (verb %[1]s on %[2]s.%[3]s named ' + variables.name + ' allows writing its %[5]s entry; the %[6]s* entries, its progress report, are written by the operator only)' : "+
		"variables.what == 'webhook serving certificate' && variables.name == %[7]s ? %[8]s : ''",
		TrustAnchorRotateVerb, TrustAnchorResource, locksv1.GroupVersion.Group, grant.RevokedBelowEpochKey,
		locksv1.RotationRequestKey, locksv1.RotationStatusPrefix, celString(locksv1.CertManagerCertSecret), certManager)
}

// policyVariables are the policy's named expressions, in evaluation order.
func policyVariables(scope AnchorScope) []admissionregistrationv1.Variable {
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
	// The operator's report in the rotation request (status.* entries) stays
	// as the operator wrote it: a created request has none, an update keeps
	// each one, with its value.
	report := celString(locksv1.RotationStatusPrefix)
	reportUnchanged := fmt.Sprintf("request.resource.resource == 'configmaps' && variables.name == %[1]s && ("+
		"request.operation == 'DELETE' || "+
		"(request.operation == 'CREATE' && (!has(object.data) || object.data.all(k, !k.startsWith(%[2]s)))) || "+
		"(request.operation == 'UPDATE' && "+
		"(!has(object.data) || object.data.all(k, !k.startsWith(%[2]s) || (has(oldObject.data) && k in oldObject.data && oldObject.data[k] == object.data[k]))) && "+
		"(!has(oldObject.data) || oldObject.data.all(k, !k.startsWith(%[2]s) || (has(object.data) && k in object.data)))))",
		celString(locksv1.KeyRotationConfigMap), report)
	// An absent entry reads as 0; one that is not a plain number as -1, which
	// no update may produce. string() keeps the expressions well typed for
	// Secrets (bytes) too, which never get here (epochKey is empty for them).
	text := func(obj string) string {
		return fmt.Sprintf("variables.epochKey != '' && has(%[1]s.data) && variables.epochKey in %[1]s.data ? string(%[1]s.data[variables.epochKey]).trim() : '0'", obj)
	}
	value := func(textVar string) string {
		return fmt.Sprintf("variables.%[1]s.matches('^[0-9]{1,18}$') ? int(variables.%[1]s) : -1", textVar)
	}
	// The break-glass permission, asked of the API server's authorizer for
	// the object written: named after the trust bundle it allows a
	// revocation, named after the rotation request it allows asking for one.
	mayRotate := fmt.Sprintf("authorizer.group(%s).resource(%s).namespace(%s).name(variables.name).check(%s).allowed()",
		celString(locksv1.GroupVersion.Group), celString(TrustAnchorResource), celString(scope.Namespace), celString(TrustAnchorRotateVerb))
	certManager := "false"
	if scope.CertManager != "" {
		certManager = fmt.Sprintf("request.resource.resource == 'secrets' && variables.name == %s && request.userInfo.username == %s",
			celString(locksv1.CertManagerCertSecret), celString(scope.CertManager))
	}
	return []admissionregistrationv1.Variable{
		{Name: "name", Expression: objectName},
		{Name: "what", Expression: whatExpr()},
		{Name: "hint", Expression: hintExpr(scope)},
		{Name: "isOperator", Expression: "request.userInfo.username == " + celString(scope.Operator)},
		{Name: "terminating", Expression: "request.operation == 'DELETE' && namespaceObject != null && has(namespaceObject.status) && has(namespaceObject.status.phase) && namespaceObject.status.phase == 'Terminating'"},
		{Name: "keysUnchanged", Expression: keysUnchanged},
		{Name: "rotation", Expression: "request.operation == 'UPDATE' && variables.keysUnchanged && " + mayRotate},
		{Name: "reportUnchanged", Expression: reportUnchanged},
		{Name: "rotationRequest", Expression: "variables.reportUnchanged && " + mayRotate},
		{Name: "certManager", Expression: certManager},
		{Name: "epochKey", Expression: "request.operation == 'UPDATE' ? (" + epochKey + ") : ''"},
		{Name: "epochLabel", Expression: "variables.epochKey == 'epoch' ? 'the issuer epoch' : variables.epochKey"},
		{Name: "oldText", Expression: text("oldObject")},
		{Name: "newText", Expression: text("object")},
		{Name: "oldEpoch", Expression: value("oldText")},
		{Name: "newEpoch", Expression: value("newText")},
	}
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
