package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/rules/issuer"
)

// conflictRetry is how soon a lost compare-and-swap is retried. The informer
// delivers the newer object anyway; this is the backstop.
const conflictRetry = 20 * time.Millisecond

// maxConcurrentGrantReads bounds the reads around the cache one decision
// makes at once (a queue of up to MaxQueueLength arrivals).
const maxConcurrentGrantReads = 8

// +kubebuilder:rbac:groups=locks.fencekeeper.dev,resources=fencedresources,verbs=get;list;watch
// +kubebuilder:rbac:groups=locks.fencekeeper.dev,resources=fencedresources/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=locks.fencekeeper.dev,resources=lockgrants,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=locks.fencekeeper.dev,resources=lockgrants/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=locks.fencekeeper.dev,resources=lockgrants/finalizers,verbs=update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// IssuerReconciler runs the lease lifecycle of one FencedResource at a
// time: queue, issue, renew, expire, release, revoke, hand off. Every decision
// is committed by one compare-and-swap of the FencedResource status; LockGrant
// statuses are then brought in line with it.
type IssuerReconciler struct {
	client.Client
	// APIReader reads around the cache when a decision must not rest on a stale view.
	APIReader client.Reader
	Identity  *IssuerIdentity
	Recorder  events.EventRecorder
	// Name distinguishes several issuing controllers in one process (tests only).
	Name                    string
	MaxConcurrentReconciles int
	// CreationVersions orders requests created in the same second.
	CreationVersions *CreationVersions

	statuses *statusMirror // which LockGrant statuses to write now (status_mirror.go)
	writer   *grantWriter  // writes them outside the lock's pass (grant_writer.go)
	requeue  issuerRequeue // asks for a decision from outside a reconcile
	// confirmSlots bounds the reads confirming arrivals (arrivals.go).
	confirmSlots chan struct{}
	// arrivals: waiters whose registry queue entry was deferred (arrivals.go)
	arrivals deferredArrivals
	// own: the registry writes the cache does not show yet (ownwrites.go)
	own ownWrites
}

// SetupWithManager registers the controller and the LockGrant indexes.
func (r *IssuerReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if err := indexGrants(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	name := r.Name
	if name == "" {
		name = "grant-issuer"
	}
	if err := r.CreationVersions.forgetDeleted(ctx, mgr.GetCache()); err != nil {
		return err
	}
	r.statuses = newStatusMirror(time.Now)
	r.writer = newGrantWriter(max(r.MaxConcurrentReconciles, 1), &r.requeue, r.writeGrant)
	r.confirmSlots = make(chan struct{}, maxConfirmReads)
	if err := mgr.Add(r.writer); err != nil {
		return err
	}
	toResource := askingFirst{handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{grantResource(o.(*locksv1.LockGrant))}
	})}
	return ctrl.NewControllerManagedBy(mgr).
		Named(name).
		Watches(&locksv1.FencedResource{}, shownOwnWrites{newEntriesLast{&handler.EnqueueRequestForObject{}}, &r.own}).
		Watches(&locksv1.LockGrant{}, toResource, builder.WithPredicates(notOwnEcho(r.statuses))).
		WatchesRawSource(r.Identity.resyncSource(r.Client)).
		WatchesRawSource(r.requeue.source()).
		WithOptions(func() controller.Options {
			o := controllerOptions(r.Name != "")
			o.MaxConcurrentReconciles = max(r.MaxConcurrentReconciles, 1)
			return o
		}()).
		Complete(r)
}

// notOwnEcho passes every LockGrant event except the cache delivering a
// status this issuer wrote (statusMirror.ownEcho).
func notOwnEcho(statuses *statusMirror) predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		lg, ok := e.ObjectNew.(*locksv1.LockGrant)
		return !ok || !statuses.ownEcho(lg)
	}}
}

// controllerOptions allows several instances of a controller in one process
// (tests run two issuers side by side) when they are given their own names.
func controllerOptions(named bool) controller.Options {
	return controller.Options{SkipNameValidation: &named}
}

// Reconcile makes one issuing decision for the FencedResource req names:
// gather what it depends on, decide (issuer.Decide, pure), commit the
// registry status by one compare-and-swap, then mirror the committed decision
// onto the LockGrants and emit its Events.
func (r *IssuerReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if err := r.Identity.Wait(ctx); err != nil {
		return ctrl.Result{}, err
	}
	if r.writer.endsBehind(req.NamespacedName) >= maxEndsBehind {
		return ctrl.Result{RequeueAfter: conflictRetry}, nil
	}
	in, found, err := r.gather(ctx, req.NamespacedName)
	if err != nil || !found {
		r.arrivals.forget(req.NamespacedName)
		r.own.forget(req.NamespacedName)
		if err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, r.denyOrphans(ctx, req.NamespacedName)
	}
	d, err := r.decide(ctx, &in)
	if err != nil || d.Superseded {
		r.arrivals.forget(req.NamespacedName)
		if d.Superseded {
			ctrl.LoggerFrom(ctx).V(1).Info("a newer issuer epoch owns this resource", "epoch", in.Epoch, "registryEpoch", in.Resource.Status.IssuerEpoch)
		}
		return ctrl.Result{}, err
	}
	from := in.Resource.ResourceVersion
	committed, err := r.commit(ctx, in.Resource, &d)
	if err != nil || !committed {
		r.arrivals.forget(req.NamespacedName)
		r.own.forget(req.NamespacedName)
		if err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{RequeueAfter: conflictRetry}, nil
	}
	if in.Resource.ResourceVersion != from {
		r.own.wrote(req.NamespacedName, from, in.Resource)
	}
	r.arrivals.set(req.NamespacedName, d.Deferred.Committed(from, in.Resource.ResourceVersion))
	r.confirmLater(ctx, req.NamespacedName, &in, &d)
	return r.mirror(req.NamespacedName, &in, &d), nil
}

// gather reads the FencedResource, its active LockGrants (from the cache's
// index) and the issuer's state; found is false when the FencedResource does
// not exist. A cached FencedResource older than the issuer's own last
// compare-and-swap on it is replaced by what that swap wrote (ownWrites).
func (r *IssuerReconciler) gather(ctx context.Context, key types.NamespacedName) (issuer.Input, bool, error) {
	own := r.own.get(key)
	fr := &locksv1.FencedResource{}
	if err := r.Get(ctx, key, fr); err != nil {
		return issuer.Input{}, false, client.IgnoreNotFound(err)
	}
	fr = r.own.view(own, fr)
	var list locksv1.LockGrantList
	if err := r.List(ctx, &list, client.InNamespace(fr.Namespace), client.MatchingFields{activeGrantsIndex: fr.Name}); err != nil {
		return issuer.Input{}, false, err
	}
	grants := list.Items
	holderDeleted := false
	if h := fr.Status.Holder; h != nil && !slices.ContainsFunc(grants, func(lg locksv1.LockGrant) bool { return string(lg.UID) == h.GrantUID }) {
		// The index does not show the holder (not seen yet, or ended in the
		// cache's view). Only an uncached read can tell a deleted holder from
		// one the cache has not caught up with.
		var lg locksv1.LockGrant
		err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: fr.Namespace, Name: h.GrantName}, &lg)
		switch {
		case apierrors.IsNotFound(err) || (err == nil && string(lg.UID) != h.GrantUID):
			holderDeleted = true
		case err != nil:
			return issuer.Input{}, false, err
		default:
			grants = append(grants, lg)
		}
	}
	s := r.Identity.state()
	return issuer.Input{
		Resource: fr, Grants: grants, HolderDeleted: holderDeleted, Now: r.Identity.clock.Now(),
		Epoch: s.epoch, TakeoverAt: s.takeoverAt, RevokedBelow: s.revokedBelow, Signer: s.signer,
		// Real time: the issuer's clock may be injected and stand still.
		Seen: r.arrivals.get(key), SeenNow: time.Now(), ConfirmLater: true, CreationVersion: r.CreationVersions.Of,
	}, true, nil
}

// decide runs issuer.DecideConfirmed with reads around the cache, all of a
// decision's at once: arrivals come in bursts (a whole queue re-requesting),
// and a release waits for the pass in progress on its lock.
func (r *IssuerReconciler) decide(ctx context.Context, in *issuer.Input) (issuer.Decision, error) {
	return issuer.DecideConfirmed(in, func(cached []*locksv1.LockGrant) ([]*locksv1.LockGrant, error) {
		fresh := make([]*locksv1.LockGrant, len(cached))
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(maxConcurrentGrantReads)
		for i, c := range cached {
			g.Go(func() error {
				uncachedGrantReads.Inc()
				var lg locksv1.LockGrant
				if err := r.APIReader.Get(gctx, client.ObjectKeyFromObject(c), &lg); err != nil {
					return client.IgnoreNotFound(err) // gone: nil
				}
				fresh[i] = &lg
				return nil
			})
		}
		return fresh, g.Wait()
	})
}

// commit writes the decided registry status with the resourceVersion it was
// decided from: the compare-and-swap that makes a fence allocation (and every
// other decision) unique. committed is false when it lost and must be retried.
func (r *IssuerReconciler) commit(ctx context.Context, fr *locksv1.FencedResource, d *issuer.Decision) (committed bool, err error) {
	if d.PolicyDenial && !d.StatusChanged {
		// A denial must not rest on a cached, older policy: no compare-and-swap
		// will check it for us, so read the registry around the cache.
		var fresh locksv1.FencedResource
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(fr), &fresh); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		if fresh.ResourceVersion != fr.ResourceVersion {
			return false, nil
		}
	}
	if d.StatusChanged {
		fr.Status = d.Status
		registryWrites.Inc()
		if err := r.Status().Update(ctx, fr); err != nil {
			if apierrors.IsConflict(err) {
				casConflicts.Inc()
				return false, nil
			}
			return false, err
		}
	}
	setPerResource(queueDepth, fr.Namespace, fr.Name, len(d.Status.Queue))
	grantsIssued.Add(float64(d.Counts.Issued))
	grantHandoffs.Add(float64(d.Counts.Handoffs))
	grantExpiries.Add(float64(d.Counts.Expiries))
	grantReleases.Add(float64(d.Counts.Releases))
	grantRevocations.Add(float64(d.Counts.Revocations))
	observeIssued(d.Counts)
	return true, nil
}

// mirror records a committed decision: its Events first (nothing later may
// lose them), then hands its LockGrant writes to the writer, which writes
// them while the next decision on this resource may already run.
func (r *IssuerReconciler) mirror(key types.NamespacedName, in *issuer.Input, d *issuer.Decision) ctrl.Result {
	fr := in.Resource
	byName := map[string]*locksv1.LockGrant{}
	byUID := map[string]*locksv1.LockGrant{}
	for i := range in.Grants {
		byName[in.Grants[i].Name] = &in.Grants[i]
		byUID[string(in.Grants[i].UID)] = &in.Grants[i]
	}
	for _, e := range d.Events {
		var regarding client.Object = fr
		if lg := byUID[e.GrantUID]; lg != nil {
			regarding = lg
		}
		r.Recorder.Eventf(regarding, fr, e.Type, e.Reason, e.Reason, "%s", e.Note)
	}
	statuses, heldDue := r.statuses.due(d.GrantStatus, byName)
	r.writer.submit(key, planWrites(statuses, d, byName))
	// A deferred phase is written at heldDue, unless the decision then ends it.
	return ctrl.Result{RequeueAfter: soonest(leftSince(d.RequeueAfter, in.SeenNow, time.Now()), heldDue)}
}

// leftSince is what is left at now of a wait of after that a decision made
// at decided asked for. A decision's RequeueAfter (an expiry, a deferral)
// counts from its gather, but the reconcile returns it only after the
// registry's compare-and-swap, and the work queue counts from the return:
// every expiry that followed a swap was decided as late as the swap took
// (about 5 ms at p50 in the expiry bench). Zero stays zero (no wait asked
// for); a wait already over is the least one, a millisecond, as in the
// decision.
func leftSince(after time.Duration, decided, now time.Time) time.Duration {
	if after <= 0 || decided.IsZero() {
		return after
	}
	return max(after-now.Sub(decided), time.Millisecond)
}

// The bookkeeping of one decision (statuses of waiters and requests that
// never held, finalizers) is written a few at a time and bounded per turn: a
// tenant queueing or deleting thousands of requests on a lock must not hold
// up the writes of other resources. What is left over waits for another turn.
const (
	bookkeepingPerPass  = 16
	bookkeepingParallel = 4
)

// planWrites orders a decision's LockGrant writes: the final statuses of the
// grants the registry ended, then the holder's status (so a LockGrant never
// shows Held while the grant before it still does), then the bookkeeping
// (waiters, requests that never held, finalizers).
func planWrites(statuses []issuer.GrantStatus, d *issuer.Decision, byName map[string]*locksv1.LockGrant) grantPlan {
	ended := map[string]bool{}
	for _, e := range d.Status.RecentlyEnded {
		ended[e.GrantUID] = true
	}
	var ends, holder, rest []issuer.GrantStatus
	for _, c := range statuses {
		lg := byName[c.Name]
		wasHeld := lg != nil && lg.Status.Phase == locksv1.PhaseHeld
		switch now := c.Status.Phase; {
		case now.Terminal() && (wasHeld || (lg != nil && ended[string(lg.UID)])):
			ends = append(ends, c)
		case now == locksv1.PhaseHeld || wasHeld:
			holder = append(holder, c)
		default:
			rest = append(rest, c)
		}
	}
	// The plan keeps its own copies of the LockGrants it writes, one per
	// LockGrant (its writes share what each response returns), not the
	// decision's whole list: a plan may wait, and a tenant's thousand
	// requests on one lock must not stay in memory with it.
	written := map[string]*locksv1.LockGrant{}
	keep := func(name string) {
		if lg := byName[name]; lg != nil && written[name] == nil {
			written[name] = lg.DeepCopy()
		}
	}
	for _, c := range statuses {
		keep(c.Name)
	}
	for _, name := range d.RemoveFinalizer {
		keep(name)
	}
	return grantPlan{
		ends:        bookkeepingWrites(ends, nil, written),
		holder:      bookkeepingWrites(holder, nil, written),
		bookkeeping: bookkeepingWrites(rest, d, written),
	}
}

// grantWrite is a bookkeeping write to a LockGrant: its status (when status
// is set), else the removal of a legacy release finalizer.
type grantWrite struct {
	status *locksv1.LockGrantStatus
	// removesFinalizer: the write removes the release finalizer.
	removesFinalizer bool
}

// grantWrites are the bookkeeping writes to one LockGrant, in order: each is
// conditioned on the resourceVersion the one before produced.
type grantWrites struct {
	lg     *locksv1.LockGrant
	writes []grantWrite
}

// bookkeepingWrites groups the statuses, then the finalizer removals of a
// decision (d may be nil: none), by LockGrant, in the order first met.
func bookkeepingWrites(statuses []issuer.GrantStatus, d *issuer.Decision, byName map[string]*locksv1.LockGrant) []grantWrites {
	var out []grantWrites
	at := map[string]int{}
	add := func(name string, w grantWrite) {
		if byName[name] == nil {
			return
		}
		i, ok := at[name]
		if !ok {
			i, at[name] = len(out), len(out)
			out = append(out, grantWrites{lg: byName[name]})
		}
		out[i].writes = append(out[i].writes, w)
	}
	for _, c := range statuses {
		st := c.Status
		add(c.Name, grantWrite{status: &st})
	}
	if d == nil {
		return out
	}
	for _, name := range d.RemoveFinalizer {
		add(name, grantWrite{removesFinalizer: true})
	}
	return out
}

// writeGrant applies one LockGrant's writes in order, stopping at the first
// that fails. A status this issuer wrote since the view it was planned from
// is not written again, and the rest apply on top of it (statusMirror.rebase):
// a plan made from a cache that lagged this issuer's own writes.
func (r *IssuerReconciler) writeGrant(ctx context.Context, g grantWrites) error {
	skip := make([]bool, len(g.writes))
	for i, w := range g.writes {
		skip[i] = (w.status != nil && r.statuses.landedSince(g.lg, *w.status)) ||
			(w.removesFinalizer && r.statuses.finalizerRemoved(g.lg.UID))
	}
	r.statuses.rebase(g.lg)
	for i, w := range g.writes {
		if skip[i] {
			continue
		}
		var err error
		if w.status != nil {
			err = WriteGrantStatus(ctx, r.Client, g.lg, *w.status)
		} else {
			err = r.removeReleaseFinalizer(ctx, g.lg)
		}
		if err != nil {
			return err
		}
		switch {
		case w.status != nil:
			r.statuses.wrote(g.lg, *w.status)
		case w.removesFinalizer:
			r.statuses.removedFinalizer(g.lg.UID)
		}
	}
	return nil
}

// soonest is the earlier of two requeue delays, 0 meaning none.
func soonest(a, b time.Duration) time.Duration {
	if a == 0 || (b > 0 && b < a) {
		return b
	}
	return a
}

// retryable folds a bookkeeping write's outcome: a LockGrant that is gone
// needs nothing, a conflict is retried later, anything else is an error.
func retryable(retry bool, err error) (bool, error) {
	switch {
	case err == nil || apierrors.IsNotFound(err):
		return retry, nil
	case apierrors.IsConflict(err):
		return true, nil
	}
	return retry, err
}

// removeReleaseFinalizer removes the legacy release finalizer from lg, as a
// merge patch conditioned on the resourceVersion we read, so a LockGrant is
// never moved by a decision made from an older view.
func (r *IssuerReconciler) removeReleaseFinalizer(ctx context.Context, lg *locksv1.LockGrant) error {
	if lg == nil {
		return nil
	}
	orig := lg.DeepCopy()
	lg.Finalizers = slices.DeleteFunc(lg.Finalizers, func(f string) bool { return f == locksv1.GrantFinalizer })
	return r.Patch(ctx, lg, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
}

// WriteGrantStatus replaces lg's whole status with st, conditioned on the
// resourceVersion lg was read at (a conflict when the LockGrant changed
// since), and leaves in lg the status as sent (a copy) and the
// resourceVersion the write made. It is the issuer's one way to write a
// LockGrant's status.
//
// What it costs the operator, a status write being part of every lock's
// cycle: a JSON patch of two operations (the status is one atomic field of
// the operator, +structType=atomic, so the whole of it is the write), where a
// merge patch's diff encodes two copies of the LockGrant and compares them;
// and the answer read as metadata only, in protobuf, where the LockGrant in
// JSON would be decoded whole for its resourceVersion.
func WriteGrantStatus(ctx context.Context, c client.Client, lg *locksv1.LockGrant, st locksv1.LockGrantStatus) error {
	data, err := json.Marshal([]jsonPatchOp{
		{Op: "replace", Path: "/metadata/resourceVersion", Value: lg.ResourceVersion},
		{Op: "add", Path: "/status", Value: st}, // add replaces a member that exists
	})
	if err != nil {
		return fmt.Errorf("encode the status of LockGrant %s: %w", lg.Name, err)
	}
	written := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: lg.Namespace, Name: lg.Name}}
	written.SetGroupVersionKind(locksv1.GroupVersion.WithKind("LockGrant"))
	if err := c.Status().Patch(ctx, written, client.RawPatch(types.JSONPatchType, data)); err != nil {
		return err
	}
	lg.ResourceVersion = written.ResourceVersion
	st.DeepCopyInto(&lg.Status) // as sent: times at the precision they had here
	return nil
}

// jsonPatchOp is one operation of an RFC 6902 JSON patch.
type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// denyOrphans settles LockGrants whose FencedResource is gone: they can never be served.
func (r *IssuerReconciler) denyOrphans(ctx context.Context, key types.NamespacedName) error {
	var list locksv1.LockGrantList
	if err := r.List(ctx, &list, client.InNamespace(key.Namespace), client.MatchingFields{activeGrantsIndex: key.Name}); err != nil {
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
	now := r.Identity.clock.Now()
	for i := range list.Items {
		lg := &list.Items[i]
		if !lg.Status.Phase.Terminal() {
			st := issuer.TerminalStatus(lg.Status, locksv1.PhaseDenied, locksv1.ReasonNoSuchResource, now)
			issuer.SetCondition(&st.Conditions, 0, locksv1.ConditionIssued, false, locksv1.ReasonNoSuchResource,
				fmt.Sprintf("FencedResource %s does not exist", key.Name))
			if err := WriteGrantStatus(ctx, r.Client, lg, st); client.IgnoreNotFound(err) != nil {
				return err
			}
			r.Recorder.Eventf(lg, nil, corev1.EventTypeWarning, locksv1.ReasonNoSuchResource, "Deny", "FencedResource %s does not exist", key.Name)
		}
		if lg.DeletionTimestamp != nil {
			if err := r.removeReleaseFinalizer(ctx, lg); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	return nil
}
