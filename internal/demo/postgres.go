package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/pgserver"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

// The database half of the story: the same incident on an invoices row of
// a real PostgreSQL, refused by the database itself.
const (
	dbResource   = "invoices-2026-07"
	dbResourceID = "invoices/2026-07"
	database     = "billing"
	storeName    = "billing-db"
	operatorRole = "fencekeeper_operator"
	workerRole   = "billing_worker"
	ownerRole    = "billing_owner"
)

// workers are the story's two worker processes, reused by its database half.
type workers struct {
	a, b   *lockclient.Client
	pauseA *pause
}

// playDatabase starts a PostgreSQL, installs the fencekeeper schema,
// protects the invoices table and plays the incident on it.
func (s *story) playDatabase(ctx context.Context, admin client.Client, w workers) (err error) {
	fmt.Fprintln(s.out, "\nThe same incident on a database row: a PostgreSQL started from the machine's server binaries.")
	srv, err := pgserver.Start(ctx, pgserver.Options{Fast: true})
	if err != nil {
		return fmt.Errorf("starting PostgreSQL: %w", err)
	}
	defer func() { err = errors.Join(err, srv.Stop()) }()
	if err := s.installStore(ctx, srv); err != nil {
		return err
	}
	if err := s.registerStore(ctx, admin, srv); err != nil {
		return err
	}
	poolA, err := workerPool(ctx, srv, w.pauseA)
	if err != nil {
		return err
	}
	defer poolA.Close()
	poolB, err := workerPool(ctx, srv, nil)
	if err != nil {
		return err
	}
	defer poolB.Close()
	return s.playRow(ctx, w, poolA, poolB, srv)
}

// installStore creates the roles and the invoices table, installs the
// schema and puts the table under the resource's fence.
func (s *story) installStore(ctx context.Context, srv *pgserver.Server) error {
	if err := srv.CreateDatabase(ctx, database); err != nil {
		return err
	}
	setup := fmt.Sprintf(`CREATE ROLE %[1]s LOGIN; CREATE ROLE %[2]s LOGIN; CREATE ROLE %[3]s NOLOGIN;
		CREATE TABLE invoices (id int PRIMARY KEY, amount int NOT NULL, settled_by text NOT NULL);
		ALTER TABLE invoices OWNER TO %[3]s;
		GRANT SELECT, INSERT, UPDATE ON invoices TO %[2]s;`, operatorRole, workerRole, ownerRole)
	if err := srv.Exec(ctx, database, setup); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, srv.DSN(database))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(ctx) }()
	if err := pgfence.Install(ctx, conn, pgfence.InstallOptions{OperatorRole: operatorRole, WorkerRoles: []string{workerRole}}); err != nil {
		return err
	}
	if err := pgfence.Protect(ctx, conn, "invoices", dbResourceID); err != nil {
		return err
	}
	s.tl.log("platform", "database", "fencekeeper schema v%d installed; table invoices protected under %s", pgfence.SchemaVersion, dbResourceID)
	return nil
}

// registerStore creates the FencedResource naming the database as a store,
// with the operator's DSN in a Secret.
func (s *story) registerStore(ctx context.Context, admin client.Client, srv *pgserver.Server) error {
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: storeName},
		StringData: map[string]string{"dsn": srv.DSN(database) + " user=" + operatorRole}}
	if err := admin.Create(ctx, secret); err != nil {
		return err
	}
	fr := &locksv1.FencedResource{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: dbResource},
		Spec: locksv1.FencedResourceSpec{
			ResourceID: dbResourceID, LeaseDurationSeconds: int32(leaseTTL / time.Second), Enforcement: locksv1.EnforcementEnforce,
			Stores: []locksv1.StoreReference{{Name: storeName, SecretRef: locksv1.StoreSecretReference{Name: storeName}}},
		},
	}
	if err := admin.Create(ctx, fr); err != nil {
		return err
	}
	s.tl.log("platform", "protect", "FencedResource %s: store %s (PostgreSQL), lease %s, Enforce", dbResource, storeName, leaseTTL)
	return nil
}

// workerPool connects as the workers' role; p, when set, pauses the pool's
// connections like the worker's process. The simple protocol sends every
// statement as text, so the pause can see which one is begin_segment.
func workerPool(ctx context.Context, srv *pgserver.Server, p *pause) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(srv.DSN(database) + " user=" + workerRole)
	if err != nil {
		return nil, err
	}
	if p != nil {
		cfg.ConnConfig.DialFunc = p.dialer()
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// playRow: worker-a writes the invoice under fence 1 and pauses just
// before its next segment; worker-b takes over with fence 2 and writes;
// worker-a resumes and the database refuses it.
func (s *story) playRow(ctx context.Context, w workers, poolA, poolB *pgxpool.Pool, srv *pgserver.Server) error {
	lockA, err := w.a.Acquire(ctx, dbResource, lockclient.AcquireOptions{OnStateChange: s.tl.stateLogger("worker-a")})
	if err != nil {
		return fmt.Errorf("worker-a acquire: %w", err)
	}
	defer lockA.Orphan()
	s.tl.log("worker-a", "acquired", "fence=%d on %s", lockA.Fence(), dbResourceID)
	opA := lockA.Operation("close-invoices-by-worker-a")
	r, err := commitRow(ctx, opA, poolA, "INSERT INTO invoices VALUES (1, 100, 'worker-a')")
	s.tl.write("worker-a", lockA.Fence(), r.Segment, err)
	s.exp.check("worker-a's first segment accepted by the database", err == nil, "%v", err)

	bHeld := make(chan acquired, 1)
	go func() {
		l, err := w.b.Acquire(ctx, dbResource, lockclient.AcquireOptions{OnStateChange: s.tl.stateLogger("worker-b")})
		bHeld <- acquired{l, err}
	}()

	w.pauseA.arm(pauseFor)
	s.tl.log("worker-a", "stalls", "just before sending segment 2 to the database, for %s (lease %s)", pauseFor, leaseTTL)
	aDone := make(chan committed, 1)
	go func() {
		r, err := commitRow(ctx, opA, poolA, "UPDATE invoices SET amount = 999, settled_by = 'worker-a' WHERE id = 1")
		aDone <- committed{r, err}
	}()

	got := <-bHeld
	if got.err != nil {
		return fmt.Errorf("worker-b acquire: %w", got.err)
	}
	lockB := got.lock
	defer lockB.Orphan()
	s.tl.log("worker-b", "acquired", "fence=%d after the issuer expired worker-a's grant", lockB.Fence())
	r, err = commitRow(ctx, lockB.Operation("close-invoices-by-worker-b"), poolB, "UPDATE invoices SET amount = 250, settled_by = 'worker-b' WHERE id = 1")
	s.tl.write("worker-b", lockB.Fence(), r.Segment, err)
	s.exp.check("worker-b's segment accepted by the database", err == nil, "%v", err)

	resumed := <-aDone
	s.tl.write("worker-a", lockA.Fence(), resumed.receipt.Segment, resumed.err)
	s.exp.check("worker-a's resumed segment refused STALE_OWNER by the database", errors.Is(resumed.err, lockclient.ErrStaleOwner), "got %v", resumed.err)
	if err := lockB.Release(ctx); err != nil {
		return fmt.Errorf("worker-b release: %w", err)
	}
	s.tl.log("worker-b", "released", "")
	return s.rowOutcome(ctx, srv)
}

// commitRow commits one statement as the operation's next segment.
func commitRow(ctx context.Context, op *lockclient.Operation, pool *pgxpool.Pool, stmt string) (fence.Receipt, error) {
	payload, err := fence.PayloadDigest(map[string]any{"statement": stmt})
	if err != nil {
		return fence.Receipt{}, err
	}
	return op.CommitTx(ctx, pool, payload, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, stmt)
		return err
	})
}

// rowOutcome checks the invoice holds worker-b's result and prints it and
// the store's receipts.
func (s *story) rowOutcome(ctx context.Context, srv *pgserver.Server) error {
	conn, err := pgx.Connect(ctx, srv.DSN(database))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(ctx) }()
	var amount int
	var by string
	if err := conn.QueryRow(ctx, "SELECT amount, settled_by FROM invoices WHERE id = 1").Scan(&amount, &by); err != nil {
		return err
	}
	s.exp.check("the invoice row holds worker-b's result", amount == 250 && by == "worker-b", "amount %d by %s", amount, by)
	fmt.Fprintf(s.out, "\nFinal row invoices/1: amount %d, settled by %s\n", amount, by)
	return printStoreReceipts(ctx, s.out, conn)
}

func printStoreReceipts(ctx context.Context, out io.Writer, conn *pgx.Conn) error {
	rows, err := conn.Query(ctx, "SELECT fence, segment, operation, receipt FROM fencekeeper.receipts WHERE resource_id = $1 ORDER BY fence, segment", dbResourceID)
	if err != nil {
		return err
	}
	defer rows.Close()
	fmt.Fprintln(out, "Receipts in fencekeeper.receipts (kept while their fence is the highest):")
	for rows.Next() {
		var f, seg int64
		var op, rc string
		if err := rows.Scan(&f, &seg, &op, &rc); err != nil {
			return err
		}
		fmt.Fprintf(out, "  fence %d segment %d %-28s %s\n", f, seg, op, rc)
	}
	return rows.Err()
}
