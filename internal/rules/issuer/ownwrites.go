package issuer

import (
	"slices"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// maxReplaced bounds how many versions OwnWrites remembers replacing while
// the cache lags. Forgetting one costs only what deciding from the cache
// cost before: a compare-and-swap that loses.
const maxReplaced = 8

// OwnWrites is the issuer's memory of its own compare-and-swaps on one
// FencedResource until its cache shows them.
//
// Why it exists: the caller decides from a cached FencedResource, and its
// cache lags its own writes. A decision asked for between a compare-and-swap
// and the cache showing it (the arrival reads' requeue, a release or a new
// request from a client that already saw the write through its own watch)
// was made from the version that swap replaced. It decided again what the
// swap had already written (the same handoff, issued again to the head it
// had just issued), and its own compare-and-swap could only lose: an API
// write for nothing, a read around the cache of a head that needed none,
// and the arrivals' confirmations dropped with the lost decision. In the
// contended bench (4 clients per lock) that was about one registry write in
// five, 0.2–0.3 per acquire/release cycle.
//
// Deciding from what the issuer wrote is as safe as waiting for the cache
// to show it: it is the object the API server returned for that swap, the
// decision is committed only by a compare-and-swap on its resourceVersion
// (so if anyone wrote since, it loses as before), and everything else a
// decision trusts (the LockGrants, arrivals confirmed at a registry version,
// the queue's confirmed entries) is judged exactly as when the cache shows
// that version.
type OwnWrites struct {
	// Latest is the FencedResource as the issuer's last compare-and-swap
	// left it: the API server's response, resourceVersion included.
	Latest *locksv1.FencedResource
	// Replaced are the versions the issuer's swaps replaced since its cache
	// last showed them, oldest first: a cached view at one of them is older
	// than Latest.
	Replaced []string
}

// Wrote records a compare-and-swap on version from that left the registry
// as fr. The caller must not change fr afterwards.
func (w OwnWrites) Wrote(from string, fr *locksv1.FencedResource) OwnWrites {
	replaced := slices.Clone(w.Replaced)
	if !slices.Contains(replaced, from) {
		replaced = append(replaced, from)
	}
	if len(replaced) > maxReplaced {
		replaced = replaced[len(replaced)-maxReplaced:]
	}
	return OwnWrites{Latest: fr, Replaced: replaced}
}

// Lags reports whether a cached view at resourceVersion rv is older than the
// issuer's latest compare-and-swap. When it does not, the cache shows that
// swap (or a newer write): the memory can be dropped.
func (w OwnWrites) Lags(rv string) bool {
	return w.Latest != nil && slices.Contains(w.Replaced, rv)
}

// View is the FencedResource to decide from: cached, unless it is at a
// version one of the issuer's own compare-and-swaps replaced, then a copy of
// what the latest of them wrote.
func (w OwnWrites) View(cached *locksv1.FencedResource) *locksv1.FencedResource {
	if !w.Lags(cached.ResourceVersion) {
		return cached
	}
	return w.Latest.DeepCopy()
}
