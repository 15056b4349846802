package controllers

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/rules/enrollment"
)

// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch;patch

// NamespaceEnrollmentReconciler keeps every namespace that holds a
// FencedResource enrolled (labelled for the acceptance webhook): the
// FencedResource webhook enrolls it before admitting the first entry; this
// puts the label back when someone removes it.
type NamespaceEnrollmentReconciler struct {
	Client client.Client
	Reader client.Reader
	Name   string
}

// Reconcile enrolls the namespace if it holds an entry and lost its label.
func (r *NamespaceEnrollmentReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var ns corev1.Namespace
	if err := r.Client.Get(ctx, req.NamespacedName, &ns); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if ns.Labels[locksv1.LabelEnrolledNamespace] == "true" || ns.DeletionTimestamp != nil {
		return ctrl.Result{}, nil
	}
	var entries locksv1.FencedResourceList
	if err := r.Client.List(ctx, &entries, client.InNamespace(ns.Name), client.Limit(1)); err != nil || len(entries.Items) == 0 {
		return ctrl.Result{}, err
	}
	ctrl.LoggerFrom(ctx).Info("enrolling namespace again: it holds FencedResources", "namespace", ns.Name)
	return ctrl.Result{}, enrollment.Ensure(ctx, r.Client, r.Reader, ns.Name)
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
	return ctrl.NewControllerManagedBy(mgr).Named(name).WithOptions(opts).
		For(&corev1.Namespace{}).
		Watches(&locksv1.FencedResource{}, toNamespace).
		Complete(r)
}
