package issuer

import (
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// rebuildQueue drops queue entries that can no longer be served and appends
// new arrivals in FIFO order (by when the issuer first saw them, then by
// creation), up to MaxQueueLength, each under its UID, and returns those it
// appended; the caller confirms they were never granted
// (Decision.Unconfirmed), unless a deferring decision at this registry
// version did (Input.Seen).
func rebuildQueue(v *view, d *Decision) []*locksv1.LockGrant {
	st, in := &v.st, v.in
	queued := map[string]bool{}
	keep := st.Queue[:0:0]
	for _, q := range st.Queue {
		// A LockGrant re-created under a queued name is another request: it
		// arrives again, and its predecessor's confirmation is not its own.
		if lg := v.byName[q.GrantName]; lg != nil && stillWaiting(v, lg) && (q.GrantUID == "" || q.GrantUID == string(lg.UID)) {
			keep = append(keep, q)
			queued[q.GrantName] = true
		}
	}
	arrivals := arrivalsOf(v, queued)
	appended := arrivals[:0:0]
	for _, lg := range arrivals {
		if len(keep) >= locksv1.MaxQueueLength {
			break
		}
		keep = append(keep, locksv1.QueuedGrant{GrantName: lg.Name, Owner: lg.Spec.Owner, GrantUID: string(lg.UID)})
		appended = append(appended, lg)
		if !in.Seen.confirmed(in.Resource, lg) {
			d.Unconfirmed = append(d.Unconfirmed, lg.Name)
		}
	}
	st.Queue = keep
	if len(st.Queue) == 0 {
		st.Queue = nil
	}
	return appended
}

// arrivalsOf lists the waiting requests not queued yet, in FIFO order: by
// when the issuer first saw them, then by creation.
func arrivalsOf(v *view, queued map[string]bool) []*locksv1.LockGrant {
	in := v.in
	var arrivals []*locksv1.LockGrant
	for i := range in.Grants {
		lg := &in.Grants[i]
		if !queued[lg.Name] && !isHolder(in.Resource.Status.Holder, lg) && lg.Status.Phase != locksv1.PhaseHeld && stillWaiting(v, lg) {
			arrivals = append(arrivals, lg)
		}
	}
	slices.SortFunc(arrivals, func(a, b *locksv1.LockGrant) int {
		if sa, sb := in.Seen.firstSeen(a, in.SeenNow), in.Seen.firstSeen(b, in.SeenNow); !sa.Equal(sb) {
			return sa.Compare(sb)
		}
		if arrivedBefore(in, a, b) {
			return -1
		}
		return 1
	})
	return arrivals
}

// stillWaiting reports whether lg may still be issued a grant: not leaving,
// never granted, not the holder, and allowed by the policy.
func stillWaiting(v *view, lg *locksv1.LockGrant) bool {
	if lg.DeletionTimestamp != nil || lg.Spec.Release || lg.Status.Phase.Terminal() || granted(&v.st, lg) {
		return false
	}
	r, _ := denial(v.in.Resource, lg, v.served)
	return r == ""
}

// issueToHead gives the head of the queue the next fence when nobody holds
// and this issuer's epoch is not revoked. The fence becomes real only if the
// caller's compare-and-swap on the FencedResource's resourceVersion succeeds.
func issueToHead(v *view, d *Decision, handoff bool) error {
	st, in, fr := &v.st, v.in, v.in.Resource
	if st.Holder != nil || len(st.Queue) == 0 || in.Epoch < in.RevokedBelow {
		return nil
	}
	entry := st.Queue[0]
	head := v.byName[entry.GrantName]
	st.Queue = st.Queue[1:]
	if len(st.Queue) == 0 {
		st.Queue = nil
	}
	fence := max(st.FenceToken, fr.Spec.FenceFloor) + 1
	now := in.Now.UTC()
	h := &locksv1.Holder{
		GrantName: head.Name, GrantUID: string(head.UID), Owner: head.Spec.Owner,
		Lease: head.Spec.Lease, RequestID: head.Spec.RequestID, FenceToken: fence,
		OperationRoot: head.Spec.OperationRoot, OperationCategory: head.Spec.OperationCategory,
		IssuerEpoch: in.Epoch, PolicyGeneration: fr.Generation, BackendRevision: fr.ResourceVersion,
		TTLSeconds: int64(fr.Spec.LeaseDurationSeconds), IssuedAt: now.Format(time.RFC3339Nano),
		ExpiresAt: metav1.NewMicroTime(now.Add(v.lease)), ObservedRenewals: head.Spec.Renewals,
	}
	digest, proof, err := in.Signer.Sign(h.Grant(fr.Spec.ResourceID))
	if err != nil {
		return fmt.Errorf("sign grant for %s: %w", head.Name, err)
	}
	h.Digest, h.Proof = digest, proof
	st.Holder = h
	st.FenceToken = fence
	st.BackendRevision = fr.ResourceVersion
	d.Counts.Issued++
	d.Counts.Waited = sinceNonNegative(in.Now, head.CreationTimestamp.Time)
	d.IssuedTo = head.Name
	if !confirmedInQueue(in.Resource.Status.Queue, head) && !in.Seen.confirmed(fr, head) && !slices.Contains(d.Unconfirmed, head.Name) {
		d.Unconfirmed = append(d.Unconfirmed, head.Name)
	}
	// Issuing is routine: the LockGrant status, the registry and the metrics
	// say it. An Event per acquisition would be an API write per cycle and
	// bury the Events an on-call person acts on (docs/monitoring.md, Events).
	if handoff {
		d.Counts.Handoffs++
		d.Counts.HandoffGap = sinceNonNegative(in.Now, v.endedAt)
	}
	return nil
}

// confirmedInQueue reports whether the committed queue (the one the
// compare-and-swap will find, not the one being built) holds lg under its UID:
// then a read around the cache confirmed it was never granted when it was
// queued, and only issuing it takes it out of the queue.
func confirmedInQueue(queue []locksv1.QueuedGrant, lg *locksv1.LockGrant) bool {
	return slices.ContainsFunc(queue, func(q locksv1.QueuedGrant) bool {
		return q.GrantName == lg.Name && q.GrantUID != "" && q.GrantUID == string(lg.UID)
	})
}
