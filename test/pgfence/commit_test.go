package pgfence_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

// receiptOf is the receipt the store gives env's segment.
func receiptOf(env fence.Envelope) string {
	g := env.Grant
	return fence.ReceiptDigest(g.Resource, g.FenceToken, g.OperationRoot, env.Segment, env.Operation, env.Payload)
}

// insertInvoice is a segment's business change: one invoice row.
func insertInvoice(ctx context.Context, id int, amount string) func(pgx.Tx) error {
	return func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO invoices VALUES ($1, $2)", id, amount)
		return err
	}
}

// invoiceAmount is the amount of invoice id ("" when there is none).
func invoiceAmount(t *testing.T, c *pgx.Conn, id int) string {
	t.Helper()
	var amount string
	err := c.QueryRow(context.Background(), "SELECT amount FROM invoices WHERE id = $1", id).Scan(&amount)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	must(t, err)
	return amount
}

// TestCommitReplay: a committed segment sent again is success with its
// original receipt, and nothing runs or lands twice; the same segment with
// another payload is QUARANTINED.
func TestCommitReplay(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	s := newStore(t, pgfence.InstallOptions{})
	s.invoices(t)
	a := grantOf("worker-a", 1, rootOf('a'))
	s.holds(t, pgfence.Enforce, a)
	pool := poolOf(t, server.DSN(s.name))

	env := w.envelope(w.issuer, a, 1, "100")
	first, err := pgfence.Commit(ctx, pool, env, insertInvoice(ctx, 1, "100"))
	if err != nil || first != receiptOf(env) {
		t.Fatalf("first commit: %q, %v; want receipt %s", first, err, receiptOf(env))
	}
	replay := func(what string) {
		t.Helper()
		ran := false
		again, err := pgfence.Commit(ctx, pool, env, func(tx pgx.Tx) error {
			ran = true
			return insertInvoice(ctx, 1, "100")(tx)
		})
		if err != nil || again != first || ran {
			t.Fatalf("%s: receipt %q, %v, change ran again: %v; want the original receipt %s", what, again, err, ran, first)
		}
	}
	// begin_segment refuses the last accepted envelope (FENCE_REQUIRED);
	// an earlier segment's is ALREADY_APPLIED. Both are success.
	replay("replay of the last segment")
	env2 := w.envelope(w.issuer, a, 2, "200")
	if _, err := pgfence.Commit(ctx, pool, env2, insertInvoice(ctx, 3, "200")); err != nil {
		t.Fatal(err)
	}
	replay("replay of an earlier segment")
	_, err = pgfence.Commit(ctx, pool, w.envelope(w.issuer, a, 1, "999"), insertInvoice(ctx, 2, "999"))
	var re *pgfence.RefusalError
	if !errors.As(err, &re) || re.Verdict != fence.Quarantined {
		t.Fatalf("another payload for segment 1: %v, want QUARANTINED", err)
	}
	if got := invoiceAmount(t, s.admin, 1); got != "100" {
		t.Fatalf("invoice 1 is %q, want 100", got)
	}
	if got := invoiceAmount(t, s.admin, 2); got != "" {
		t.Fatalf("the quarantined segment's invoice landed: %q", got)
	}
}

// TestCommitRefusals: a refusal at begin_segment or at COMMIT is a
// *RefusalError, an error of the change rolls it back; nothing lands.
func TestCommitRefusals(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	s := newStore(t, pgfence.InstallOptions{})
	s.invoices(t)
	a, b := grantOf("worker-a", 1, rootOf('a')), grantOf("worker-b", 2, rootOf('b'))
	s.holds(t, pgfence.Enforce, a)
	pool := poolOf(t, server.DSN(s.name))

	boom := errors.New("the change failed")
	_, err := pgfence.Commit(ctx, pool, w.envelope(w.issuer, a, 1, "1"), func(tx pgx.Tx) error {
		if err := insertInvoice(ctx, 1, "1")(tx); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("a failing change: %v", err)
	}
	// The registry ends A's grant while its transaction is open: COMMIT refuses.
	_, err = pgfence.Commit(ctx, pool, w.envelope(w.issuer, a, 1, "1"), func(tx pgx.Tx) error {
		if err := insertInvoice(ctx, 1, "1")(tx); err != nil {
			return err
		}
		must(t, pgfence.EndGrant(ctx, s.operator, a.Digest(), "Expired", now))
		must(t, pgfence.PublishGrant(ctx, s.operator, b, now.Add(hour)))
		return nil
	})
	if re, ok := pgfence.AsRefusal(err); !ok || re.Verdict != fence.NotHeld {
		t.Fatalf("a commit after the grant ended: %v, want NOT_HELD", err)
	}
	if _, err := pgfence.Commit(ctx, pool, w.envelope(w.issuer, b, 1, "2"), insertInvoice(ctx, 2, "2")); err != nil {
		t.Fatalf("B's segment: %v", err)
	}
	_, err = pgfence.Commit(ctx, pool, w.envelope(w.issuer, a, 2, "3"), insertInvoice(ctx, 3, "3"))
	if re, ok := pgfence.AsRefusal(err); !ok || re.Verdict != fence.StaleOwner {
		t.Fatalf("A after the handoff: %v, want STALE_OWNER", err)
	}
	for id, want := range map[int]string{1: "", 2: "2", 3: ""} {
		if got := invoiceAmount(t, s.admin, id); got != want {
			t.Fatalf("invoice %d is %q, want %q", id, got, want)
		}
	}
}

// TestCommitAnswerLost cuts the connection at COMMIT. When the server got
// it, the segment committed and Commit says so with its receipt, even when
// the server's commit is still waiting (for a synchronous standby that never
// answers: until that process ends, the receipt is invisible to every other
// session, so a read then would find the segment absent). When the server
// never got it, Commit proves it absent (ErrNotApplied) and the same segment
// can be committed again.
func TestCommitAnswerLost(t *testing.T) {
	w := newWorld(t)
	srv := faultServer(t)
	s := storeOn(t, srv)
	s.invoices(t)
	a := grantOf("worker-a", 1, rootOf('a'))
	s.holds(t, pgfence.Enforce, a)
	px := startProxy(t, srv.TCPAddress())
	pool := poolOf(t, tcpDSN(px.addr(), s.name))
	var segment int64
	id := 0
	for round := 1; round <= 3; round++ {
		for _, waits := range []bool{false, true} {
			segment++
			id++
			env := w.envelope(w.issuer, a, segment, fmt.Sprint(id))
			t.Run(fmt.Sprintf("the server got COMMIT, waits %v, #%d", waits, round), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				cuts := px.cuts.Load()
				px.arm(cutAfter)
				defer px.arm(forward)
				got, err := pgfence.Commit(ctx, pool, env, func(tx pgx.Tx) error {
					if waits {
						if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = on"); err != nil {
							return err
						}
					}
					return insertInvoice(ctx, id, fmt.Sprint(id))(tx)
				})
				if px.cuts.Load() != cuts+1 {
					t.Fatal("the proxy did not see the COMMIT")
				}
				if err != nil || got != receiptOf(env) {
					t.Fatalf("Commit: %q, %v; want receipt %s (the segment committed)", got, err, receiptOf(env))
				}
				if amount := invoiceAmount(t, s.admin, id); amount != fmt.Sprint(id) {
					t.Fatalf("invoice %d: %q", id, amount)
				}
			})
		}
		segment++
		id++
		env := w.envelope(w.issuer, a, segment, fmt.Sprint(id))
		t.Run(fmt.Sprintf("the server never got COMMIT #%d", round), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			px.arm(cutBefore)
			defer px.arm(forward)
			_, err := pgfence.Commit(ctx, pool, env, insertInvoice(ctx, id, fmt.Sprint(id)))
			if !errors.Is(err, pgfence.ErrNotApplied) {
				t.Fatalf("Commit: %v, want ErrNotApplied", err)
			}
			t.Logf("Commit: %v", err)
			if amount := invoiceAmount(t, s.admin, id); amount != "" {
				t.Fatalf("invoice %d landed: %q", id, amount)
			}
			got, err := pgfence.Commit(ctx, pool, env, insertInvoice(ctx, id, fmt.Sprint(id)))
			if err != nil || got != receiptOf(env) {
				t.Fatalf("the same segment again: %q, %v", got, err)
			}
		})
	}
}

// TestCommitServerKilled crashes PostgreSQL between begin_segment and
// COMMIT and restarts it a second later. The COMMIT reaches the proxy and
// gets no answer, so Commit resolves it, retrying while the server is down:
// nothing of the segment landed (ErrNotApplied), and the same segment is
// then accepted (not ALREADY_APPLIED). A segment acknowledged before the
// crash survives it, and so does one whose commit record was written when
// the server died (its COMMIT waiting on the standby): Commit reports it
// applied once the server has recovered.
func TestCommitServerKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := newWorld(t)
	srv := faultServer(t)
	s := storeOn(t, srv)
	s.invoices(t)
	a := grantOf("worker-a", 1, rootOf('a'))
	s.holds(t, pgfence.Enforce, a)
	px := startProxy(t, srv.TCPAddress())
	pool := poolOf(t, tcpDSN(px.addr(), s.name))
	restartIn := func(d time.Duration) <-chan error {
		done := make(chan error, 1)
		go func() {
			time.Sleep(d)
			done <- srv.Restart(ctx)
		}()
		return done
	}

	env1 := w.envelope(w.issuer, a, 1, "1")
	if _, err := pgfence.Commit(ctx, pool, env1, insertInvoice(ctx, 1, "1")); err != nil {
		t.Fatal(err)
	}
	env2 := w.envelope(w.issuer, a, 2, "2")
	var restarted <-chan error
	_, err := pgfence.Commit(ctx, pool, env2, func(tx pgx.Tx) error {
		if err := insertInvoice(ctx, 2, "2")(tx); err != nil {
			return err
		}
		pid := tx.Conn().PgConn().PID()
		if err := srv.Kill(); err != nil {
			return err
		}
		waitProcessGone(t, pid)
		restarted = restartIn(time.Second)
		return nil
	})
	must(t, <-restarted)
	if !errors.Is(err, pgfence.ErrNotApplied) {
		t.Fatalf("Commit across the crash: %v, want ErrNotApplied", err)
	}
	t.Logf("Commit across the crash: %v", err)
	admin := connect(t, srv.DSN(s.name))
	if got := invoiceAmount(t, admin, 1); got != "1" {
		t.Fatalf("the segment acknowledged before the crash: invoice 1 is %q", got)
	}
	if got := invoiceAmount(t, admin, 2); got != "" {
		t.Fatalf("invoice 2 landed: %q", got)
	}
	ran := false
	got, err := pgfence.Commit(ctx, pool, env2, func(tx pgx.Tx) error {
		ran = true
		return insertInvoice(ctx, 2, "2")(tx)
	})
	if err != nil || got != receiptOf(env2) || !ran {
		t.Fatalf("the same segment after the restart: %q, %v (ran %v)", got, err, ran)
	}

	// The server dies while the COMMIT of segment 3 waits on the standby.
	env3 := w.envelope(w.issuer, a, 3, "3")
	go func() {
		for ctx.Err() == nil {
			var waiting bool
			if admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event = 'SyncRep')").Scan(&waiting) == nil && waiting {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := srv.Kill(); err != nil {
			t.Error(err)
		}
		restarted = restartIn(time.Second)
	}()
	got, err = pgfence.Commit(ctx, pool, env3, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = on"); err != nil {
			return err
		}
		return insertInvoice(ctx, 3, "3")(tx)
	})
	must(t, <-restarted)
	if err != nil || got != receiptOf(env3) {
		t.Fatalf("a commit written when the server died: %q, %v; want its receipt", got, err)
	}
	admin = connect(t, srv.DSN(s.name))
	rs, err := pgfence.FindReceipts(ctx, admin, resourceID, env2.Operation)
	must(t, err)
	if len(rs) != 3 || invoiceAmount(t, admin, 3) != "3" {
		t.Fatalf("receipts %+v, want segments 1 to 3 and invoice 3", rs)
	}
}

// waitProcessGone waits until the process pid has exited (a backend of a
// killed postmaster exits once it notices).
func waitProcessGone(t *testing.T, pid uint32) {
	t.Helper()
	if _, err := os.Stat("/proc/self"); err != nil {
		time.Sleep(2 * time.Second) // no /proc: give it time
		return
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("server process %d still runs 30s after the crash", pid)
}

// TestCommitBeginPaths: Commit sends BEGIN and begin_segment_enforced as one
// message. A refusal there leaves the connection usable (the same server
// process commits the next segment); a segment Shadow lets through is begun
// again the long way, recorded once, and has no receipt; a schema older than
// version 3 is served the long way too, with the server's receipt.
func TestCommitBeginPaths(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	s := newStore(t, pgfence.InstallOptions{})
	s.invoices(t)
	a, b := grantOf("worker-a", 1, rootOf('a')), grantOf("worker-b", 2, rootOf('b'))
	s.holds(t, pgfence.Enforce, b, a)
	cfg, err := pgxpool.ParseConfig(server.DSN(s.name) + " user=" + workerRole)
	must(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	must(t, err)
	t.Cleanup(pool.Close)
	pid := func() uint32 {
		c, err := pool.Acquire(ctx)
		must(t, err)
		defer c.Release()
		return c.Conn().PgConn().PID()
	}

	env := w.envelope(w.issuer, b, 1, "1")
	if got, err := pgfence.Commit(ctx, pool, env, insertInvoice(ctx, 1, "1")); err != nil || got != receiptOf(env) {
		t.Fatalf("B's segment: %q, %v", got, err)
	}
	before := pid()
	_, err = pgfence.Commit(ctx, pool, w.envelope(w.issuer, a, 1, "2"), insertInvoice(ctx, 2, "2"))
	if re, ok := pgfence.AsRefusal(err); !ok || re.Verdict != fence.StaleOwner {
		t.Fatalf("A's stale segment: %v, want STALE_OWNER", err)
	}
	env = w.envelope(w.issuer, b, 2, "3")
	if got, err := pgfence.Commit(ctx, pool, env, insertInvoice(ctx, 3, "3")); err != nil || got != receiptOf(env) {
		t.Fatalf("B's segment after the refusal: %q, %v", got, err)
	}
	if after := pid(); after != before {
		t.Fatalf("the refusal cost the connection: server process %d, then %d", before, after)
	}

	must(t, pgfence.PublishResource(ctx, s.operator, resourceID, pgfence.Shadow, b.PolicyGeneration))
	got, err := pgfence.Commit(ctx, pool, w.envelope(w.issuer, a, 2, "4"), insertInvoice(ctx, 4, "4"))
	if err != nil || got != "" {
		t.Fatalf("A's stale segment in Shadow: %q, %v; want let through without a receipt", got, err)
	}
	var n int
	must(t, s.admin.QueryRow(ctx, "SELECT count(*) FROM fencekeeper.shadow_refusals WHERE verdict = 'STALE_OWNER'").Scan(&n))
	if n != 1 || invoiceAmount(t, s.admin, 4) != "4" {
		t.Fatalf("Shadow: %d STALE_OWNER records (want 1), invoice 4 %q", n, invoiceAmount(t, s.admin, 4))
	}

	old := newStore(t, pgfence.InstallOptions{Version: 2})
	old.invoices(t)
	old.holds(t, pgfence.Enforce, a)
	oldPool := poolOf(t, server.DSN(old.name))
	env = w.envelope(w.issuer, a, 1, "5")
	if got, err := pgfence.Commit(ctx, oldPool, env, insertInvoice(ctx, 5, "5")); err != nil || got != receiptOf(env) {
		t.Fatalf("a segment on schema version 2: %q, %v", got, err)
	}
	env = w.envelope(w.issuer, a, 2, "6")
	if got, err := pgfence.Commit(ctx, oldPool, env, insertInvoice(ctx, 6, "6")); err != nil || got != receiptOf(env) {
		t.Fatalf("the next segment on schema version 2: %q, %v", got, err)
	}
}

// TestReceiptsInCommitOrder: a transaction that started before another
// segment of the resource committed, and began its own segment after it,
// has the later committed_at.
func TestReceiptsInCommitOrder(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	s := newStore(t, pgfence.InstallOptions{})
	s.invoices(t)
	a := grantOf("worker-a", 1, rootOf('a'))
	s.holds(t, pgfence.Enforce, a)
	early, err := s.worker.Begin(ctx)
	must(t, err)
	defer func() { _ = early.Rollback(ctx) }()
	if _, err := early.Exec(ctx, "SELECT 1"); err != nil { // now() is fixed here
		t.Fatal(err)
	}
	other := connect(t, server.DSN(s.name)+" user="+workerRole)
	if _, err := segment(ctx, other, w.envelope(w.issuer, a, 1, "1"), "INSERT INTO invoices VALUES (1, '1')"); err != nil {
		t.Fatal(err)
	}
	if _, err := pgfence.BeginSegment(ctx, early, w.envelope(w.issuer, a, 2, "2")); err != nil {
		t.Fatal(err)
	}
	must(t, early.Commit(ctx))
	rs, err := pgfence.FindReceipts(ctx, s.worker, resourceID, "op-worker-a")
	if err != nil || len(rs) != 2 {
		t.Fatalf("receipts: %+v, %v", rs, err)
	}
	if !rs[1].CommittedAt.After(rs[0].CommittedAt) {
		t.Fatalf("segment 2 committed after segment 1 but has committed_at %s, not after %s", rs[1].CommittedAt, rs[0].CommittedAt)
	}
}
