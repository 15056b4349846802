package controllers

import (
	"context"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// askingFirst passes a LockGrant's events to its FencedResource's handler,
// except one that the initial list replays and that asks for something now.
//
// A new leader's controllers start on caches its standby time already
// synced, and the initial list replays every object; controller-runtime
// queues those at low priority, in no useful order. At 100,000
// FencedResources that sweep takes many seconds, and a request made while
// no leader was issuing, or a release the dead leader did not settle,
// would wait for its place in it. Such LockGrants are queued at the
// default priority instead, ahead of the sweep; every other entry is still
// decided by it (a held lease's extension included).
type askingFirst struct {
	handler.TypedEventHandler[client.Object, reconcile.Request]
}

// Create implements handler.EventHandler.
func (h askingFirst) Create(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	lg, isGrant := e.Object.(*locksv1.LockGrant)
	pq, isPriority := q.(priorityqueue.PriorityQueue[reconcile.Request])
	if !e.IsInInitialList || !isGrant || !isPriority || !asksNow(lg) {
		h.TypedEventHandler.Create(ctx, e, q)
		return
	}
	pq.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(0)}, grantResource(lg))
}

// asksNow reports whether a LockGrant waits on a decision: a request not
// yet queued by the registry, a held grant's release or renewal, or a
// deletion. A queued request behind a holder is not: only its holder's
// ending moves it.
func asksNow(lg *locksv1.LockGrant) bool {
	switch {
	case lg.Status.Phase.Terminal():
		return false
	case lg.DeletionTimestamp != nil, lg.Status.Phase == "":
		return true
	case lg.Status.Phase == locksv1.PhaseHeld:
		return lg.Spec.Release || lg.Spec.Renewals != lg.Status.ObservedRenewals
	}
	return false
}

// grantResource is the request for the FencedResource a LockGrant names.
func grantResource(lg *locksv1.LockGrant) reconcile.Request {
	return reconcile.Request{NamespacedName: client.ObjectKey{Namespace: lg.Namespace, Name: lg.Spec.Resource}}
}

// newEntriesLast passes a FencedResource's events to next, except the
// creation of an entry nobody holds or waits on, which it queues at low
// priority: its first decision only writes its conditions. One tenant
// creating entries by the thousand then no longer delays everyone's
// requests, releases and expiries, which are queued at the default
// priority (an entry someone asks for is raised to it by askingFirst's
// events). At 100,000 entries created at the API server's pace, requests
// waited behind a backlog of 90,000 such decisions.
type newEntriesLast struct {
	handler.TypedEventHandler[client.Object, reconcile.Request]
}

// Create implements handler.EventHandler.
func (h newEntriesLast) Create(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	fr, isEntry := e.Object.(*locksv1.FencedResource)
	pq, isPriority := q.(priorityqueue.PriorityQueue[reconcile.Request])
	if e.IsInInitialList || !isEntry || !isPriority || fr.Status.Holder != nil || len(fr.Status.Queue) > 0 {
		h.TypedEventHandler.Create(ctx, e, q)
		return
	}
	pq.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(handler.LowPriority)}, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(fr)})
}
