package lockclient

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/jackc/pgx/v5"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

// storeAttempts bounds how often CommitTx numbers a segment again after
// another commit took the number, or after a lost COMMIT proven absent.
const storeAttempts = 8

// StoreKind is the kind an unresolved store commit is recorded under on the
// LockGrant (fencekeeper.dev/unresolved-mutation: "PostgreSQL/<resourceID>").
const StoreKind = "PostgreSQL"

// CommitTx commits the next segment of the operation to a PostgreSQL
// database under the lock's grant: fn makes the change in the transaction
// whose first statement, fencekeeper.begin_segment, accepted the segment
// (pgfence.Commit), and payload is the caller's digest of that change
// (fence.PayloadDigest of what it writes: the database cannot compute it).
//
// It waits until the operator has published the grant at the store, so a
// HELD lock never meets its own grant unpublished (while ctx lasts and the
// lock lives). The segment number continues from the store's fence state, so
// a restarted worker resumes where it stopped; after a commit the lock
// remembers where its grant stands at that database, and the next commit
// there sends its segment without reading first. The resource row's lock
// orders commits: one that finds its number taken by a commit made since it
// read the state (QUARANTINED, or ALREADY_APPLIED of another segment) is
// numbered again and fn runs again, in a new transaction; fn's work in a
// transaction that did not commit is gone. A commit of this operation that
// states the same change for the same number is the same segment: success,
// with its receipt, and the change is in the store once.
//
// What the result guarantees, as for Commit:
//   - nil: the segment is applied (its receipt is returned). In Shadow, a
//     segment Enforce would refuse is let through with an empty receipt;
//   - a *DenialError (errors.Is ErrStaleOwner, ErrNotHeld, …), a Guard error,
//     or any other error but ErrMutationUnknown: nothing of this commit
//     landed, nor can it later. A COMMIT whose answer was lost and that the
//     receipts prove absent is committed again, numbered anew;
//   - ErrMutationUnknown (an *UnknownOutcomeError, Object "PostgreSQL/<resourceID>"):
//     the receipts could not decide a COMMIT whose answer was lost; it is
//     recorded on the LockGrant for reconciliation, as Commit does.
func (op *Operation) CommitTx(ctx context.Context, db pgfence.Pool, payload string, fn func(pgx.Tx) error) (fence.Receipt, error) {
	var taken error
	for attempt := 0; attempt < storeAttempts; attempt++ {
		if err := op.lock.Guard(); err != nil {
			return fence.Receipt{}, err
		}
		g, proof := op.lock.Grant()
		next, ok := op.lock.storeNext(db, g)
		if !ok {
			st, err := op.storeReady(ctx, db, g)
			if err != nil {
				return fence.Receipt{}, err
			}
			next = st.NextSegment(g)
		}
		env := fence.Envelope{Grant: g, Proof: proof, Operation: op.id, Segment: next, Payload: payload}
		want := fence.Receipt{Fence: g.FenceToken, Segment: env.Segment, Operation: op.id, Payload: payload,
			Receipt: fence.ReceiptDigest(g.Resource, g.FenceToken, g.OperationRoot, env.Segment, op.id, payload)}
		got, err := pgfence.Commit(ctx, db, env, fn)
		r, again, err := op.settleStore(ctx, g, want, got, err)
		op.lock.storeCommitted(db, g, want.Segment, err == nil && got != "")
		if !again {
			return r, err
		}
		taken = err
	}
	return fence.Receipt{}, fmt.Errorf("lockclient: commit to %s kept meeting other commits: %w", op.lock.resource, taken)
}

// storeCursor is where a lock's grant stands at one database: the segment
// it last committed there.
type storeCursor struct {
	digest string
	last   int64
}

// storeNext is the segment that follows the last one g committed at db
// through this lock, when this lock committed one there since it holds g.
// The resource row's lock at the store is what orders segments: a number
// another commit took since is refused there, and CommitTx reads the
// store's state again (storeCommitted forgot the cursor).
func (l *Lock) storeNext(db pgfence.Pool, g grant.Grant) (int64, bool) {
	if !reflect.TypeOf(db).Comparable() {
		return 0, false
	}
	l.storesMu.Lock()
	defer l.storesMu.Unlock()
	c, ok := l.stores[db]
	if !ok || c.digest != g.Digest() {
		return 0, false
	}
	return c.last + 1, true
}

// storeCommitted moves the cursor past segment when it committed with a
// receipt, and forgets it otherwise (the next commit reads the store).
func (l *Lock) storeCommitted(db pgfence.Pool, g grant.Grant, segment int64, committed bool) {
	if !reflect.TypeOf(db).Comparable() {
		return
	}
	l.storesMu.Lock()
	defer l.storesMu.Unlock()
	if !committed {
		delete(l.stores, db)
		return
	}
	if l.stores == nil {
		l.stores = map[pgfence.Pool]storeCursor{}
	}
	if c, ok := l.stores[db]; !ok || c.digest != g.Digest() || c.last < segment {
		l.stores[db] = storeCursor{digest: g.Digest(), last: segment}
	}
}

// settleStore interprets pgfence.Commit's answer: the receipt, an error, or
// again (the number was taken, or the commit proven absent).
func (op *Operation) settleStore(ctx context.Context, g grant.Grant, want fence.Receipt, got string, err error) (fence.Receipt, bool, error) {
	switch {
	case err == nil && (got == want.Receipt || got == ""):
		want.Receipt = got
		return want, false, nil
	case err == nil:
		return fence.Receipt{}, true, fmt.Errorf("segment %d of fence %d is another commit's (receipt %s)", want.Segment, want.Fence, got)
	case errors.Is(err, pgfence.ErrNotApplied):
		return fence.Receipt{}, true, err
	case errors.Is(err, pgfence.ErrOutcomeUnknown):
		return fence.Receipt{}, false, op.storeUnknown(ctx, g, want, err)
	}
	re, ok := pgfence.AsRefusal(err)
	if !ok {
		return fence.Receipt{}, false, err
	}
	d := &DenialError{Verdict: re.Verdict, Message: re.Message, Receipt: re.Receipt}
	// The number was fresh when read: another commit took it since.
	return fence.Receipt{}, re.Verdict == fence.Quarantined, d
}

// storeReady waits until the grant is published at the store, and returns
// the resource's fence state read after that. A grant a newer fence
// superseded is sent at once: the store refuses it (STALE_OWNER).
func (op *Operation) storeReady(ctx context.Context, db pgfence.Pool, g grant.Grant) (pgfence.State, error) {
	for attempt := 0; ; attempt++ {
		published, st, err := storeView(ctx, db, g)
		if err != nil {
			return pgfence.State{}, fmt.Errorf("lockclient: reading the store's state of %s: %w", g.Resource, err)
		}
		if published || st.HighestFence > g.FenceToken {
			return st, nil
		}
		select {
		case <-ctx.Done():
			return pgfence.State{}, fmt.Errorf("lockclient: grant with fence %d of %s not published at the store: %w", g.FenceToken, g.Resource, ctx.Err())
		case <-op.lock.Done():
			return pgfence.State{}, op.lock.Guard()
		case <-time.After(publicationPoll(attempt)):
		}
	}
}

// publicationPoll is how long storeReady waits before asking again: the
// operator publishes within milliseconds of the issue, so at first often
// (a poll is one small query), then backing off to a second.
func publicationPoll(attempt int) time.Duration {
	if attempt < 20 {
		return 5 * time.Millisecond
	}
	return min(time.Duration(attempt-19)*20*time.Millisecond, time.Second)
}

func storeView(ctx context.Context, db pgfence.Pool, g grant.Grant) (bool, pgfence.State, error) {
	conn, err := db.Acquire(ctx)
	if err != nil {
		return false, pgfence.State{}, err
	}
	defer conn.Release()
	return pgfence.PublishedState(ctx, conn, g.Digest(), g.Resource)
}

// storeUnknown records a store commit the receipts could not decide on the
// LockGrant, as Commit does for an object, and returns it.
func (op *Operation) storeUnknown(ctx context.Context, g grant.Grant, want fence.Receipt, cause error) error {
	obj := &unstructured.Unstructured{}
	obj.SetKind(StoreKind)
	obj.SetName(g.Resource)
	return op.unknown(ctx, obj, Sent{Receipt: want, GrantDigest: g.Digest()}, cause.Error())
}
