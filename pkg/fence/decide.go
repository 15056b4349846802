package fence

import (
	"errors"
	"fmt"
	"time"

	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// Verdict is the outcome of one mutation attempt. Every denial message starts with it.
type Verdict string

// Verdicts, in the order the contract evaluates them (docs/contract.md, "Verdicts").
const (
	// Accepted: the segment is applied.
	Accepted Verdict = "ACCEPTED"
	// Unchanged: an update that changes nothing; allowed, no segment consumed.
	Unchanged Verdict = "UNCHANGED"

	FenceRequired     Verdict = "FENCE_REQUIRED"
	BadGrant          Verdict = "BAD_GRANT"
	ForgedGrant       Verdict = "FORGED_GRANT"
	WrongResource     Verdict = "WRONG_RESOURCE"
	WrongOwner        Verdict = "WRONG_OWNER"
	RevokedEpoch      Verdict = "REVOKED_EPOCH"
	PayloadMismatch   Verdict = "PAYLOAD_MISMATCH"
	FenceRegression   Verdict = "FENCE_REGRESSION"
	StaleOwner        Verdict = "STALE_OWNER"
	RootMismatch      Verdict = "ROOT_MISMATCH"
	NotHeld           Verdict = "NOT_HELD"
	PolicyStale       Verdict = "POLICY_STALE"
	SegmentOutOfOrder Verdict = "SEGMENT_OUT_OF_ORDER"
	AlreadyApplied    Verdict = "ALREADY_APPLIED"
	Quarantined       Verdict = "QUARANTINED"
	// ReceiptLogMismatch: the write's receipt log is not the stored log plus
	// this segment (docs/contract.md, "The receipt log"): the product's code for
	// the receipt-log check.
	ReceiptLogMismatch Verdict = "RECEIPT_LOG_MISMATCH"
	// DeleteNotDeclared: a DELETE that the object's last accepted segment did
	// not declare (intent "delete") under the registry's current grant, or
	// that does not come from that grant's owner.
	DeleteNotDeclared Verdict = "DELETE_NOT_DECLARED"
	// ProtectionRemoved: a write that removes the protection label or the
	// fencekeeper.dev/resource annotation of a target (DecideWrite).
	ProtectionRemoved Verdict = "PROTECTION_REMOVED"
)

// A denial carries its verdict as data as well as in its message: the
// admission status's details.causes hold one cause of type CauseVerdict whose
// message is the code and, for ALREADY_APPLIED, one of type CauseReceipt whose
// message is the original receipt. The API server passes both to the client.
const (
	CauseVerdict = "fencekeeper.dev/verdict"
	CauseReceipt = "fencekeeper.dev/receipt"
)

// Allowed reports whether the verdict lets the write through (in Enforce mode).
func (v Verdict) Allowed() bool { return v == Accepted || v == Unchanged }

// Authentication reports whether the verdict is an authentication failure,
// decided before any fence state is read.
func (v Verdict) Authentication() bool {
	switch v {
	case FenceRequired, BadGrant, ForgedGrant, WrongResource, WrongOwner, RevokedEpoch, PayloadMismatch:
		return true
	}
	return false
}

// State is the fence state a protected resource holds. For a Kubernetes object
// it is derived from the last accepted fence annotation and the receipt log.
type State struct {
	HighestFence int64
	Root         string
	LastSegment  int64
	Receipts     []Receipt
	// Accepted is the last accepted envelope exactly as stored ("" if none):
	// presenting it again is not a fresh segment.
	Accepted string
	// GrantDigest identifies the grant of the last accepted segment. A fence
	// belongs to exactly one grant, so another grant with the same fence means
	// the registry issued it twice.
	GrantDigest string
	// DeleteIntent: the last accepted segment declares intent "delete"
	// (derived from Accepted, for display; Decide reads Accepted itself).
	DeleteIntent bool
}

// NextSegment is the segment a write under g continues with on an object
// whose stored fence state is st: the next one when st's last accepted
// segment is g's, else 1 (a new fence starts at segment 1).
func NextSegment(st State, g grant.Grant) int64 {
	if st.HighestFence == g.FenceToken && st.GrantDigest == g.Digest() {
		return st.LastSegment + 1
	}
	return 1
}

// StateOf derives the stored state from an object's fence and receipts annotations.
func StateOf(fenceAnnotation, receiptsAnnotation string) (State, error) {
	rs, err := ParseReceipts(receiptsAnnotation)
	if err != nil {
		return State{}, err
	}
	if fenceAnnotation == "" {
		return State{Receipts: rs}, nil
	}
	e, err := ParseEnvelope(fenceAnnotation)
	if err != nil {
		return State{}, fmt.Errorf("stored fence annotation: %w", err)
	}
	return State{HighestFence: e.Grant.FenceToken, Root: e.Grant.OperationRoot, LastSegment: e.Segment,
		Receipts: rs, Accepted: fenceAnnotation, GrantDigest: e.Grant.Digest(), DeleteIntent: e.Intent == IntentDelete}, nil
}

// Holder is the registry's current holder, as a linearizable read returned it.
type Holder struct {
	// Digest is the holder's grant digest: the grant presented must be this one.
	Digest    string
	Owner     string
	Lease     string
	RequestID string
	Fence     int64
	ExpiresAt time.Time
}

// Registry is a linearizable view of the resource's registry entry.
type Registry struct {
	// Found is false when there is no registry entry for the resource;
	// Missing then says why (shown in the WRONG_RESOURCE message).
	Found      bool
	Missing    string
	ResourceID string
	// Generation is the entry's current policy generation.
	Generation int64
	// Holder is nil when nothing is held.
	Holder *Holder
	// Now is the acceptance point's clock reading, to judge expiry.
	Now time.Time
}

// Attempt is one incoming mutation.
type Attempt struct {
	// User is the authenticated caller (admission userInfo.username).
	User string
	// Pod is the UID of the pod the caller's bound token names (admission
	// userInfo.extra authentication.kubernetes.io/pod-uid), "" when none: a
	// grant whose lease is pod-bound admits only that pod.
	Pod string
	// Delete is true for a deletion; the fields below are then unused.
	Delete bool
	// Changed is false for an update that changes nothing at all.
	Changed bool
	// Fence is the new fence annotation ("" when absent).
	Fence string
	// Payload is the digest of the new business content, computed by the acceptance point.
	Payload string
}

// Decision is the outcome of Decide.
type Decision struct {
	Verdict Verdict
	// Message explains the verdict; it starts with the verdict code.
	Message string
	// Receipt is set for Accepted (the new receipt) and AlreadyApplied (the original one).
	Receipt string
	// State is the resource's state after the decision: unchanged unless Accepted.
	State State
	// Envelope is the parsed attempt, when it parsed.
	Envelope *Envelope
}

// Decide applies the contract's acceptance rules (docs/contract.md, "Verdicts"). It never changes st for a
// rejected attempt: the returned State is st itself unless the verdict is Accepted.
func Decide(st State, a Attempt, reg Registry, bundle *grant.TrustBundle) Decision {
	deny := denier(st)
	if a.Delete {
		return decideDelete(st, a, reg, deny)
	}
	if !a.Changed {
		return Decision{Verdict: Unchanged, Message: "UNCHANGED: the update changes nothing", State: st}
	}
	e, denied := authenticate(st, a, reg, bundle, deny)
	if denied != nil {
		return *denied
	}
	return judgeFence(st, a, reg, e, deny)
}

// denyFunc builds a denial that leaves the stored state as it is.
type denyFunc func(v Verdict, format string, args ...any) Decision

func denier(st State) denyFunc {
	return func(v Verdict, format string, args ...any) Decision {
		return Decision{Verdict: v, Message: string(v) + ": " + fmt.Sprintf(format, args...), State: st}
	}
}

// authenticate applies the authentication rules, in the contract's order,
// before any fence state is read: it returns the envelope, or the denial.
func authenticate(st State, a Attempt, reg Registry, bundle *grant.TrustBundle, deny denyFunc) (Envelope, *Decision) {
	refuse := func(d Decision) (Envelope, *Decision) { return Envelope{}, &d }
	if a.Fence == "" {
		return refuse(deny(FenceRequired, "the write changes a protected object but carries no %s annotation", AnnotationFence))
	}
	if a.Fence == st.Accepted {
		return refuse(deny(FenceRequired, "the write changes a protected object but carries the %s annotation of the last accepted segment; every change needs a fresh segment", AnnotationFence))
	}
	e, err := ParseEnvelope(a.Fence)
	if err != nil {
		return refuse(deny(BadGrant, "%v", err))
	}
	g := e.Grant
	var d Decision
	switch err := bundle.Verify(g, g.Digest(), e.Proof); {
	case errors.Is(err, grant.ErrMalformed):
		d = deny(BadGrant, "%v", err)
	case err != nil:
		d = deny(ForgedGrant, "%v", err)
	case !reg.Found:
		d = deny(WrongResource, "%s", reg.missing())
	case g.Resource != reg.ResourceID:
		d = deny(WrongResource, "the grant is for resource %q, this object is %q", g.Resource, reg.ResourceID)
	case a.User != g.Owner:
		d = deny(WrongOwner, "the grant belongs to %q, the request comes from %q", g.Owner, a.User)
	case !grant.LeaseAdmits(g.Lease, a.Pod):
		d = deny(WrongOwner, "the grant is bound to its requester's pod (lease %s), the request comes from %s of %q", g.Lease, grant.DescribePod(a.Pod), a.User)
	case bundle.Revoked(g.IssuerEpoch):
		d = deny(RevokedEpoch, "the grant was issued under epoch %d; epochs below %d are revoked", g.IssuerEpoch, bundle.RevokedBelowEpoch)
	case e.Payload != a.Payload:
		d = deny(PayloadMismatch, "the annotation's payload %s is not the digest of the new content (%s)", e.Payload, a.Payload)
	default:
		return e, nil
	}
	return refuse(withEnvelope(d, e))
}

// judgeFence applies the fence rules to an authenticated write, against the
// stored state and the registry's linearizable view.
func judgeFence(st State, a Attempt, reg Registry, e Envelope, deny denyFunc) Decision {
	g := e.Grant
	f, h := g.FenceToken, st.HighestFence
	current, notCurrent, why := isCurrent(g, reg)
	if d, conflicts := judgeOlderOrOther(st, e, current, deny); conflicts {
		return d
	}
	switch {
	case !current:
		return withEnvelope(deny(notCurrent, "%s", why), e)
	case f > h && e.Segment != 1:
		return withEnvelope(deny(SegmentOutOfOrder, "a new fence (%d > %d) must start at segment 1, got %d", f, h, e.Segment), e)
	case f > h || e.Segment == st.LastSegment+1:
		return accept(st, a, reg, e)
	case e.Segment > st.LastSegment+1:
		return withEnvelope(deny(SegmentOutOfOrder, "segment %d skips ahead: the next segment of fence %d is %d", e.Segment, f, st.LastSegment+1), e)
	}
	return judgeReplay(st, e, deny)
}

// judgeOlderOrOther decides a fence below the object's, or the object's
// fence under another grant or operation root: never accepted, and a
// regression of the registry when the registry calls the grant current.
func judgeOlderOrOther(st State, e Envelope, current bool, deny denyFunc) (Decision, bool) {
	g := e.Grant
	f, h := g.FenceToken, st.HighestFence
	rootDiffers := f == h && g.OperationRoot != st.Root
	otherGrant := rootDiffers || (f == h && st.GrantDigest != "" && g.Digest() != st.GrantDigest)
	switch {
	case f < h && current:
		return withEnvelope(deny(FenceRegression, "the registry's current grant has fence %d but the object already accepted fence %d: the registry went backwards; raise spec.fenceFloor above %d", f, h, h), e), true
	case f < h:
		return withEnvelope(deny(StaleOwner, "fence %d is older than fence %d the object already accepted", f, h), e), true
	case otherGrant && current:
		return withEnvelope(deny(FenceRegression, "fence %d was already used at this object by another grant: the registry went backwards; raise spec.fenceFloor above %d", f, h), e), true
	case rootDiffers:
		return withEnvelope(deny(RootMismatch, "fence %d is bound to another grant (operation root %s) at this object; this grant has root %s", f, st.Root, g.OperationRoot), e), true
	}
	return Decision{}, false
}

// accept applies the segment: the next state and its receipt.
func accept(st State, a Attempt, reg Registry, e Envelope) Decision {
	g, f := e.Grant, e.Grant.FenceToken
	r := Receipt{Fence: f, Segment: e.Segment, Operation: e.Operation, Payload: e.Payload,
		Receipt: ReceiptDigest(reg.ResourceID, f, g.OperationRoot, e.Segment, e.Operation, e.Payload)}
	next := State{HighestFence: f, Root: g.OperationRoot, LastSegment: e.Segment,
		Receipts: AppendReceipt(st.Receipts, r), Accepted: a.Fence, GrantDigest: g.Digest(), DeleteIntent: e.Intent == IntentDelete}
	return Decision{Verdict: Accepted, Message: fmt.Sprintf("ACCEPTED: fence %d segment %d, receipt %s", f, e.Segment, r.Receipt),
		Receipt: r.Receipt, State: next, Envelope: &e}
}

// judgeReplay decides a segment at or below the last one: a replay, or a
// conflicting rewrite.
func judgeReplay(st State, e Envelope, deny denyFunc) Decision {
	f := e.Grant.FenceToken
	for _, r := range st.Receipts {
		if r.Fence == f && r.Segment == e.Segment {
			if r.Payload == e.Payload {
				d := withEnvelope(deny(AlreadyApplied, "fence %d segment %d was applied already; receipt %s", f, e.Segment, r.Receipt), e)
				d.Receipt = r.Receipt
				return d
			}
			return withEnvelope(deny(Quarantined, "fence %d segment %d was applied with payload %s; this attempt carries %s", f, e.Segment, r.Payload, e.Payload), e)
		}
	}
	return withEnvelope(deny(SegmentOutOfOrder, "segment %d of fence %d is at or below the last segment %d and its receipt is no longer in the log", e.Segment, f, st.LastSegment), e)
}

// isCurrent reports whether g is the registry's HELD, unexpired grant of the
// current policy generation; otherwise it gives the verdict and why.
func isCurrent(g grant.Grant, reg Registry) (bool, Verdict, string) {
	h := reg.Holder
	switch {
	case h == nil:
		return false, NotHeld, "the registry shows no holder for this resource"
	case h.Fence != g.FenceToken || h.Lease != g.Lease || h.RequestID != g.RequestID || (h.Digest != "" && h.Digest != g.Digest()):
		return false, NotHeld, fmt.Sprintf("the registry's holder is fence %d (lease %s), not this grant's fence %d (lease %s)", h.Fence, h.Lease, g.FenceToken, g.Lease)
	case !reg.Now.Before(h.ExpiresAt):
		return false, NotHeld, fmt.Sprintf("the grant with fence %d expired at %s", g.FenceToken, h.ExpiresAt.UTC().Format(time.RFC3339Nano))
	case g.PolicyGeneration != reg.Generation:
		return false, PolicyStale, fmt.Sprintf("the grant was issued under policy generation %d, the FencedResource is at generation %d; acquire a new grant", g.PolicyGeneration, reg.Generation)
	}
	return true, "", ""
}

// decideDelete allows a DELETE only from the owner of the registry's current
// grant, after that same grant committed a segment declaring the delete as
// the object's last accepted one. A process sharing the holder's identity
// can therefore not delete on its own, nor on the strength of an intent an
// earlier grant declared.
func decideDelete(st State, a Attempt, reg Registry, deny func(Verdict, string, ...any) Decision) Decision {
	h := reg.Holder
	switch {
	case !reg.Found:
		return deny(WrongResource, "%s", reg.missing())
	case h == nil:
		return deny(DeleteNotDeclared, "deleting a protected object needs the currently held grant; the registry shows none")
	case a.User != h.Owner:
		return deny(DeleteNotDeclared, "only the owner %q of the current grant (fence %d) may delete this object, the request comes from %q", h.Owner, h.Fence, a.User)
	case !grant.LeaseAdmits(h.Lease, a.Pod):
		return deny(WrongOwner, "the current grant (fence %d) is bound to its requester's pod (lease %s), the delete comes from %s of %q", h.Fence, h.Lease, grant.DescribePod(a.Pod), a.User)
	case !reg.Now.Before(h.ExpiresAt):
		return deny(DeleteNotDeclared, "the grant with fence %d expired at %s; deleting needs the currently held grant", h.Fence, h.ExpiresAt.UTC().Format(time.RFC3339Nano))
	case h.Fence < st.HighestFence:
		return deny(FenceRegression, "the holder's fence %d is below fence %d the object already accepted: the registry went backwards; raise spec.fenceFloor above %d", h.Fence, st.HighestFence, st.HighestFence)
	}
	if why := undeclared(st, reg); why != "" {
		return deny(DeleteNotDeclared, "%s; commit a fenced segment with intent %q under the current grant, then delete", why, IntentDelete)
	}
	return Decision{Verdict: Accepted, Message: fmt.Sprintf("ACCEPTED: deletion declared by fence %d segment %d", h.Fence, st.LastSegment), State: st}
}

// undeclared says why the stored state does not declare a delete under the
// registry's current grant ("" when it does).
func undeclared(st State, reg Registry) string {
	if st.Accepted == "" {
		return "the object carries no accepted fenced segment"
	}
	e, err := ParseEnvelope(st.Accepted)
	if err != nil {
		return fmt.Sprintf("the object's last accepted segment is unreadable: %v", err)
	}
	g := e.Grant
	switch {
	case reg.Holder.Digest == "" || g.Digest() != reg.Holder.Digest:
		return fmt.Sprintf("the object's last accepted segment was written under fence %d (lease %s), not under the current grant (fence %d, lease %s)",
			g.FenceToken, g.Lease, reg.Holder.Fence, reg.Holder.Lease)
	case e.Intent != IntentDelete:
		return fmt.Sprintf("the object's last accepted segment (fence %d segment %d) does not declare a delete", g.FenceToken, e.Segment)
	}
	if current, _, why := isCurrent(g, reg); !current {
		return why
	}
	return ""
}

func (r Registry) missing() string {
	if r.Missing != "" {
		return r.Missing
	}
	return "no FencedResource registers this object"
}

func withEnvelope(d Decision, e Envelope) Decision {
	d.Envelope = &e
	return d
}
