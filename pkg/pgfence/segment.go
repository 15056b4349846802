package pgfence

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// ErrShadowed is BeginSegment's answer when the resource is in Shadow and
// Enforce would have refused the segment: the transaction may go on, the
// refusal is recorded in fencekeeper.shadow_refusals.
var ErrShadowed = errors.New("pgfence: segment let through by Shadow")

// BeginSegment runs fencekeeper.begin_segment with env as the first
// statement of tx and returns the new receipt. A refusal is a *RefusalError
// (AsRefusal); the caller must then roll tx back.
func BeginSegment(ctx context.Context, tx pgx.Tx, env fence.Envelope) (string, error) {
	var receipt *string
	if err := tx.QueryRow(ctx, "SELECT fencekeeper.begin_segment($1::jsonb)", env.Encode()).Scan(&receipt); err != nil {
		if re, ok := AsRefusal(err); ok {
			return "", re
		}
		return "", err
	}
	if receipt == nil {
		return "", ErrShadowed
	}
	return *receipt, nil
}

// State is a resource's fence state at the store.
type State struct {
	Found        bool
	HighestFence int64
	Root         string
	LastSegment  int64
	GrantDigest  string
	Mode         string
	Generation   int64
}

// NextSegment is the segment a write under g continues with.
func (s State) NextSegment(g grant.Grant) int64 {
	return fence.NextSegment(fence.State{HighestFence: s.HighestFence, LastSegment: s.LastSegment, GrantDigest: s.GrantDigest}, g)
}

// ResourceState reads the resource's fence state.
func ResourceState(ctx context.Context, q Querier, resourceID string) (State, error) {
	var s State
	err := q.QueryRow(ctx, "SELECT highest_fence, root, last_segment, grant_digest, mode, generation FROM fencekeeper.resource_state($1)", resourceID).
		Scan(&s.HighestFence, &s.Root, &s.LastSegment, &s.GrantDigest, &s.Mode, &s.Generation)
	if errors.Is(err, pgx.ErrNoRows) {
		return State{}, nil
	}
	s.Found = err == nil
	return s, err
}

// StoredReceipt is one accepted segment as the store keeps it.
type StoredReceipt struct {
	fence.Receipt
	CommittedAt time.Time
}

// FindReceipts returns the receipts the store keeps for an operation of a
// resource, oldest first: how a commit whose answer was lost is resolved.
func FindReceipts(ctx context.Context, q Querier, resourceID, operation string) ([]StoredReceipt, error) {
	rows, err := q.Query(ctx, "SELECT fence, segment, payload, receipt, committed_at FROM fencekeeper.find_receipts($1, $2)", resourceID, operation)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (StoredReceipt, error) {
		r := StoredReceipt{Receipt: fence.Receipt{Operation: operation}}
		err := row.Scan(&r.Fence, &r.Segment, &r.Payload, &r.Receipt.Receipt, &r.CommittedAt)
		return r, err
	})
}

// Published reports whether the grant is published at the store and not ended.
func Published(ctx context.Context, q Querier, digest string) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, "SELECT fencekeeper.published($1)", digest).Scan(&ok)
	return ok, err
}

// PublishedState is Published and ResourceState in one round trip: what a
// client waiting for its grant's publication asks at each look.
func PublishedState(ctx context.Context, q Querier, digest, resourceID string) (bool, State, error) {
	var published bool
	var s State
	var highest, last, generation *int64
	var root, grantDigest, mode *string
	err := q.QueryRow(ctx, "SELECT fencekeeper.published($1), s.highest_fence, s.root, s.last_segment, s.grant_digest, s.mode, s.generation "+
		"FROM (SELECT 1) one LEFT JOIN fencekeeper.resource_state($2) s ON true", digest, resourceID).
		Scan(&published, &highest, &root, &last, &grantDigest, &mode, &generation)
	if err != nil || highest == nil {
		return published, State{}, err
	}
	s = State{Found: true, HighestFence: *highest, Root: *root, LastSegment: *last, GrantDigest: *grantDigest, Mode: *mode, Generation: *generation}
	return published, s, nil
}

// Outcome is what the receipts prove about a segment whose commit answer was lost.
type Outcome int

// Outcomes of Resolve.
const (
	// Applied: the segment's receipt is stored; it committed.
	Applied Outcome = iota
	// Absent: the resource is still at the segment's fence and no receipt
	// of it is stored; it did not commit and never will (its transaction is over).
	Absent
	// Undeterminable: a higher fence was accepted since, and the receipts
	// of older fences are not kept.
	Undeterminable
)

func (o Outcome) String() string {
	return [...]string{"applied", "proven absent", "undeterminable"}[o]
}

// Resolve decides whether the segment env committed, from the store's
// receipts and fence state. Call it on a fresh connection after the
// transaction's session is gone (a cut connection's transaction is rolled
// back or committed by then), never guess.
func Resolve(ctx context.Context, q Querier, env fence.Envelope) (Outcome, string, error) {
	g := env.Grant
	rs, err := FindReceipts(ctx, q, g.Resource, env.Operation)
	if err != nil {
		return Undeterminable, "", err
	}
	want := fence.ReceiptDigest(g.Resource, g.FenceToken, g.OperationRoot, env.Segment, env.Operation, env.Payload)
	for _, r := range rs {
		if r.Receipt.Receipt == want {
			return Applied, want, nil
		}
	}
	st, err := ResourceState(ctx, q, g.Resource)
	if err != nil {
		return Undeterminable, "", err
	}
	if st.HighestFence <= g.FenceToken {
		return Absent, "", nil
	}
	return Undeterminable, "", fmt.Errorf("pgfence: fence %d was superseded by fence %d at %s; its receipts are no longer kept",
		g.FenceToken, st.HighestFence, g.Resource)
}
