package lockclient_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// examplesStoreDSN names the workers' DSN of the PostgreSQL database the
// FencedResource "ledger" names as its store (spec.stores), with the
// fencekeeper schema installed and the table ledger protected.
// test/examples starts that database and sets it.
const examplesStoreDSN = "FENCEKEEPER_EXAMPLES_STORE_DSN"

// ExampleOperation_CommitTx writes a ledger row to PostgreSQL under the
// grant: the database itself refuses the segment unless the grant is the
// current one, so a worker whose lease ended cannot land it.
func ExampleOperation_CommitTx() {
	ctx := context.Background()
	db, err := pgxpool.New(ctx, os.Getenv(examplesStoreDSN))
	if err != nil {
		panic(err)
	}
	defer db.Close()
	c, _ := lockclient.NewForConfig(ctx, cfg, "billing")
	lock, err := c.Acquire(ctx, "ledger", lockclient.AcquireOptions{RequestID: "post-1"})
	if err != nil {
		panic(err)
	}
	defer lock.Orphan()

	entry := map[string]any{"id": 1, "amount": "100.00"}
	payload, err := fence.PayloadDigest(entry) // the digest of the change, stated by the worker
	if err != nil {
		panic(err)
	}
	receipt, err := lock.Operation("post-2026-07-19").CommitTx(ctx, db, payload, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO ledger (id, amount) VALUES ($1, $2)", entry["id"], entry["amount"])
		return err
	})
	if err != nil {
		panic(err) // errors.Is(err, lockclient.ErrStaleOwner), ErrExpired, ErrMutationUnknown, …
	}
	fmt.Printf("segment %d committed under fence %d\n", receipt.Segment, receipt.Fence)
	if err := lock.Release(ctx); err != nil {
		panic(err)
	}
	// Output:
	// segment 1 committed under fence 1
}
