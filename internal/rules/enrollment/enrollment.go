// Package enrollment keeps the label that routes a namespace's writes of
// protected kinds to the acceptance webhook (api/v1alpha1.LabelEnrolledNamespace).
// A namespace is enrolled before its first FencedResource is admitted and
// stays enrolled: removing the label while an entry exists would let
// unlabelled writes to its target bypass the webhook, so only an
// administrator removes it, after the last entry is gone (docs/security.md).
//
// Some namespaces are never enrolled (Exemptions): kube-system, kube-public,
// the operator's own namespace and the ones an installer adds
// (--exempt-namespaces). A fail-closed webhook in front of them would make
// the control plane's own writes, or the operator's, wait on the operator.
package enrollment

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// AlwaysExempt are the namespaces no installation enrolls, whatever it
// configures: the control plane's own.
var AlwaysExempt = []string{metav1.NamespaceSystem, metav1.NamespacePublic}

// Exemptions are the namespaces that are never enrolled: AlwaysExempt, the
// operator's namespace and the extra ones of --exempt-namespaces. The zero
// value exempts AlwaysExempt only.
type Exemptions struct {
	operator string
	names    []string // sorted, unique, AlwaysExempt and operator included
}

// NewExemptions returns the exemptions of an operator running in
// operatorNamespace with extra names (already validated by ParseExtra).
func NewExemptions(operatorNamespace string, extra []string) Exemptions {
	names := append(slices.Clone(AlwaysExempt), extra...)
	if operatorNamespace != "" {
		names = append(names, operatorNamespace)
	}
	slices.Sort(names)
	return Exemptions{operator: operatorNamespace, names: slices.Compact(names)}
}

// ParseExtra parses the --exempt-namespaces flag: comma-separated namespace
// names (DNS labels); empty entries are ignored.
func ParseExtra(flag string) ([]string, error) {
	var out []string
	for _, s := range strings.Split(flag, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if errs := validation.IsDNS1123Label(s); len(errs) > 0 {
			return nil, fmt.Errorf("--exempt-namespaces: %q is not a namespace name (%s); give comma-separated namespace names such as kube-node-lease,monitoring",
				s, strings.Join(errs, "; "))
		}
		out = append(out, s)
	}
	return out, nil
}

// Names are every exempt namespace, the operator's first and the others
// sorted (the order config/webhook writes them in): the values of the
// webhook configuration's `kubernetes.io/metadata.name NotIn` selector.
func (e Exemptions) Names() []string {
	if e.names == nil {
		return slices.Sorted(slices.Values(AlwaysExempt))
	}
	out := []string{}
	if e.operator != "" {
		out = append(out, e.operator)
	}
	for _, n := range e.names {
		if n != e.operator {
			out = append(out, n)
		}
	}
	return out
}

// Has reports whether namespace is exempt.
func (e Exemptions) Has(namespace string) bool {
	return slices.Contains(e.Names(), namespace)
}

// Refusal is the error for a FencedResource (or an enrollment) in an exempt
// namespace, nil when namespace is not exempt. It says why and what to do.
func (e Exemptions) Refusal(namespace string) error {
	if !e.Has(namespace) {
		return nil
	}
	why := "it is the control plane's own namespace"
	switch {
	case namespace == e.operator:
		why = "it is the fencekeeper operator's own namespace"
	case !slices.Contains(AlwaysExempt, namespace):
		why = "the operator was started with it in --exempt-namespaces (chart value exemptNamespaces)"
	}
	return fmt.Errorf("namespace %s is exempt from fencing and is never enrolled: %s, and a fail-closed webhook there would make its writes wait on the operator (exempt: %s). "+
		"Put the FencedResource and the object it protects in an application namespace", namespace, why, strings.Join(e.Names(), ", "))
}

// Ensure labels a namespace so that the protected-object webhook sees
// every write of a protected kind in it, labelled or not. The FencedResource
// webhook does it before admitting an entry, so no entry exists in a namespace
// whose writes bypass the webhook; the operator keeps the label in place. An
// exempt namespace is refused (Exemptions.Refusal) and left as it is.
func Ensure(ctx context.Context, w client.Writer, reader client.Reader, exempt Exemptions, name string) error {
	if err := exempt.Refusal(name); err != nil {
		return err
	}
	var ns corev1.Namespace
	if err := reader.Get(ctx, types.NamespacedName{Name: name}, &ns); err != nil {
		return fmt.Errorf("read namespace %s: %w", name, err)
	}
	if ns.Labels[locksv1.LabelEnrolledNamespace] == "true" {
		return nil
	}
	patch := client.MergeFrom(ns.DeepCopy())
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	ns.Labels[locksv1.LabelEnrolledNamespace] = "true"
	if err := w.Patch(ctx, &ns, patch); err != nil {
		return fmt.Errorf("enroll namespace %s (label %s=true): %w", name, locksv1.LabelEnrolledNamespace, err)
	}
	return nil
}

// Remove takes the enrollment label off a namespace (an exempt one the
// operator finds enrolled, or every one at uninstall) and reports whether it
// was there. The patch is conditioned on the resourceVersion read, so a
// concurrent change is retried by the caller rather than overwritten.
func Remove(ctx context.Context, w client.Writer, reader client.Reader, name string) (bool, error) {
	var ns corev1.Namespace
	if err := reader.Get(ctx, types.NamespacedName{Name: name}, &ns); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	if _, ok := ns.Labels[locksv1.LabelEnrolledNamespace]; !ok {
		return false, nil
	}
	patch := client.MergeFromWithOptions(ns.DeepCopy(), client.MergeFromWithOptimisticLock{})
	delete(ns.Labels, locksv1.LabelEnrolledNamespace)
	if err := w.Patch(ctx, &ns, patch); err != nil {
		return false, fmt.Errorf("unenroll namespace %s (remove label %s): %w", name, locksv1.LabelEnrolledNamespace, err)
	}
	return true, nil
}
