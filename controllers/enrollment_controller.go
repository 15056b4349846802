package controllers

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/rules/enrollment"
)

// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch;patch

// NamespaceEnrollmentReconciler keeps every namespace that holds a
// FencedResource enrolled (labelled for the acceptance webhook): the
// FencedResource webhook enrolls it before admitting the first entry; this
// puts the label back when someone removes it. An exempt namespace is never
// enrolled: one found enrolled (it became exempt later, or was labelled by
// hand) loses the label, with an Event.
type NamespaceEnrollmentReconciler struct {
	Client   client.Client
	Reader   client.Reader
	Name     string
	Exempt   enrollment.Exemptions
	Recorder events.EventRecorder
}

// Reconcile enrolls the namespace if it holds an entry and lost its label.
func (r *NamespaceEnrollmentReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var ns corev1.Namespace
	if err := r.Client.Get(ctx, req.NamespacedName, &ns); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if r.Exempt.Has(ns.Name) {
		return ctrl.Result{}, r.unenrollExempt(ctx, &ns)
	}
	if ns.Labels[locksv1.LabelEnrolledNamespace] == "true" || ns.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	var entries locksv1.FencedResourceList
	if err := r.Client.List(ctx, &entries, client.InNamespace(ns.Name), client.Limit(1)); err != nil || len(entries.Items) == 0 {
		return ctrl.Result{}, err
	}
	ctrl.LoggerFrom(ctx).Info("enrolling namespace again: it holds FencedResources", "namespace", ns.Name)
	return ctrl.Result{}, enrollment.Ensure(ctx, r.Client, r.Reader, r.Exempt, ns.Name)
}

// unenrollExempt removes the enrollment label from an exempt namespace. The
// webhook configuration's namespaceSelector already keeps the webhooks away
// from it; the label only misleads, and an uninstall would have to find it.
// Entries left there protect nothing any more: the Event says so.
func (r *NamespaceEnrollmentReconciler) unenrollExempt(ctx context.Context, ns *corev1.Namespace) error {
	if _, ok := ns.Labels[locksv1.LabelEnrolledNamespace]; !ok {
		return nil
	}
	removed, err := enrollment.Remove(ctx, r.Client, r.Reader, ns.Name)
	if err != nil || !removed {
		return err
	}
	var entries locksv1.FencedResourceList
	if err := r.Client.List(ctx, &entries, client.InNamespace(ns.Name)); err != nil {
		return err
	}
	note := fmt.Sprintf("namespace %s is exempt from fencing (%s): removed label %s", ns.Name, strings.Join(r.Exempt.Names(), ", "), locksv1.LabelEnrolledNamespace)
	if n := len(entries.Items); n > 0 {
		note += fmt.Sprintf("; its %d FencedResources protect nothing here any more: recreate them, with their targets, in an application namespace", n)
	}
	ctrl.LoggerFrom(ctx).Info("unenrolled an exempt namespace", "namespace", ns.Name, "fencedResources", len(entries.Items))
	if r.Recorder != nil {
		r.Recorder.Eventf(ns, nil, corev1.EventTypeWarning, locksv1.EventReasonNamespaceExempt, "Unenroll", "%s", note)
	}
	return nil
}

// SetupWithManager watches namespaces and FencedResources.
func (r *NamespaceEnrollmentReconciler) SetupWithManager(mgr ctrl.Manager) error {
	name := r.Name
	if name == "" {
		name = "namespace-enrollment"
	}
	opts := controllerOptions(r.Name != "")
	toNamespace := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetNamespace()}}}
	})
	// Only an entry's arrival (or departure) matters to its namespace's
	// enrollment: the issuer's status writes, one or more per handoff,
	// would each cost a reconcile that finds nothing to do.
	existence := predicate.Funcs{UpdateFunc: func(event.UpdateEvent) bool { return false }}
	return ctrl.NewControllerManagedBy(mgr).Named(name).WithOptions(opts).
		For(&corev1.Namespace{}).
		Watches(&locksv1.FencedResource{}, toNamespace, builder.WithPredicates(existence)).
		Complete(r)
}
