package controllers

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/issuing"
)

// heldMirrorDelay is how long a LockGrant's move to a new non-final phase
// (Pending when it is queued, Held when it is granted) waits before it is
// written. Most waits and most critical sections are shorter: the LockGrant
// then goes straight to its final status, which carries the grant, and an
// acquire/release cycle costs one LockGrant status write instead of two or
// three. Nothing waits for these writes: lockclient is HELD from the
// registry's holder record, the webhook reads only the registry, and a
// final status (Released, Expired, Revoked, Denied) is written at once.
const heldMirrorDelay = 100 * time.Millisecond

// maxDeferredHolds bounds the memory of deferred Held writes; past it they
// are all written at once.
const maxDeferredHolds = 4096

// freshHolds decides which planned LockGrant statuses to write now: a move to
// a new non-final phase is deferred for heldMirrorDelay of real time (the
// issuer's clock may be injected and stand still), counted from the first
// decision that planned it; everything else (final statuses, renewals and
// condition updates within a phase) is written at once.
type freshHolds struct {
	now   func() time.Time
	mu    sync.Mutex
	since map[types.UID]time.Time
}

func newFreshHolds(now func() time.Time) *freshHolds {
	return &freshHolds{now: now, since: map[types.UID]time.Time{}}
}

// due returns the statuses to write now, in the planned order, and how long
// until the earliest deferred one is due (0 when none is deferred).
func (f *freshHolds) due(planned []issuing.GrantStatus, grants map[string]*locksv1.LockGrant) ([]issuing.GrantStatus, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.since) > maxDeferredHolds {
		clear(f.since)
	}
	now := f.now()
	var write []issuing.GrantStatus
	var wait time.Duration
	for _, s := range planned {
		lg := grants[s.Name]
		if lg == nil || s.Status.Phase.Terminal() || lg.Status.Phase == s.Status.Phase {
			if lg != nil {
				delete(f.since, lg.UID)
			}
			write = append(write, s)
			continue
		}
		first, ok := f.since[lg.UID]
		if !ok {
			first = now
			f.since[lg.UID] = now
		}
		if left := heldMirrorDelay - now.Sub(first); left > 0 {
			if wait == 0 || left < wait {
				wait = left
			}
			continue
		}
		delete(f.since, lg.UID)
		write = append(write, s)
	}
	return write, wait
}
