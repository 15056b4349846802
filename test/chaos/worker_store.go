package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

// storeCommitTimeout bounds one CommitTx: waiting for the grant's
// publication, the transaction, and resolving a lost COMMIT answer.
const storeCommitTimeout = 8 * time.Second

// storeCommits commits one or two segments of operation op to the store
// with the library (Operation.CommitTx), each appending a row that states
// what the worker believed: its grant's fence and request, the segment, the
// payload. Unknown outcomes are the library's to resolve (it ends the
// session that ran the transaction and reads the receipts) and, when it
// cannot, to record on the LockGrant. It returns the segments acknowledged.
func (w *worker) storeCommits(ctx context.Context, lock *lockclient.Lock, res, reqID, op string) int64 {
	if w.db == nil {
		return 0
	}
	operation := lock.Operation(op)
	segments := 1 + w.rnd.IntN(2)
	var acked int64
	for seg := acked + 1; seg <= int64(segments); seg = acked + 1 {
		row := w.storeRow(res, reqID, op, lock.Fence(), seg, "")
		id := w.log.emit(Event{Kind: "store-call", Resource: res, Object: lockclient.StoreKind + "/" + row.table, RequestID: reqID, Fence: row.fence, Segment: seg, Payload: row.payload})
		sctx, cancel := context.WithTimeout(ctx, storeCommitTimeout)
		rcpt, err := operation.CommitTx(sctx, w.db, row.payload, row.insert(sctx))
		cancel()
		ret := Event{ID: id, Kind: "store", Resource: res, Object: lockclient.StoreKind + "/" + row.table, RequestID: reqID, Fence: row.fence, Segment: seg, Payload: row.payload}
		switch d, denied := lockclient.AsDenial(err); {
		case err == nil:
			ret.Outcome = "ok"
			if rcpt.Segment != seg || rcpt.Fence != row.fence {
				ret.Detail = fmt.Sprintf("the store numbered it fence %d segment %d", rcpt.Fence, rcpt.Segment)
			}
		case denied:
			ret.Outcome, ret.Detail = "denied", string(d.Verdict)+": "+d.Message
		case errors.Is(err, lockclient.ErrMutationUnknown):
			ret.Outcome, ret.Detail = "unknown", err.Error()
		default:
			ret.Outcome, ret.Detail = "rejected", err.Error()
		}
		w.log.emit(ret)
		if err != nil {
			break
		}
		acked++
	}
	return acked
}

// ledgerRow is one row a worker appends to a resource's business table.
type ledgerRow struct {
	table, res, req, op, owner, payload string
	fence, segment                      int64
}

// storeRow states a row; marker tells an adversary's rows apart.
func (w *worker) storeRow(res, req, op string, f, seg int64, marker string) ledgerRow {
	r := ledgerRow{table: storeTable(w.o.Namespace, res), res: w.o.Namespace + "/" + res, req: req, op: op, owner: w.o.Name, fence: f, segment: seg}
	r.payload, _ = fence.PayloadDigest(map[string]any{"resource": r.res, "fence": f, "request": req, "operation": op, "segment": seg, "worker": w.o.Name, "marker": marker})
	return r
}

// insert appends the row in tx, after taking the resource's advisory lock
// (held to the transaction's end): rows of one resource get their seq in
// the order their transactions commit, whoever wrote them.
func (r ledgerRow) insert(ctx context.Context) func(pgx.Tx) error {
	return func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", r.res); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, fmt.Sprintf("INSERT INTO %s (resource, fence, request, operation, segment, payload, worker) VALUES ($1, $2, $3, $4, $5, $6, $7)",
			pgx.Identifier{r.table}.Sanitize()), r.res, r.fence, r.req, r.op, r.segment, r.payload, r.owner)
		return err
	}
}

// storeAttack, as soon as the store shows a fence above the ended grant g
// accepted, commits g's next segment anyway, twice: through begin_segment
// with the old grant (bypassing the lock client's Guard), and as a plain
// INSERT with no segment at all. The store must refuse both: STALE_OWNER,
// and the protected table's FENCE_REQUIRED.
func (w *worker) storeAttack(ctx context.Context, g oldGrant) {
	if w.db == nil || g.g.FenceToken == 0 || !w.waitStoreSuperseded(ctx, g) {
		return
	}
	seg := g.storeSegs + 1
	row := w.storeRow(g.res, g.g.RequestID, g.storeOp, g.g.FenceToken, seg, "stale")
	env := fence.Envelope{Grant: g.g, Proof: g.proof, Operation: g.storeOp, Segment: seg, Payload: row.payload}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	sent := time.Now().UnixNano()
	_, err := pgfence.Commit(sctx, w.db, env, row.insert(sctx))
	cancel()
	w.log.emit(Event{Kind: "store-stale", Resource: g.res, RequestID: row.req, Fence: row.fence, Segment: seg, Payload: row.payload, Sent: sent, Outcome: storeOutcome(err), Detail: errText(err)})

	raw := w.storeRow(g.res, g.g.RequestID, g.storeOp, g.g.FenceToken, seg, "raw")
	sctx, cancel = context.WithTimeout(ctx, 5*time.Second)
	sent = time.Now().UnixNano()
	err = pgx.BeginFunc(sctx, w.db, raw.insert(sctx))
	cancel()
	w.log.emit(Event{Kind: "store-raw", Resource: g.res, RequestID: raw.req, Fence: raw.fence, Segment: seg, Payload: raw.payload, Sent: sent, Outcome: storeOutcome(err), Detail: errText(err)})
}

// waitStoreSuperseded polls the store for up to a second until the
// resource's highest accepted fence is above g's.
func (w *worker) waitStoreSuperseded(ctx context.Context, g oldGrant) bool {
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := pgfence.ResourceState(qctx, w.db, g.g.Resource)
		cancel()
		if err == nil && st.HighestFence > g.g.FenceToken {
			return true
		}
		_ = ctxtime.Sleep(ctx, 50*time.Millisecond)
	}
	return false
}

// storeOutcome of an adversary store write: only "ok" (a violation) and
// "denied" (a refusal of the fencekeeper schema) are judged.
func storeOutcome(err error) string {
	if err == nil {
		return "ok"
	}
	if _, refused := pgfence.AsRefusal(err); refused {
		return "denied"
	}
	return "refused"
}
