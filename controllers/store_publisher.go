package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

// storeCallTimeout bounds one publication to one store (connecting
// included): a store that hangs holds one of the publisher's workers this
// long, never the issuer.
const storeCallTimeout = 5 * time.Second

// The publisher's retries: controller-runtime's per-item exponential
// backoff, from storeRetryFirst up to storeRetryLongest apart.
const (
	storeRetryFirst   = 500 * time.Millisecond
	storeRetryLongest = 30 * time.Second
	// storeWorkers bounds how many FencedResources publish at once.
	storeWorkers = 4
	// storeWorkersPerNamespace bounds how many of them one namespace's
	// FencedResources hold at once: a tenant naming stores that hang (each
	// call holds a worker storeCallTimeout) cannot take every worker and
	// delay every other tenant's publication, hence their first writes.
	storeWorkersPerNamespace = storeWorkers / 2
	// namespaceBusyRetry: a FencedResource whose namespace holds its share
	// is tried again this soon, without calling any store.
	namespaceBusyRetry = 100 * time.Millisecond
)

// The DSN Secrets are read one by one around the cache (get only: never
// listed, watched or cached).
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get

// StorePublisher publishes the registry to the PostgreSQL stores a
// FencedResource names (spec.stores): the resource's mode and policy
// generation, the issuer's revocation, the holder the allocating
// compare-and-swap wrote (status.holder, with its expiry, which renewals
// raise), and the end of every other grant still open at the store. A
// database cannot verify Ed25519: what it accepts is what this publishes.
//
// It is a controller of its own (its own workqueue and workers), so a store
// that is down delays only the first segment of its own resource's grants,
// never the issuing of any grant; one namespace's resources hold at most
// half of its workers, so stores that hang delay only their own tenant's
// publications. A failing store is retried with backoff;
// status.stores and the StoresPublished condition are written in one status
// write, only when they change.
type StorePublisher struct {
	Client client.Client
	// Reader reads the DSN Secrets around the cache.
	Reader   client.Reader
	Identity *IssuerIdentity
	Recorder events.EventRecorder
	Name     string

	pools storePools
	// grantUIDs remembers the LockGrant UID of each holder published, by
	// resource and digest, to end it at the store with the registry's reason.
	mu        sync.Mutex
	grantUIDs map[types.NamespacedName]map[string]string
	failing   map[storeKey]bool
	// busy counts the reconciles running per namespace.
	busy map[string]int
	// retry is the failing resources' backoff. It is the publisher's own,
	// not the workqueue's: a resource that waits for its namespace's share
	// is requeued without resetting it.
	retry workqueue.TypedRateLimiter[reconcile.Request]
}

// SetupWithManager watches FencedResources that name stores (and those that
// stop naming them, to close their connections), and follows the issuer's
// resyncs (a raised revokedBelowEpoch).
func (r *StorePublisher) SetupWithManager(mgr ctrl.Manager) error {
	name := r.Name
	if name == "" {
		name = "store-publisher"
	}
	named := predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return hasStores(e.Object) },
		UpdateFunc:  func(e event.UpdateEvent) bool { return publicationChanged(e.ObjectOld, e.ObjectNew) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return hasStores(e.Object) },
		GenericFunc: func(e event.GenericEvent) bool { return hasStores(e.Object) },
	}
	o := controllerOptions(r.Name != "")
	o.MaxConcurrentReconciles = storeWorkers
	return ctrl.NewControllerManagedBy(mgr).
		Named(name).
		For(&locksv1.FencedResource{}, builder.WithPredicates(named)).
		WatchesRawSource(r.Identity.resyncSource(r.Client)).
		WithOptions(o).
		Complete(r)
}

// publicationChanged: an update of a FencedResource with stores changes
// what they are published (the spec, the holder, the recently ended
// grants). The publisher's own status.stores write does not, so it does
// not publish everything a second time at every handoff.
func publicationChanged(oldObj, newObj client.Object) bool {
	o, ok1 := oldObj.(*locksv1.FencedResource)
	n, ok2 := newObj.(*locksv1.FencedResource)
	if !ok1 || !ok2 || !hasStores(o) && !hasStores(n) {
		return false
	}
	return o.Generation != n.Generation || !equality.Semantic.DeepEqual(o.Spec, n.Spec) ||
		!equality.Semantic.DeepEqual(o.Status.Holder, n.Status.Holder) ||
		!equality.Semantic.DeepEqual(o.Status.RecentlyEnded, n.Status.RecentlyEnded)
}

func hasStores(o client.Object) bool {
	fr, ok := o.(*locksv1.FencedResource)
	return ok && len(fr.Spec.Stores) > 0
}

// Reconcile publishes to every store of the FencedResource: gather the
// entry, publish to each store (idempotent, in parallel), decide the
// status, write it if it changed, then record the Events.
func (r *StorePublisher) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if err := r.Identity.Wait(ctx); err != nil {
		return ctrl.Result{}, err
	}
	if !r.enter(req.Namespace) {
		return ctrl.Result{RequeueAfter: namespaceBusyRetry}, nil
	}
	defer r.leave(req.Namespace)
	fr := &locksv1.FencedResource{}
	if err := r.Client.Get(ctx, req.NamespacedName, fr); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName, nil)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	r.forget(req.NamespacedName, fr.Spec.Stores)
	if len(fr.Spec.Stores) == 0 {
		return ctrl.Result{}, r.clearStatus(ctx, fr)
	}
	id := r.Identity.state()
	p := publicationOf(fr, id.revokedBelow)
	p.epoch = id.epoch
	outcomes := r.publishAll(ctx, fr, p)
	next, evs, changed := decideStoreStatuses(fr.Status.Stores, outcomes, metav1.Now())
	cond := storesCondition(next, fr.Generation)
	if changed || conditionChanged(fr.Status.Conditions, cond) {
		if err := r.writeStatus(ctx, fr, next, cond); err != nil {
			return ctrl.Result{}, err
		}
		r.emit(fr, evs)
	}
	r.countFailing(req.NamespacedName, outcomes)
	for _, o := range outcomes {
		if !o.ok {
			// Status, Event and metrics say why; retried with backoff.
			return ctrl.Result{RequeueAfter: r.retries().When(req)}, nil
		}
	}
	r.retries().Forget(req)
	return ctrl.Result{}, nil
}

func (r *StorePublisher) retries() workqueue.TypedRateLimiter[reconcile.Request] {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.retry == nil {
		r.retry = workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](storeRetryFirst, storeRetryLongest)
	}
	return r.retry
}

// enter takes one of the namespace's share of the workers, if one is free.
func (r *StorePublisher) enter(namespace string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.busy[namespace] >= storeWorkersPerNamespace {
		return false
	}
	if r.busy == nil {
		r.busy = map[string]int{}
	}
	r.busy[namespace]++
	return true
}

func (r *StorePublisher) leave(namespace string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.busy[namespace]--; r.busy[namespace] <= 0 {
		delete(r.busy, namespace)
	}
}

// publication is what every store of a resource receives.
type publication struct {
	// epoch is the publishing leader's issuer epoch: a store refuses a
	// publication below one it took (a deposed leader's, late).
	epoch         int64
	resource      types.NamespacedName
	resourceID    string
	mode          pgfence.Mode
	generation    int64
	revokedBelow  int64
	holder        *grant.Grant
	holderUID     string
	expiresAt     time.Time
	recentlyEnded []locksv1.EndedGrant
}

// publicationOf is the registry's current truth for the stores. The policy
// generation is metadata.generation, the one the issuer signs into grants
// (policyGeneration) and the acceptance webhook compares them with.
func publicationOf(fr *locksv1.FencedResource, revokedBelow int64) publication {
	p := publication{resource: client.ObjectKeyFromObject(fr), resourceID: fr.Spec.ResourceID, mode: pgfence.Shadow,
		generation: fr.Generation, revokedBelow: revokedBelow, recentlyEnded: fr.Status.RecentlyEnded}
	if fr.Spec.Enforcement == locksv1.EnforcementEnforce {
		p.mode = pgfence.Enforce
	}
	if h := fr.Status.Holder; h != nil {
		g := h.Grant(fr.Spec.ResourceID)
		p.holder, p.holderUID, p.expiresAt = &g, h.GrantUID, h.ExpiresAt.Time
	}
	return p
}

// publishAll publishes to every store at once: a slow store does not hold
// the others back.
func (r *StorePublisher) publishAll(ctx context.Context, fr *locksv1.FencedResource, p publication) []storeOutcome {
	outcomes := make([]storeOutcome, len(fr.Spec.Stores))
	var wg sync.WaitGroup
	for i, s := range fr.Spec.Stores {
		wg.Go(func() { outcomes[i] = r.publishTo(ctx, fr, s, p) })
	}
	wg.Wait()
	return outcomes
}

func (r *StorePublisher) publishTo(ctx context.Context, fr *locksv1.FencedResource, s locksv1.StoreReference, p publication) storeOutcome {
	ctx, cancel := context.WithTimeout(ctx, storeCallTimeout)
	defer cancel()
	start := time.Now()
	out := r.publishOnce(ctx, fr.Namespace, s, p)
	storePublishDuration.Observe(time.Since(start).Seconds())
	if out.ok {
		storePublications.WithLabelValues("ok").Inc()
	} else {
		storePublications.WithLabelValues("error").Inc()
	}
	return out
}

func (r *StorePublisher) publishOnce(ctx context.Context, namespace string, s locksv1.StoreReference, p publication) storeOutcome {
	out := storeOutcome{name: s.Name}
	sec, err := r.secret(ctx, namespace, s.SecretRef)
	if err != nil {
		out.reason, out.message = locksv1.ReasonStoreSecretNotFound, err.Error()
		return out
	}
	user := storeKey{resource: p.resource, store: s.Name}
	pool, err := r.pools.get(user, poolKey{namespace, s.SecretRef.Name, s.SecretRef.DSNKey()}, sec.ResourceVersion, string(sec.Data[s.SecretRef.DSNKey()]))
	if err != nil {
		out.reason, out.message = locksv1.ReasonStorePublishFailed,
			fmt.Sprintf("Secret %s/%s key %s: %v: put the operator role's libpq DSN (keyword/value or URL) there", namespace, s.SecretRef.Name, s.SecretRef.DSNKey(), err)
		return out
	}
	uids := r.rememberHolder(p)
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return publish(ctx, tx, p, uids) }); err != nil {
		out.reason, out.message = classifyStoreError(err)
		return out
	}
	out.ok = true
	if p.holder != nil {
		out.fence, out.digest = p.holder.FenceToken, p.holder.Digest()
	}
	return out
}

// publish writes the registry's truth in one transaction: the resource, the
// revocation, the holder, and the end of every other open grant.
func publish(ctx context.Context, tx pgx.Tx, p publication, grantUIDs map[string]string) error {
	if err := pgfence.PublishEpoch(ctx, tx, p.epoch); err != nil {
		return err
	}
	if err := pgfence.PublishResource(ctx, tx, p.resourceID, p.mode, p.generation); err != nil {
		return err
	}
	if err := pgfence.PublishRevocation(ctx, tx, p.revokedBelow); err != nil {
		return err
	}
	holder := ""
	if p.holder != nil {
		holder = p.holder.Digest()
		if err := pgfence.PublishGrant(ctx, tx, *p.holder, p.expiresAt); err != nil {
			return err
		}
	}
	rows, err := tx.Query(ctx, "SELECT digest FROM fencekeeper.grants WHERE resource_id = $1 AND ended_at IS NULL", p.resourceID)
	if err != nil {
		return fmt.Errorf("read the open grants of %s: %w", p.resourceID, err)
	}
	open, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read the open grants of %s: %w", p.resourceID, err)
	}
	now := time.Now()
	for _, e := range decideEnds(open, holder, grantUIDs, p.recentlyEnded) {
		if err := pgfence.EndGrant(ctx, tx, e.digest, e.reason, now); err != nil {
			return err
		}
	}
	return nil
}

// secret reads the DSN's Secret around the cache and checks it holds the key.
func (r *StorePublisher) secret(ctx context.Context, namespace string, ref locksv1.StoreSecretReference) (*corev1.Secret, error) {
	sec := &corev1.Secret{}
	if err := r.Reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: ref.Name}, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("the Secret %s/%s is not found: create it with the operator role's DSN under key %s", namespace, ref.Name, ref.DSNKey())
		}
		return nil, fmt.Errorf("cannot read Secret %s/%s (%v): the operator needs get on secrets", namespace, ref.Name, err)
	}
	if len(sec.Data[ref.DSNKey()]) == 0 {
		return nil, fmt.Errorf("the Secret %s/%s has no key %s: put the operator role's DSN there", namespace, ref.Name, ref.DSNKey())
	}
	return sec, nil
}

// SQLSTATEs the publisher tells apart.
const (
	sqlStateInvalidSchema     = "3F000"
	sqlStateUndefinedFunction = "42883"
	sqlStateUndefinedTable    = "42P01"
	sqlStateNoPrivilege       = "42501"
)

// classifyStoreError names what went wrong and what to do about it.
func classifyStoreError(err error) (reason, message string) {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return locksv1.ReasonStoreUnreachable, fmt.Sprintf("cannot reach the store (%v): check the DSN's host and port and that the database is up; "+
			"publication is retried, and this resource's workers wait for their grant to be published before their first segment", err)
	}
	switch pe.Code {
	case sqlStateInvalidSchema, sqlStateUndefinedFunction, sqlStateUndefinedTable:
		return locksv1.ReasonStoreSchemaNotInstalled, fmt.Sprintf("the fencekeeper schema is not installed, or older than this operator needs (%s): "+
			"run kubectl fence pg install --dsn <the database's DSN> --operator-role <this DSN's role> (an upgrade keeps every row)", pe.Message)
	case pgfence.SQLStateEpochSuperseded:
		return locksv1.ReasonStorePublishFailed, fmt.Sprintf("%s: %s", pe.Message, pe.Hint)
	case sqlStateNoPrivilege:
		return locksv1.ReasonStorePublishFailed, fmt.Sprintf("permission denied (%s): the DSN's role must be the operator role "+
			"named at kubectl fence pg install --operator-role", pe.Message)
	}
	return locksv1.ReasonStorePublishFailed, fmt.Sprintf("the store refused the publication: %s (SQLSTATE %s)", pe.Message, pe.Code)
}

// rememberHolder records the holder's LockGrant UID by digest and returns a
// copy of what the publisher knows of the resource.
func (r *StorePublisher) rememberHolder(p publication) map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.grantUIDs == nil {
		r.grantUIDs = map[types.NamespacedName]map[string]string{}
	}
	known := r.grantUIDs[p.resource]
	if known == nil {
		known = map[string]string{}
		r.grantUIDs[p.resource] = known
	}
	if p.holder != nil {
		known[p.holder.Digest()] = p.holderUID
	}
	// Bounded like recentlyEnded: older grants are ended with the unknown reason.
	for len(known) > 2*locksv1.MaxRecentlyEnded {
		for d := range known {
			if p.holder == nil || d != p.holder.Digest() {
				delete(known, d)
				break
			}
		}
	}
	out := make(map[string]string, len(known))
	for d, uid := range known {
		out[d] = uid
	}
	return out
}

// forget closes the connections of the resource's stores not in keep, and
// drops what the publisher remembers of a resource without stores.
func (r *StorePublisher) forget(resource types.NamespacedName, keep []locksv1.StoreReference) {
	r.pools.forget(resource, func(store string) bool {
		return slices.ContainsFunc(keep, func(s locksv1.StoreReference) bool { return s.Name == store })
	})
	if len(keep) > 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.grantUIDs, resource)
	for k := range r.failing {
		if k.resource == resource {
			delete(r.failing, k)
		}
	}
	storesFailing.Set(float64(len(r.failing)))
}

// countFailing updates fencekeeper_stores_failing.
func (r *StorePublisher) countFailing(resource types.NamespacedName, outcomes []storeOutcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failing == nil {
		r.failing = map[storeKey]bool{}
	}
	for k := range r.failing {
		if k.resource == resource {
			delete(r.failing, k)
		}
	}
	for _, o := range outcomes {
		if !o.ok {
			r.failing[storeKey{resource: resource, store: o.name}] = true
		}
	}
	storesFailing.Set(float64(len(r.failing)))
}

// writeStatus writes status.stores and the StoresPublished condition in one
// merge patch conditioned on the resourceVersion read: the patch carries the
// whole conditions list, so it must not overwrite a status the issuer wrote
// since (a conflict is retried with backoff, on the new version).
func (r *StorePublisher) writeStatus(ctx context.Context, fr *locksv1.FencedResource, stores []locksv1.StoreStatus, cond metav1.Condition) error {
	patch := client.MergeFromWithOptions(fr.DeepCopy(), client.MergeFromWithOptimisticLock{})
	fr.Status.Stores = stores
	meta.SetStatusCondition(&fr.Status.Conditions, cond)
	return r.Client.Status().Patch(ctx, fr, patch)
}

// clearStatus removes status.stores and StoresPublished from an entry that
// no longer names stores.
func (r *StorePublisher) clearStatus(ctx context.Context, fr *locksv1.FencedResource) error {
	if len(fr.Status.Stores) == 0 && meta.FindStatusCondition(fr.Status.Conditions, locksv1.ConditionStoresPublished) == nil {
		return nil
	}
	patch := client.MergeFromWithOptions(fr.DeepCopy(), client.MergeFromWithOptimisticLock{})
	fr.Status.Stores = nil
	meta.RemoveStatusCondition(&fr.Status.Conditions, locksv1.ConditionStoresPublished)
	return r.Client.Status().Patch(ctx, fr, patch)
}

func (r *StorePublisher) emit(fr *locksv1.FencedResource, evs []storeEvent) {
	if r.Recorder == nil {
		return
	}
	for _, e := range evs {
		kind := corev1.EventTypeNormal
		if e.warning {
			kind = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(fr, nil, kind, e.reason, "Publish", "store %s: %s", e.store, e.message)
	}
}
