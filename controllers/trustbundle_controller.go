package controllers

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// TrustBundleReconciler follows the trust-bundle ConfigMap: when
// revokedBelowEpoch rises, every FencedResource is reconciled so that grants
// issued under older epochs are revoked and their waiters served. It also
// carries out signing-key rotations (keyrotation.go).
type TrustBundleReconciler struct {
	client.Client
	Identity *IssuerIdentity
	Name     string
}

// SetupWithManager watches only the trust-bundle ConfigMap.
func (r *TrustBundleReconciler) SetupWithManager(mgr ctrl.Manager) error {
	name := r.Name
	if name == "" {
		name = "trust-bundle"
	}
	isBundle := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetNamespace() == r.Identity.namespace &&
			(o.GetName() == locksv1.TrustBundleConfigMap || o.GetName() == locksv1.KeyRotationConfigMap)
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named(name).
		For(&corev1.ConfigMap{}, builder.WithPredicates(isBundle)).
		WithOptions(controllerOptions(r.Name != "")).
		Complete(r)
}

// Reconcile loads the bundle into the issuer and moves a key rotation on by
// one step (the rotation request ConfigMap maps here too).
func (r *TrustBundleReconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	if err := r.Identity.Wait(ctx); err != nil {
		return ctrl.Result{}, err
	}
	r.loadBundle(ctx)
	rot := keyRotator{client: r.Client, reader: r.Identity.reader, identity: r.Identity}
	inProgress, err := rot.step(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	if inProgress {
		// Verifier reports are polled, not watched: a rotation is rare and short.
		return ctrl.Result{RequeueAfter: rotationPollBackoff}, nil
	}
	return ctrl.Result{}, nil
}

// loadBundle installs the trust bundle in the issuer; a missing or broken
// bundle keeps the last one loaded.
func (r *TrustBundleReconciler) loadBundle(ctx context.Context) {
	var cm corev1.ConfigMap
	key := client.ObjectKey{Namespace: r.Identity.namespace, Name: locksv1.TrustBundleConfigMap}
	if err := r.Get(ctx, key, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			ctrl.LoggerFrom(ctx).Error(err, "trust bundle deleted; keeping the last one loaded")
		} else {
			ctrl.LoggerFrom(ctx).Error(err, "read the trust bundle; keeping the last one loaded")
		}
		return
	}
	b, err := grant.ParseTrustBundle(cm.Data)
	if err != nil {
		// A broken bundle must not silently widen or narrow trust: keep the old one.
		ctrl.LoggerFrom(ctx).Error(err, "trust bundle is invalid; keeping the last one loaded")
		return
	}
	signer := r.Identity.state().signer
	if pub, ok := b.Keys[signer.KeyID()]; !ok || !pub.Equal(signer.PublicKey()) {
		// Verifiers would reject every grant this issuer signs from now on.
		ctrl.LoggerFrom(ctx).Error(nil, "trust bundle no longer trusts the signing key; keeping the last one loaded", "keyID", signer.KeyID())
		return
	}
	if r.Identity.setBundle(b) {
		ctrl.LoggerFrom(ctx).Info("revocation epoch changed", "revokedBelowEpoch", b.RevokedBelowEpoch)
		r.Identity.ResyncAll()
	}
}
