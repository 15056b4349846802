package sim

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// Keys the adversary signs with: one nobody trusts, and one that claims the
// issuer's key ID.
var (
	forgerKey = sync.OnceValue(func() *grant.Signer {
		s, err := grant.NewSigner("k-attacker", bytes.Repeat([]byte{0xa7}, 32))
		if err != nil {
			panic(err)
		}
		return s
	})
	impostorKey = sync.OnceValue(func() *grant.Signer {
		s, err := grant.NewSigner(issuerKey().KeyID(), bytes.Repeat([]byte{0x1f}, 32))
		if err != nil {
			panic(err)
		}
		return s
	})
)

// neighbourResourceID is another resource the same issuer signs grants for.
const neighbourResourceID = "invoice-batch/2026-07-20"

// adversary injects the faults: it arms one-shot faults on workers, pauses
// them, breaks the issuer, restores registry backups, and sends writes of
// its own — forged, tampered, oversized, stolen, replayed — through the same
// network and acceptance point as everyone else.
type adversary struct {
	w      *world
	sent   []*request   // the latest writes workers sent, for duplicates and replays
	issued []issuedCopy // every grant the registry issued, in order
	n      int          // numbers the adversary's contents
	// whenAbsent are creates waiting for the target to be deleted.
	whenAbsent []func()
}

// strangerUser is an identity that never holds the lock (a co-tenant with
// edit rights on ConfigMaps).
const strangerUser = "system:serviceaccount:" + namespace + ":intruder"

type issuedCopy struct {
	g     grant.Grant
	proof string
}

func newAdversary(w *world) *adversary { return &adversary{w: w} }

func (a *adversary) remember(r *request) {
	a.sent = append(a.sent, r)
	if len(a.sent) > 32 {
		a.sent = a.sent[1:]
	}
}

func (a *adversary) sawIssued(g grant.Grant, proof string) {
	a.issued = append(a.issued, issuedCopy{g, proof})
}

// inject tries one fault of the schedule's plan.
func (a *adversary) inject() {
	p := &a.w.faults
	f := p.enabled[a.w.rng.IntN(len(p.enabled))]
	if slices.Contains(p.suppressed, f) {
		return
	}
	if a.apply(f) {
		p.budget--
	}
}

// injected counts an immediate fault and traces it.
func (a *adversary) injected(f Fault, format string, args ...any) bool {
	a.w.res.Faults[f]++
	a.w.tracef("FAULT %s: %s", f, fmt.Sprintf(format, args...))
	return true
}

func held(k *worker) bool {
	return k.lock != nil && k.lock.held && k.lock.state == lockclient.StateHeld && !k.lock.releasing
}

// apply injects fault f, or arms it on a worker to fire at the worker's
// next chance; it reports whether it could.
func (a *adversary) apply(f Fault) bool {
	// An owner pause freezes a worker now one time in three, else between
	// its guard and its write.
	if f == FaultOwnerPause && a.w.rng.IntN(3) == 0 {
		return a.pauseOwner()
	}
	if ar, ok := armers[f]; ok {
		return a.arm(ar.ok, ar.flag)
	}
	if inject, ok := injectors[f]; ok {
		return inject(a)
	}
	return false
}

// armer arms a one-shot fault on a worker: which workers can take it, and
// its flag among the worker's armed faults.
type armer struct {
	ok   func(*worker) bool
	flag func(*worker) *bool
}

// armers arm the faults a worker commits itself once armed.
var armers = map[Fault]armer{
	FaultOwnerPause:          {held, func(k *worker) *bool { return &k.armed.pauseBeforeWrite }},
	FaultLostRenewalResponse: {held, func(k *worker) *bool { return &k.armed.lostRenewal }},
	FaultLostAcquireResponse: {func(k *worker) bool { return k.jobsLeft > 1 || (k.jobsLeft == 1 && k.lock == nil) }, func(k *worker) *bool { return &k.armed.lostAcquire }},
	FaultReleaseReacquire:    {held, func(k *worker) *bool { return &k.armed.reacquire }},
	FaultOutOfOrderSegment:   {held, func(k *worker) *bool { return &k.armed.skipSegment }},
	FaultLostWriteAck:        {held, func(k *worker) *bool { return &k.armed.lostWriteAck }},
	FaultDelayedMessage:      {held, func(k *worker) *bool { return &k.armed.delayWrite }},
	FaultDeclaredDelete:      {func(k *worker) bool { return held(k) && k.segments >= 2 }, func(k *worker) *bool { return &k.armed.declareDelete }},
}

// injectors inject the faults the adversary commits itself. FaultIndexLag
// and FaultPlantedOwnForgery have none: they happen only as the entry is
// created (see startIndexLag).
var injectors = map[Fault]func(*adversary) bool{
	FaultDuplicateSegment:   (*adversary).duplicate,
	FaultReplayOldEnvelope:  (*adversary).replayOld,
	FaultDifferentPayload:   (*adversary).differentPayload,
	FaultRestoreSnapshot:    (*adversary).restoreBackup,
	FaultForgedGrant:        (*adversary).forged,
	FaultOversizedToken:     (*adversary).oversized,
	FaultTamperedGrant:      (*adversary).tampered,
	FaultCrossResource:      (*adversary).crossResource,
	FaultRevokedEpoch:       (*adversary).revokeEpoch,
	FaultStolenGrant:        (*adversary).stolen,
	FaultPayloadMismatch:    (*adversary).payloadMismatch,
	FaultUnfencedWrite:      (*adversary).unfenced,
	FaultIssuerFailover:     (*adversary).failover,
	FaultPolicyChange:       (*adversary).policyChange,
	FaultReceiptLog:         (*adversary).receiptLog,
	FaultStrangerCreate:     func(a *adversary) bool { return a.onAbsent(a.strangerCreate) },
	FaultPlantedCreate:      func(a *adversary) bool { return a.onAbsent(a.plantedCreate) },
	FaultProtectionRemoved:  (*adversary).protectionRemoved,
	FaultUndeclaredDelete:   (*adversary).undeclaredDelete,
	FaultNamespaceTeardown:  (*adversary).impersonatedTeardown,
	FaultIssuerCacheLag:     (*adversary).issuerCacheLag,
	FaultSharedIdentity:     (*adversary).sharedIdentity,
	FaultMirrorLost:         (*adversary).mirrorLost,
	FaultHolderGrantDeleted: (*adversary).holderGrantDeleted,
}

// mirrorLost has the issuer's next one to three decisions commit while
// their LockGrant writes are lost.
func (a *adversary) mirrorLost() bool {
	n := 1 + a.w.rng.IntN(3)
	a.w.reg.mirrorLost += n
	return a.injected(FaultMirrorLost, "the issuer's next %d decision(s) commit, and their LockGrant writes are lost", n)
}

// arm sets a one-shot fault on a random worker matching ok; it is counted
// when it fires.
func (a *adversary) arm(ok func(*worker) bool, flag func(*worker) *bool) bool {
	var cands []*worker
	for _, k := range a.w.workers {
		if ok(k) && !*flag(k) {
			cands = append(cands, k)
		}
	}
	if len(cands) == 0 {
		return false
	}
	*flag(cands[a.w.rng.IntN(len(cands))]) = true
	return true
}

// pauseOwner freezes a worker for longer than the lease at whatever it is
// doing (the armed variant pauses it between its guard and its write).
func (a *adversary) pauseOwner() bool {
	var cands []*worker
	for _, k := range a.w.workers {
		if k.prepared != nil && !k.paused() {
			cands = append(cands, k)
		}
	}
	if len(cands) == 0 {
		for _, k := range a.w.workers {
			if k.lock != nil && k.lock.held && !k.paused() {
				cands = append(cands, k)
			}
		}
	}
	if len(cands) == 0 {
		return false
	}
	k := cands[a.w.rng.IntN(len(cands))]
	k.pausedUntil = a.w.now.Add(lease + time.Duration(a.w.rng.Int64N(int64(2*lease))))
	if k.prepared != nil && k.prepared.fault == faultNone {
		k.prepared.fault = FaultOwnerPause
	}
	return a.injected(FaultOwnerPause, "%s pauses until +%s (write prepared: %t)", k.name, k.pausedUntil.Sub(simStart).Truncate(time.Millisecond), k.prepared != nil)
}

// holderGrant is the registry's current holder's grant.
func (a *adversary) holderGrant() (issuedCopy, bool) {
	if h := a.w.reg.fr.Status.Holder; h != nil {
		for i := len(a.issued) - 1; i >= 0; i-- {
			if a.issued[i].g.Digest() == h.Digest {
				return a.issued[i], true
			}
		}
	}
	return issuedCopy{}, false
}

// genuine picks a grant the registry issued: the current holder's if any.
func (a *adversary) genuine() (issuedCopy, bool) {
	if len(a.issued) == 0 {
		return issuedCopy{}, false
	}
	if ic, ok := a.holderGrant(); ok && a.w.rng.IntN(4) != 0 {
		return ic, true
	}
	return a.issued[a.w.rng.IntN(len(a.issued))], true
}

// storedState is the fence state of the stored object.
func (a *adversary) storedState() fence.State {
	if a.w.obj.stored == nil {
		return fence.State{}
	}
	ann := annotations(a.w.obj.stored)
	st, _ := fence.StateOf(ann[fence.AnnotationFence], ann[fence.AnnotationReceipts])
	return st
}

// nextSegment is the segment that would follow for g at the stored object.
func (a *adversary) nextSegment(g grant.Grant) int64 {
	if st := a.storedState(); st.HighestFence == g.FenceToken && st.GrantDigest == g.Digest() {
		return st.LastSegment + 1
	}
	return 1
}

func (a *adversary) content() map[string]string {
	a.n++
	return map[string]string{"operation": "adversary", "result": fmt.Sprintf("overwritten-%d", a.n)}
}

// craftSpec is what an adversary's write carries whatever the object holds.
type craftSpec struct {
	env     fence.Envelope
	content map[string]string
	payload string              // "" = the digest of content
	mangle  func(string) string // rewrites the encoded fence annotation
	// mangleLog rewrites the receipt log the write carries.
	mangleLog func([]fence.Receipt) []fence.Receipt
	// drop removes a protection mark from the write.
	drop int
}

// The protection marks a write can drop.
const (
	dropNothing = iota
	dropLabel
	dropAnnotation
	renameAnnotation
)

var dropNames = [...]string{"nothing", "the protected label", "the resource annotation", "the resource annotation renamed"}

// craft builds a write of content onto the stored object, carrying env (its
// payload set to the content's digest unless payload is given) and the receipt
// log an accepted write must carry, so only the fence annotation can fail it.
// It is built again onto the object as it is when the write arrives.
func (a *adversary) craft(f Fault, user string, env fence.Envelope, content map[string]string, payload string) *request {
	r := &request{kind: reqWriteObject, user: user, fault: f, rebuild: &craftSpec{env: env, content: content, payload: payload}}
	a.rebuild(r)
	return r
}

// rebuild (re)builds r's object from its craftSpec onto the stored object.
func (a *adversary) rebuild(r *request) {
	c := r.rebuild
	env, payload := c.env, c.payload
	obj := newObject()
	if a.w.obj.stored != nil {
		obj = runtime.DeepCopyJSON(a.w.obj.stored)
	}
	setData(obj, c.content)
	lbl := labels(obj)
	lbl[fence.LabelProtected] = "true"
	setStringMap(obj, "labels", lbl)
	ann := annotations(obj)
	ann[fence.AnnotationResource] = resourceName
	if payload == "" {
		payload, _ = fence.PayloadDigest(fence.ObjectPayload(obj))
	}
	env.Payload = payload
	if env.Operation == "" {
		env.Operation = "adversary"
	}
	if _, err := fence.Stamp(ann, env); err != nil {
		panic(err)
	}
	if c.mangle != nil {
		ann[fence.AnnotationFence] = c.mangle(ann[fence.AnnotationFence])
	}
	switch c.drop {
	case dropLabel:
		delete(lbl, fence.LabelProtected)
		setStringMap(obj, "labels", lbl)
	case dropAnnotation:
		delete(ann, fence.AnnotationResource)
	case renameAnnotation:
		ann[fence.AnnotationResource] = "another-entry"
	}
	if c.mangleLog != nil {
		log, err := fence.ParseReceipts(ann[fence.AnnotationReceipts])
		if err != nil {
			panic(err)
		}
		ann[fence.AnnotationReceipts] = fence.EncodeReceipts(c.mangleLog(log))
	}
	setStringMap(obj, "annotations", ann)
	setRV(obj, "")
	r.object, r.create = obj, a.w.obj.stored == nil
}

// send sends r. A request in a worker's identity comes from that worker's
// pod (a stale process of the holder is in its pod) unless it names another
// (FaultSharedIdentity).
func (a *adversary) send(r *request) {
	if r.pod == "" {
		r.pod = a.podOf(r.user)
	}
	a.w.send(r)
}

// podOf is the pod of the worker whose identity user is ("" for none).
func (a *adversary) podOf(user string) string {
	for _, k := range a.w.workers {
		if k.user == user {
			return k.pod
		}
	}
	return ""
}

func (a *adversary) otherUser(not string) string {
	var users []string
	for _, k := range a.w.workers {
		if k.user != not {
			users = append(users, k.user)
		}
	}
	if len(users) == 0 {
		return "system:serviceaccount:" + namespace + ":intruder"
	}
	return users[a.w.rng.IntN(len(users))]
}

func (a *adversary) duplicate() bool {
	if len(a.sent) == 0 {
		return false
	}
	orig := a.sent[len(a.sent)-1-a.w.rng.IntN(min(3, len(a.sent)))]
	r := &request{kind: reqWriteObject, user: orig.user, object: runtime.DeepCopyJSON(orig.object), rv: orig.rv, create: orig.create, fault: FaultDuplicateSegment}
	if a.w.rng.IntN(2) == 0 {
		r.rv = "" // a client without optimistic concurrency
		setRV(r.object, "")
	}
	a.send(r)
	return a.injected(FaultDuplicateSegment, "the network delivers %s's write again", orig.user)
}

// replayOld re-sends an earlier write: verbatim, or its envelope and content
// onto the current object (so that only its staleness can fail it).
func (a *adversary) replayOld() bool {
	if len(a.sent) == 0 {
		return false
	}
	orig := a.sent[a.w.rng.IntN(len(a.sent))]
	verbatim := a.w.rng.IntN(2) == 0
	r := a.replayOf(orig, verbatim, FaultReplayOldEnvelope)
	if r == nil {
		return false
	}
	a.send(r)
	return a.injected(FaultReplayOldEnvelope, "an old write of %s arrives again (verbatim: %t)", orig.user, verbatim)
}

func (a *adversary) replayOf(orig *request, verbatim bool, f Fault) *request {
	if verbatim {
		obj := runtime.DeepCopyJSON(orig.object)
		setRV(obj, "")
		return &request{kind: reqWriteObject, user: orig.user, object: obj, create: orig.create && a.w.obj.stored == nil, fault: f}
	}
	env, err := fence.ParseEnvelope(annotations(orig.object)[fence.AnnotationFence])
	if err != nil {
		return nil
	}
	data := map[string]string{}
	if m, ok := orig.object["data"].(map[string]any); ok {
		for k, v := range m {
			data[k], _ = v.(string)
		}
	}
	return a.craft(f, orig.user, env, data, env.Payload)
}

// lateWrite sends, to arrive after d, the next segment of operation under a
// grant that is about to end: a write of its holder still in flight.
func (a *adversary) lateWrite(g grant.Grant, proof, operation string, d time.Duration, f Fault) {
	r := a.craft(f, g.Owner, fence.Envelope{Grant: g, Proof: proof, Operation: operation, Segment: a.nextSegment(g)}, a.content(), "")
	a.send(r)
	r.notBefore = a.w.now.Add(d)
}

func (a *adversary) differentPayload() bool {
	stored := a.w.obj.stored
	if stored == nil {
		return false
	}
	st := a.storedState()
	env, err := fence.ParseEnvelope(st.Accepted)
	if err != nil {
		return false
	}
	// The last segment, or an earlier one still in the receipt log.
	var segs []fence.Receipt
	for _, r := range st.Receipts {
		if r.Fence == env.Grant.FenceToken {
			segs = append(segs, r)
		}
	}
	if len(segs) > 0 {
		r := segs[a.w.rng.IntN(len(segs))]
		env.Segment, env.Operation = r.Segment, r.Operation
	}
	a.send(a.craft(FaultDifferentPayload, env.Grant.Owner, env, a.content(), ""))
	return a.injected(FaultDifferentPayload, "segment %d of fence %d sent again with another payload", env.Segment, env.Grant.FenceToken)
}

func (a *adversary) restoreBackup() bool {
	var cands []snapshot
	for _, s := range a.w.reg.snapshots {
		if a.w.now.Sub(s.at) >= 500*time.Millisecond {
			cands = append(cands, s)
		}
	}
	if len(cands) == 0 {
		return false
	}
	s := cands[a.w.rng.IntN(len(cands))]
	a.injected(FaultRestoreSnapshot, "the registry backend is restored to its backup of +%s", s.at.Sub(simStart).Truncate(time.Millisecond))
	a.w.reg.restore(s)
	return true
}

func (a *adversary) forged() bool {
	src, ok := a.genuine()
	if !ok {
		return false
	}
	g := src.g
	g.FenceToken = max(g.FenceToken, a.storedState().HighestFence) + 1 + int64(a.w.rng.IntN(3))
	var proof, how string
	switch a.w.rng.IntN(3) {
	case 0:
		_, proof, _ = forgerKey().Sign(g)
		how = "signed by an untrusted key"
	case 1:
		_, proof, _ = impostorKey().Sign(g)
		how = "signed by another key under the issuer's key ID"
	default:
		sig := make([]byte, 64)
		for i := range sig {
			sig[i] = byte(a.w.rng.IntN(256))
		}
		proof = "ed25519:" + issuerKey().KeyID() + ":" + base64.StdEncoding.EncodeToString(sig)
		how = "with random signature bytes"
	}
	a.send(a.craft(FaultForgedGrant, g.Owner, fence.Envelope{Grant: g, Proof: proof, Segment: 1}, a.content(), ""))
	return a.injected(FaultForgedGrant, "grant with fence %d %s, sent by %s", g.FenceToken, how, g.Owner)
}

func (a *adversary) oversized() bool {
	src, ok := a.genuine()
	if !ok {
		return false
	}
	g := src.g
	env := fence.Envelope{Grant: g, Proof: src.proof, Segment: a.nextSegment(g)}
	variant := a.w.rng.IntN(4)
	if variant == 0 {
		env.Operation = strings.Repeat("x", fence.MaxFenceAnnotationBytes) // pushes the annotation past 8 KiB
	}
	token := `"fenceToken":` + strconv.FormatInt(g.FenceToken, 10) + `,`
	replacement, how := token, "an annotation over 8 KiB"
	switch variant {
	case 1:
		replacement, how = `"fenceToken":9223372036854775808,`, "fenceToken 2^63"
	case 2:
		replacement, how = `"fenceToken":-`+strconv.FormatInt(g.FenceToken, 10)+`,`, "a negative fenceToken"
	case 3:
		replacement, how = `"fenceToken":0,`, "fenceToken 0"
	}
	r := &request{kind: reqWriteObject, user: g.Owner, fault: FaultOversizedToken, rebuild: &craftSpec{env: env, content: a.content(),
		mangle: func(raw string) string { return strings.Replace(raw, token, replacement, 1) }}}
	a.rebuild(r)
	a.send(r)
	return a.injected(FaultOversizedToken, "grant of %s with %s", g.Owner, how)
}

func (a *adversary) tampered() bool {
	src, ok := a.genuine()
	if !ok {
		return false
	}
	g := src.g
	var field string
	switch a.w.rng.IntN(10) {
	case 0:
		g.FenceToken += 1 + int64(a.w.rng.IntN(3))
		field = "fenceToken"
	case 1:
		g.Owner = a.otherUser(g.Owner)
		field = "owner"
	case 2:
		g.Lease += "-x"
		field = "lease"
	case 3:
		g.RequestID += "-x"
		field = "requestID"
	case 4:
		g.OperationRoot = lockclient.OperationRoot("another plan")
		field = "operationRoot"
	case 5:
		g.IssuerEpoch++
		field = "issuerEpoch"
	case 6:
		g.TTLSeconds = 3600
		field = "ttlSeconds"
	case 7:
		g.PolicyGeneration++
		field = "policyGeneration"
	case 8:
		g.BackendRevision += "0"
		field = "backendRevision"
	default:
		g.Resource = neighbourResourceID
		field = "resource"
	}
	a.send(a.craft(FaultTamperedGrant, g.Owner, fence.Envelope{Grant: g, Proof: src.proof, Segment: a.nextSegment(src.g)}, a.content(), ""))
	return a.injected(FaultTamperedGrant, "a genuine grant (fence %d) with its %s changed, sent by %s", src.g.FenceToken, field, g.Owner)
}

func (a *adversary) crossResource() bool {
	src, ok := a.genuine()
	if !ok {
		return false
	}
	g := src.g
	g.Resource = neighbourResourceID
	g.FenceToken = max(g.FenceToken, a.storedState().HighestFence) + 1 + int64(a.w.rng.IntN(3))
	_, proof, err := issuerKey().Sign(g) // genuinely issued, for the neighbour
	if err != nil {
		panic(err)
	}
	a.send(a.craft(FaultCrossResource, g.Owner, fence.Envelope{Grant: g, Proof: proof, Segment: 1}, a.content(), ""))
	return a.injected(FaultCrossResource, "a grant the issuer signed for %s (fence %d), sent by %s", neighbourResourceID, g.FenceToken, g.Owner)
}

func (a *adversary) revokeEpoch() bool {
	r := a.w.reg
	if r.revokedBelow > r.epoch || !r.outageUntil.IsZero() {
		return false
	}
	d := time.Duration(500+a.w.rng.IntN(4500)) * time.Millisecond
	a.injected(FaultRevokedEpoch, "issuer epoch %d is revoked; a new epoch takes over in %s", r.epoch, d)
	holder, held := a.holderGrant()
	r.revokeEpoch(d)
	// A write under the revoked epoch arrives after the new epoch started.
	if held {
		a.lateWrite(holder.g, holder.proof, "late-"+holder.g.RequestID, d+time.Second, FaultRevokedEpoch)
	}
	return true
}

func (a *adversary) stolen() bool {
	src, ok := a.genuine()
	if !ok {
		return false
	}
	user := a.otherUser(src.g.Owner)
	a.send(a.craft(FaultStolenGrant, user, fence.Envelope{Grant: src.g, Proof: src.proof, Segment: a.nextSegment(src.g)}, a.content(), ""))
	return a.injected(FaultStolenGrant, "%s presents the grant of %s (fence %d)", user, src.g.Owner, src.g.FenceToken)
}

// sharedIdentity: another replica of the holder's ServiceAccount — the
// owner's identity, its own pod — reads the holder's grant from the object's
// fence annotation and uses it: the next segment, a delete intent, or (once
// the holder declared a delete) the delete itself.
func (a *adversary) sharedIdentity() bool {
	src, ok := a.holderGrant()
	if !ok {
		return false
	}
	replica := "uid-replica-of-" + src.g.Owner
	if a.w.obj.stored != nil && a.w.rng.IntN(3) == 0 {
		a.send(&request{kind: reqDeleteObject, user: src.g.Owner, pod: replica, fault: FaultSharedIdentity})
		return a.injected(FaultSharedIdentity, "another pod of %s deletes the target under the holder's grant (fence %d)", src.g.Owner, src.g.FenceToken)
	}
	env := fence.Envelope{Grant: src.g, Proof: src.proof, Segment: a.nextSegment(src.g)}
	if a.w.rng.IntN(2) == 0 {
		env.Intent = fence.IntentDelete
	}
	r := a.craft(FaultSharedIdentity, src.g.Owner, env, a.content(), "")
	r.pod = replica
	a.send(r)
	return a.injected(FaultSharedIdentity, "another pod of %s writes under the holder's grant (fence %d, intent %q)", src.g.Owner, src.g.FenceToken, env.Intent)
}

// holderGrantDeleted deletes the holder's LockGrant. Nothing holds it back
// (no finalizer): the issuer decides at once, from a cache that may still
// show it (FaultIssuerCacheLag) or a read around it that finds it gone.
func (a *adversary) holderGrantDeleted() bool {
	r := a.w.reg
	h := r.fr.Status.Holder
	if h == nil {
		return false
	}
	i := slices.IndexFunc(r.grants, func(lg locksv1.LockGrant) bool { return lg.Name == h.GrantName && string(lg.UID) == h.GrantUID })
	if i < 0 {
		return false
	}
	r.grants = slices.Delete(r.grants, i, i+1)
	a.injected(FaultHolderGrantDeleted, "LockGrant %s of %s (fence %d) is deleted while it holds", h.GrantName, h.Owner, h.FenceToken)
	r.reconcile()
	return true
}

func (a *adversary) payloadMismatch() bool {
	src, ok := a.genuine()
	if !ok {
		return false
	}
	other, _ := fence.PayloadDigest(map[string]any{"data": map[string]any{"result": "what the grant holder meant"}})
	a.send(a.craft(FaultPayloadMismatch, src.g.Owner, fence.Envelope{Grant: src.g, Proof: src.proof, Segment: a.nextSegment(src.g)}, a.content(), other))
	return a.injected(FaultPayloadMismatch, "%s's write (fence %d) carries the digest of other content", src.g.Owner, src.g.FenceToken)
}

// unfenced changes the object without a fresh fence annotation.
func (a *adversary) unfenced() bool {
	stored := a.w.obj.stored
	obj := newObject()
	if stored != nil {
		obj = runtime.DeepCopyJSON(stored)
	}
	setRV(obj, "")
	ann, lbl := annotations(obj), labels(obj)
	lbl[fence.LabelProtected] = "true"
	var how string
	switch v := a.w.rng.IntN(4); {
	case stored == nil || v == 0:
		setData(obj, a.content())
		delete(ann, fence.AnnotationFence)
		how = "new content, no fence annotation"
	case v == 1:
		setData(obj, a.content())
		how = "new content under the last accepted fence annotation"
	case v == 2:
		delete(lbl, fence.LabelProtected)
		delete(ann, fence.AnnotationFence)
		how = "the protected label and the fence annotation removed"
	default:
		ann[fence.AnnotationReceipts] = ""
		how = "the receipt log cleared"
	}
	ann[fence.AnnotationResource] = resourceName
	setStringMap(obj, "annotations", ann)
	setStringMap(obj, "labels", lbl)
	user := a.otherUser("")
	a.send(&request{kind: reqWriteObject, user: user, object: obj, create: stored == nil, fault: FaultUnfencedWrite})
	return a.injected(FaultUnfencedWrite, "%s writes %s", user, how)
}

func (a *adversary) failover() bool {
	r := a.w.reg
	if !r.outageUntil.IsZero() {
		return false
	}
	d := time.Duration(500+a.w.rng.Int64N(int64(2*lease/time.Millisecond))) * time.Millisecond
	r.outage(d)
	return a.injected(FaultIssuerFailover, "the issuer loses its leader for %s; epoch %d follows", d, r.epoch+1)
}

// issuerCacheLag freezes the issuer's view of the LockGrants that exist now
// for a while: it decides from those copies, however they change meanwhile,
// and must not give a request its cache shows waiting a second fence.
func (a *adversary) issuerCacheLag() bool {
	r := a.w.reg
	if r.w.now.Before(r.cacheLagUntil) || len(r.grants) == 0 {
		return false
	}
	d := time.Duration(200+a.w.rng.IntN(3000)) * time.Millisecond
	r.staleGrants = make([]locksv1.LockGrant, len(r.grants))
	for i := range r.grants {
		r.grants[i].DeepCopyInto(&r.staleGrants[i])
	}
	r.cacheLagUntil = r.w.now.Add(d)
	return a.injected(FaultIssuerCacheLag, "the issuer's LockGrant cache stops at %d LockGrants for %s", len(r.grants), d)
}

func (a *adversary) policyChange() bool {
	r := a.w.reg
	floor := max(r.fr.Spec.FenceFloor, r.fr.Status.FenceToken) + 1 + int64(a.w.rng.IntN(3))
	a.injected(FaultPolicyChange, "the operator raises spec.fenceFloor to %d", floor)
	r.changeSpec(func(s *locksv1.FencedResourceSpec) { s.FenceFloor = floor })
	return true
}

// receiptLog sends the holder's next segment with a receipt log that is not
// the stored log plus that segment: history dropped or a receipt forged.
func (a *adversary) receiptLog() bool {
	src, ok := a.holderGrant()
	if !ok {
		return false
	}
	var how string
	var mangle func([]fence.Receipt) []fence.Receipt
	if a.w.obj.stored == nil {
		return false // a create carries no stored log to tamper with
	}
	switch v := a.w.rng.IntN(3); {
	case v == 0 && len(a.storedState().Receipts) > 0:
		how, mangle = "the stored receipts dropped", func(l []fence.Receipt) []fence.Receipt { return l[len(l)-1:] }
	case v <= 1:
		how, mangle = "the new receipt's digest forged", func(l []fence.Receipt) []fence.Receipt {
			l[len(l)-1].Receipt = fence.ReceiptDigest(resourceID, 1, src.g.OperationRoot, 1, "forged", l[len(l)-1].Payload)
			return l
		}
	default:
		how, mangle = "an extra receipt added", func(l []fence.Receipt) []fence.Receipt {
			return fence.AppendReceipt(l, fence.Receipt{Fence: 1, Segment: 99, Operation: "invented", Payload: l[len(l)-1].Payload, Receipt: l[len(l)-1].Receipt})
		}
	}
	env := fence.Envelope{Grant: src.g, Proof: src.proof, Operation: "op-" + src.g.RequestID, Segment: a.nextSegment(src.g)}
	r := &request{kind: reqWriteObject, user: src.g.Owner, fault: FaultReceiptLog, rebuild: &craftSpec{env: env, content: a.content(), mangleLog: mangle}}
	a.rebuild(r)
	a.send(r)
	return a.injected(FaultReceiptLog, "%s's next segment (fence %d) with %s", src.g.Owner, src.g.FenceToken, how)
}

// onReply: the adversary does not act on answers; the verdicts are counted
// where they are decided.
func (a *adversary) onReply(rp *reply) {
	a.w.tracef("adversary's write (%s, as %s): %s", rp.req.fault, rp.req.user, rp.summary())
}

// onAbsent fires a create of the target now if it is absent, else when it
// is next deleted (during the faulty phase).
func (a *adversary) onAbsent(fire func()) bool {
	if a.w.obj.stored == nil {
		fire()
		return true
	}
	if len(a.whenAbsent) >= 4 {
		return false
	}
	a.whenAbsent = append(a.whenAbsent, fire)
	return true
}

// targetDeleted: the object was just deleted; the waiting creates go out.
func (a *adversary) targetDeleted() {
	fire := a.whenAbsent
	a.whenAbsent = nil
	if a.w.quiet || a.w.terminating {
		return
	}
	for _, f := range fire {
		f()
	}
}

// strangerCreate: someone without a grant creates the absent target, with
// or without the protection marks, without a fence.
func (a *adversary) strangerCreate() {
	a.sendStrangerCreate(FaultStrangerCreate)
}

func (a *adversary) sendStrangerCreate(f Fault) {
	obj := newObject()
	setData(obj, a.content())
	how := "without label, annotation or fence"
	if a.w.rng.IntN(3) == 0 {
		setStringMap(obj, "labels", map[string]string{fence.LabelProtected: "true"})
		setStringMap(obj, "annotations", map[string]string{fence.AnnotationResource: resourceName})
		how = "labelled and annotated, without fence"
	}
	user := a.strangerOrCoTenant()
	a.send(&request{kind: reqWriteObject, user: user, object: obj, create: true, fault: f})
	a.injected(f, "%s creates the absent target %s", user, how)
}

func (a *adversary) strangerOrCoTenant() string {
	if a.w.rng.IntN(2) == 0 {
		return strangerUser
	}
	return a.otherUser("")
}

// plantedCreate: someone creates the absent target carrying fence state it
// was never granted: the holder's envelope with a forged receipt, another
// resource's genuine envelope, or an envelope forged for this resource, each
// with planted receipts.
func (a *adversary) plantedCreate() {
	variant := a.w.rng.IntN(3)
	if variant == plantOwnForgery && a.w.now.Before(a.w.indexLagUntil) {
		variant = plantNeighbour // landing in the lag window is FaultPlantedOwnForgery's
	}
	a.sendPlantedCreate(FaultPlantedCreate, variant)
}

// The variants of sendPlantedCreate.
const (
	plantHolderEnvelope = iota // the holder's envelope, a forged receipt added
	plantNeighbour             // another resource's genuine envelope
	plantOwnForgery            // an envelope forged for this resource
)

func (a *adversary) sendPlantedCreate(f Fault, variant int) {
	user := a.strangerOrCoTenant()
	if src, ok := a.holderGrant(); ok && variant == plantHolderEnvelope {
		g := src.g
		forged := fence.Receipt{Fence: g.FenceToken + 7, Segment: 1, Operation: "planted"}
		r := &request{kind: reqWriteObject, user: user, fault: f, rebuild: &craftSpec{
			env: fence.Envelope{Grant: g, Proof: src.proof, Operation: "op-" + g.RequestID, Segment: a.nextSegment(g)}, content: a.content(),
			mangleLog: func(l []fence.Receipt) []fence.Receipt {
				forged.Payload, forged.Receipt = l[0].Payload, fence.ReceiptDigest(resourceID, forged.Fence, g.OperationRoot, 1, "planted", l[0].Payload)
				return append([]fence.Receipt{forged}, l...)
			}}}
		a.rebuild(r)
		a.send(r)
		a.injected(f, "%s creates the target with the holder's envelope (fence %d) and a forged receipt", user, g.FenceToken)
		return
	}
	// Unlabelled and unannotated: only the registry can tell it is a target.
	obj := newObject()
	setData(obj, a.content())
	payload, _ := fence.PayloadDigest(fence.ObjectPayload(obj))
	fenceToken := 90 + int64(a.w.rng.IntN(10))
	g := grant.Grant{Schema: grant.Schema, Resource: neighbourResourceID, Owner: user, RequestID: "planted", Lease: "planted",
		OperationRoot: lockclient.OperationRoot("planted"), FenceToken: fenceToken, BackendRevision: "1", PolicyGeneration: 1,
		IssuerEpoch: a.w.reg.epoch, TTLSeconds: leaseSeconds, IssuedAt: a.w.now.UTC().Format(time.RFC3339)}
	signer, how := issuerKey(), "a genuine envelope of "+neighbourResourceID
	if variant == plantOwnForgery {
		g.Resource, signer, how = resourceID, forgerKey(), "an envelope forged for this resource"
	}
	_, proof, err := signer.Sign(g)
	if err != nil {
		panic(err)
	}
	env := fence.Envelope{Grant: g, Proof: proof, Operation: "planted", Segment: 3, Payload: payload}
	var planted []fence.Receipt
	for seg := int64(1); seg <= 3; seg++ {
		planted = append(planted, fence.Receipt{Fence: fenceToken, Segment: seg, Operation: "planted", Payload: payload,
			Receipt: fence.ReceiptDigest(g.Resource, fenceToken, g.OperationRoot, seg, "planted", payload)})
	}
	setStringMap(obj, "annotations", map[string]string{fence.AnnotationFence: env.Encode(), fence.AnnotationReceipts: fence.EncodeReceipts(planted)})
	a.send(&request{kind: reqWriteObject, user: user, object: obj, create: true, fault: f})
	a.injected(f, "%s creates the target unlabelled with %s (fence %d) and 3 planted receipts", user, how, fenceToken)
}

// protectionRemoved: a write that drops the protected label or the resource
// annotation, by the holder under its valid grant or by someone else.
func (a *adversary) protectionRemoved() bool {
	stored := a.w.obj.stored
	if stored == nil {
		return false
	}
	drop := 1 + a.w.rng.IntN(3)
	if src, ok := a.holderGrant(); ok && a.w.rng.IntN(2) == 0 {
		g := src.g
		r := &request{kind: reqWriteObject, user: g.Owner, fault: FaultProtectionRemoved, rebuild: &craftSpec{
			env: fence.Envelope{Grant: g, Proof: src.proof, Operation: "op-" + g.RequestID, Segment: a.nextSegment(g)}, content: a.content(), drop: drop}}
		a.rebuild(r)
		a.send(r)
		return a.injected(FaultProtectionRemoved, "the holder %s's next segment (fence %d) drops %s", g.Owner, g.FenceToken, dropNames[drop])
	}
	obj := runtime.DeepCopyJSON(stored)
	setRV(obj, "")
	lbl, ann := labels(obj), annotations(obj)
	switch drop {
	case dropLabel:
		delete(lbl, fence.LabelProtected)
	case dropAnnotation:
		delete(ann, fence.AnnotationResource)
	default:
		ann[fence.AnnotationResource] = "another-entry"
	}
	setStringMap(obj, "labels", lbl)
	setStringMap(obj, "annotations", ann)
	user := a.strangerOrCoTenant()
	a.send(&request{kind: reqWriteObject, user: user, object: obj, fault: FaultProtectionRemoved})
	return a.injected(FaultProtectionRemoved, "%s drops %s (no new fence)", user, dropNames[drop])
}

// undeclaredDelete: a process deletes the target without a declared
// intent: a stale replica sharing the holder's (or an earlier holder's)
// identity, or someone else.
func (a *adversary) undeclaredDelete() bool {
	if a.w.obj.stored == nil || len(a.issued) == 0 {
		return false
	}
	user, who := a.issued[a.w.rng.IntN(len(a.issued))].g.Owner, "an earlier holder's identity"
	if src, ok := a.holderGrant(); ok && a.w.rng.IntN(3) != 0 {
		user, who = src.g.Owner, "the holder's identity"
	} else if a.w.rng.IntN(3) == 0 {
		user, who = strangerUser, "a stranger"
	}
	r := &request{kind: reqDeleteObject, user: user, fault: FaultUndeclaredDelete}
	if a.w.rng.IntN(2) == 0 {
		r.rv = resourceVersion(a.w.obj.stored)
	}
	a.send(r)
	return a.injected(FaultUndeclaredDelete, "a stale process with %s (%s) deletes the target (resourceVersion %q)", who, user, r.rv)
}

// impersonatedTeardown: the namespace controller's identity deletes the
// target while the namespace is not terminating. The real teardown comes at
// the end of the schedule (world.teardown).
func (a *adversary) impersonatedTeardown() bool {
	if a.w.obj.stored == nil {
		return false
	}
	a.send(&request{kind: reqDeleteObject, user: locksv1.NamespaceControllerUsername, fault: FaultNamespaceTeardown})
	return a.injected(FaultNamespaceTeardown, "the namespace controller's identity deletes the target; the namespace is not terminating")
}

// startIndexLag: the FencedResource was just created and the webhook's
// target index does not know it yet; someone creates the target meanwhile:
// unfenced, with another resource's envelope (FaultIndexLag), or with an
// envelope forged for this resource (FaultPlantedOwnForgery).
func (a *adversary) startIndexLag(f Fault) {
	d := time.Duration(1000+a.w.rng.IntN(4000)) * time.Millisecond
	a.w.indexLagUntil = a.w.now.Add(d)
	a.w.tracef("FAULT %s: the webhook's target index learns of the entry only at +%s", f, d)
	switch {
	case f == FaultPlantedOwnForgery:
		a.sendPlantedCreate(f, plantOwnForgery)
	case a.w.rng.IntN(2) == 0:
		a.sendStrangerCreate(f)
	default:
		a.sendPlantedCreate(f, plantNeighbour)
	}
}
