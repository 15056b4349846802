package controllers

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// DefaultEndedGrantRetention is how long an ended LockGrant is kept by default.
const DefaultEndedGrantRetention = time.Hour

// +kubebuilder:rbac:groups=locks.fencekeeper.dev,resources=lockgrants,verbs=delete

// EndedGrantCollector deletes LockGrants that have been ended (Released,
// Expired, Revoked, Denied) for longer than Retention, so that neither etcd
// nor every replica's cache grows with each acquisition ever made. A
// LockGrant that records a write whose outcome is unknown is kept until that
// record is resolved: it is what ReconciliationRequired points an on-call
// person to. Deleting an ended LockGrant changes no decision (issuer.Active);
// its requestID may then be used again by a new request.
//
// The time is counted from when the leading replica first saw the LockGrant
// ended (the API has no end time but the condition's message): a new leader
// starts counting afresh, which only keeps history longer.
type EndedGrantCollector struct {
	Client    client.Client
	Clock     clock.Clock
	Retention time.Duration

	seen map[types.UID]time.Time // first seen ended, on Clock
}

// NeedLeaderElection is true: one replica collects.
func (c *EndedGrantCollector) NeedLeaderElection() bool { return true }

// Start collects every Retention/4 (at least every second, at most every
// minute) until ctx ends.
func (c *EndedGrantCollector) Start(ctx context.Context) error {
	interval := min(max(c.Retention/4, time.Second), time.Minute)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := c.collect(ctx); err != nil && ctx.Err() == nil {
			ctrl.LoggerFrom(ctx).Error(err, "collecting ended LockGrants")
		}
	}
}

// collect runs one pass: gather from the cache, decide, delete.
func (c *EndedGrantCollector) collect(ctx context.Context) error {
	var list locksv1.LockGrantList
	// Read only: the cache's objects are not copied.
	if err := c.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return err
	}
	var due []*locksv1.LockGrant
	due, c.seen = dueForCollection(list.Items, c.seen, c.Clock.Now(), c.Retention)
	for _, lg := range due {
		// Preconditions: an owner who annotated an unresolved write (or
		// anything else) since the cache saw it keeps the LockGrant.
		uid, rv := lg.UID, lg.ResourceVersion
		target := &locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: lg.Namespace, Name: lg.Name}}
		err := c.Client.Delete(ctx, target, client.Preconditions{UID: &uid, ResourceVersion: &rv})
		switch {
		case err == nil:
			grantsCollected.Inc()
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		default:
			return err
		}
	}
	return nil
}

// dueForCollection returns the LockGrants ended for at least retention and
// the first-seen times to keep for the next pass (only of LockGrants still
// collectable and not yet gone: the memory is bounded by what the cache holds).
func dueForCollection(grants []locksv1.LockGrant, seen map[types.UID]time.Time, now time.Time, retention time.Duration) ([]*locksv1.LockGrant, map[types.UID]time.Time) {
	next := make(map[types.UID]time.Time, len(seen))
	var due []*locksv1.LockGrant
	for i := range grants {
		lg := &grants[i]
		if !collectable(lg) {
			continue
		}
		first, ok := seen[lg.UID]
		if !ok {
			first = now
		}
		// Kept while due too: a delete refused for a newer resourceVersion
		// is tried again next pass, still counted from the first sighting.
		next[lg.UID] = first
		if now.Sub(first) >= retention {
			due = append(due, lg)
		}
	}
	return due, next
}

// collectable: ended, not being deleted already, and no unresolved write recorded.
func collectable(lg *locksv1.LockGrant) bool {
	return lg.Status.Phase.Terminal() && lg.DeletionTimestamp == nil && !recordsUnresolvedMutation(lg)
}
