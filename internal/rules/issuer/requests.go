package issuer

import (
	"fmt"
	"math"
	"slices"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// requestKey is what makes a LockGrant one request within its resource:
// its owner and requestID. Another owner's requestID is another request.
type requestKey struct{ owner, requestID string }

func keyOf(lg *locksv1.LockGrant) requestKey {
	return requestKey{lg.Spec.Owner, lg.Spec.RequestID}
}

// servedRequests picks the one LockGrant served per owner and requestID
// among those that contend for it: the one granted already, else the first
// in the queue's FIFO order (servedBefore). Names in the client library's
// form are unique per request at admission; LockGrants written by hand may
// carry any name, so two of one owner can share a requestID.
func servedRequests(in *Input) map[requestKey]string {
	st := &in.Resource.Status
	chosen := map[requestKey]*locksv1.LockGrant{}
	for i := range in.Grants {
		lg := &in.Grants[i]
		if !contends(in.Resource, lg) {
			continue
		}
		if cur, ok := chosen[keyOf(lg)]; !ok || servedBefore(in, st, lg, cur) {
			chosen[keyOf(lg)] = lg
		}
	}
	served := make(map[requestKey]string, len(chosen))
	for k, lg := range chosen {
		served[k] = lg.Name
	}
	return served
}

// contends reports whether lg can take its request's place: it was granted,
// or it can still be queued. An ended LockGrant changes no decision (Active),
// and one that is leaving, withdrawn or refused by the policy leaves the
// place to its twin: it is settled by its own reason, not as a duplicate.
func contends(fr *locksv1.FencedResource, lg *locksv1.LockGrant) bool {
	switch {
	case !Active(lg):
		return false
	case granted(&fr.Status, lg):
		return true
	case lg.DeletionTimestamp != nil || lg.Spec.Release:
		return false
	}
	reason, _ := ownDenial(fr, lg)
	return reason == ""
}

// servedBefore orders two LockGrants of one request as the queue would
// serve them: a granted one first, then by place in the committed registry
// queue, then as rebuildQueue appends arrivals (first seen, then creation).
func servedBefore(in *Input, st *locksv1.FencedResourceStatus, a, b *locksv1.LockGrant) bool {
	if ga, gb := granted(st, a), granted(st, b); ga != gb {
		return ga
	}
	if qa, qb := queuePlace(st.Queue, a), queuePlace(st.Queue, b); qa != qb {
		return qa < qb
	}
	if sa, sb := in.Seen.firstSeen(a, in.SeenNow), in.Seen.firstSeen(b, in.SeenNow); !sa.Equal(sb) {
		return sa.Before(sb)
	}
	return arrivedBefore(in, a, b)
}

// queuePlace is lg's index in the registry queue (as rebuildQueue keeps
// entries: by name, under its UID when one is recorded), or the queue's
// length when it is not queued.
func queuePlace(queue []locksv1.QueuedGrant, lg *locksv1.LockGrant) int {
	i := slices.IndexFunc(queue, func(q locksv1.QueuedGrant) bool {
		return q.GrantName == lg.Name && (q.GrantUID == "" || q.GrantUID == string(lg.UID))
	})
	if i < 0 {
		return len(queue)
	}
	return i
}

// denial returns why a waiting request can never be served, or "": its own
// reason first, else that another LockGrant is served for its request.
func denial(fr *locksv1.FencedResource, lg *locksv1.LockGrant, served map[requestKey]string) (string, string) {
	if reason, msg := ownDenial(fr, lg); reason != "" {
		return reason, msg
	}
	if n, ok := served[keyOf(lg)]; ok && n != lg.Name {
		return locksv1.ReasonDuplicateRequest, fmt.Sprintf("LockGrant %s already carries requestID %q of owner %q for this resource: one LockGrant per resource, owner and requestID",
			n, lg.Spec.RequestID, lg.Spec.Owner)
	}
	return "", ""
}

// ownDenial returns why lg itself can never be served, or "".
func ownDenial(fr *locksv1.FencedResource, lg *locksv1.LockGrant) (string, string) {
	if err := locksv1.UnsignableRequest(lg.Spec); err != nil {
		// Denied, not queued: its signing would fail the whole decision.
		return locksv1.ReasonUnsignable, fmt.Sprintf("no grant can be signed for this request: %v", err)
	}
	return fr.PolicyViolation(lg.Spec.Owner, lg.Spec.OperationCategory)
}

// arrivedBefore orders requests FIFO by creation: its second, then its
// version (Input.CreationVersion; one the caller cannot place comes after
// those it can), then by name for a stable order.
func arrivedBefore(in *Input, a, b *locksv1.LockGrant) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	if va, vb := creationVersion(in, a), creationVersion(in, b); va != vb {
		return va < vb
	}
	return a.Name < b.Name
}

// creationVersion is lg's Input.CreationVersion, the largest number when
// the caller cannot tell: with the name, a total order.
func creationVersion(in *Input, lg *locksv1.LockGrant) uint64 {
	if in.CreationVersion != nil {
		if rv, ok := in.CreationVersion(lg.UID); ok {
			return rv
		}
	}
	return math.MaxUint64
}

// granted reports whether the registry status st, or lg's own status, says
// lg was ever granted: it holds, it carries a grant, or it ended recently.
func granted(st *locksv1.FencedResourceStatus, lg *locksv1.LockGrant) bool {
	_, ended := endedGrant(st, lg)
	return lg.Status.Grant != nil || isHolder(st.Holder, lg) || ended
}

// isHolder reports whether the holder record names lg (name and UID: a
// re-created LockGrant of the same name is another request).
func isHolder(h *locksv1.Holder, lg *locksv1.LockGrant) bool {
	return h != nil && lg != nil && h.GrantName == lg.Name && h.GrantUID == string(lg.UID)
}

// Active reports whether a decision can still act on lg: it has not ended,
// or it is being deleted and still carries the legacy release finalizer
// (which the decision removes). An ended
// LockGrant decides nothing: its status never changes again, its name (and
// so its requestID) cannot be taken while it exists, and the registry's
// holder record and recentlyEnded say what the queue needs. The operator's
// cache index holds only these, so a decision costs the same after a
// resource's millionth acquisition as after its first.
func Active(lg *locksv1.LockGrant) bool {
	return !lg.Status.Phase.Terminal() || (lg.DeletionTimestamp != nil && slices.Contains(lg.Finalizers, locksv1.GrantFinalizer))
}
