package pgfence_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

// invoices is a business table owned by an application role (not the
// workers'), written by the workers, under resourceID's fence.
func (s *store) invoices(t *testing.T) {
	t.Helper()
	exec(t, s.admin, "CREATE TABLE invoices (id int PRIMARY KEY, amount text NOT NULL)")
	exec(t, s.admin, "ALTER TABLE invoices OWNER TO "+ownerRole)
	exec(t, s.admin, "GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON invoices TO "+workerRole+", "+breakGlassRole)
	must(t, pgfence.Protect(context.Background(), s.admin, "invoices", resourceID))
}

// holds publishes g as the resource's current holder.
func (s *store) holds(t *testing.T, mode pgfence.Mode, g grant.Grant, ended ...grant.Grant) {
	t.Helper()
	ctx := context.Background()
	must(t, pgfence.PublishResource(ctx, s.operator, g.Resource, mode, g.PolicyGeneration))
	for _, e := range ended {
		must(t, pgfence.PublishGrant(ctx, s.operator, e, now.Add(hour)))
		must(t, pgfence.EndGrant(ctx, s.operator, e.Digest(), "Expired", now))
	}
	must(t, pgfence.PublishGrant(ctx, s.operator, g, now.Add(hour)))
}

// segment runs begin_segment and then stmt in one transaction of conn,
// committing when both succeed.
func segment(ctx context.Context, conn *pgx.Conn, env fence.Envelope, stmt string, args ...any) (string, error) {
	var receipt string
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		r, err := pgfence.BeginSegment(ctx, tx, env)
		if err != nil && !errors.Is(err, pgfence.ErrShadowed) {
			return err
		}
		receipt = r
		_, err = tx.Exec(ctx, stmt, args...)
		return err
	})
	return receipt, err
}

func verdictOf(err error) fence.Verdict {
	if re, ok := pgfence.AsRefusal(err); ok {
		return re.Verdict
	}
	return ""
}

func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// TestStaleOwnerAtTheDatabase is the opening incident on a real database:
// A's lease ends while it is paused, B takes over and writes its row, A
// wakes up and writes under its old grant: refused, B's row intact.
func TestStaleOwnerAtTheDatabase(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	s := newStore(t, pgfence.InstallOptions{})
	s.invoices(t)
	a, b := grantOf("worker-a", 1, rootOf('a')), grantOf("worker-b", 2, rootOf('b'))

	s.holds(t, pgfence.Enforce, a)
	if _, err := segment(ctx, s.worker, w.envelope(w.issuer, a, 1, "100"), "INSERT INTO invoices VALUES (1, '100')"); err != nil {
		t.Fatalf("A's first segment: %v", err)
	}
	// A pauses; the registry ends its grant and issues fence 2 to B.
	s.holds(t, pgfence.Enforce, b, a)
	if _, err := segment(ctx, s.worker, w.envelope(w.issuer, b, 1, "250"), "UPDATE invoices SET amount = '250' WHERE id = 1"); err != nil {
		t.Fatalf("B's segment: %v", err)
	}
	_, err := segment(ctx, s.worker, w.envelope(w.issuer, a, 2, "999"), "UPDATE invoices SET amount = '999' WHERE id = 1")
	if verdictOf(err) != fence.StaleOwner {
		t.Fatalf("A's write after the handoff: %v, want STALE_OWNER", err)
	}
	var amount string
	must(t, s.admin.QueryRow(ctx, "SELECT amount FROM invoices WHERE id = 1").Scan(&amount))
	if amount != "250" {
		t.Fatalf("B's row is %q, want 250", amount)
	}
}

// TestProtectedTable: a change outside an accepted segment of the table's
// resource is FENCE_REQUIRED whoever makes it, break-glass roles aside.
func TestProtectedTable(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	s := newStore(t, pgfence.InstallOptions{BreakGlassRoles: []string{breakGlassRole}})
	s.invoices(t)
	a := grantOf("worker-a", 1, rootOf('a'))
	s.holds(t, pgfence.Enforce, a)

	refused := func(name string, err error) {
		t.Helper()
		if verdictOf(err) != fence.FenceRequired {
			t.Fatalf("%s: %v, want FENCE_REQUIRED", name, err)
		}
	}
	_, err := s.worker.Exec(ctx, "INSERT INTO invoices VALUES (1, '100')")
	refused("a worker's INSERT without a segment", err)
	_, err = s.admin.Exec(ctx, "INSERT INTO invoices VALUES (1, '100')")
	refused("a superuser's INSERT without a segment", err)
	owner := connect(t, server.DSN(s.name)+" user="+ownerRole)
	_, err = owner.Exec(ctx, "TRUNCATE invoices")
	refused("the owner's TRUNCATE", err)

	// A segment of another resource does not open this table.
	o := grantOf("worker-a", 1, rootOf('f'))
	o.Resource = "billing/other"
	s.holds(t, pgfence.Enforce, o)
	_, err = segment(ctx, s.worker, w.envelope(w.issuer, o, 1, "x"), "INSERT INTO invoices VALUES (1, '100')")
	refused("an INSERT under another resource's segment", err)

	if _, err := segment(ctx, s.worker, w.envelope(w.issuer, a, 1, "100"), "INSERT INTO invoices VALUES (1, '100')"); err != nil {
		t.Fatalf("an INSERT in an accepted segment: %v", err)
	}

	bg := connect(t, server.DSN(s.name)+" user="+breakGlassRole)
	if _, err := bg.Exec(ctx, "UPDATE invoices SET amount = '0' WHERE id = 1"); err != nil {
		t.Fatalf("break-glass UPDATE: %v", err)
	}
	var who, op, tbl string
	must(t, s.admin.QueryRow(ctx, "SELECT login_role, operation, table_name FROM fencekeeper.break_glass_audit").Scan(&who, &op, &tbl))
	if who != breakGlassRole || op != "UPDATE" || tbl != "public.invoices" {
		t.Fatalf("audit row: %s %s %s", who, op, tbl)
	}
}

// TestWorkerPrivileges: the workers' role can begin segments and write its
// tables, and nothing that would let it fence itself.
func TestWorkerPrivileges(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	s := newStore(t, pgfence.InstallOptions{BreakGlassRoles: []string{breakGlassRole}})
	s.invoices(t)
	a := grantOf("worker-a", 1, rootOf('a'))
	s.holds(t, pgfence.Enforce, a)
	forbidden := []string{
		"INSERT INTO fencekeeper.resources (resource_id) VALUES ('x')",
		"UPDATE fencekeeper.resources SET highest_fence = 0",
		"DELETE FROM fencekeeper.receipts",
		"INSERT INTO fencekeeper.receipts (resource_id, fence, segment, operation, payload, receipt) VALUES ('" + resourceID + "', 1, 1, 'o', 'p', 'r')",
		"UPDATE fencekeeper.grants SET ended_at = NULL",
		"SELECT * FROM fencekeeper.grants",
		"INSERT INTO fencekeeper.break_glass_roles VALUES ('" + workerRole + "')",
		"DELETE FROM fencekeeper.break_glass_audit",
		"UPDATE fencekeeper.issuer SET revoked_below_epoch = 0",
		"SELECT fencekeeper.publish_grant('sha256:x', '{}'::jsonb, now())",
		"SELECT fencekeeper.publish_resource('x', 'Enforce', 1)",
		"SELECT fencekeeper.end_grant('x', 'r', now())",
		"SELECT fencekeeper.publish_revocation(0)",
		"SELECT fencekeeper.publish_epoch(99)",
		"SELECT fencekeeper.protect('invoices', 'billing/other')",
		"ALTER TABLE invoices DISABLE TRIGGER fencekeeper_guard",
		"DROP TRIGGER fencekeeper_guard ON invoices",
		"SET session_replication_role = replica",
	}
	for _, stmt := range forbidden {
		_, err := s.worker.Exec(ctx, stmt)
		if code := sqlState(err); code != "42501" {
			t.Errorf("the workers' role ran %q: %v (SQLSTATE %q), want 42501 permission denied", stmt, err, code)
		}
	}
	// What it may do.
	if _, err := segment(ctx, s.worker, w.envelope(w.issuer, a, 1, "100"), "INSERT INTO invoices VALUES (1, '100')"); err != nil {
		t.Fatalf("a segment as the workers' role: %v", err)
	}
	if rs, err := pgfence.FindReceipts(ctx, s.worker, resourceID, "op-worker-a"); err != nil || len(rs) != 1 {
		t.Fatalf("receipts as the workers' role: %v %v", rs, err)
	}
	// Only the operator's role publishes; it cannot write the receipts.
	if _, err := s.operator.Exec(ctx, "DELETE FROM fencekeeper.receipts"); sqlState(err) != "42501" {
		t.Fatalf("the operator's role deleted receipts: %v", err)
	}
}

// TestShadow: in Shadow a refused segment and an unfenced write go through,
// recorded with what Enforce would have said; Enforce then refuses.
func TestShadow(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	s := newStore(t, pgfence.InstallOptions{})
	s.invoices(t)
	a, b := grantOf("worker-a", 1, rootOf('a')), grantOf("worker-b", 2, rootOf('b'))
	s.holds(t, pgfence.Shadow, b, a)
	if _, err := segment(ctx, s.worker, w.envelope(w.issuer, b, 1, "1"), "INSERT INTO invoices VALUES (1, '1')"); err != nil {
		t.Fatal(err)
	}
	if _, err := segment(ctx, s.worker, w.envelope(w.issuer, a, 1, "2"), "UPDATE invoices SET amount = '2'"); err != nil {
		t.Fatalf("a stale segment in Shadow: %v", err)
	}
	if _, err := s.worker.Exec(ctx, "UPDATE invoices SET amount = '3'"); err != nil {
		t.Fatalf("an unfenced write in Shadow: %v", err)
	}
	rows, err := s.admin.Query(ctx, "SELECT verdict, message FROM fencekeeper.shadow_refusals ORDER BY id")
	must(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		Verdict, Message string
	}])
	must(t, err)
	// The stale segment, its UPDATE (no accepted segment in its
	// transaction), and the unfenced UPDATE.
	if len(got) != 3 || got[0].Verdict != "STALE_OWNER" || got[1].Verdict != "FENCE_REQUIRED" || got[2].Verdict != "FENCE_REQUIRED" {
		t.Fatalf("shadow refusals: %+v", got)
	}
	must(t, pgfence.PublishResource(ctx, s.operator, resourceID, pgfence.Enforce, 1))
	if _, err := s.worker.Exec(ctx, "UPDATE invoices SET amount = '4'"); verdictOf(err) != fence.FenceRequired {
		t.Fatalf("an unfenced write in Enforce: %v", err)
	}
	_, err = segment(ctx, s.worker, w.envelope(w.issuer, a, 2, "5"), "UPDATE invoices SET amount = '5'")
	if verdictOf(err) != fence.StaleOwner {
		t.Fatalf("a stale segment in Enforce: %v", err)
	}
}

// TestUpgrade installs version 1, writes through it, installs the current
// version over it: every row kept, the last accepted envelope still
// recognised, and the store goes on.
func TestUpgrade(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	s := newStore(t, pgfence.InstallOptions{Version: 1})
	exec(t, s.admin, "CREATE TABLE ledger (id int PRIMARY KEY, amount text)")
	exec(t, s.admin, "GRANT SELECT, INSERT, UPDATE ON ledger TO "+workerRole)
	a := grantOf("worker-a", 1, rootOf('a'))
	s.holds(t, pgfence.Enforce, a)
	r1, err := segment(ctx, s.worker, w.envelope(w.issuer, a, 1, "1"), "INSERT INTO ledger VALUES (1, '1')")
	must(t, err)

	if err := pgfence.Install(ctx, s.admin, pgfence.InstallOptions{OperatorRole: operatorRole, WorkerRoles: []string{workerRole}}); err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	if v, _ := pgfence.InstalledVersion(ctx, s.admin); v != pgfence.SchemaVersion {
		t.Fatalf("installed version %d after the upgrade", v)
	}
	rs, err := pgfence.FindReceipts(ctx, s.worker, resourceID, "op-worker-a")
	if err != nil || len(rs) != 1 || rs[0].Receipt.Receipt != r1 {
		t.Fatalf("receipts after the upgrade: %+v %v", rs, err)
	}
	st, err := pgfence.ResourceState(ctx, s.worker, resourceID)
	if err != nil || st.HighestFence != 1 || st.LastSegment != 1 {
		t.Fatalf("state after the upgrade: %+v %v", st, err)
	}
	// The last accepted envelope, kept whole before version 3 and by its
	// digest since, is still recognised.
	if _, err := segment(ctx, s.worker, w.envelope(w.issuer, a, 1, "1"), "UPDATE ledger SET amount = '1'"); verdictOf(err) != fence.FenceRequired {
		t.Fatalf("the last accepted envelope again after the upgrade: %v, want FENCE_REQUIRED", err)
	}
	if _, err := segment(ctx, s.worker, w.envelope(w.issuer, a, 2, "2"), "UPDATE ledger SET amount = '2'"); err != nil {
		t.Fatalf("the next segment after the upgrade: %v", err)
	}
	// Again: nothing changes; an older version than installed is refused.
	must(t, pgfence.Install(ctx, s.admin, pgfence.InstallOptions{}))
	if err := pgfence.Install(ctx, s.admin, pgfence.InstallOptions{Version: 1}); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("installing version 1 over %d: %v", pgfence.SchemaVersion, err)
	}
	var n int
	must(t, s.admin.QueryRow(ctx, "SELECT count(*) FROM fencekeeper.receipts").Scan(&n))
	if n != 2 {
		t.Fatalf("%d receipts after reinstalling, want 2", n)
	}
}

// TestRecheckAtCommit: a transaction that began its segment under the
// current grant but commits after the grant ended lands nothing.
func TestRecheckAtCommit(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	s := newStore(t, pgfence.InstallOptions{})
	s.invoices(t)
	a, b := grantOf("worker-a", 1, rootOf('a')), grantOf("worker-b", 2, rootOf('b'))
	s.holds(t, pgfence.Enforce, a)
	tx, err := s.worker.Begin(ctx)
	must(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := pgfence.BeginSegment(ctx, tx, w.envelope(w.issuer, a, 1, "1")); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO invoices VALUES (1, '1')"); err != nil {
		t.Fatal(err)
	}
	// The registry ends A's grant and issues B's while A's transaction is open.
	must(t, pgfence.EndGrant(ctx, s.operator, a.Digest(), "Expired", now))
	must(t, pgfence.PublishGrant(ctx, s.operator, b, now.Add(hour)))
	if err := tx.Commit(ctx); verdictOf(err) != fence.NotHeld {
		t.Fatalf("A's commit after its grant ended: %v, want NOT_HELD", err)
	}
	var n int
	must(t, s.admin.QueryRow(ctx, "SELECT count(*) FROM invoices").Scan(&n))
	if n != 0 {
		t.Fatalf("%d rows landed", n)
	}
	if _, err := segment(ctx, s.worker, w.envelope(w.issuer, b, 1, "2"), "INSERT INTO invoices VALUES (1, '2')"); err != nil {
		t.Fatalf("B's segment: %v", err)
	}
}

// TestPublishEpoch: a publication of an issuer epoch below one the store
// took lands nothing (a deposed leader's, late: it would end the current
// holder at the store for good); the policy generation is the registry's,
// also when a restore took it back.
func TestPublishEpoch(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	s := newStore(t, pgfence.InstallOptions{})
	s.invoices(t)
	a, b := grantOf("worker-a", 1, rootOf('a')), grantOf("worker-b", 2, rootOf('b'))
	publishAs := func(epoch int64, fn func(tx pgx.Tx) error) error {
		return pgx.BeginFunc(ctx, s.operator, func(tx pgx.Tx) error {
			if err := pgfence.PublishEpoch(ctx, tx, epoch); err != nil {
				return err
			}
			return fn(tx)
		})
	}
	// The new leader (epoch 2) publishes B, A's end.
	must(t, publishAs(2, func(tx pgx.Tx) error {
		must(t, pgfence.PublishResource(ctx, tx, resourceID, pgfence.Enforce, b.PolicyGeneration))
		must(t, pgfence.PublishGrant(ctx, tx, a, now.Add(hour)))
		must(t, pgfence.EndGrant(ctx, tx, a.Digest(), "Expired", now))
		return pgfence.PublishGrant(ctx, tx, b, now.Add(hour))
	}))
	// The deposed leader (epoch 1) wakes up with A as the holder.
	err := publishAs(1, func(tx pgx.Tx) error {
		if err := pgfence.PublishGrant(ctx, tx, a, now.Add(hour)); err != nil {
			return err
		}
		return pgfence.EndGrant(ctx, tx, b.Digest(), "Released", now)
	})
	if sqlState(err) != pgfence.SQLStateEpochSuperseded || !strings.Contains(err.Error(), "EPOCH_SUPERSEDED") {
		t.Fatalf("a publication of epoch 1 after epoch 2: %v, want SQLSTATE %s", err, pgfence.SQLStateEpochSuperseded)
	}
	if ok, err := pgfence.Published(ctx, s.worker, b.Digest()); err != nil || !ok {
		t.Fatalf("B after the deposed leader's publication: published %v, %v", ok, err)
	}
	if _, err := segment(ctx, s.worker, w.envelope(w.issuer, b, 1, "b"), "INSERT INTO invoices VALUES (1, 'b')"); err != nil {
		t.Fatalf("B's segment: %v", err)
	}
	// The same epoch, and a higher one, publish.
	must(t, publishAs(2, func(pgx.Tx) error { return nil }))
	must(t, publishAs(3, func(tx pgx.Tx) error { return pgfence.PublishResource(ctx, tx, resourceID, pgfence.Enforce, 2) }))
	// A restore took that spec change back: generation 2 → 1.
	must(t, publishAs(3, func(tx pgx.Tx) error { return pgfence.PublishResource(ctx, tx, resourceID, pgfence.Enforce, 1) }))
	st, err := pgfence.ResourceState(ctx, s.worker, resourceID)
	if err != nil || st.Generation != 1 {
		t.Fatalf("the generation after the restore: %+v, %v; want 1", st, err)
	}
	if err := publishAs(2, func(pgx.Tx) error { return nil }); sqlState(err) != pgfence.SQLStateEpochSuperseded {
		t.Fatalf("epoch 2 after epoch 3: %v", err)
	}
}
