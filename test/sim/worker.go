package sim

import (
	"fmt"
	"strconv"
	"time"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// maxTriesPerJob bounds how often a worker acquires the lock anew for one job.
const maxTriesPerJob = 20

// worker follows the contract's client rules (docs/contract.md, "Worker client states"), one
// request at a time, like the client library's Acquire/renew/Commit:
//
//   - lock: its state is the client library's, computed by its state machine
//     (lockclient.Next) from what the worker learned: a renewal sent, no
//     answer, an interval passed, a confirmed view of the LockGrant;
//   - a lost acquire response is recovered by reading the same requestID;
//   - the guard: a new effect (a write) is started only in HELD;
//   - a write without an answer is MUTATION_UNKNOWN, resolved from the
//     object's receipts by operation ID before anything else, with the
//     library's rule (lockclient.ResolveSent): while the object is still at
//     the version the write was conditioned on, it is in flight, not absent,
//     and no refusal is reported until every such send is decided;
//   - a job is one operation of segments 1..N under one operation root.
type worker struct {
	w        *world
	name     string
	user     string
	pod      string // the UID of the pod it runs in: its grants are bound to it
	jobsLeft int
	segments int // per operation
	tries    int // acquisitions for the current job
	attempt  int // acquisitions so far; names the requestIDs

	lock     *clientLock
	prepared *request // a write built after the guard passed, not yet sent
	unknown  *unknownWrite
	// inFlight are sends that got no answer and may still land; settleThen,
	// a last read to decide them before the worker stops writing under its
	// lock (then it goes on with settleThen).
	inFlight    []*unknownWrite
	settleThen  func()
	pending     *request // the outstanding request
	wakeAt      time.Time
	pausedUntil time.Time
	armed       armedFaults
	// retries counts denied writes that are worth retrying under one lock.
	retries int
	// abandoned counts jobs given up after maxTriesPerJob acquisitions.
	abandoned int
	// sop is the store commit in progress (storeworker.go).
	sop *storeOp
}

// clientLock is the worker's view of one acquisition.
type clientLock struct {
	// state is the lock's state, as lockclient.Next computes it (learn).
	state        lockclient.State
	grantName    string
	requestID    string
	lease        string
	root         string
	created      bool // the LockGrant is believed to exist
	held         bool // a grant was received
	grant        grant.Grant
	proof        string
	digest       string
	renewals     int64 // spec.renewals as last written
	nextRenew    time.Time
	releasing    bool
	releaseAcked bool
	operation    string
	committed    int64     // the last segment of the operation known to be applied
	workUntil    time.Time // computing the next segment until then
	// rewrite: a write met a concurrent one; like the client library's commit
	// loop, read again and write at once, without stopping to renew.
	rewrite bool
	// rewriteFault carries the fault of the write that met the conflict.
	rewriteFault Fault
	// deleted: this lock deleted the object; its re-creation is tagged
	// with FaultDeclaredDelete.
	deleted bool
	// orphaned: the worker stopped following this lock, as an application
	// calls Lock.Orphan, and starts over; its state stays what the library
	// last computed.
	orphaned bool
	// store: this lock's operation commits to the PostgreSQL store;
	// storeLast, the segment its grant last committed there through this
	// lock (0: unknown; lockclient's cursor: the next commit sends the
	// following number without reading the store first).
	store     bool
	storeLast int64
}

// ended: the library ended the lock (EXPIRED or RELEASED), or the worker
// orphaned it.
func (l *clientLock) ended() bool {
	return l.orphaned || l.state == lockclient.StateExpired || l.state == lockclient.StateReleased
}

// mayStartEffects is the guard: a new effect (a write) only in HELD, and not
// while releasing.
func (l *clientLock) mayStartEffects() bool {
	return l.state == lockclient.StateHeld && !l.releasing && !l.orphaned
}

type unknownWrite struct {
	sent  lockclient.Sent
	reqID int64 // the request that carried it
	since time.Time
}

// armedFaults are one-shot faults the adversary set up for the worker's next
// request of a kind.
type armedFaults struct {
	lostRenewal, lostAcquire, lostWriteAck, delayWrite, skipSegment, reacquire, pauseBeforeWrite bool
	// declareDelete: the next segment declares a delete (lockclient's
	// Operation.Delete), the object is deleted, and the next segment
	// re-creates it.
	declareDelete bool
	// The store path: the next COMMIT (or its answer) is lost or late; the
	// worker stops between begin_segment and COMMIT.
	lostCommit, pauseInTx bool
}

func newWorker(w *world, name string, jobs, segments int) *worker {
	return &worker{w: w, name: name, user: "system:serviceaccount:" + namespace + ":" + name, pod: "uid-" + name + "-0",
		jobsLeft: jobs, segments: segments, wakeAt: w.now}
}

func (k *worker) paused() bool { return k.w.now.Before(k.pausedUntil) }

func (k *worker) hasWork() bool {
	return k.prepared != nil || k.unknown != nil || k.settleThen != nil || k.lock != nil || k.jobsLeft > 0 || k.storeBusy()
}

func (k *worker) ready() bool {
	return !k.paused() && k.pending == nil && !k.w.now.Before(k.wakeAt) && k.hasWork()
}

func (k *worker) timedOut() bool {
	return !k.paused() && k.pending != nil && !k.w.now.Before(k.pending.sentAt.Add(requestTimeout))
}

func (k *worker) finishedAll() bool {
	return k.jobsLeft == 0 && k.lock == nil && k.unknown == nil && k.pending == nil && k.prepared == nil &&
		len(k.inFlight) == 0 && k.settleThen == nil && !k.storeBusy()
}

// nextEvent is when the worker next wants to do something.
func (k *worker) nextEvent() time.Time {
	switch {
	case k.paused():
		return k.pausedUntil
	case k.pending != nil:
		return k.pending.sentAt.Add(requestTimeout)
	case k.hasWork():
		return k.wakeAt
	}
	return time.Time{}
}

func (k *worker) describe() string {
	s := fmt.Sprintf("jobs left %d", k.jobsLeft)
	if l := k.lock; l != nil {
		s += fmt.Sprintf(", lock %s %s committed %d/%d", l.requestID, l.state, l.committed, k.segments)
		if l.orphaned {
			s += " (orphaned)"
		}
	}
	if k.unknown != nil {
		s += ", MUTATION_UNKNOWN"
	}
	return s
}

func (k *worker) send(r *request) {
	r.from, r.user, r.pod = k, k.user, k.pod
	k.pending = r
	k.w.send(r)
}

func (k *worker) sleep(d time.Duration) { k.wakeAt = k.w.now.Add(d) }

// learn moves the lock's state by the client library's state machine
// (lockclient.Next) on what the worker learned, as the Lock does; the worker
// never sets a state itself. It returns the state before.
func (k *worker) learn(e lockclient.Event) (from lockclient.State) {
	l := k.lock
	from = l.state
	to, why := lockclient.Next(from, e)
	if to != from {
		if why != nil {
			k.w.tracef("%s: %s -> %s (%v)", k.name, from, to, why)
		} else {
			k.w.tracef("%s: %s -> %s", k.name, from, to)
		}
		l.state = to
	}
	return from
}

// orphan stops following the lock, as an application calls Lock.Orphan when
// its grant is gone although the Lock cannot tell: a restored registry issued
// its LockGrant anew, and the Lock ignores a view of another grant, so it
// stays where it was. The state stays what Next computed; the worker starts over.
func (k *worker) orphan(why string) {
	if l := k.lock; l != nil && !l.orphaned {
		k.w.tracef("%s: orphans its lock in %s: %s", k.name, l.state, why)
		l.orphaned = true
	}
}

// act performs the worker's next step.
func (k *worker) act() {
	if r := k.prepared; r != nil {
		if k.armed.pauseBeforeWrite {
			// The stale-owner story: the process stops between its guard
			// and its write, for longer than the lease.
			k.armed.pauseBeforeWrite = false
			k.pausedUntil = k.w.now.Add(lease + time.Duration(k.w.rng.Int64N(int64(2*lease))))
			r.fault = FaultOwnerPause
			k.w.res.Faults[FaultOwnerPause]++
			k.w.tracef("FAULT %s: %s stops before its write until +%s", FaultOwnerPause, k.name, k.pausedUntil.Sub(simStart).Truncate(time.Millisecond))
			return
		}
		// The effect. The guard passed when the write was built; whatever
		// happened since (a pause) is what fencing exists for.
		k.prepared = nil
		k.sendWrite(r)
		return
	}
	if k.unknown != nil || k.settleThen != nil {
		k.send(&request{kind: reqGetObject}) // resolve before anything else
		return
	}
	if k.storeBusy() {
		k.storeContinue() // an open transaction, or a lost COMMIT to resolve
		return
	}
	l := k.lock
	if l == nil && len(k.inFlight) > 0 {
		k.settleThen = func() {} // nothing left to write under: decide them
		return
	}
	if l != nil && l.held && !l.ended() && !k.w.now.Before(l.nextRenew) {
		// The Lock's renewal tick: a renewal still unconfirmed a whole
		// interval after it was sent is an uncertain one.
		k.learn(lockclient.Event{Kind: lockclient.EventIntervalPassed})
	}
	switch {
	case l == nil:
		k.acquire()
	case l.ended():
		k.lockEnded()
	case l.state == lockclient.StateRequested && !l.created:
		k.createGrant()
	case l.releasing && !l.releaseAcked:
		k.send(&request{kind: reqRelease, grantName: l.grantName})
	case l.state == lockclient.StateHeld && !l.releasing:
		switch {
		case l.rewrite:
			l.rewrite = false
			k.send(&request{kind: reqGetObject})
		case !k.w.now.Before(l.nextRenew):
			k.renew()
		case k.w.now.Before(l.workUntil):
			k.wakeAt = minTime(l.workUntil, l.nextRenew)
		case l.committed >= int64(k.segments):
			k.w.tracef("%s: operation %s complete; releasing", k.name, l.operation)
			l.releasing = true
			k.send(&request{kind: reqRelease, grantName: l.grantName})
		case l.store:
			k.storeStep()
		default:
			k.send(&request{kind: reqGetObject})
		}
	default: // REQUESTED, RENEWING, OWNERSHIP_UNKNOWN, or a release to confirm
		k.send(&request{kind: reqGetGrant, grantName: l.grantName})
	}
}

func (k *worker) acquire() {
	if k.jobsLeft == 0 {
		return
	}
	k.attempt++
	rid := fmt.Sprintf("%s-r%d", k.name, k.attempt)
	k.lock = &clientLock{state: lockclient.StateRequested, requestID: rid, lease: grant.PodLease(k.pod), rewriteFault: faultNone,
		root: lockclient.OperationRoot(resourceName + "/" + rid), grantName: locksv1.LockGrantName(resourceName, k.user, rid)}
	k.retries = 0
	k.sop = nil
	if k.w.store != nil {
		// In a store schedule, an acquisition's operation commits to the
		// store or to the object; the probe's second job, to the store.
		if k == k.w.probe {
			k.lock.store = k.jobsLeft == 1
		} else {
			k.lock.store = k.w.rng.IntN(2) == 0
		}
	}
	k.w.tracef("%s: REQUESTED (requestID %s, store %t)", k.name, rid, k.lock.store)
	k.createGrant()
}

func (k *worker) createGrant() {
	l := k.lock
	r := &request{kind: reqCreateGrant, spec: locksv1.LockGrantSpec{Resource: resourceName, Owner: k.user,
		RequestID: l.requestID, Lease: l.lease, OperationRoot: l.root}}
	if k.armed.lostAcquire {
		k.armed.lostAcquire = false
		r.dropReply = true
		k.w.res.Faults[FaultLostAcquireResponse]++
		k.w.tracef("FAULT %s: the answer to %s's create will be lost", FaultLostAcquireResponse, k.name)
	}
	k.send(r)
}

func (k *worker) renew() {
	l := k.lock
	l.renewals++
	l.nextRenew = k.w.now.Add(renewEvery) // the next tick
	k.learn(lockclient.Event{Kind: lockclient.EventRenewalSent})
	r := &request{kind: reqRenew, grantName: l.grantName, renewals: l.renewals}
	if k.armed.lostRenewal {
		k.armed.lostRenewal = false
		// Either way the client hears nothing; only the second one renewed.
		if k.w.rng.IntN(2) == 0 {
			r.dropRequest = true
		} else {
			r.dropReply = true
		}
		k.w.res.Faults[FaultLostRenewalResponse]++
		k.w.tracef("FAULT %s: %s's renewal gets no answer", FaultLostRenewalResponse, k.name)
	}
	k.send(r)
}

func (k *worker) sendWrite(r *request) {
	if k.armed.lostWriteAck {
		k.armed.lostWriteAck = false
		r.dropReply, r.fault = true, FaultLostWriteAck
		k.w.res.Faults[FaultLostWriteAck]++
		k.w.tracef("FAULT %s: the answer to %s's write will be lost", FaultLostWriteAck, k.name)
		if k.w.rng.IntN(2) == 0 {
			// In flight at the server: admitted at once, applied by etcd up
			// to two leases later, after the client gave up and read the
			// object (found by make chaos).
			r.commitAfter = time.Duration(1+k.w.rng.Int64N(int64(2*lease))) * time.Nanosecond
			k.w.tracef("FAULT %s: %s's write will wait at the API server for %s", FaultLostWriteAck, k.name, r.commitAfter.Truncate(time.Millisecond))
		}
	}
	if k.armed.delayWrite {
		k.armed.delayWrite = false
		r.notBefore, r.fault = k.w.now.Add(lease+time.Duration(k.w.rng.Int64N(int64(lease)))), FaultDelayedMessage
		if k.w.rng.IntN(2) == 0 {
			// A write without a resourceVersion precondition (a patch, or a
			// store without compare-and-swap): only the fence can stop it.
			r.rv = ""
			setRV(r.object, "")
		}
		k.w.res.Faults[FaultDelayedMessage]++
		k.w.tracef("FAULT %s: %s's write is held in the network until +%s", FaultDelayedMessage, k.name, r.notBefore.Sub(simStart).Truncate(time.Millisecond))
	}
	k.w.adv.remember(r)
	k.send(r)
}

// onReply handles the answer to the outstanding request.
func (k *worker) onReply(rp *reply) {
	if rp.req != k.pending {
		k.w.tracef("%s: ignores a late answer to #%d (%s)", k.name, rp.req.id, rp.summary())
		return
	}
	k.pending = nil
	l := k.lock
	switch rp.req.kind {
	case reqCreateGrant:
		if l != nil && l.requestID == rp.req.spec.RequestID {
			l.created = true
			k.sleep(pollEvery)
		}
	case reqGetGrant:
		if l != nil && l.grantName == rp.req.grantName {
			k.observe(rp)
		}
	case reqRenew:
		if l != nil && rp.status == replyNotFound {
			k.learn(lockclient.Event{Kind: lockclient.EventGone}) // the registry keeps no record of our grant
		}
	case reqRelease:
		if l == nil {
			break
		}
		if rp.status == replyNotFound {
			k.learn(lockclient.Event{Kind: lockclient.EventGone}) // nothing left to release
			break
		}
		l.releaseAcked = true
		if k.armed.reacquire {
			k.reacquireAtOnce()
		}
	case reqGetObject:
		if k.unknown != nil || k.settleThen != nil || len(k.inFlight) > 0 {
			if !k.settle(rp) {
				return
			}
		}
		k.prepare(rp.object, rp.deleted)
	case reqWriteObject:
		k.writeAnswered(rp)
	case reqDeleteObject:
		k.deleteAnswered(rp)
	case reqStoreView, reqStoreBegin, reqStoreCommit, reqStoreResolve:
		k.storeAnswered(rp)
	}
}

// timeout handles a request that got no answer in time.
func (k *worker) timeout() {
	r := k.pending
	k.pending = nil
	l := k.lock
	k.w.tracef("%s: no answer to %s (#%d)", k.name, r.kind, r.id)
	switch r.kind {
	case reqCreateGrant:
		// The create may have landed: read the same requestID before anything else.
		if l != nil {
			l.created = true
		}
	case reqRenew:
		if l != nil {
			k.learn(lockclient.Event{Kind: lockclient.EventNoAnswer})
		}
	case reqGetGrant:
		// A renewal's confirmation or a query got no answer. (The read of a
		// request not held yet, or of a release, stands for the Lock's
		// watch: silence there changes nothing.)
		if l != nil && (l.state == lockclient.StateRenewing || l.state == lockclient.StateOwnershipUnknown) {
			k.learn(lockclient.Event{Kind: lockclient.EventNoAnswer})
		}
	case reqWriteObject:
		k.unknown = &unknownWrite{sent: lockclient.Sent{Receipt: r.receipt, Create: r.create, ResourceVersion: r.rv, GrantDigest: k.w.grantDigestOf(r)},
			reqID: r.id, since: k.w.now}
		k.w.res.UnknownOutcomes++
		k.w.tracef("%s: MUTATION_UNKNOWN (fence %d segment %d)", k.name, r.receipt.Fence, r.receipt.Segment)
	case reqStoreView, reqStoreBegin, reqStoreCommit, reqStoreResolve:
		k.storeTimeout(r)
	}
}

// observe applies a confirmed view of the LockGrant.
func (k *worker) observe(rp *reply) {
	l := k.lock
	if rp.status == replyNotFound {
		if !l.held {
			l.created = false // lost on the way, or the registry was restored: create it again
		} else {
			k.learn(lockclient.Event{Kind: lockclient.EventGone}) // the registry keeps no record of our grant
		}
		return
	}
	lg := rp.grant
	if l.held && lg.Status.Grant != nil && lg.Status.Digest != l.digest {
		// A restored registry issued this request anew: our grant is gone.
		// The Lock ignores a view of another grant.
		k.orphan("its LockGrant carries another grant")
		return
	}
	seen := lockclient.Event{Kind: lockclient.EventObserved, Phase: lg.Status.Phase}
	switch {
	case l.held:
		seen.Confirmed = lg.Status.ObservedRenewals >= l.renewals
		if lg.Status.Phase == locksv1.PhaseHeld && l.state == lockclient.StateOwnershipUnknown {
			// The query's answer: the issuer still counts us as the holder,
			// whatever became of the renewal.
			l.renewals, seen.Confirmed = max(l.renewals, lg.Spec.Renewals), true
		}
		switch from := k.learn(seen); {
		case l.state != lockclient.StateHeld || from == lockclient.StateHeld:
			// not back in HELD: nothing to reschedule
		case from == lockclient.StateOwnershipUnknown:
			l.nextRenew = k.w.now // renew at once
		default: // the renewal is confirmed
			l.nextRenew = k.w.now.Add(renewEvery)
		}
	case lg.Status.Phase == locksv1.PhaseHeld && lg.Status.Grant == nil:
		// Not decided for Acquire until the view carries the grant.
	default:
		if lg.Status.Phase == locksv1.PhaseHeld {
			l.held, l.grant, l.proof, l.digest = true, lg.Status.Grant.ToGrant(), lg.Status.Proof, lg.Status.Digest
			l.renewals, l.nextRenew = lg.Spec.Renewals, k.w.now.Add(renewEvery)
			l.operation = fmt.Sprintf("%s-op%d", k.name, k.attempt)
			l.workUntil = k.w.now.Add(computeTime(k.w))
		}
		seen.Confirmed = true // as the Lock enters HELD (startSession)
		k.learn(seen)
	}
	switch {
	case l.state == lockclient.StateRequested:
		k.sleep(pollEvery)
	case l.state != lockclient.StateHeld || l.releasing: // waiting for the issuer to confirm
		k.sleep(pollEvery / 3)
	}
}

// lockEnded starts over after EXPIRED or RELEASED: the job is done if its
// operation committed, otherwise it is tried again under a new acquisition.
func (k *worker) lockEnded() {
	if len(k.inFlight) > 0 {
		k.settleThen = k.lockEnded
		return
	}
	l := k.lock
	k.lock = nil
	if l.held && l.committed >= int64(k.segments) {
		k.jobDone(false)
		return
	}
	k.tries++
	if k.tries >= maxTriesPerJob {
		k.w.tracef("%s: gives the job up after %d acquisitions", k.name, k.tries)
		k.jobDone(true)
	}
	k.sleep(time.Duration(200+k.w.rng.IntN(1800)) * time.Millisecond)
}

func (k *worker) jobDone(abandoned bool) {
	k.jobsLeft--
	k.tries = 0
	if abandoned {
		k.abandoned++
		k.w.res.JobsAbandoned++
	} else {
		k.w.res.JobsDone++
	}
}

// reacquireAtOnce: the interleaved release-and-reacquire fault. The worker
// does not wait for the release to be confirmed and requests the lock again
// (for one more job, or to retry this one); and a write of the old grant,
// still in flight, arrives later.
func (k *worker) reacquireAtOnce() {
	k.armed.reacquire = false
	l := k.lock
	k.w.res.Faults[FaultReleaseReacquire]++
	k.w.tracef("FAULT %s: %s requests the lock again before its release is confirmed", FaultReleaseReacquire, k.name)
	k.w.adv.lateWrite(l.grant, l.proof, l.operation, time.Duration(k.w.rng.IntN(3000))*time.Millisecond, FaultReleaseReacquire)
	k.lock = nil
	if l.committed >= int64(k.segments) {
		k.jobDone(false)
		k.jobsLeft++ // and one more
	}
	k.acquire()
}

// prepare builds the next segment's write from the object as read; the guard
// is checked here, before the effect is started.
func (k *worker) prepare(obj map[string]any, deleted *locksv1.DeletedTarget) {
	l := k.lock
	if l == nil || !l.mayStartEffects() || l.store {
		return // no new effect unless HELD (and this lock writes the store)
	}
	exists := obj != nil
	if !exists {
		obj = newObject()
	}
	ann := annotations(obj)
	st, err := fence.StateOf(ann[fence.AnnotationFence], ann[fence.AnnotationReceipts])
	if err != nil {
		k.w.oracle.violation(vSimulator, "%s cannot read the stored fence state: %v", k.name, err)
		k.sleep(time.Second)
		return
	}
	segment := int64(1)
	switch {
	case exists && st.HighestFence == l.grant.FenceToken && st.GrantDigest == l.digest:
		segment = st.LastSegment + 1
	case !exists && deleted != nil && deleted.GrantDigest == l.digest:
		segment = deleted.Segment + 1 // lockclient's segmentAfterDelete
	}
	if segment > int64(k.segments) {
		l.committed = max(l.committed, segment-1) // already applied (a resolved write or a replay)
		return
	}
	fault := Fault(faultNone)
	if l.rewriteFault != faultNone {
		fault, l.rewriteFault = l.rewriteFault, faultNone
	}
	if k.armed.skipSegment {
		k.armed.skipSegment = false
		segment += 1 + int64(k.w.rng.IntN(2))
		fault = FaultOutOfOrderSegment
		k.w.res.Faults[FaultOutOfOrderSegment]++
		k.w.tracef("FAULT %s: %s numbers its next segment %d", FaultOutOfOrderSegment, k.name, segment)
	}
	intent := ""
	switch {
	case k.armed.declareDelete && exists && segment < int64(k.segments) && fault == faultNone:
		// Operation.Delete: the next segment, same content, intent "delete".
		k.armed.declareDelete = false
		intent, fault = fence.IntentDelete, FaultDeclaredDelete
		k.w.res.Faults[FaultDeclaredDelete]++
		k.w.tracef("FAULT %s: %s declares a delete with segment %d", FaultDeclaredDelete, k.name, segment)
	case !exists && l.deleted:
		fault = FaultDeclaredDelete // the re-creation
	}
	if intent == "" {
		setData(obj, segmentContent(l.operation, segment))
	}
	lbl := labels(obj)
	lbl[fence.LabelProtected] = "true"
	setStringMap(obj, "labels", lbl)
	ann[fence.AnnotationResource] = resourceName
	payload, err := fence.PayloadDigest(fence.ObjectPayload(obj))
	if err != nil {
		panic(err)
	}
	receipt, err := fence.Stamp(ann, fence.Envelope{Grant: l.grant, Proof: l.proof, Operation: l.operation, Segment: segment, Payload: payload, Intent: intent})
	if err != nil {
		panic(err)
	}
	setStringMap(obj, "annotations", ann)
	k.prepared = &request{kind: reqWriteObject, create: !exists, object: obj, rv: resourceVersion(obj), receipt: receipt, fault: fault,
		deleteAfter: intent != ""}
	k.wakeAt = k.w.now
}

// computeTime is how long a worker computes one segment.
func computeTime(w *world) time.Duration {
	return time.Duration(w.rng.IntN(2500)) * time.Millisecond
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// segmentContent is the business content of one segment.
func segmentContent(operation string, segment int64) map[string]string {
	return map[string]string{"operation": operation, "segment": strconv.FormatInt(segment, 10),
		"result": fmt.Sprintf("%s/%d", operation, segment*segment)}
}

func (k *worker) writeAnswered(rp *reply) {
	l := k.lock
	r := rp.req
	applied := rp.status == replyOK || rp.verdict == fence.AlreadyApplied // ALREADY_APPLIED is success
	switch {
	case applied:
		k.supersede()
		if l != nil && l.digest == k.w.grantDigestOf(r) {
			l.committed = max(l.committed, r.receipt.Segment)
			l.workUntil = k.w.now.Add(computeTime(k.w))
			if r.deleteAfter && rp.status == replyOK && l.mayStartEffects() {
				// Delete exactly the object the intent segment wrote.
				k.send(&request{kind: reqDeleteObject, rv: rp.rv, fault: FaultDeclaredDelete})
			}
		}
	case rp.status != replyDenied:
		// Conflict or a concurrent create: read again and renumber.
		if l != nil {
			l.rewrite, l.rewriteFault = true, r.fault
		}
	case rp.verdict == fence.SegmentOutOfOrder || rp.verdict == fence.Quarantined || rp.verdict == fence.ReceiptLogMismatch:
		k.retries++
		if k.retries > 5 {
			k.giveUp()
		}
	default:
		k.giveUp() // this grant can write no more
	}
}

// deleteAnswered: a declared delete's answer. Gone or deleted: the next
// segment re-creates the object; a conflict (something was written after
// the intent) leaves it, and the next segment updates it; a denial ends
// this lock's writing.
func (k *worker) deleteAnswered(rp *reply) {
	l := k.lock
	switch {
	case l == nil:
	case rp.status == replyOK || rp.status == replyNotFound:
		l.deleted = true
	case rp.status == replyDenied:
		k.giveUp()
	}
}

// giveUp stops using the lock after a denial: release it if we may still hold it.
func (k *worker) giveUp() {
	if len(k.inFlight) > 0 {
		// The library reports the refusal only once every earlier send
		// that got no answer is decided.
		k.settleThen = k.giveUp
		return
	}
	l := k.lock
	if l == nil {
		return
	}
	if l.held && !l.releasing && !l.ended() {
		l.releasing = true
		return
	}
	k.orphan("its writes are refused")
}

// settle decides the sends that got no answer from a read (the client
// library's decideLost, with its rule, lockclient.ResolveSent): a fresh
// unknown outcome, and those still in flight. A send in flight stays
// undecided; before the worker stops writing under its lock (settleThen),
// what is still in flight is MUTATION_UNKNOWN for a human, never a refusal.
// It reports whether the read may go on to build the next write.
func (k *worker) settle(rp *reply) bool {
	fresh := k.unknown != nil
	sends := k.inFlight
	if fresh {
		sends = append(sends, k.unknown)
	}
	then := k.settleThen
	k.unknown, k.inFlight, k.settleThen = nil, nil, nil
	undetermined := k.decideSends(sends, rp)
	if then != nil || undetermined {
		k.escalateInFlight()
	}
	switch {
	case undetermined:
		k.giveUp()
	case then != nil:
		then()
	case !fresh:
		return true
	}
	return false
}

// decideSends resolves each send from the read rp answered; those in flight
// go back to k.inFlight. It reports whether one is undeterminable.
func (k *worker) decideSends(sends []*unknownWrite, rp *reply) (undetermined bool) {
	res := k.w.res
	seen, err := observed(rp.object, rp.deleted)
	for _, u := range sends {
		out := lockclient.Undeterminable
		if err == nil {
			out, _ = lockclient.ResolveSent(u.sent, seen)
		}
		if out == lockclient.InFlight && k.w.cfg.lostSendsProvenAbsent {
			out = lockclient.ProvenAbsent // the old rule: a read that misses it
		}
		k.w.oracle.unknownResolved(u.reqID, u.sent.Receipt, out, rp.served)
		k.w.tracef("%s: MUTATION_UNKNOWN (fence %d segment %d, #%d): %s", k.name, u.sent.Receipt.Fence, u.sent.Receipt.Segment, u.reqID, out)
		switch out {
		case lockclient.InFlight:
			res.UnknownInFlight++
			k.inFlight = append(k.inFlight, u)
			continue
		case lockclient.Applied:
			res.UnknownApplied++
			if l := k.lock; l != nil && l.digest == u.sent.GrantDigest {
				l.committed = max(l.committed, u.sent.Receipt.Segment)
			}
		case lockclient.ProvenAbsent:
			res.UnknownAbsent++ // the next step re-reads and, under the guard, writes again
		default: // undeterminable, or applied with another payload
			res.UnknownUndetermined++ // a human decides; this lock writes no more
			undetermined = true
		}
		res.MaxUnknownResolution = max(res.MaxUnknownResolution, k.w.now.Sub(u.since))
	}
	return undetermined
}

// escalateInFlight: the worker stops writing under its lock with sends
// still in flight. The library reports MUTATION_UNKNOWN for them, recorded
// for a human (ReconciliationRequired), never the refusal.
func (k *worker) escalateInFlight() {
	for _, u := range k.inFlight {
		k.w.tracef("%s: MUTATION_UNKNOWN stays (fence %d segment %d in flight): ReconciliationRequired", k.name, u.sent.Receipt.Fence, u.sent.Receipt.Segment)
		k.w.res.UnknownUndetermined++
		k.w.res.MaxUnknownResolution = max(k.w.res.MaxUnknownResolution, k.w.now.Sub(u.since))
	}
	k.inFlight = nil
}

// supersede: a send of the segment landed, so the earlier ones in flight,
// conditioned on the version it moved past, never will.
func (k *worker) supersede() {
	for _, u := range k.inFlight {
		k.w.res.UnknownAbsent++
		k.w.res.MaxUnknownResolution = max(k.w.res.MaxUnknownResolution, k.w.now.Sub(u.since))
	}
	k.inFlight = nil
}

// observed is what the client library's read shows of a write of unknown
// outcome: the object (nil: absent) and, when it is absent, the registry's
// record of its last deletion.
func observed(obj map[string]any, deleted *locksv1.DeletedTarget) (lockclient.Observed, error) {
	if obj == nil {
		return lockclient.Observed{Deleted: deleted}, nil
	}
	ann := annotations(obj)
	st, err := fence.StateOf(ann[fence.AnnotationFence], ann[fence.AnnotationReceipts])
	return lockclient.Observed{Exists: true, ResourceVersion: resourceVersion(obj), State: st}, err
}

// grantDigestOf is the digest of the grant a write carries ("" if none).
func (w *world) grantDigestOf(r *request) string {
	e, err := w.readEnvelope(annotations(r.object)[fence.AnnotationFence])
	if err != nil {
		return ""
	}
	return e.digest
}
