package issuer

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// ReadGrants reads LockGrants around the issuer's cache (from the API
// server): one result per request, in order, nil for one that is gone. A
// decision that queues several arrivals asks for them in one call, so the
// caller may read them at once: the pass (and a release that waits for it)
// then takes one round trip, not one per arrival.
type ReadGrants func(cached []*locksv1.LockGrant) ([]*locksv1.LockGrant, error)

// maxConfirmRounds bounds how often a cache that keeps disagreeing with the
// API server is read around before the reconcile fails and is retried.
const maxConfirmRounds = 3

// DecideConfirmed runs Decide and confirms with read every LockGrant the
// decision trusts the cache about for the first time (Decision.Unconfirmed):
// that it still waits and was never granted. A cache that missed an earlier
// grant must not earn a LockGrant a second fence, so when a read disagrees
// the decision is made again from what was read, which in.Grants then holds.
// A queued head was confirmed when it was queued: a handoff reads nothing.
func DecideConfirmed(in *Input, read ReadGrants) (Decision, error) {
	confirmed := map[types.UID]bool{}
	for round := 0; ; round++ {
		d, err := Decide(*in)
		if err != nil || len(d.Unconfirmed) == 0 {
			return confirmDeferred(d, in, confirmed), err
		}
		// Each LockGrant once: a cache that lags may hold a name twice (a
		// request and its re-creation), and the decision lists it twice.
		var ask []*locksv1.LockGrant
		asked := map[types.UID]bool{}
		for _, name := range d.Unconfirmed {
			i := slices.IndexFunc(in.Grants, func(lg locksv1.LockGrant) bool { return lg.Name == name })
			if cached := &in.Grants[i]; !confirmed[cached.UID] && !asked[cached.UID] {
				asked[cached.UID] = true
				ask = append(ask, cached.DeepCopy())
			}
		}
		if len(ask) == 0 {
			return confirmDeferred(d, in, confirmed), nil
		}
		fresh, err := read(ask)
		if err != nil {
			return Decision{}, err
		}
		if len(fresh) != len(ask) {
			return Decision{}, fmt.Errorf("read %d LockGrants around the cache for %d asked", len(fresh), len(ask))
		}
		grants, changed := slices.Clone(in.Grants), false
		for k, cached := range ask {
			i := slices.IndexFunc(grants, func(lg locksv1.LockGrant) bool { return lg.UID == cached.UID })
			switch {
			case fresh[k] == nil:
				grants = slices.Delete(grants, i, i+1)
				changed = true
			case NeverGranted(cached, fresh[k]):
				confirmed[cached.UID] = true
			default:
				grants[i] = *fresh[k]
				changed = true
			}
		}
		if !changed {
			return confirmDeferred(d, in, confirmed), nil
		}
		in.Grants = grants
		if round == maxConfirmRounds {
			return Decision{}, fmt.Errorf("the LockGrant cache keeps disagreeing with the API server about %v", d.Unconfirmed)
		}
	}
}

// NeverGranted reports whether fresh, read around the cache, is the cached
// request still waiting: the API server holds it and it was never granted.
func NeverGranted(cached, fresh *locksv1.LockGrant) bool {
	return fresh.UID == cached.UID && fresh.Status.Grant == nil && !fresh.Status.Phase.Terminal() &&
		fresh.DeletionTimestamp == nil && !fresh.Spec.Release
}

// confirmDeferred marks the arrivals d deferred as confirmed: each was read
// around the cache in this call (confirmed), or confirmed at this registry
// version before, except those left to the caller's reads (Decision.Confirm).
func confirmDeferred(d Decision, in *Input, confirmed map[types.UID]bool) Decision {
	if len(d.Deferred.FirstSeen) == 0 {
		return d
	}
	d.Confirm = slices.DeleteFunc(d.Confirm, func(name string) bool {
		i := slices.IndexFunc(in.Grants, func(lg locksv1.LockGrant) bool { return lg.Name == name })
		return i >= 0 && confirmed[in.Grants[i].UID]
	})
	later := map[types.UID]bool{}
	for _, name := range d.Confirm {
		for i := range in.Grants {
			if in.Grants[i].Name == name {
				later[in.Grants[i].UID] = true
			}
		}
	}
	d.Deferred.Confirmed = make(map[types.UID]bool, len(d.Deferred.FirstSeen))
	for uid := range d.Deferred.FirstSeen {
		if !later[uid] {
			d.Deferred.Confirmed[uid] = true
		}
	}
	return d
}
