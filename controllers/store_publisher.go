package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	corev1 "k8s.io/api/core/v1"
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

// storeCallTimeout bounds one publication to one store: a store that hangs
// holds one of the publisher's workers this long, never the issuer.
const storeCallTimeout = 5 * time.Second

// The DSN Secrets are read one by one (get only: never listed or watched).
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get

// StorePublisher publishes the registry to the PostgreSQL stores a
// FencedResource names (spec.stores): the resource's mode and policy
// generation, the issuer's revocation, the holder the allocating
// compare-and-swap wrote (with its expiry, which renewals raise), and the
// end of every other grant still open at the store. A database cannot
// verify Ed25519: what it accepts is what this publishes.
//
// It is a controller of its own, so a store that is down delays only its own
// grants' first segment, never the issuing of any grant; a failing store is
// retried with backoff (at most storeRetryLongest apart), and its health is
// written to status.stores and the StoresPublished condition only when it
// changes.
type StorePublisher struct {
	Client client.Client
	// Reader reads the DSN Secrets around the cache: the operator never
	// caches (or lists) Secrets.
	Reader   client.Reader
	Identity *IssuerIdentity
	Recorder events.EventRecorder
	Name     string
	pools    storePools
}

const (
	storeRetryFirst   = 500 * time.Millisecond
	storeRetryLongest = 30 * time.Second
)

// SetupWithManager watches FencedResources that name stores (and those that
// stop naming them, to close their connections).
func (r *StorePublisher) SetupWithManager(mgr ctrl.Manager) error {
	name := r.Name
	if name == "" {
		name = "store-publisher"
	}
	named := predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return hasStores(e.Object) },
		UpdateFunc:  func(e event.UpdateEvent) bool { return hasStores(e.ObjectOld) || hasStores(e.ObjectNew) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return hasStores(e.Object) },
		GenericFunc: func(e event.GenericEvent) bool { return hasStores(e.Object) },
	}
	o := controllerOptions(r.Name != "")
	o.MaxConcurrentReconciles = 4
	o.RateLimiter = workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](storeRetryFirst, storeRetryLongest)
	return ctrl.NewControllerManagedBy(mgr).
		Named(name).
		For(&locksv1.FencedResource{}, builder.WithPredicates(named)).
		WithOptions(o).
		Complete(r)
}

func hasStores(o client.Object) bool {
	fr, ok := o.(*locksv1.FencedResource)
	return ok && len(fr.Spec.Stores) > 0
}

// Reconcile publishes to every store of the FencedResource: gather, publish
// (idempotent), then write the stores' health if it changed, then Events.
func (r *StorePublisher) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if err := r.Identity.Wait(ctx); err != nil {
		return ctrl.Result{}, err
	}
	fr := &locksv1.FencedResource{}
	if err := r.Client.Get(ctx, req.NamespacedName, fr); err != nil {
		if apierrors.IsNotFound(err) {
			r.pools.closeResource(req.NamespacedName, nil)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	r.pools.closeResource(req.NamespacedName, fr.Spec.Stores)
	pub := publicationOf(fr, r.Identity.state().revokedBelow)
	outcomes := make([]storeOutcome, 0, len(fr.Spec.Stores))
	for _, s := range fr.Spec.Stores {
		outcomes = append(outcomes, r.publishTo(ctx, fr, s, pub))
	}
	next, changes, changed := decideStoreStatuses(fr.Status.Stores, outcomes, metav1.Now())
	if changed {
		if err := r.writeStatus(ctx, fr, next); err != nil {
			return ctrl.Result{}, err
		}
		r.emit(fr, changes)
	}
	for _, o := range outcomes {
		if !o.ready {
			return ctrl.Result{}, fmt.Errorf("store %s of %s: %s", o.name, req.NamespacedName, o.message)
		}
	}
	return ctrl.Result{}, nil
}

// publication is what every store of a resource receives.
type publication struct {
	resourceID   string
	mode         pgfence.Mode
	generation   int64
	revokedBelow int64
	holder       *grant.Grant
	expiresAt    time.Time
}

func publicationOf(fr *locksv1.FencedResource, revokedBelow int64) publication {
	p := publication{resourceID: fr.Spec.ResourceID, mode: pgfence.Shadow, generation: fr.Generation, revokedBelow: revokedBelow}
	if fr.Spec.Enforcement == locksv1.EnforcementEnforce {
		p.mode = pgfence.Enforce
	}
	if h := fr.Status.Holder; h != nil {
		g := h.Grant(fr.Spec.ResourceID)
		p.holder, p.expiresAt = &g, h.ExpiresAt.Time
	}
	return p
}

// storeOutcome is one store's result of a publication.
type storeOutcome struct {
	name, reason, message string
	ready                 bool
}

func (r *StorePublisher) publishTo(ctx context.Context, fr *locksv1.FencedResource, s locksv1.StoreReference, p publication) storeOutcome {
	out := storeOutcome{name: s.Name}
	dsn, err := r.dsn(ctx, fr.Namespace, s.SecretRef)
	if err != nil {
		out.reason, out.message = locksv1.ReasonStoreSecretNotFound, err.Error()
		return out
	}
	pool, err := r.pools.get(storeKey{resource: client.ObjectKeyFromObject(fr), store: s.Name}, dsn)
	if err != nil {
		out.reason, out.message = locksv1.ReasonStorePublishFailed, fmt.Sprintf("the DSN in Secret %s key %s does not parse: %v", s.SecretRef.Name, secretKey(s.SecretRef), err)
		return out
	}
	ctx, cancel := context.WithTimeout(ctx, storeCallTimeout)
	defer cancel()
	start := time.Now()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return publish(ctx, tx, p) })
	storePublishDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		storePublications.WithLabelValues("error").Inc()
		out.reason, out.message = classifyStoreError(err)
		return out
	}
	storePublications.WithLabelValues("ok").Inc()
	out.ready, out.reason, out.message = true, locksv1.ReasonStorePublished, "the store has the registry's current holder and every end"
	return out
}

// publish writes the registry's truth in one transaction: the resource, the
// revocation, the holder, and the end of every other open grant.
func publish(ctx context.Context, tx pgx.Tx, p publication) error {
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
	open, err := pgfence.OpenGrants(ctx, tx, p.resourceID)
	if err != nil {
		return err
	}
	for _, d := range open {
		if d == holder {
			continue
		}
		if err := pgfence.EndGrant(ctx, tx, d, "Ended", time.Now()); err != nil {
			return err
		}
	}
	return nil
}

func (r *StorePublisher) dsn(ctx context.Context, namespace string, ref locksv1.StoreSecretReference) (string, error) {
	sec := &corev1.Secret{}
	if err := r.Reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: ref.Name}, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return "", fmt.Errorf("the Secret %s/%s is not found: create it with the operator role's DSN under key %s", namespace, ref.Name, secretKey(ref))
		}
		return "", fmt.Errorf("reading Secret %s/%s: %v", namespace, ref.Name, err)
	}
	v, ok := sec.Data[secretKey(ref)]
	if !ok || len(v) == 0 {
		return "", fmt.Errorf("the Secret %s/%s has no key %s: put the operator role's DSN there", namespace, ref.Name, secretKey(ref))
	}
	return string(v), nil
}

func secretKey(ref locksv1.StoreSecretReference) string {
	if ref.Key == "" {
		return "dsn"
	}
	return ref.Key
}

// classifyStoreError names what went wrong and what to do about it.
func classifyStoreError(err error) (reason, message string) {
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && (pe.Code == "3F000" || pe.Code == "42883"):
		return locksv1.ReasonStoreSchemaNotInstalled, fmt.Sprintf("the fencekeeper schema is not installed (%s): run kubectl fence pg install --dsn … --operator-role <this DSN's role>", pe.Message)
	case errors.As(err, &pe) && pe.Code == "42501":
		return locksv1.ReasonStorePublishFailed, fmt.Sprintf("permission denied (%s): the DSN's role must be the operator role named at kubectl fence pg install", pe.Message)
	case errors.As(err, &pe):
		return locksv1.ReasonStorePublishFailed, fmt.Sprintf("publishing failed: %s (SQLSTATE %s)", pe.Message, pe.Code)
	}
	return locksv1.ReasonStoreUnreachable, fmt.Sprintf("cannot reach the store: %v; publication is retried, and this resource's grants wait for it before their first segment", err)
}

// storeChange is a store whose health changed, for the Events.
type storeChange struct {
	name, message string
	ready         bool
}

// decideStoreStatuses is the next status.stores: one entry per outcome, the
// transition time kept while ready and reason stay; changed is false when
// nothing a reader would see changed.
func decideStoreStatuses(prev []locksv1.StoreStatus, outcomes []storeOutcome, now metav1.Time) ([]locksv1.StoreStatus, []storeChange, bool) {
	old := map[string]locksv1.StoreStatus{}
	for _, s := range prev {
		old[s.Name] = s
	}
	next := make([]locksv1.StoreStatus, 0, len(outcomes))
	var changes []storeChange
	changed := len(prev) != len(outcomes)
	for _, o := range outcomes {
		s := locksv1.StoreStatus{Name: o.name, Ready: o.ready, Reason: o.reason, Message: truncate(o.message, 1024), LastTransitionTime: now}
		p, seen := old[o.name]
		if seen && p.Ready == s.Ready && p.Reason == s.Reason {
			s.LastTransitionTime = p.LastTransitionTime
		}
		if !seen || p.Ready != s.Ready {
			// A first failure is news; a first success is not.
			if !s.Ready || seen {
				changes = append(changes, storeChange{name: o.name, message: s.Message, ready: s.Ready})
			}
		}
		changed = changed || !seen || p.Ready != s.Ready || p.Reason != s.Reason || p.Message != s.Message
		next = append(next, s)
	}
	return next, changes, changed
}

// storesCondition sums the stores up.
func storesCondition(stores []locksv1.StoreStatus, generation int64) metav1.Condition {
	c := metav1.Condition{Type: locksv1.ConditionStoresPublished, Status: metav1.ConditionTrue, ObservedGeneration: generation,
		Reason: locksv1.ReasonStorePublished, Message: fmt.Sprintf("%d of %d stores take what the operator publishes", len(stores), len(stores))}
	for _, s := range stores {
		if !s.Ready {
			c.Status, c.Reason, c.Message = metav1.ConditionFalse, s.Reason, fmt.Sprintf("store %s: %s", s.Name, s.Message)
			return c
		}
	}
	return c
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// writeStatus merges the stores' health into the status; it carries no
// resourceVersion, so it never conflicts with the issuer's compare-and-swap
// (which retries on the new version instead).
func (r *StorePublisher) writeStatus(ctx context.Context, fr *locksv1.FencedResource, stores []locksv1.StoreStatus) error {
	patch := client.MergeFrom(fr.DeepCopy())
	fr.Status.Stores = stores
	meta.SetStatusCondition(&fr.Status.Conditions, storesCondition(stores, fr.Generation))
	return r.Client.Status().Patch(ctx, fr, patch)
}

func (r *StorePublisher) emit(fr *locksv1.FencedResource, changes []storeChange) {
	if r.Recorder == nil {
		return
	}
	for _, c := range changes {
		if c.ready {
			r.Recorder.Eventf(fr, nil, corev1.EventTypeNormal, locksv1.EventReasonStoreRecovered, "Publish", "store %s: %s", c.name, c.message)
			continue
		}
		r.Recorder.Eventf(fr, nil, corev1.EventTypeWarning, locksv1.EventReasonStorePublishFailed, "Publish", "store %s: %s", c.name, c.message)
	}
}

// storeKey is one store of one FencedResource.
type storeKey struct {
	resource types.NamespacedName
	store    string
}

// storePools keeps one small pool per store, replaced when its DSN changes
// and closed when the store or its FencedResource goes away.
type storePools struct {
	mu    sync.Mutex
	pools map[storeKey]*storePool
}

type storePool struct {
	dsn  string
	pool *pgxpool.Pool
}

func (p *storePools) get(k storeKey, dsn string) (*pgxpool.Pool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if cur, ok := p.pools[k]; ok {
		if cur.dsn == dsn {
			return cur.pool, nil
		}
		cur.pool.Close()
		delete(p.pools, k)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, errors.New("invalid DSN") // never echo a DSN: it may hold a password
	}
	cfg.MaxConns = 2
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = storeCallTimeout
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	if p.pools == nil {
		p.pools = map[storeKey]*storePool{}
	}
	p.pools[k] = &storePool{dsn: dsn, pool: pool}
	return pool, nil
}

// closeResource closes the pools of resource's stores not in keep.
func (p *storePools) closeResource(resource types.NamespacedName, keep []locksv1.StoreReference) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, sp := range p.pools {
		if k.resource != resource || storeNamed(keep, k.store) {
			continue
		}
		sp.pool.Close()
		delete(p.pools, k)
	}
}

func storeNamed(stores []locksv1.StoreReference, name string) bool {
	for _, s := range stores {
		if s.Name == name {
			return true
		}
	}
	return false
}
