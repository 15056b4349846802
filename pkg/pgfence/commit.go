package pgfence

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

// Errors of a commit whose answer was lost.
var (
	// ErrNotApplied: the answer to COMMIT was lost and the receipts prove the
	// segment absent: nothing of it landed, and nothing of it can land any
	// more. The caller may commit the change again as a new segment.
	ErrNotApplied = errors.New("pgfence: the segment was not applied")
	// ErrOutcomeUnknown: the answer to COMMIT was lost and nothing decided
	// whether the segment committed (a newer fence pruned the receipts, the
	// resource is in Shadow, or ctx ended first). The change may have landed.
	ErrOutcomeUnknown = errors.New("pgfence: the segment's outcome is unknown")
)

// Pool is where Commit runs: a pool of connections such as *pgxpool.Pool.
// Each transaction takes a connection from it, and a commit whose answer was
// lost is resolved on another one (a connection that failed is never handed
// out again). A single *pgx.Conn cannot be one: once its connection is cut it
// cannot open another, so such a commit could never be resolved.
type Pool interface {
	Beginner
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// backend identifies the server process that ran a transaction: its PID,
// and its start time so that a later process given the same PID is not
// taken for it.
type backend struct {
	pid   uint32
	start *time.Time
}

// Commit runs fn as one fenced segment: it begins a transaction on db,
// runs BeginSegment with env as its first statement, then fn(tx), then
// COMMIT, and returns the segment's receipt.
//
//   - ALREADY_APPLIED is success: the segment committed earlier, and its
//     original receipt is returned (fn does not run). So is the last
//     accepted segment sent again, which begin_segment refuses as
//     FENCE_REQUIRED: its receipt is read from the store;
//   - a refusal, of begin_segment or at COMMIT (a grant that ended in the
//     meantime), is a *RefusalError, and any other error before COMMIT, of
//     COMMIT before it was sent, or an ERROR the server answered COMMIT
//     with, means nothing of the segment landed;
//   - when COMMIT got no answer (or the server ended the session: FATAL),
//     Commit never guesses. On another connection
//     of db (retried while the database cannot be reached, as long as ctx
//     lasts) it terminates the server process that ran the transaction if it
//     is still there (pg_terminate_backend: a role may end its own sessions)
//     and waits until it is gone, since then its transaction is decided; only
//     then it reads the receipts (Resolve). Applied: the receipt; proven
//     absent: ErrNotApplied; otherwise, or when ctx ends first,
//     ErrOutcomeUnknown. Both wrap the error COMMIT returned.
//
// In Shadow, a segment that Enforce would refuse is let through (recorded in
// fencekeeper.shadow_refusals): fn runs and the transaction commits with no
// receipt, and Commit returns "" and nil. Such a commit whose answer was lost
// is ErrOutcomeUnknown, since no receipt can show it.
func Commit(ctx context.Context, db Pool, env fence.Envelope, fn func(pgx.Tx) error) (string, error) {
	conn, err := db.Acquire(ctx)
	if err != nil {
		return "", fmt.Errorf("pgfence: begin: %w", err)
	}
	// The connection goes back to db before any resolution takes another.
	release := sync.OnceFunc(conn.Release)
	defer release()
	ran, err := backendOf(ctx, conn.Conn())
	if err != nil {
		return "", fmt.Errorf("pgfence: begin: %w", err)
	}
	tx, receipt, err := beginSegmentTx(ctx, conn.Conn(), env)
	switch re, refused := AsRefusal(err); {
	case refused && re.Verdict == fence.AlreadyApplied:
		return re.Receipt, nil
	case refused && re.Verdict == fence.FenceRequired:
		release()
		return sentAgain(ctx, db, env, re)
	case err != nil:
		return "", err
	}
	// After a commit, successful or not, Rollback does nothing.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return "", err
	}
	cerr := tx.Commit(ctx)
	release()
	if cerr == nil {
		return receipt, nil
	}
	if answered(cerr) {
		if re, ok := AsRefusal(cerr); ok {
			return "", re
		}
		return "", fmt.Errorf("pgfence: commit: %w", cerr)
	}
	if receipt == "" {
		return "", fmt.Errorf("%w: COMMIT of a segment Shadow let through got no answer, and no receipt can show it: %w", ErrOutcomeUnknown, cerr)
	}
	return resolveLost(ctx, db, env, ran, cerr)
}

// sentAgain tells the replay of the last accepted segment, which
// begin_segment refuses as FENCE_REQUIRED (the envelope of the last accepted
// segment again, as the webhook refuses an object write that keeps its fence
// annotation), from a real refusal: the receipts show it applied.
func sentAgain(ctx context.Context, db Pool, env fence.Envelope, refusal *RefusalError) (string, error) {
	conn, err := db.Acquire(ctx)
	if err != nil {
		return "", refusal
	}
	defer conn.Release()
	if out, receipt, err := Resolve(ctx, conn, env); err == nil && out == Applied {
		return receipt, nil
	}
	return "", refusal
}

// Keys of what Commit keeps about a connection (pgconn's CustomData).
const (
	backendStartKey = "fencekeeper.backend_start"
	// slowBeginKey: begin_segment_enforced cannot be called on this
	// connection (a schema older than version 3, or not granted).
	slowBeginKey = "fencekeeper.slow_begin"
)

// PostgreSQL's SQLSTATEs for a function that does not exist or may not be called.
const (
	sqlStateUndefinedFunction     = "42883"
	sqlStateInsufficientPrivilege = "42501"
)

// backendOf identifies the server process of c, reading its start time
// once per connection, for resolveLost.
func backendOf(ctx context.Context, c *pgx.Conn) (backend, error) {
	b := backend{pid: c.PgConn().PID()}
	data := c.PgConn().CustomData()
	if start, ok := data[backendStartKey].(*time.Time); ok {
		b.start = start
		return b, nil
	}
	if err := c.QueryRow(ctx, "SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()").Scan(&b.start); err != nil {
		return b, err
	}
	data[backendStartKey] = b.start
	return b, nil
}

// beginSegmentTx begins a transaction on c whose first statement begins the
// segment env, and returns it with the segment's receipt ("" when Shadow let
// the segment through). Where it can, it sends BEGIN and
// begin_segment_enforced as one message, so that a segment costs no round
// trip more than a plain transaction; the envelope then travels as a
// literal, which is safe with standard_conforming_strings (a JSON document
// has no NUL). A segment Shadow would let through, or a schema without
// begin_segment_enforced, takes the two round trips of BEGIN and
// BeginSegment. On an error nothing is open on c.
func beginSegmentTx(ctx context.Context, c *pgx.Conn, env fence.Envelope) (pgx.Tx, string, error) {
	g := env.Grant
	receipt := fence.ReceiptDigest(g.Resource, g.FenceToken, g.OperationRoot, env.Segment, env.Operation, env.Payload)
	doc := env.Encode()
	data := c.PgConn().CustomData()
	if data[slowBeginKey] == nil && c.PgConn().ParameterStatus("standard_conforming_strings") == "on" && !strings.ContainsRune(doc, 0) {
		begin := "BEGIN; SELECT fencekeeper.begin_segment_enforced(" + quoteLiteral(doc) + "::jsonb, " + quoteLiteral(receipt) + ")"
		tx, err := c.BeginTx(ctx, pgx.TxOptions{BeginQuery: begin})
		if err == nil {
			return tx, receipt, nil
		}
		abandon(ctx, c)
		var pe *pgconn.PgError
		switch {
		case !errors.As(err, &pe):
			return nil, "", err
		case pe.Code == sqlStateUndefinedFunction || pe.Code == sqlStateInsufficientPrivilege:
			data[slowBeginKey] = true
		case pe.Code != SQLStateShadowed:
			if re, ok := AsRefusal(err); ok {
				return nil, "", re
			}
			return nil, "", err
		}
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		return nil, "", err
	}
	r, err := BeginSegment(ctx, tx, env)
	switch {
	case errors.Is(err, ErrShadowed):
		return tx, "", nil
	case err != nil:
		_ = tx.Rollback(ctx)
		return nil, "", err
	}
	return tx, r, nil
}

// abandon rolls back the transaction block a failed BEGIN message left open.
func abandon(ctx context.Context, c *pgx.Conn) {
	if !c.IsClosed() && c.PgConn().TxStatus() != 'I' {
		if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
			_ = c.Close(ctx)
		}
	}
}

// quoteLiteral is s as an SQL string literal (standard_conforming_strings on).
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// answered reports whether COMMIT's error decided the transaction: the
// server answered with an ERROR (it rolled back), or COMMIT was never sent.
// A FATAL one does not: the server process is ending its session, which a
// COMMIT may have committed first (one waiting on a synchronous standby
// when it is terminated commits locally, warns, then ends with FATAL).
func answered(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Severity != "FATAL" && pe.Severity != "PANIC"
	}
	return errors.Is(err, pgx.ErrTxCommitRollback) || pgconn.SafeToRetry(err)
}

// resolveLost decides a segment whose COMMIT got no answer, on fresh
// connections of db, retrying while the database cannot be reached.
func resolveLost(ctx context.Context, db Pool, env fence.Envelope, ran backend, cause error) (string, error) {
	for attempt := 0; ; attempt++ {
		out, receipt, err := resolveOnce(ctx, db, env, ran)
		switch {
		case err == nil && out == Applied:
			return receipt, nil
		case err == nil && out == Absent:
			return "", fmt.Errorf("%w: COMMIT got no answer, and the receipts prove segment %d of fence %d absent: %w",
				ErrNotApplied, env.Segment, env.Grant.FenceToken, cause)
		case !errors.Is(err, errUnreachable):
			return "", fmt.Errorf("%w: COMMIT got no answer (%w), and the receipts cannot decide it: %w", ErrOutcomeUnknown, cause, err)
		}
		if serr := ctxtime.Sleep(ctx, min(time.Duration(attempt+1)*50*time.Millisecond, time.Second)); serr != nil {
			return "", fmt.Errorf("%w: COMMIT got no answer (%w), and the database stayed unreachable: %w", ErrOutcomeUnknown, cause, err)
		}
	}
}

// errUnreachable marks a failure of the connection, worth another attempt.
var errUnreachable = errors.New("pgfence: database unreachable")

// resolveOnce ends the process that ran the transaction, then reads the
// receipts, on one connection of db. A failure with a connection that no
// longer answers is errUnreachable; any other is final.
func resolveOnce(ctx context.Context, db Pool, env fence.Envelope, ran backend) (Outcome, string, error) {
	conn, err := db.Acquire(ctx)
	if err != nil {
		return Undeterminable, "", fmt.Errorf("%w: %w", errUnreachable, err)
	}
	defer conn.Release()
	out, receipt, err := endThenResolve(ctx, conn, env, ran)
	if err != nil && ctx.Err() == nil && conn.Ping(ctx) != nil {
		return out, receipt, fmt.Errorf("%w: %w", errUnreachable, err)
	}
	return out, receipt, err
}

func endThenResolve(ctx context.Context, q Querier, env fence.Envelope, ran backend) (Outcome, string, error) {
	if err := awaitEnded(ctx, q, ran); err != nil {
		return Undeterminable, "", err
	}
	return Resolve(ctx, q, env)
}

// awaitEnded terminates the server process ran if it is still there and
// waits until it is gone: its transaction is then committed or rolled back
// (a process leaves pg_stat_activity after it ended its transaction).
func awaitEnded(ctx context.Context, q Querier, ran backend) error {
	const match = "pid = $1 AND ($2::timestamptz IS NULL OR backend_start = $2)"
	if _, err := q.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "+match, int64(ran.pid), ran.start); err != nil {
		return fmt.Errorf("terminating server process %d: %w", ran.pid, err)
	}
	for attempt := 0; ; attempt++ {
		var there bool
		if err := q.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE "+match+")", int64(ran.pid), ran.start).Scan(&there); err != nil {
			return fmt.Errorf("waiting for server process %d to end: %w", ran.pid, err)
		}
		if !there {
			return nil
		}
		if err := ctxtime.Sleep(ctx, min(time.Duration(attempt+1)*10*time.Millisecond, 200*time.Millisecond)); err != nil {
			return fmt.Errorf("server process %d has not ended: %w", ran.pid, err)
		}
	}
}
