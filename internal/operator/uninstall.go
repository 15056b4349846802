package operator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/rules/enrollment"
	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
)

// UninstallOptions say what one installation's cleanup removes.
type UninstallOptions struct {
	// Namespace is the operator's namespace (its Deployment and leader Lease).
	Namespace string
	// Deployment is the manager Deployment, scaled to 0 first ("" : none).
	Deployment string
	// WebhookConfiguration is the ValidatingWebhookConfiguration removed.
	WebhookConfiguration string
	// StopTimeout bounds the wait for the operator to stop (0: 2 minutes).
	StopTimeout time.Duration
	// Log receives one line per step.
	Log func(format string, args ...any)
}

// Uninstall removes what fencekeeper leaves in a cluster besides the objects
// its manifest or chart lists, in an order in which nothing fights and
// nothing hangs:
//
//  1. the webhook configuration: after it, nothing waits on a webhook. It
//     goes first so that a cleanup that fails later (the operator does not
//     stop) never leaves a cluster with fail-closed webhooks and no replica
//     behind them; the operator never re-creates a deleted configuration;
//  2. the manager Deployment is scaled to 0, and the cleanup waits until no
//     replica leads (no pod of it is left and the leader Lease is free): the
//     leader restores the trust-anchor policy and binding and re-enrolls
//     namespaces, so it must be gone before they are removed;
//  3. the trust-anchor ValidatingAdmissionPolicy and its binding, which the
//     operator created at run time (no manifest lists them);
//  4. the fencekeeper.dev/enrolled label of every namespace;
//  5. the locks.fencekeeper.dev/release finalizer of every LockGrant that
//     carries it (earlier versions put it on), which only a running
//     operator removes: left behind, it hangs the deletion of
//     the LockGrant CRD and of the namespaces that hold one.
//
// Every step tolerates what is already gone, so it can run again.
func Uninstall(ctx context.Context, cfg *rest.Config, o UninstallOptions) error {
	if o.Namespace == "" || o.WebhookConfiguration == "" {
		return errors.New("uninstall: the operator namespace and the webhook configuration name are required")
	}
	if o.StopTimeout <= 0 {
		o.StopTimeout = 2 * time.Minute
	}
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	c, err := client.New(cfg, client.Options{Scheme: locksv1.Scheme})
	if err != nil {
		return err
	}
	if err := deleteAll(ctx, c, o, &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: o.WebhookConfiguration}}); err != nil {
		return err
	}
	if err := stopOperator(ctx, c, o); err != nil {
		return err
	}
	if err := deleteAll(ctx, c, o,
		&admissionregistrationv1.ValidatingAdmissionPolicyBinding{ObjectMeta: metav1.ObjectMeta{Name: TrustAnchorPolicyName}},
		&admissionregistrationv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: TrustAnchorPolicyName}}); err != nil {
		return err
	}
	if err := unenrollAll(ctx, c, o); err != nil {
		return err
	}
	return releaseFinalizers(ctx, c, o)
}

// deleteAll deletes objs, those already gone included.
func deleteAll(ctx context.Context, c client.Client, o UninstallOptions, objs ...client.Object) error {
	for _, obj := range objs {
		kind := fmt.Sprintf("%T", obj)[len("*v1."):]
		if err := client.IgnoreNotFound(c.Delete(ctx, obj)); err != nil {
			return fmt.Errorf("delete %s %s: %w", kind, obj.GetName(), err)
		}
		o.Log("deleted %s %s", kind, obj.GetName())
	}
	return nil
}

// stopOperator scales the manager to 0 and waits until none of its pods is
// left and no replica holds the leader Lease (a stopping leader releases it;
// a killed one lets it expire).
func stopOperator(ctx context.Context, c client.Client, o UninstallOptions) error {
	var selector labels.Selector
	if o.Deployment != "" {
		var d appsv1.Deployment
		err := c.Get(ctx, client.ObjectKey{Namespace: o.Namespace, Name: o.Deployment}, &d)
		switch {
		case apierrors.IsNotFound(err):
			o.Log("Deployment %s/%s is gone", o.Namespace, o.Deployment)
		case err != nil:
			return fmt.Errorf("read Deployment %s/%s: %w", o.Namespace, o.Deployment, err)
		default:
			if selector, err = metav1.LabelSelectorAsSelector(d.Spec.Selector); err != nil {
				return fmt.Errorf("the selector of Deployment %s/%s: %w", o.Namespace, o.Deployment, err)
			}
			if err := c.Patch(ctx, &d, client.RawPatch(client.Merge.Type(), []byte(`{"spec":{"replicas":0}}`))); err != nil {
				return fmt.Errorf("scale Deployment %s/%s to 0: %w", o.Namespace, o.Deployment, err)
			}
			o.Log("scaled Deployment %s/%s to 0", o.Namespace, o.Deployment)
		}
	}
	deadline := time.Now().Add(o.StopTimeout)
	for {
		running, err := operatorRunning(ctx, c, o.Namespace, selector)
		if err != nil {
			return err
		}
		if running == "" {
			o.Log("no operator replica runs")
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the operator still runs after %s (%s): stop it (scale its Deployment to 0) and run the cleanup again", o.StopTimeout, running)
		}
		if err := ctxtime.Sleep(ctx, time.Second); err != nil {
			return err
		}
	}
}

// operatorRunning says what still runs of the operator ("" when nothing).
func operatorRunning(ctx context.Context, c client.Client, ns string, selector labels.Selector) (string, error) {
	if selector != nil {
		var pods corev1.PodList
		if err := c.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabelsSelector{Selector: selector}); err != nil {
			return "", fmt.Errorf("list the manager's pods in %s: %w", ns, err)
		}
		if n := len(pods.Items); n > 0 {
			return fmt.Sprintf("%d pods, e.g. %s", n, pods.Items[0].Name), nil
		}
	}
	var lease coordinationv1.Lease
	err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: locksv1.LeaderElectionID}, &lease)
	switch {
	case apierrors.IsNotFound(err):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("read the leader Lease %s/%s: %w", ns, locksv1.LeaderElectionID, err)
	}
	s := lease.Spec
	if s.HolderIdentity == nil || *s.HolderIdentity == "" || s.RenewTime == nil || s.LeaseDurationSeconds == nil {
		return "", nil
	}
	if time.Since(s.RenewTime.Time) > time.Duration(*s.LeaseDurationSeconds)*time.Second {
		return "", nil // expired: its holder is gone
	}
	return "leader " + *s.HolderIdentity, nil
}

// unenrollAll takes the enrollment label off every namespace.
func unenrollAll(ctx context.Context, c client.Client, o UninstallOptions) error {
	var list corev1.NamespaceList
	if err := c.List(ctx, &list, client.HasLabels{locksv1.LabelEnrolledNamespace}); err != nil {
		return fmt.Errorf("list enrolled namespaces: %w", err)
	}
	for _, ns := range list.Items {
		if _, err := enrollment.Remove(ctx, c, c, ns.Name); err != nil {
			return err
		}
		o.Log("unenrolled namespace %s", ns.Name)
	}
	return nil
}

// releaseFinalizers removes the operator's finalizer from every LockGrant.
func releaseFinalizers(ctx context.Context, c client.Client, o UninstallOptions) error {
	var list locksv1.LockGrantList
	if err := c.List(ctx, &list); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return nil // the CRD is gone already
		}
		return fmt.Errorf("list LockGrants: %w", err)
	}
	for i := range list.Items {
		lg := &list.Items[i]
		if !slices.Contains(lg.Finalizers, locksv1.GrantFinalizer) {
			continue
		}
		patch := client.MergeFromWithOptions(lg.DeepCopy(), client.MergeFromWithOptimisticLock{})
		lg.Finalizers = slices.DeleteFunc(lg.Finalizers, func(f string) bool { return f == locksv1.GrantFinalizer })
		if err := client.IgnoreNotFound(c.Patch(ctx, lg, patch)); err != nil {
			return fmt.Errorf("remove finalizer %s from LockGrant %s/%s: %w", locksv1.GrantFinalizer, lg.Namespace, lg.Name, err)
		}
		o.Log("removed finalizer %s from LockGrant %s/%s", locksv1.GrantFinalizer, lg.Namespace, lg.Name)
	}
	return nil
}
