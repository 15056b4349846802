// Package enrollment keeps the label that routes a namespace's writes of
// protected kinds to the acceptance webhook (api/v1alpha1.LabelEnrolledNamespace).
// A namespace is enrolled before its first FencedResource is admitted and
// stays enrolled: removing the label while an entry exists would let
// unlabelled writes to its target bypass the webhook, so only an
// administrator removes it, after the last entry is gone (docs/security.md).
package enrollment

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// Ensure labels a namespace so that the protected-object webhook sees
// every write of a protected kind in it, labelled or not. The FencedResource
// webhook does it before admitting an entry, so no entry exists in a namespace
// whose writes bypass the webhook; the operator keeps the label in place.
func Ensure(ctx context.Context, w client.Writer, reader client.Reader, name string) error {
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
