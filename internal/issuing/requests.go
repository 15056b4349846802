package issuing

import (
	"fmt"
	"slices"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// servedRequests picks the one LockGrant served per requestID: one that was
// granted already, otherwise the earliest (the webhook's uniqueness check can
// race with a twin create). It returns requestID -> LockGrant name.
func servedRequests(fr *locksv1.FencedResource, grants []locksv1.LockGrant) map[string]string {
	served := map[string]string{}
	chosen := map[string]*locksv1.LockGrant{}
	for i := range grants {
		lg := &grants[i]
		cur, ok := chosen[lg.Spec.RequestID]
		switch {
		case !ok:
		case granted(&fr.Status, cur) != granted(&fr.Status, lg):
			if !granted(&fr.Status, lg) {
				continue
			}
		case !arrivedBefore(lg, cur):
			continue
		}
		chosen[lg.Spec.RequestID] = lg
		served[lg.Spec.RequestID] = lg.Name
	}
	return served
}

// denial returns why a waiting request can never be served, or "".
func denial(fr *locksv1.FencedResource, lg *locksv1.LockGrant, served map[string]string) (string, string) {
	if n := served[lg.Spec.RequestID]; n != lg.Name {
		return locksv1.ReasonDuplicateRequest, fmt.Sprintf("LockGrant %s already carries requestID %q for this resource", n, lg.Spec.RequestID)
	}
	if err := locksv1.UnsignableRequest(lg.Spec); err != nil {
		// Denied, not queued: its signing would fail the whole decision.
		return locksv1.ReasonUnsignable, fmt.Sprintf("no grant can be signed for this request: %v", err)
	}
	return fr.PolicyViolation(lg.Spec.Owner, lg.Spec.OperationCategory)
}

// arrivedBefore orders requests FIFO by creation, then by name for a stable order.
func arrivedBefore(a, b *locksv1.LockGrant) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
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
// or it is being deleted and still carries the release finalizer. An ended
// LockGrant decides nothing: its status never changes again, its name (and
// so its requestID) cannot be taken while it exists, and the registry's
// holder record and recentlyEnded say what the queue needs. The operator's
// cache index holds only these, so a decision costs the same after a
// resource's millionth acquisition as after its first.
func Active(lg *locksv1.LockGrant) bool {
	return !lg.Status.Phase.Terminal() || (lg.DeletionTimestamp != nil && slices.Contains(lg.Finalizers, locksv1.GrantFinalizer))
}
