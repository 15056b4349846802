package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

// The store oracle judges every segment the store committed, from the
// contract's rules and its own accounts (the oracle's: the grants the
// registry issued, their leases by the issuer's clock, the registry's
// holder), not from begin_segment's rules or the publisher's:
//
//   - the grant document is one the registry issued for this resource;
//   - fence order: never below a fence the store accepted, never the same
//     fence under another grant, segments 1, 2, 3… with none skipped;
//   - the lease had not ended by the issuer's clock when the segment
//     landed (the latest end the issuer ever gave it: a registry restore
//     that forgets a renewal does not shorten what was granted);
//   - a grant that is no longer the registry's current one when its segment
//     lands is a stale write if a grant with a higher fence had already been
//     issued AND published at the store; otherwise it is the documented
//     publication lag (docs/postgres.md: an early end the store cannot know
//     until the operator tells it), counted apart by why it ended;
//   - receipts: the store's receipt is the contract's digest, computed here;
//     every segment a client was told is applied (COMMIT answered, the same
//     segment ALREADY_APPLIED, a lost COMMIT resolved applied) committed
//     with that receipt; a COMMIT resolved proven absent never lands; what
//     committed survives a restart.
type storeOracle struct {
	w *world
	// publishedFence: the highest fence of a genuine grant published at the store.
	publishedFence int64

	acceptedAny bool
	lastFence   int64
	lastDigest  string
	lastSegment int64
	// segments: every segment the store committed, by fence/segment/operation.
	segments map[string]storeSegment
	// claimedAbsent: lost COMMITs (by transaction) resolved as proven absent.
	claimedAbsent map[int64]bool
	// sentRaw: the envelopes workers sent (the adversary replays them).
	sentRaw []string
}

type storeSegment struct {
	payload, receipt string
	txID             int64
}

func newStoreOracle(w *world) *storeOracle {
	return &storeOracle{w: w, segments: map[string]storeSegment{}, claimedAbsent: map[int64]bool{}}
}

// Reasons a committed segment's grant was no longer current while the store
// could not know yet (the publication lag).
const (
	lagReleased = iota // released (or ended with a successor issued) before the store was told
	lagRevoked         // its issuer epoch revoked
	lagPolicy          // the policy generation changed
	lagRestored        // a registry restore took the grant back
	numLagReasons
)

var lagNames = [numLagReasons]string{"release", "revocation", "policy change", "registry restore"}

func (so *storeOracle) sent(raw string) {
	so.sentRaw = append(so.sentRaw, raw)
	if len(so.sentRaw) > 32 {
		so.sentRaw = so.sentRaw[1:]
	}
}

// published records a grant the publisher's transaction inserted.
func (so *storeOracle) published(g *storeGrant) {
	if _, genuine := so.w.oracle.issued[string(g.g.Canonical())]; !genuine || g.g.Resource != resourceID {
		so.w.oracle.violation(vStoreForged, "the store was given grant %s (fence %d), which the registry never issued", short(g.digest), g.g.FenceToken)
		return
	}
	so.publishedFence = max(so.publishedFence, g.g.FenceToken)
}

// registryRestored: a registry restore took back every fence above the
// restored fence token; a grant issued since with a fence below one it took
// back is not the successor of that one (the registry forgot it; the store
// was told so when the restored holder was published), so only fences the
// registry still counts make a later segment stale.
func (so *storeOracle) registryRestored(fenceToken int64) {
	so.publishedFence = min(so.publishedFence, fenceToken)
}

// attempted counts a begin_segment decision.
func (so *storeOracle) attempted(tx *storeTx, v fence.Verdict) {
	res := so.w.res
	res.StoreAttempts++
	res.countStoreVerdict(v, tx.sf)
	if tx.parsed && !so.issuedHere(tx.env) {
		res.StoreForgedAttempts++
	}
}

// issuedHere: the envelope's grant document is one the registry issued for
// this resource (the store compares documents as JSON: the canonical form).
func (so *storeOracle) issuedHere(e fence.Envelope) bool {
	_, ok := so.w.oracle.issued[string(e.Grant.Canonical())]
	return ok && e.Grant.Resource == resourceID
}

// committed judges a segment that landed at the store.
func (so *storeOracle) committed(tx *storeTx) {
	w, o := so.w, so.w.oracle
	e := tx.env
	g := e.Grant
	digest := g.Digest()
	what := fmt.Sprintf("store segment fence %d seg %d op %s (grant %s)", g.FenceToken, e.Segment, e.Operation, short(digest))
	if so.claimedAbsent[tx.id] {
		o.violation(vStoreUnknown, "%s landed after its lost COMMIT was resolved proven absent", what)
	}
	if !so.issuedHere(e) {
		o.violation(vStoreForged, "%s committed: the registry never issued this grant for %s", what, resourceID)
	}
	so.judgeCurrent(what, e, digest)
	so.judgeOrder(what, e, digest)
	want := fence.ReceiptDigest(resourceID, g.FenceToken, g.OperationRoot, e.Segment, e.Operation, e.Payload)
	if tx.receipt != want {
		o.violation(vStoreReceipt, "%s committed with receipt %s; the contract's digest is %s", what, short(tx.receipt), short(want))
	}
	so.acceptedAny = true
	so.lastFence, so.lastDigest, so.lastSegment = g.FenceToken, digest, e.Segment
	so.segments[segmentKey(g.FenceToken, e.Segment, e.Operation)] = storeSegment{payload: e.Payload, receipt: want, txID: tx.id}
	w.res.StoreSegments++
}

// judgeCurrent: was the grant the registry's current one when its segment
// landed, and if not, is that the documented lag or a violation?
func (so *storeOracle) judgeCurrent(what string, e fence.Envelope, digest string) {
	w, o := so.w, so.w.oracle
	now, r := w.now, w.reg
	h := r.fr.Status.Holder
	current := h != nil && h.Digest == digest && o.reg.holder == digest && now.Before(o.deadlines[digest]) &&
		e.Grant.PolicyGeneration == r.fr.Generation && e.Grant.IssuerEpoch >= r.revokedBelow
	if current {
		return
	}
	g := e.Grant
	switch end := o.maxDeadline[digest]; {
	case !now.Before(end):
		o.violation(vStoreExpired, "%s committed at +%s; its lease ended at +%s by the issuer's clock", what, now.Sub(simStart), end.Sub(simStart))
	case so.publishedFence > g.FenceToken:
		o.violation(vStoreStale, "%s committed while the registry's holder is %s and fence %d was already issued and published at the store",
			what, holderName(h), so.publishedFence)
	default:
		reason := lagReleased
		switch {
		case g.IssuerEpoch < r.revokedBelow:
			reason = lagRevoked
		case g.PolicyGeneration != r.fr.Generation:
			reason = lagPolicy
		case !now.Before(o.deadlines[digest]) || (h != nil && h.FenceToken < g.FenceToken):
			reason = lagRestored
		}
		w.res.StoreLagWrites[reason]++
		w.tracef("oracle: %s committed in the publication lag after a %s (registry holder %s): counted, docs/postgres.md", what, lagNames[reason], holderName(h))
	}
}

// judgeOrder: fence order and segment numbering at the store.
func (so *storeOracle) judgeOrder(what string, e fence.Envelope, digest string) {
	o := so.w.oracle
	f, seg := e.Grant.FenceToken, e.Segment
	switch {
	case !so.acceptedAny:
		if seg != 1 {
			o.violation(vStoreSkipped, "%s committed as the store's first segment", what)
		}
	case f < so.lastFence:
		o.violation(vStoreRegressed, "%s committed after fence %d", what, so.lastFence)
	case f == so.lastFence && digest != so.lastDigest:
		o.violation(vStoreRegressed, "%s committed: fence %d already belongs to grant %s", what, f, short(so.lastDigest))
	case f == so.lastFence && seg != so.lastSegment+1:
		o.violation(vStoreSkipped, "%s committed after segment %d", what, so.lastSegment)
	case f > so.lastFence && seg != 1:
		o.violation(vStoreSkipped, "%s committed as the first segment of fence %d", what, f)
	}
}

// acknowledged: a client was told its segment is applied, with receipt.
func (so *storeOracle) acknowledged(e fence.Envelope, receipt, how string) {
	g := e.Grant
	s, ok := so.segments[segmentKey(g.FenceToken, e.Segment, e.Operation)]
	switch {
	case !ok:
		so.w.oracle.violation(vStoreLost, "fence %d segment %d acknowledged as applied (%s), but the store never committed it", g.FenceToken, e.Segment, how)
	case s.payload != e.Payload || s.receipt != receipt:
		so.w.oracle.violation(vStoreReceipt, "fence %d segment %d acknowledged (%s) with receipt %s; the store committed receipt %s for payload %s",
			g.FenceToken, e.Segment, how, short(receipt), short(s.receipt), short(s.payload))
	}
}

// resolved checks a lost COMMIT's resolution against what the store committed
// before the read (served: its tick); proven absent is a claim that it never lands.
func (so *storeOracle) resolved(txID int64, e fence.Envelope, outcome resolution, _ int64) {
	g := e.Grant
	s, ok := so.segments[segmentKey(g.FenceToken, e.Segment, e.Operation)]
	landed := ok && s.txID == txID
	switch outcome {
	case resolvedAbsent:
		so.claimedAbsent[txID] = true
		if landed {
			so.w.oracle.violation(vStoreUnknown, "fence %d segment %d resolved as proven absent, but it committed", g.FenceToken, e.Segment)
		}
	case resolvedApplied:
		if !ok || s.payload != e.Payload {
			so.w.oracle.violation(vStoreUnknown, "fence %d segment %d resolved as applied, but the store never committed it", g.FenceToken, e.Segment)
		}
	}
}

// checkDurable: what the store holds is what committed (a restart loses
// nothing that committed, and keeps every receipt of the highest fence).
func (so *storeOracle) checkDurable(when string) {
	s := so.w.store
	if !so.acceptedAny {
		return
	}
	if s.st.HighestFence != so.lastFence || s.st.LastSegment != so.lastSegment || s.st.GrantDigest != so.lastDigest {
		so.w.oracle.violation(vStoreLost, "%s the store is at fence %d segment %d; it committed fence %d segment %d", when,
			s.st.HighestFence, s.st.LastSegment, so.lastFence, so.lastSegment)
	}
	for k, seg := range so.segments {
		var f, n int64
		var op string
		if _, err := fmt.Sscanf(k, "%d/%d/", &f, &n); err != nil || f != so.lastFence {
			continue
		}
		op = k[len(fmt.Sprintf("%d/%d/", f, n)):]
		if !slices.ContainsFunc(s.receipts, func(r fence.Receipt) bool {
			return r.Fence == f && r.Segment == n && r.Operation == op && r.Receipt == seg.receipt
		}) {
			so.w.oracle.violation(vStoreLost, "%s the receipt of fence %d segment %d (op %s) is gone from the store", when, f, n, op)
		}
	}
}

// noteDeadline keeps, for every grant, the latest lease end the issuer gave it.
func (o *oracle) noteDeadline(digest string, t time.Time) {
	o.deadlines[digest] = t
	if t.After(o.maxDeadline[digest]) {
		o.maxDeadline[digest] = t
	}
}
