package lockclient

import (
	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

// Resolution is what a read says about a write whose outcome is unknown
// (MUTATION_UNKNOWN: docs/contract.md, "Mutation outcomes").
type Resolution int

const (
	// Undeterminable means the receipt log no longer reaches back to the write.
	Undeterminable Resolution = iota
	// Applied means the write's receipt is in the log; reuse it.
	Applied
	// AppliedOtherPayload means the segment was applied with a different payload.
	AppliedOtherPayload
	// ProvenAbsent means the write did not land and never will; it may be
	// sent again under a current fence, and a refusal of that is the truth.
	ProvenAbsent
	// InFlight means the write has not landed yet but still may: the object
	// is still at the version the write was conditioned on (or, for a create,
	// still absent), so the API server may yet commit it. A read proves
	// nothing more; only the object moving on decides it.
	InFlight
)

func (r Resolution) String() string {
	return [...]string{"undeterminable", "applied", "applied with another payload", "proven absent", "in flight"}[r]
}

// Sent is a fenced write that got no answer.
type Sent struct {
	Receipt fence.Receipt
	// Create: the write was a create (it lands only while the object does
	// not exist); otherwise an update conditioned on ResourceVersion ("":
	// on nothing, so it may land whenever).
	Create          bool
	ResourceVersion string
	// GrantDigest is the digest of the grant the write carried.
	GrantDigest string
}

// Observed is the object as a quorum read made after the send found it.
type Observed struct {
	Exists          bool
	ResourceVersion string
	// State is the object's fence state (zero when it does not exist).
	State fence.State
	// Deleted is the registry's record of the target's last deletion
	// (FencedResource status.deletedTarget), read when the object does not exist.
	Deleted *locksv1.DeletedTarget
}

// ResolveSent decides a write that got no answer from a read made after it.
//
// A read that does not show the write proves nothing while the write may
// still land: the API server may have admitted it and be waiting on etcd,
// whose transaction is conditioned on the object's version (found by make
// chaos: a segment reported refused landed seconds later). So absence is
// proven only when the write can no longer land:
//   - an update: the object moved past the resourceVersion it was
//     conditioned on (etcd compares the key's mod revision, which never comes
//     back), or the object is gone (a delete moves it too);
//   - a create: the object exists (created by another write). A create has
//     no version to be conditioned on: it could still land after that object
//     is deleted, which takes a declared delete of the current holder.
//
// Until then the result is InFlight. The receipt log decides the rest
// (resolveFromLog, resolveDeleted): they say what a read shows, and only
// ResolveSent says what it proves, so they are not exported.
func ResolveSent(s Sent, o Observed) (Resolution, fence.Receipt) {
	if !s.Create && s.ResourceVersion == "" {
		// Conditioned on nothing (the library never sends one): it lands
		// whenever it reaches the object, so no read proves it absent.
		out, r := ResolveSent(Sent{Receipt: s.Receipt, Create: true, GrantDigest: s.GrantDigest}, o)
		if out == ProvenAbsent {
			out = InFlight
		}
		return out, r
	}
	switch {
	case o.Exists && !s.Create && o.ResourceVersion == s.ResourceVersion:
		// Unchanged since the write was conditioned on it: not landed, as a
		// landing changes the version; but it still can.
		return InFlight, fence.Receipt{}
	case o.Exists:
		return resolveFromLog(o.State, s.Receipt)
	}
	out, r := resolveDeleted(o.Deleted, s.GrantDigest, s.Receipt)
	if out == ProvenAbsent && s.Create {
		return InFlight, fence.Receipt{} // it lands whenever the object does not exist
	}
	return out, r
}

// resolveFromLog decides a write (its fence, segment, operation and payload)
// from the stored fence state alone. Segments of a fence are accepted in
// order and the log keeps the newest receipts, so the write is absent now
// when the object never reached it, or when the log reaches back past where
// it would be and lacks it. Absent now is absent for good only if the write
// can no longer land: ResolveSent adds that rule.
func resolveFromLog(st fence.State, want fence.Receipt) (Resolution, fence.Receipt) {
	for _, r := range st.Receipts {
		if r.Fence == want.Fence && r.Segment == want.Segment && r.Operation == want.Operation {
			if r.Payload == want.Payload {
				return Applied, r
			}
			return AppliedOtherPayload, r
		}
	}
	if st.HighestFence < want.Fence || (st.HighestFence == want.Fence && st.LastSegment < want.Segment) {
		return ProvenAbsent, fence.Receipt{}
	}
	if len(st.Receipts) == 0 {
		return Undeterminable, fence.Receipt{}
	}
	if oldest := st.Receipts[0]; oldest.Fence < want.Fence || (oldest.Fence == want.Fence && oldest.Segment < want.Segment) {
		return ProvenAbsent, fence.Receipt{}
	}
	return Undeterminable, fence.Receipt{}
}

// resolveDeleted decides a write of unknown outcome to an object that no
// longer exists, from the registry's record of its last deletion
// (FencedResource status.deletedTarget, fence F segment S):
//   - deleted by this grant at or after this segment: it had landed
//     (segments of a fence are accepted in order);
//   - deleted by this grant before this segment, by an older fence, or never:
//     it did not land (had it created the object, the object would exist, or
//     a later delete would have replaced the record);
//   - deleted by a newer fence: the object lived on past this grant and its
//     receipts went with it, so nothing shows whether the write landed.
func resolveDeleted(deleted *locksv1.DeletedTarget, grantDigest string, want fence.Receipt) (Resolution, fence.Receipt) {
	switch {
	case deleted == nil || deleted.FenceToken < want.Fence:
		return ProvenAbsent, fence.Receipt{}
	case deleted.FenceToken > want.Fence || deleted.GrantDigest != grantDigest:
		return Undeterminable, fence.Receipt{}
	case deleted.Segment >= want.Segment:
		return Applied, want
	default:
		return ProvenAbsent, fence.Receipt{}
	}
}
