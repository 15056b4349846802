package sim

import (
	"time"

	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

// A worker's commits to the store follow lockclient's Operation.CommitTx:
// under the guard (HELD), wait until the grant is published at the store
// (storeReady: published, or a higher fence already there), number the
// segment from the store's fence state (or, after a commit with a receipt
// under this lock, from the lock's cursor, without reading), run
// begin_segment, then COMMIT
// (pgfence.Commit). ALREADY_APPLIED of this segment, or FENCE_REQUIRED for
// the last accepted envelope that the receipts show applied, is success; a
// number another commit took (QUARANTINED, ALREADY_APPLIED of another
// receipt) is numbered again, up to storeAttempts times; any other refusal
// ends the lock's writing. A begin_segment without an answer landed nothing
// (COMMIT was never sent; the session is closed). A COMMIT without an answer
// is resolved on a fresh connection, retried while the store is
// unreachable: end the server process that ran it, then read the receipts
// by operation (applied, proven absent: commit again, or undeterminable:
// MUTATION_UNKNOWN for a human).

// storeAttempts is lockclient's bound on renumbering one commit.
const storeAttempts = 8

// storeReadyWait is how long a worker's context lets CommitTx wait for its
// grant's publication before the application gives the lock up.
const storeReadyWait = 30 * time.Second

type storePhase int

const (
	storeIdle      storePhase = iota
	storeBeginDue             // the envelope is built; begin_segment is next
	storeCommitDue            // begin_segment accepted; COMMIT is next
	storeResolve              // COMMIT got no answer: resolve before anything else
	storeSentAgain            // FENCE_REQUIRED: the receipts say whether it was ours
)

// storeOp is one CommitTx call in progress.
type storeOp struct {
	phase     storePhase
	txID      int64
	env       fence.Envelope
	want      fence.Receipt
	waitSince time.Time
	since     time.Time // when the COMMIT's answer went missing
	taken     int
	fault     Fault
}

// storeBusy: a store commit must go on before anything else (an open
// transaction to commit, or a lost COMMIT to resolve).
func (k *worker) storeBusy() bool {
	return k.sop != nil && (k.sop.phase == storeBeginDue || k.sop.phase == storeCommitDue || k.sop.phase == storeResolve || k.sop.phase == storeSentAgain)
}

func (k *worker) storeUnsettled() bool { return k.sop != nil && k.sop.phase == storeResolve }

// storeContinue sends the next request of the commit in progress.
func (k *worker) storeContinue() {
	op := k.sop
	switch op.phase {
	case storeBeginDue:
		k.sendBegin()
	case storeCommitDue:
		r := &request{kind: reqStoreCommit, storeTx: op.txID, fault: op.fault}
		if k.armed.lostCommit {
			k.armed.lostCommit = false
			k.w.store.txs[op.txID].sf = sfLostCommitAnswer
			switch k.w.rng.IntN(3) {
			case 0:
				r.dropReply = true
				k.w.storeFaultFired(sfLostCommitAnswer, "the answer to %s's COMMIT (fence %d segment %d) will be lost", k.name, op.env.Grant.FenceToken, op.env.Segment)
			case 1:
				r.dropRequest = true
				k.w.storeFaultFired(sfLostCommitAnswer, "%s's COMMIT (fence %d segment %d) is lost on the way", k.name, op.env.Grant.FenceToken, op.env.Segment)
			default:
				r.notBefore = k.w.now.Add(time.Duration(500+k.w.rng.IntN(4000)) * time.Millisecond)
				k.w.storeFaultFired(sfLostCommitAnswer, "%s's COMMIT (fence %d segment %d) is held in the network until +%s", k.name,
					op.env.Grant.FenceToken, op.env.Segment, r.notBefore.Sub(simStart).Truncate(time.Millisecond))
			}
		}
		k.send(r)
	case storeResolve:
		k.send(&request{kind: reqStoreResolve, storeTx: op.txID, storeEnv: op.env})
	case storeSentAgain:
		k.send(&request{kind: reqStoreResolve, storeEnv: op.env}) // nothing to end: begin_segment refused it
	}
}

// storeStep starts (or goes on with) a commit under a HELD lock: from the
// lock's cursor when its grant committed here before, else after reading
// the store's view.
func (k *worker) storeStep() {
	if k.sop == nil {
		k.sop = &storeOp{waitSince: k.w.now, fault: faultNone}
	}
	if l := k.lock; l.storeLast > 0 {
		k.storeBuild(l.storeLast + 1)
		return
	}
	k.send(&request{kind: reqStoreView, storeDigest: k.lock.digest})
}

// storeViewed: storeReady's read came back.
func (k *worker) storeViewed(rp *reply) {
	l, op := k.lock, k.sop
	if l == nil || op == nil || !l.mayStartEffects() {
		k.sop = nil
		return
	}
	a := rp.store
	if !a.published && a.state.HighestFence <= l.grant.FenceToken {
		k.storeWait()
		return
	}
	k.storeBuild(fence.NextSegment(a.state, l.grant))
}

// storeBuild builds the envelope of segment under the lock's grant.
func (k *worker) storeBuild(segment int64) {
	l, op := k.lock, k.sop
	if segment > int64(k.segments) {
		l.committed = max(l.committed, segment-1)
		k.sop = nil
		return
	}
	if k.armed.skipSegment {
		k.armed.skipSegment = false
		segment += 1 + int64(k.w.rng.IntN(2))
		op.fault = FaultOutOfOrderSegment
		k.w.res.Faults[FaultOutOfOrderSegment]++
		k.w.tracef("FAULT %s: %s numbers its next store segment %d", FaultOutOfOrderSegment, k.name, segment)
	}
	payload, err := fence.PayloadDigest(map[string]any{"data": segmentContent(l.operation, segment)})
	if err != nil {
		panic(err)
	}
	op.env = fence.Envelope{Grant: l.grant, Proof: l.proof, Operation: l.operation, Segment: segment, Payload: payload}
	op.want = fence.Receipt{Fence: l.grant.FenceToken, Segment: segment, Operation: l.operation, Payload: payload,
		Receipt: fence.ReceiptDigest(l.grant.Resource, l.grant.FenceToken, l.grant.OperationRoot, segment, l.operation, payload)}
	op.phase = storeBeginDue
	if k.armed.pauseBeforeWrite {
		// The stale-owner story at the store: the process stops between its
		// guard and begin_segment, for longer than the lease.
		k.armed.pauseBeforeWrite = false
		k.pausedUntil = k.w.now.Add(lease + time.Duration(k.w.rng.Int64N(int64(2*lease))))
		op.fault = FaultOwnerPause
		k.w.res.Faults[FaultOwnerPause]++
		k.w.tracef("FAULT %s: %s stops before its begin_segment until +%s", FaultOwnerPause, k.name, k.pausedUntil.Sub(simStart).Truncate(time.Millisecond))
		return
	}
	k.wakeAt = k.w.now
}

// storeWait: the grant is not published yet; wait while the context lasts.
func (k *worker) storeWait() {
	if k.w.now.Sub(k.sop.waitSince) > storeReadyWait {
		k.w.tracef("%s: its grant is still not published at the store after %s; gives the lock up", k.name, storeReadyWait)
		k.w.res.StoreWaitsGivenUp++
		k.sop = nil
		k.giveUp()
		return
	}
	k.sleep(pollEvery)
}

func (k *worker) sendBegin() {
	op := k.sop
	r := &request{kind: reqStoreBegin, storeRaw: op.env.Encode(), fault: op.fault}
	k.send(r)
	op.txID = r.id
	k.w.store.txs[r.id] = &storeTx{id: r.id, from: k, raw: r.storeRaw, fault: op.fault, sf: -1}
	k.w.storeOracle.sent(r.storeRaw)
}

// storeAnswered handles the store's answer to a commit request.
func (k *worker) storeAnswered(rp *reply) {
	op := k.sop
	if op == nil {
		return
	}
	switch rp.req.kind {
	case reqStoreView:
		k.storeViewed(rp)
	case reqStoreBegin:
		k.storeBegun(rp)
	case reqStoreCommit:
		k.storeCommitted(rp)
	case reqStoreResolve:
		k.storeResolved(rp)
	}
}

func (k *worker) storeBegun(rp *reply) {
	op := k.sop
	a := rp.store
	switch a.verdict {
	case fence.Accepted:
		op.phase = storeCommitDue
		if k.armed.pauseInTx {
			k.armed.pauseInTx = false
			k.pausedUntil = k.w.now.Add(lease + time.Duration(k.w.rng.Int64N(int64(2*lease))))
			k.w.store.txs[op.txID].sf = sfPauseInTransaction
			k.w.storeFaultFired(sfPauseInTransaction, "%s stops with its transaction open (fence %d segment %d) until +%s", k.name,
				op.env.Grant.FenceToken, op.env.Segment, k.pausedUntil.Sub(simStart).Truncate(time.Millisecond))
			return
		}
		k.wakeAt = k.w.now
	case fence.AlreadyApplied:
		if a.receipt == op.want.Receipt {
			k.storeApplied(op.env, a.receipt, "ALREADY_APPLIED")
			return
		}
		k.storeRenumber()
	case fence.FenceRequired:
		op.phase = storeSentAgain
		k.wakeAt = k.w.now
	case fence.Quarantined:
		k.storeRenumber()
	default:
		k.storeForget()
		k.sop = nil
		k.giveUp()
	}
}

func (k *worker) storeCommitted(rp *reply) {
	op := k.sop
	switch rp.store.verdict {
	case fence.Accepted:
		k.storeApplied(op.env, rp.store.receipt, "COMMIT")
	case verdictNoTx:
		k.storeForget()
		k.sop = nil // rolled back with its session: nothing landed; read again
	default:
		k.storeForget()
		k.sop = nil // refused at COMMIT: nothing landed
		k.giveUp()
	}
}

func (k *worker) storeResolved(rp *reply) {
	op := k.sop
	a := rp.store
	if op.phase == storeSentAgain {
		if a.outcome == resolvedApplied {
			k.storeApplied(op.env, a.receipt, "FENCE_REQUIRED, found in the receipts")
			return
		}
		k.storeForget()
		k.sop = nil
		k.giveUp()
		return
	}
	res := k.w.res
	k.w.storeOracle.resolved(op.txID, op.env, a.outcome, rp.served)
	k.w.tracef("%s: lost COMMIT (fence %d segment %d, #%d): %s", k.name, op.env.Grant.FenceToken, op.env.Segment, op.txID, a.outcome)
	res.StoreMaxResolution = max(res.StoreMaxResolution, k.w.now.Sub(op.since))
	switch a.outcome {
	case resolvedApplied:
		res.StoreUnknownApplied++
		k.storeApplied(op.env, a.receipt, "resolved")
	case resolvedAbsent:
		res.StoreUnknownAbsent++
		k.storeRenumber()
	default:
		res.StoreUnknownUndetermined++ // ErrMutationUnknown: recorded for a human; this lock writes no more
		k.storeForget()
		k.sop = nil
		k.giveUp()
	}
}

// storeApplied: the segment is applied (how says how the worker knows).
func (k *worker) storeApplied(env fence.Envelope, receipt, how string) {
	k.w.storeOracle.acknowledged(env, receipt, how)
	k.sop = nil
	if l := k.lock; l != nil && l.digest == env.Grant.Digest() {
		l.storeLast = max(l.storeLast, env.Segment)
		l.committed = max(l.committed, env.Segment)
		l.workUntil = k.w.now.Add(computeTime(k.w))
	}
}

// storeRenumber: the number was taken (or the commit proven absent): read
// the state again and number anew, at most storeAttempts times.
func (k *worker) storeRenumber() {
	k.storeForget()
	op := k.sop
	op.taken++
	if op.taken >= storeAttempts {
		k.sop = nil
		k.giveUp()
		return
	}
	op.phase, op.waitSince = storeIdle, k.w.now
	if k.lock == nil || !k.lock.mayStartEffects() {
		k.sop = nil
	}
}

// storeForget: a commit did not end with a receipt; the next one reads
// the store's state first.
func (k *worker) storeForget() {
	if k.lock != nil {
		k.lock.storeLast = 0
	}
}

// storeTimeout: a store request got no answer in time.
func (k *worker) storeTimeout(r *request) {
	op := k.sop
	if op == nil {
		return
	}
	if r.kind != reqStoreView {
		k.storeForget()
	}
	switch r.kind {
	case reqStoreView:
		if k.w.now.Sub(op.waitSince) > storeReadyWait {
			k.storeWait()
		}
	case reqStoreBegin:
		// COMMIT was never sent: the session closes and nothing lands.
		k.w.store.abandon(r.id)
		op.phase = storeIdle
		k.retries++
		if k.retries > 5 {
			k.sop = nil
			k.giveUp()
		}
	case reqStoreCommit:
		op.phase, op.since = storeResolve, k.w.now
		k.w.res.StoreUnknown++
		k.w.tracef("%s: COMMIT of fence %d segment %d got no answer: resolving from the receipts", k.name, op.env.Grant.FenceToken, op.env.Segment)
	}
}
