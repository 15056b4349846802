package sim

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// The oracle judges every write the acceptance point let through. It is
// written from the contract's rules (docs/contract.md) and keeps its own account of the lease (who
// holds, until when), so a bug in fence.Decide, the webhook or the planner
// shows up as a disagreement with it. Its only inputs from the system are
// what a careful observer could see: the documents the issuer handed out,
// when the issuer ran, the registry's holder record, and the objects written.
type oracle struct {
	w *world
	// issued holds every grant document the registry issued for this
	// resource (its exact bytes), with the signature that came with it.
	issued map[string]issuedGrant
	// deadlines is, for every issued grant (by digest), when its lease ends
	// or ended by the issuer's clock.
	deadlines map[string]time.Time
	reg       oracleRegistry
	// grantedTo is the fence each LockGrant (by UID) was granted: a request
	// is served once. A registry restore takes grants back, and with them
	// this memory (FENCE_REGRESSION is what guards the object then).
	grantedTo map[types.UID]int64

	// The fence state of the protected object, from the writes it accepted.
	acceptedAny bool
	lastFence   int64
	lastDigest  string
	lastSegment int64
	lastIntent  bool // the last accepted segment declares a delete
	// maxFence is the highest fence any write the object stored carried
	// under a grant the registry issued for this resource.
	maxFence int64
	// trustedLog is the receipt log of the last accepted write: the only log
	// an accepted write may extend. Planted receipts never enter it; a
	// declared delete empties it (the re-created object starts a new log).
	trustedLog []oracleReceipt
	// written is every segment the object stored, by fence/segment/operation.
	written map[string]writtenSegment
	// lostWritten holds the segments of incarnations the registry forgot: a
	// re-creation after a restore took back the deletion record starts its
	// segments over, so the same fence/segment/operation may come again.
	lostWritten map[string]writtenSegment
	// deletedMemoryLost: the object is deleted and a registry restore took
	// back the entry's record of it (status.deletedTarget), the only memory
	// of a deleted target (docs/security.md, "Known limits").
	deletedMemoryLost bool
	// claimedAbsent: the sends (by request ID) a client resolved as proven
	// absent or reported refused, with the tick of that claim: none may
	// land afterwards.
	claimedAbsent map[int64]int64
	// maxDeadline is, for every issued grant, the latest lease end the
	// issuer ever gave it (a restore does not take a granted renewal back
	// from a store that was told of it).
	maxDeadline map[string]time.Time
}

// acceptance is what the oracle judges a write's authority against: the
// moment the acceptance point decided it and the registry as it was then. A
// write that commits late (the API server admitted it, etcd applied it
// later) is judged as of its admission; its fence order as of its landing.
type acceptance struct {
	now        time.Time
	holder     *locksv1.Holder
	regHolder  string
	generation int64
	knownLimit bool
}

func (o *oracle) acceptanceNow() acceptance {
	return acceptance{now: o.w.now, holder: o.w.reg.fr.Status.Holder.DeepCopy(), regHolder: o.reg.holder,
		generation: o.w.reg.fr.Generation, knownLimit: o.knownLimit()}
}

type writtenSegment struct {
	payload string
	tick    int64 // when it was stored
}

type issuedGrant struct {
	keyID     string
	signature []byte
}

// oracleRegistry is the oracle's account of the registry's lease, kept by
// the contract's rules: a grant holds for ttlSeconds from issue; a renewal that
// reaches the issuer before the lease ends extends it to one lease from then;
// a new issuer epoch extends the held lease to one lease from the takeover.
// It is backed up and restored together with the registry's backend.
type oracleRegistry struct {
	epoch            int64  // the issuer epoch the registry state was last decided under
	holder           string // digest of the holding grant ("" none)
	lockGrant        string // its LockGrant
	ttl              time.Duration
	deadline         time.Time
	observedRenewals int64
}

func (o oracleRegistry) clone() oracleRegistry { return o }

func newOracle(w *world) *oracle {
	return &oracle{w: w, issued: map[string]issuedGrant{}, grantedTo: map[types.UID]int64{}, deadlines: map[string]time.Time{}, written: map[string]writtenSegment{}, lostWritten: map[string]writtenSegment{}, claimedAbsent: map[int64]int64{}, maxDeadline: map[string]time.Time{}}
}

// Kinds of violation; each has its counter in Counters.
type violationKind int

const (
	vStaleWrite violationKind = iota
	vForgedAccepted
	vOtherAuthAccepted
	vAuthChangedHighest
	vExpiredOwner
	vSkippedSegment
	vRegressedToken
	vUncheckedMutation
	vReceiptLog
	vUndeclaredDelete
	vProtectionDropped
	vPlantedInherited
	vPlantedObserved
	vUnknownMisresolved
	vUncoveredEntry
	vTwinEntry
	vGrantedTwice
	vLiveness
	vNotLinearizable
	vSimulator
	vWrongPod
	// The store path (storeoracle.go).
	vStoreStale
	vStoreForged
	vStoreExpired
	vStoreRegressed
	vStoreSkipped
	vStoreLost
	vStoreReceipt
	vStoreUnknown
	vStoreHolderEnded
	numViolationKinds
)

var violationNames = [...]string{"accepted stale write", "accepted forged/tampered/cross-resource grant",
	"accepted unauthenticated write", "authentication failure changed highestFence", "accepted write from an expired owner",
	"accepted skipped segment", "accepted regressed token", "mutation not checked",
	"accepted write with a wrong receipt log", "deletion not declared by the current holder",
	"write that drops the protection label or annotation landed", "planted receipts inherited by an accepted write",
	"highestObservedFence raised by planted state", "MUTATION_UNKNOWN resolved wrongly",
	"registry entry admitted for a kind the webhook does not see",
	"second registry entry admitted for one object", "LockGrant granted twice", "liveness",
	"history not linearizable", "simulator error", "accepted write or delete from another pod of the holder's identity",
	"store: stale segment committed", "store: segment of a grant never issued committed", "store: segment from an expired owner committed",
	"store: regressed token committed", "store: skipped segment committed", "store: acknowledged segment lost",
	"store: receipt inconsistent", "store: lost COMMIT resolved wrongly",
	"store: the registry's holder ended by a publication"}

// Violation is one broken rule in one schedule.
type Violation struct {
	Kind   string
	Step   int
	Detail string
}

func (o *oracle) violation(kind violationKind, format string, args ...any) {
	res := o.w.res
	res.Violated[kind]++
	if len(res.Violations) < 16 {
		res.Violations = append(res.Violations, Violation{Kind: violationNames[kind], Step: o.w.step, Detail: fmt.Sprintf(format, args...)})
	}
	o.w.tracef("VIOLATION %s: %s", violationNames[kind], fmt.Sprintf(format, args...))
}

// issuerRuns is called before each issuer decision: the lease rules applied
// at this moment, to the grant the registry holds.
func (o *oracle) issuerRuns(r *registry) {
	now := o.w.now
	h := r.fr.Status.Holder
	if h == nil || h.Digest != o.reg.holder {
		if h != nil || o.reg.holder != "" {
			o.violation(vSimulator, "the oracle lost track of the registry's holder (registry %s, oracle %s)", holderName(h), short(o.reg.holder))
		}
		o.reg.epoch = r.epoch
		return
	}
	if r.epoch > o.reg.epoch && o.reg.deadline.Before(r.takeoverAt.Add(o.reg.ttl)) {
		o.reg.deadline = r.takeoverAt.Add(o.reg.ttl)
	}
	// A renewal counts from when the issuer can see it: the lease is the
	// issuer's to judge, on its clock and its view of the LockGrant (a
	// lagging cache applies a renewal late, and extends from then).
	if lg := r.issuerSees(o.reg.lockGrant); lg != nil && lg.Spec.Renewals > o.reg.observedRenewals && now.Before(o.reg.deadline) {
		o.reg.observedRenewals = lg.Spec.Renewals
		if renewed := now.Add(o.reg.ttl); renewed.After(o.reg.deadline) { // a renewal never shortens a lease
			o.reg.deadline = renewed
		}
	}
	o.reg.epoch = r.epoch
	o.noteDeadline(o.reg.holder, o.reg.deadline)
}

// grantIssued records a grant the registry just handed out: the document as its
// holder receives it (LockGrant status) and its lease.
func (o *oracle) grantIssued(r *registry, h *locksv1.Holder) {
	lg := r.find(h.GrantName)
	if lg == nil {
		o.violation(vSimulator, "holder %s has no LockGrant", h.GrantName)
		return
	}
	// The document as its holder receives it: the LockGrant status, or the
	// registry's holder record when that mirror was lost (FaultMirrorLost).
	st := lg.Status
	if st.Grant == nil {
		st = h.HeldStatus(r.fr.Spec.ResourceID)
	}
	g := st.Grant.ToGrant()
	doc := g.Canonical()
	digest := digestOf(doc)
	keyID, sig, ok := parseProof(st.Proof)
	if !ok || digest != h.Digest || digest != st.Digest {
		o.violation(vSimulator, "issued grant of %s is inconsistent (digest %s, holder %s, proof %q)", h.GrantName, short(digest), short(h.Digest), st.Proof)
		return
	}
	if fence, ok := o.grantedTo[lg.UID]; ok {
		o.violation(vGrantedTwice, "LockGrant %s (%s) was granted fence %d, and now fence %d", lg.Name, lg.UID, fence, g.FenceToken)
	}
	o.grantedTo[lg.UID] = g.FenceToken
	o.issued[string(doc)] = issuedGrant{keyID: keyID, signature: sig}
	o.w.adv.sawIssued(g, lg.Status.Proof)
	ttl := time.Duration(g.TTLSeconds) * time.Second
	o.reg = oracleRegistry{epoch: r.epoch, holder: digest, lockGrant: h.GrantName, ttl: ttl,
		deadline: o.w.now.Add(ttl), observedRenewals: lg.Spec.Renewals}
	o.noteDeadline(digest, o.reg.deadline)
}

// decided is called after each issuer decision.
func (o *oracle) decided(r *registry) {
	h := r.fr.Status.Holder
	switch {
	case h == nil:
		o.reg.holder = ""
	case h.Digest != o.reg.holder:
		o.grantIssued(r, h)
	}
	o.reg.epoch = r.epoch
}

// restored follows a registry restore: the holder's lease is what it was
// when the backup was taken.
func (o *oracle) restored(s oracleRegistry) {
	dt := o.w.reg.fr.Status.DeletedTarget
	if o.w.obj.stored == nil && o.acceptedAny && (dt == nil || dt.FenceToken != o.lastFence || dt.Segment != o.lastSegment) {
		o.deletedMemoryLost = true
	}
	o.reg = s.clone()
	clear(o.grantedTo)
	if o.reg.holder != "" {
		o.noteDeadline(o.reg.holder, o.reg.deadline)
	}
}

// authClass is the oracle's own judgement of a write's authentication.
type authClass int

const (
	authOK authClass = iota
	authUnfenced
	authMalformed
	authForged
	authCrossResource
	authWrongOwner
	authWrongPod
	authRevoked
	authPayload
)

var authNames = [...]string{"authenticated", "no fresh fence annotation", "malformed or oversized fence annotation",
	"forged or tampered grant", "grant of another resource", "grant of another owner", "pod-bound grant used from another pod", "grant of a revoked issuer epoch",
	"payload is not the digest of the content"}

// judgeWrite judges one write the acceptance point decided. committed says
// whether it changed the stored object.
func (o *oracle) judgeWrite(req *request, old, obj map[string]any, committed bool, verdict fence.Verdict) {
	if e, class, mutation := o.judgeAttempt(req, old, obj); mutation && committed {
		o.judgeCommitted(req, old, obj, verdict, e, class, o.acceptanceNow())
	}
}

// judgeAttempt counts a write the acceptance point decides and
// authenticates it; false when it changes nothing.
func (o *oracle) judgeAttempt(req *request, old, obj map[string]any) (*oracleEnvelope, authClass, bool) {
	if old != nil && sameObject(old, obj) {
		return nil, authOK, false // changes nothing: not a mutation
	}
	res := o.w.res
	res.Attempts++
	e, class := o.authenticate(req.user, req.pod, old, obj)
	if class != authOK {
		res.AuthFailures++
	}
	if class == authForged || class == authCrossResource || class == authMalformed {
		res.ForgedAttempts++
	}
	return e, class, true
}

// judgeCommitted judges a write that changed the stored object, decided by
// the acceptance point at a.
func (o *oracle) judgeCommitted(req *request, old, obj map[string]any, verdict fence.Verdict, e *oracleEnvelope, class authClass, a acceptance) {
	res := o.w.res
	if at, claimed := o.claimedAbsent[req.id]; claimed {
		o.violation(vUnknownMisresolved, "%s landed at tick %d; its client resolved it proven absent or reported it refused at tick %d", o.w.describeWrite(obj), o.w.tick, at)
	}
	what := o.w.describeWrite(obj) + " by " + req.user
	if verdict == verdictNotProtected && a.knownLimit {
		o.judgeKnownLimitWrite(what, obj, e, class)
		return
	}
	res.Mutations++
	if lacks := protectionLacking(obj); lacks != "" {
		o.violation(vProtectionDropped, "%s stored without %s", what, lacks)
	}
	if verdict == fence.Accepted {
		res.CheckedMutations++
	} else {
		o.violation(vUncheckedMutation, "%s was written with verdict %q", what, verdict)
	}
	if class != authOK {
		o.judgeUnauthenticated(what, req, old, obj, e, class)
		return
	}

	o.judgeCurrentGrant(what, e, a)
	o.judgeFenceOrder(what, req, old, e)
	switch o.receiptLogExtended(old, obj, e) {
	case logInherited:
		o.violation(vPlantedInherited, "%s accepted: its receipt log extends receipts that were planted, not accepted", what)
	case logWrong:
		o.violation(vReceiptLog, "%s accepted: its receipt log is not the stored log plus this segment", what)
	}
	o.recordAccepted(e)
	o.deletedMemoryLost = false
	o.trustedLog = nil
	_ = json.Unmarshal([]byte(annotations(obj)[fence.AnnotationReceipts]), &o.trustedLog)
	res.Commits++
}

// judgeKnownLimitWrite counts a write that landed in docs/security.md's
// "Known limits" window: the index does not know the entry yet and no grant
// was used at the object; its state counts for nothing (the planted-state
// rules watch that).
func (o *oracle) judgeKnownLimitWrite(what string, obj map[string]any, e *oracleEnvelope, class authClass) {
	o.w.res.KnownLimitWrites++
	o.w.tracef("oracle: %s landed in the documented index-lag window (no grant used at the target yet)", what)
	if e != nil && class != authForged && class != authCrossResource && class != authMalformed {
		// "untrusted unless it is a real, bound grant of this entry":
		// a genuine envelope is this entry's history, receipts and all.
		o.recordAccepted(e)
		o.trustedLog = nil
		_ = json.Unmarshal([]byte(annotations(obj)[fence.AnnotationReceipts]), &o.trustedLog)
	}
}

// judgeUnauthenticated judges a write accepted although its envelope failed
// authentication (class): a violation of its own kind, and another if it
// moved the object's fence.
func (o *oracle) judgeUnauthenticated(what string, req *request, old, obj map[string]any, e *oracleEnvelope, class authClass) {
	switch class {
	case authForged, authCrossResource, authMalformed:
		o.violation(vForgedAccepted, "%s accepted: %s", what, authNames[class])
	case authWrongPod:
		o.violation(vWrongPod, "%s from %s accepted: %s", what, grant.DescribePod(req.pod), authNames[class])
	default:
		o.violation(vOtherAuthAccepted, "%s accepted: %s", what, authNames[class])
	}
	if o.w.fenceOf(old) != o.w.fenceOf(obj) {
		o.violation(vAuthChangedHighest, "%s moved the object's fence from %d to %d", what, o.w.fenceOf(old), o.w.fenceOf(obj))
	}
	o.recordAccepted(e)
}

// judgeCurrentGrant judges an authenticated write: the grant must be the
// registry's current one when the acceptance point decided it.
func (o *oracle) judgeCurrentGrant(what string, e *oracleEnvelope, a acceptance) {
	now, h := a.now, a.holder
	switch {
	case !now.Before(o.deadlines[e.digest]):
		o.violation(vExpiredOwner, "%s accepted at +%s; its lease ended at +%s", what, now.Sub(simStart), o.deadlines[e.digest].Sub(simStart))
		o.violation(vStaleWrite, "%s accepted from an expired owner", what)
	case h == nil || h.Digest != e.digest || a.regHolder != e.digest:
		o.violation(vStaleWrite, "%s accepted while the registry's holder is %s", what, holderName(h))
	case e.grant.PolicyGeneration != a.generation:
		o.violation(vStaleWrite, "%s accepted with policy generation %d; the FencedResource is at %d", what, e.grant.PolicyGeneration, a.generation)
	}
}

// judgeFenceOrder judges an authenticated write's fence and segment against
// what the object accepted before.
func (o *oracle) judgeFenceOrder(what string, req *request, old map[string]any, e *oracleEnvelope) {
	f, seg := e.grant.FenceToken, e.Segment
	switch {
	case o.deletedMemoryLost && old == nil:
		// Re-created after a registry restore took back the deletion record
		// (and maybe newer fences): the segments, even the fence, start over
		// from what the restored registry holds (staleness and authentication
		// against it are still judged, before this).
		o.w.res.DeletedMemoryLostWrites++
		o.w.hist.decidedAfterLostDelete(req.historyOp)
		for k, v := range o.written {
			o.lostWritten[k] = v
		}
		clear(o.written)
	case !o.acceptedAny:
		if seg != 1 {
			o.violation(vSkippedSegment, "%s accepted as the object's first write", what)
		}
	case f < o.lastFence:
		o.violation(vRegressedToken, "%s accepted after fence %d", what, o.lastFence)
	case f == o.lastFence && e.digest != o.lastDigest:
		o.violation(vRegressedToken, "%s accepted: fence %d already belongs to grant %s", what, f, short(o.lastDigest))
	case f == o.lastFence && seg != o.lastSegment+1:
		o.violation(vSkippedSegment, "%s accepted after segment %d", what, o.lastSegment)
	case f > o.lastFence && seg != 1:
		o.violation(vSkippedSegment, "%s accepted as the first segment of fence %d", what, f)
	}
}

// knownLimit: the write falls in docs/security.md's documented window — the
// webhook's index does not know the entry yet and no fenced write has been
// accepted at the target.
func (o *oracle) knownLimit() bool {
	return o.w.now.Before(o.w.indexLagUntil) && !o.acceptedAny
}

// protectionLacking says which protection mark a stored target lacks.
func protectionLacking(obj map[string]any) string {
	switch {
	case labels(obj)[fence.LabelProtected] != "true":
		return "the label " + fence.LabelProtected + "=true"
	case annotations(obj)[fence.AnnotationResource] != resourceName:
		return "the annotation " + fence.AnnotationResource + "=" + resourceName
	}
	return ""
}

// judgeDelete judges a delete the acceptance point decided (docs/contract.md,
// "Deleting a protected object"): allowed only for the owner of the registry's current grant
// after that grant's segment declaring the delete is the object's last
// accepted one, or for the namespace controller emptying a terminating
// namespace.
func (o *oracle) judgeDelete(req *request, allowed bool, verdict fence.Verdict) {
	res := o.w.res
	res.DeleteAttempts++
	if !allowed {
		return
	}
	if verdict == verdictNotProtected && o.knownLimit() {
		res.KnownLimitWrites++ // the same documented window as an unfenced create
		return
	}
	res.Deletes++
	if o.w.terminating && req.user == locksv1.NamespaceControllerUsername {
		res.TeardownDeletes++
		return
	}
	what := fmt.Sprintf("delete by %s (verdict %s)", req.user, verdict)
	if verdict != fence.Accepted {
		o.violation(vUncheckedMutation, "%s removed the target", what)
	}
	now, r := o.w.now, o.w.reg
	h := r.fr.Status.Holder
	g, issued := o.holderGrant()
	switch {
	case h == nil || o.reg.holder == "" || h.Digest != o.reg.holder || !issued:
		o.violation(vUndeclaredDelete, "%s while the registry's holder is %s", what, holderName(h))
	case req.user != g.Owner:
		o.violation(vUndeclaredDelete, "%s; the current grant belongs to %s", what, g.Owner)
	case !grant.LeaseAdmits(g.Lease, req.pod):
		o.violation(vWrongPod, "%s from %s; the current grant is bound to its requester's pod (lease %s)", what, grant.DescribePod(req.pod), g.Lease)
	case !now.Before(o.reg.deadline):
		o.violation(vUndeclaredDelete, "%s after the current lease ended", what)
	case g.PolicyGeneration != r.fr.Generation:
		o.violation(vUndeclaredDelete, "%s under policy generation %d; the FencedResource is at %d", what, g.PolicyGeneration, r.fr.Generation)
	case o.lastDigest != o.reg.holder || !o.lastIntent:
		o.violation(vUndeclaredDelete, "%s: the object's last accepted segment (fence %d segment %d, intent %t) is not the current grant's declared delete",
			what, o.lastFence, o.lastSegment, o.lastIntent)
	}
	// The re-created object continues this fence state with a new log.
	o.trustedLog = nil
	o.lastIntent = false
}

// holderGrant is the grant document the oracle's holder was issued.
func (o *oracle) holderGrant() (oracleGrant, bool) {
	for doc := range o.issued {
		if digestOf([]byte(doc)) == o.reg.holder {
			var g oracleGrant
			return g, json.Unmarshal([]byte(doc), &g) == nil
		}
	}
	return oracleGrant{}, false
}

// observedRecorded checks a highestObservedFence the registry records: it
// may come only from fences the object stored under genuine grants.
func (o *oracle) observedRecorded(highest int64) {
	if highest > o.maxFence {
		o.violation(vPlantedObserved, "highestObservedFence raised to %d; the highest fence the target stored under a genuine grant is %d", highest, o.maxFence)
	}
}

func (o *oracle) recordAccepted(e *oracleEnvelope) {
	if e == nil {
		return
	}
	o.acceptedAny = true
	o.lastFence, o.lastDigest, o.lastSegment, o.lastIntent = e.grant.FenceToken, e.digest, e.Segment, e.Intent == fence.IntentDelete
	if _, genuine := o.issued[string(e.Grant)]; genuine && e.grant.Resource == resourceID {
		o.maxFence = max(o.maxFence, e.grant.FenceToken)
	}
	o.written[segmentKey(e.grant.FenceToken, e.Segment, e.Operation)] = writtenSegment{e.Payload, o.w.tick}
}

func segmentKey(fence, segment int64, operation string) string {
	return fmt.Sprintf("%d/%d/%s", fence, segment, operation)
}

// oracleReceipt is one receipt log entry as docs/contract.md defines it.
type oracleReceipt struct {
	Fence     int64  `json:"fence"`
	Segment   int64  `json:"segment"`
	Operation string `json:"operation"`
	Payload   string `json:"payload"`
	Receipt   string `json:"receipt"`
}

// Outcomes of the receipt-log check.
const (
	logExtended  = iota // the trusted log plus this segment
	logInherited        // planted receipts plus this segment
	logWrong
)

// receiptLogExtended: the new receipt log is the trusted log (the oracle's
// own account: the log of the last accepted write) plus this segment's
// receipt (sha256 of "resourceID\nfence\nroot\nsegment\noperation\npayload"),
// trimmed to the newest 32. A log that extends the stored receipts when
// those were planted (not the trusted log) is an inherited one.
func (o *oracle) receiptLogExtended(old, obj map[string]any, e *oracleEnvelope) int {
	var after []oracleReceipt
	if json.Unmarshal([]byte(annotations(obj)[fence.AnnotationReceipts]), &after) != nil {
		return logWrong
	}
	g := e.grant
	r := oracleReceipt{Fence: g.FenceToken, Segment: e.Segment, Operation: e.Operation, Payload: e.Payload,
		Receipt: digestOf(fmt.Appendf(nil, "%s\n%d\n%s\n%d\n%s\n%s", resourceID, g.FenceToken, g.OperationRoot, e.Segment, e.Operation, e.Payload))}
	extend := func(log []oracleReceipt) []oracleReceipt {
		want := append(slices.Clone(log), r)
		if len(want) > 32 {
			want = want[len(want)-32:]
		}
		return want
	}
	if slices.Equal(extend(o.trustedLog), after) {
		return logExtended
	}
	var stored []oracleReceipt
	if old != nil {
		if raw := annotations(old)[fence.AnnotationReceipts]; raw != "" && json.Unmarshal([]byte(raw), &stored) == nil &&
			len(stored) > 0 && !slices.Equal(stored, o.trustedLog) && slices.Equal(extend(stored), after) {
			return logInherited
		}
	}
	return logWrong
}

// unknownResolved checks a client's resolution of a MUTATION_UNKNOWN against
// what the object really stored when the client read it (at tick read).
//
// A send resolved proven absent is a claim that it never lands: should it
// land later, judgeCommitted reports it.
func (o *oracle) unknownResolved(reqID int64, want fence.Receipt, outcome lockclient.Resolution, read int64) {
	if outcome == lockclient.ProvenAbsent {
		o.claimedAbsent[reqID] = read
	}
	key := segmentKey(want.Fence, want.Segment, want.Operation)
	seg, stored := o.written[key]
	stored = stored && seg.tick <= read
	lost, inLost := o.lostWritten[key]
	switch {
	case outcome == lockclient.ProvenAbsent && !stored && inLost && lost.tick <= read:
		// The same segment landed in an incarnation the registry forgot; the
		// re-created object cannot show it (docs/security.md, "Known limits").
		o.w.res.DeletedMemoryLostWrites++
	case outcome == lockclient.Applied && (!stored || seg.payload != want.Payload):
		o.violation(vUnknownMisresolved, "fence %d segment %d resolved as applied, but the object never stored it", want.Fence, want.Segment)
	case outcome == lockclient.ProvenAbsent && stored && o.deletedMemoryLost:
		// The object was deleted and a registry restore took back the record
		// of it: the client cannot see that the segment had landed.
		o.w.res.DeletedMemoryLostWrites++
	case outcome == lockclient.ProvenAbsent && stored:
		o.violation(vUnknownMisresolved, "fence %d segment %d resolved as proven absent, but the object stored it", want.Fence, want.Segment)
	}
}

// authenticate applies the contract's authentication list to a write.
func (o *oracle) authenticate(user, pod string, old, obj map[string]any) (*oracleEnvelope, authClass) {
	raw := annotations(obj)[fence.AnnotationFence]
	if raw == "" || (old != nil && raw == annotations(old)[fence.AnnotationFence]) {
		return nil, authUnfenced
	}
	if len(raw) > fence.MaxFenceAnnotationBytes {
		return nil, authMalformed
	}
	e, err := o.w.readEnvelope(raw)
	if err != nil || e.Segment < 1 {
		return nil, authMalformed
	}
	return &e, o.authClass(&e, user, pod, obj)
}

// authClass judges a parsed envelope against who sends it and what it writes.
func (o *oracle) authClass(e *oracleEnvelope, user, pod string, obj map[string]any) authClass {
	issued, ok := o.issued[string(e.Grant)]
	keyID, sig, proofOK := parseProof(e.Proof)
	switch {
	case e.grant.Resource != resourceID:
		return authCrossResource
	case !ok || !proofOK || keyID != issued.keyID || !bytes.Equal(sig, issued.signature):
		return authForged
	case user != e.grant.Owner:
		return authWrongOwner
	case !grant.LeaseAdmits(e.grant.Lease, pod):
		return authWrongPod
	case e.grant.IssuerEpoch < o.w.reg.revokedBelow:
		return authRevoked
	case e.Payload != contentDigest(obj):
		return authPayload
	}
	return authOK
}

// oracleEnvelope is the fence annotation as the oracle reads it.
type oracleEnvelope struct {
	Grant     json.RawMessage `json:"grant"`
	Proof     string          `json:"proof"`
	Operation string          `json:"operation"`
	Segment   int64           `json:"segment"`
	Payload   string          `json:"payload"`
	Intent    string          `json:"intent"`

	grant  oracleGrant
	digest string // of the grant document's bytes
}

type oracleGrant struct {
	Resource         string `json:"resource"`
	Owner            string `json:"owner"`
	Lease            string `json:"lease"`
	FenceToken       int64  `json:"fenceToken"`
	OperationRoot    string `json:"operationRoot"`
	PolicyGeneration int64  `json:"policyGeneration"`
	IssuerEpoch      int64  `json:"issuerEpoch"`
}

// readEnvelope parses a fence annotation loosely (any JSON of the right
// shape), remembering the answer: the same annotation is read many times.
func (w *world) readEnvelope(s string) (oracleEnvelope, error) {
	if r, ok := w.envelopes[s]; ok {
		return r.e, r.err
	}
	var e oracleEnvelope
	err := json.Unmarshal([]byte(s), &e)
	if err == nil {
		err = json.Unmarshal(e.Grant, &e.grant)
	}
	if err == nil {
		e.digest = digestOf(e.Grant)
	}
	if len(w.envelopes) > 512 {
		clear(w.envelopes)
	}
	w.envelopes[s] = parsedEnvelope{e, err}
	return e, err
}

type parsedEnvelope struct {
	e   oracleEnvelope
	err error
}

// fenceOf is the fence of the object's fence annotation (0 when none).
func (w *world) fenceOf(obj map[string]any) int64 {
	if obj == nil {
		return 0
	}
	e, err := w.readEnvelope(annotations(obj)[fence.AnnotationFence])
	if err != nil {
		return 0
	}
	return e.grant.FenceToken
}

// parseProof splits "ed25519:<keyID>:<base64 signature>".
func parseProof(p string) (string, []byte, bool) {
	parts := strings.SplitN(p, ":", 3)
	if len(parts) != 3 || parts[0] != "ed25519" {
		return "", nil, false
	}
	sig, err := base64.StdEncoding.DecodeString(parts[2])
	return parts[1], sig, err == nil
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// contentDigest is the contract's payload digest of a ConfigMap: the canonical
// JSON (compact, sorted keys, no HTML escaping) of {"binaryData","data"}
// without empty members.
func contentDigest(obj map[string]any) string {
	p := map[string]any{}
	for _, k := range []string{"data", "binaryData"} {
		if m, ok := obj[k].(map[string]any); ok && len(m) > 0 {
			p[k] = m
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(p); err != nil {
		panic(err)
	}
	return digestOf(bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
}
