package controllers

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// conflictRetry is how soon a lost compare-and-swap is retried. The informer
// delivers the newer object anyway; this is the backstop.
const conflictRetry = 20 * time.Millisecond

// +kubebuilder:rbac:groups=locks.fencekeeper.dev,resources=fencedresources,verbs=get;list;watch
// +kubebuilder:rbac:groups=locks.fencekeeper.dev,resources=fencedresources/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=locks.fencekeeper.dev,resources=lockgrants,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=locks.fencekeeper.dev,resources=lockgrants/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=locks.fencekeeper.dev,resources=lockgrants/finalizers,verbs=update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// GrantIssuerReconciler runs the lease lifecycle of one FencedResource at a
// time: queue, issue, renew, expire, release, revoke, hand off. Every decision
// is committed by one compare-and-swap of the FencedResource status; LockGrant
// statuses are then brought in line with it.
type GrantIssuerReconciler struct {
	client.Client
	// APIReader reads around the cache when a decision must not rest on a stale view.
	APIReader client.Reader
	Issuer    *Issuer
	Recorder  events.EventRecorder
	// Name distinguishes several issuing controllers in one process (tests only).
	Name                    string
	MaxConcurrentReconciles int
}

// SetupWithManager registers the controller and the LockGrant index.
func (r *GrantIssuerReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &locksv1.LockGrant{}, locksv1.LockGrantResourceField, func(o client.Object) []string {
		return []string{o.(*locksv1.LockGrant).Spec.Resource}
	}); err != nil {
		return fmt.Errorf("index LockGrants by %s: %w", locksv1.LockGrantResourceField, err)
	}
	name := r.Name
	if name == "" {
		name = "grant-issuer"
	}
	toResource := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: o.(*locksv1.LockGrant).Spec.Resource}}}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named(name).
		For(&locksv1.FencedResource{}).
		Watches(&locksv1.LockGrant{}, toResource).
		WatchesRawSource(r.Issuer.resyncSource(r.Client)).
		WithOptions(func() controller.Options {
			o := controllerOptions(r.Name != "")
			o.MaxConcurrentReconciles = max(r.MaxConcurrentReconciles, 1)
			return o
		}()).
		Complete(r)
}

// controllerOptions allows several instances of a controller in one process
// (tests run two issuers side by side) when they are given their own names.
func controllerOptions(named bool) controller.Options {
	return controller.Options{SkipNameValidation: &named}
}

// Reconcile makes one issuing decision for the FencedResource req names.
func (r *GrantIssuerReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if err := r.Issuer.Wait(ctx); err != nil {
		return ctrl.Result{}, err
	}
	var fr locksv1.FencedResource
	if err := r.Get(ctx, req.NamespacedName, &fr); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, r.denyOrphans(ctx, req.NamespacedName)
	}
	var list locksv1.LockGrantList
	if err := r.List(ctx, &list, client.InNamespace(fr.Namespace), client.MatchingFields{locksv1.LockGrantResourceField: fr.Name}); err != nil {
		return ctrl.Result{}, err
	}
	grants := list.Items
	holderDeleted := false
	if h := fr.Status.Holder; h != nil && !slices.ContainsFunc(grants, func(lg locksv1.LockGrant) bool { return string(lg.UID) == h.GrantUID }) {
		// The cache does not show the holder. Only an uncached read can tell a
		// deleted holder from one the cache has not caught up with.
		var lg locksv1.LockGrant
		err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: fr.Namespace, Name: h.GrantName}, &lg)
		switch {
		case apierrors.IsNotFound(err) || (err == nil && string(lg.UID) != h.GrantUID):
			holderDeleted = true
		case err != nil:
			return ctrl.Result{}, err
		default:
			grants = append(grants, lg)
		}
	}

	s := r.Issuer.state()
	in := planInput{
		fr: &fr, grants: grants, holderDeleted: holderDeleted, now: r.Issuer.clock.Now(),
		epoch: s.epoch, takeoverAt: s.takeoverAt, revokedBelow: s.revokedBelow, signer: s.signer,
	}
	p, err := r.plan(ctx, &in)
	if err != nil || p.superseded {
		if p.superseded {
			ctrl.LoggerFrom(ctx).V(1).Info("a newer issuer epoch owns this resource", "epoch", s.epoch, "registryEpoch", fr.Status.IssuerEpoch)
		}
		return ctrl.Result{}, err
	}
	if p.policyDenial && !p.statusChanged {
		// A denial must not rest on a cached, older policy: no compare-and-swap
		// will check it for us, so read the registry around the cache.
		var fresh locksv1.FencedResource
		if err := r.APIReader.Get(ctx, req.NamespacedName, &fresh); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
		if fresh.ResourceVersion != fr.ResourceVersion {
			return ctrl.Result{RequeueAfter: conflictRetry}, nil
		}
	}
	if p.statusChanged {
		fr.Status = p.status
		registryWrites.Inc()
		// Update carries the resourceVersion we read: the compare-and-swap that
		// makes a fence allocation (and every other decision) unique.
		if err := r.Status().Update(ctx, &fr); err != nil {
			if apierrors.IsConflict(err) {
				casConflicts.Inc()
				return ctrl.Result{RequeueAfter: conflictRetry}, nil
			}
			return ctrl.Result{}, err
		}
	}
	queueDepth.WithLabelValues(fr.Namespace, fr.Name).Set(float64(len(p.status.Queue)))
	grantsIssued.Add(float64(p.issued))
	grantHandoffs.Add(float64(p.handoffs))
	grantExpiries.Add(float64(p.expiries))
	grantReleases.Add(float64(p.releases))
	grantRevocations.Add(float64(p.revocations))
	observeIssued(&p)

	byName := map[string]*locksv1.LockGrant{}
	byUID := map[string]*locksv1.LockGrant{}
	for i := range in.grants {
		byName[in.grants[i].Name] = &in.grants[i]
		byUID[string(in.grants[i].UID)] = &in.grants[i]
	}
	// The decision is committed: record it before anything else can fail.
	for _, e := range p.events {
		var regarding client.Object = &fr
		if lg := byUID[e.grant]; lg != nil {
			regarding = lg
		}
		r.Recorder.Eventf(regarding, &fr, e.kind, e.reason, e.reason, "%s", e.note)
	}
	retry := false
	for _, c := range p.grantStatus {
		if err := r.patchGrant(ctx, byName[c.name], true, func(lg *locksv1.LockGrant) { lg.Status = c.status }); err != nil {
			if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				return ctrl.Result{}, err
			}
			// Keep the order: nothing later is written before this one lands.
			retry = true
			break
		}
	}
	for _, name := range p.removeFinalizer {
		if err := r.patchGrant(ctx, byName[name], false, func(lg *locksv1.LockGrant) {
			lg.Finalizers = slices.DeleteFunc(lg.Finalizers, func(f string) bool { return f == locksv1.GrantFinalizer })
		}); client.IgnoreNotFound(err) != nil {
			if !apierrors.IsConflict(err) {
				return ctrl.Result{}, err
			}
			retry = true
		}
	}
	for _, name := range p.addFinalizer {
		if err := r.patchGrant(ctx, byName[name], false, func(lg *locksv1.LockGrant) {
			lg.Finalizers = append(lg.Finalizers, locksv1.GrantFinalizer)
		}); client.IgnoreNotFound(err) != nil {
			if !apierrors.IsConflict(err) {
				return ctrl.Result{}, err
			}
			retry = true
		}
	}
	if retry {
		return ctrl.Result{RequeueAfter: conflictRetry}, nil
	}
	return ctrl.Result{RequeueAfter: p.requeueAfter}, nil
}

// plan runs planGrants and, before a fence is handed to a LockGrant, confirms
// with an uncached read that the LockGrant still waits and was never granted:
// a cache that missed its earlier grant must not earn it a second fence.
func (r *GrantIssuerReconciler) plan(ctx context.Context, in *planInput) (planOutput, error) {
	for attempt := 0; ; attempt++ {
		p, err := planGrants(*in)
		if err != nil || p.issuedTo == "" || attempt == 3 {
			if attempt == 3 && p.issuedTo != "" {
				return planOutput{}, fmt.Errorf("LockGrant cache keeps disagreeing with the API server about %s", p.issuedTo)
			}
			return p, err
		}
		i := slices.IndexFunc(in.grants, func(lg locksv1.LockGrant) bool { return lg.Name == p.issuedTo })
		cached := &in.grants[i]
		var fresh locksv1.LockGrant
		err = r.APIReader.Get(ctx, client.ObjectKeyFromObject(cached), &fresh)
		switch {
		case apierrors.IsNotFound(err):
			in.grants = slices.Delete(slices.Clone(in.grants), i, i+1)
		case err != nil:
			return planOutput{}, err
		case fresh.UID == cached.UID && fresh.Status.Grant == nil && !fresh.Status.Phase.Terminal() &&
			fresh.DeletionTimestamp == nil && !fresh.Spec.Release:
			return p, nil
		default:
			grants := slices.Clone(in.grants)
			grants[i] = fresh
			in.grants = grants
		}
	}
}

// patchGrant applies mutate as a merge patch conditioned on the resourceVersion
// we read, so a LockGrant is never moved by a decision made from an older view.
func (r *GrantIssuerReconciler) patchGrant(ctx context.Context, lg *locksv1.LockGrant, status bool, mutate func(*locksv1.LockGrant)) error {
	if lg == nil {
		return nil
	}
	orig := lg.DeepCopy()
	mutate(lg)
	patch := client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})
	if status {
		return r.Status().Patch(ctx, lg, patch)
	}
	return r.Patch(ctx, lg, patch)
}

// denyOrphans settles LockGrants whose FencedResource is gone: they can never be served.
func (r *GrantIssuerReconciler) denyOrphans(ctx context.Context, key types.NamespacedName) error {
	var list locksv1.LockGrantList
	if err := r.List(ctx, &list, client.InNamespace(key.Namespace), client.MatchingFields{locksv1.LockGrantResourceField: key.Name}); err != nil {
		return err
	}
	if len(list.Items) == 0 {
		return nil
	}
	// The LockGrant cache may be ahead of the FencedResource cache; confirm.
	if err := r.APIReader.Get(ctx, key, &locksv1.FencedResource{}); !apierrors.IsNotFound(err) {
		return err // nil: it exists, and its own event will bring us back
	}
	queueDepth.DeleteLabelValues(key.Namespace, key.Name)
	now := r.Issuer.clock.Now()
	for i := range list.Items {
		lg := &list.Items[i]
		if !lg.Status.Phase.Terminal() {
			st := terminalStatus(lg.Status, locksv1.PhaseDenied, locksv1.ReasonNoSuchResource, now)
			setCondition(&st.Conditions, 0, locksv1.ConditionIssued, false, locksv1.ReasonNoSuchResource,
				fmt.Sprintf("FencedResource %s does not exist", key.Name))
			if err := r.patchGrant(ctx, lg, true, func(lg *locksv1.LockGrant) { lg.Status = st }); client.IgnoreNotFound(err) != nil {
				return err
			}
			r.Recorder.Eventf(lg, nil, corev1.EventTypeWarning, locksv1.ReasonNoSuchResource, "Deny", "FencedResource %s does not exist", key.Name)
		}
		if lg.DeletionTimestamp != nil {
			if err := r.patchGrant(ctx, lg, false, func(lg *locksv1.LockGrant) {
				lg.Finalizers = slices.DeleteFunc(lg.Finalizers, func(f string) bool { return f == locksv1.GrantFinalizer })
			}); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	return nil
}
