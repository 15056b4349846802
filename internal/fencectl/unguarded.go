package fencectl

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

// The unguarded write shows the acceptance point at work: it sends a write
// stamped with a LockGrant's grant whatever the client knows of that grant
// (expired, released, revoked), so that the webhook, not the client, refuses
// it. It lives here, in the plugin, because a worker must never write past
// its guard: pkg/lockclient has no such path.

// unguardedGrant reads LockGrant name and its signed grant, whatever its phase.
func (o *options) unguardedGrant(ctx context.Context, name string) (*locksv1.LockGrant, error) {
	kube, err := o.kube()
	if err != nil {
		return nil, err
	}
	var lg locksv1.LockGrant
	if err := kube.Get(ctx, client.ObjectKey{Namespace: o.ns(), Name: name}, &lg); err != nil {
		return nil, explainAPI(err, "LockGrant "+name)
	}
	if lg.Status.Grant == nil {
		return nil, fmt.Errorf("LockGrant %s was never granted (%s): there is no grant to send", name, phaseOrPending(lg.Status.Phase))
	}
	return &lg, nil
}

// WriteUnguarded reads obj, applies mutate, stamps the next segment of
// operation under lg's grant (intent "delete" declares a delete) and sends it
// in one create or update. The receipt is the one the write would earn.
func WriteUnguarded(ctx context.Context, kube client.Client, lg *locksv1.LockGrant, obj *unstructured.Unstructured,
	operation, intent string, mutate func() error) (fence.Receipt, error) {
	err := kube.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return fence.Receipt{}, err
	}
	ann := obj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	st, err := fence.StateOf(ann[fence.AnnotationFence], ann[fence.AnnotationReceipts])
	if err != nil {
		return fence.Receipt{}, fmt.Errorf("stored fence state of %s: %w", obj.GetName(), err)
	}
	if err := mutate(); err != nil {
		return fence.Receipt{}, err
	}
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[fence.LabelProtected] = "true"
	obj.SetLabels(labels)
	ann[fence.AnnotationResource] = lg.Spec.Resource
	payload, err := fence.PayloadDigest(fence.ObjectPayload(obj.Object))
	if err != nil {
		return fence.Receipt{}, err
	}
	g := lg.Status.Grant.ToGrant()
	r, err := fence.Stamp(ann, fence.Envelope{Grant: g, Proof: lg.Status.Proof, Operation: operation,
		Segment: fence.NextSegment(st, g), Payload: payload, Intent: intent})
	if err != nil {
		return fence.Receipt{}, err
	}
	obj.SetAnnotations(ann)
	if exists {
		return r, kube.Update(ctx, obj)
	}
	return r, kube.Create(ctx, obj)
}

// deleteUnguarded declares the delete in the next segment under lg's grant
// (content unchanged) and deletes the object as that segment wrote it.
func deleteUnguarded(ctx context.Context, kube client.Client, lg *locksv1.LockGrant, obj *unstructured.Unstructured, operation string) (fence.Receipt, error) {
	r, err := WriteUnguarded(ctx, kube, lg, obj, operation, fence.IntentDelete, func() error { return nil })
	if err != nil {
		return fence.Receipt{}, err
	}
	uid, rv := obj.GetUID(), obj.GetResourceVersion()
	return r, kube.Delete(ctx, obj, client.Preconditions(metav1.Preconditions{UID: &uid, ResourceVersion: &rv}))
}

func phaseOrPending(p locksv1.LockGrantPhase) locksv1.LockGrantPhase {
	if p == "" {
		return locksv1.PhasePending
	}
	return p
}
