package fencectl

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

// receipts reads a receipt log from one of two places: the protected object
// of a FencedResource (FENCEDRESOURCE, on the cluster), or a resource's rows
// at a PostgreSQL fenced store (--resource, with --dsn). One command, so that
// "did my write land?" has one answer wherever the write went; --operation
// narrows either to one operation.

// receiptsFlags are receipts' own flags.
type receiptsFlags struct {
	dsn, resource, operation string
}

// atStore says whether the flags name a store rather than an object.
func (f *receiptsFlags) atStore(cmd *cobra.Command) bool {
	return cmd.Flags().Changed("dsn") || cmd.Flags().Changed("resource")
}

func (f *receiptsFlags) args(cmd *cobra.Command, args []string) error {
	switch atStore := f.atStore(cmd); {
	case atStore && len(args) > 0:
		return fmt.Errorf("receipts reads either FENCEDRESOURCE's object (on the cluster) or --resource at a PostgreSQL store (--dsn), not both")
	case atStore && f.resource == "":
		return fmt.Errorf("--dsn needs --resource ID: which resource of the store to read")
	case !atStore && len(args) != 1:
		return fmt.Errorf("receipts needs FENCEDRESOURCE (its object's receipt log) or --resource ID (a PostgreSQL store's, with --dsn or $%s) (see --help)", envDSN)
	}
	return nil
}

func (o *options) receiptsCmd() *cobra.Command {
	f := &receiptsFlags{}
	cmd := &cobra.Command{
		Use:   "receipts [FENCEDRESOURCE]",
		Short: "Show the receipt log and fence state of a FencedResource's protected object, or of a resource at a PostgreSQL store",
		Long: `With FENCEDRESOURCE: the receipt log and fence state stamped on its protected object.
With --resource ID: the receipts a PostgreSQL fenced store keeps for that
resource (--dsn, or $FENCEKEEPER_PG_DSN), with when each committed; without
--operation that reads fencekeeper.receipts, which the operator's role may
read, and a worker's role reads its own operation's with --operation.`,
		Example: `  # The fence state and receipt log stamped on invoice-batch-2026-07-19's protected object
  kubectl fence receipts invoice-batch-2026-07-19 -n billing

  # Did a write whose answer was lost land? Look for its operation and segment
  kubectl fence receipts fr/invoice-batch-2026-07-19 -n billing -o jsonpath='{range .receipts[*]}{.operation} {.segment} {.receipt}{"\n"}{end}'

  # The same for a PostgreSQL store: one operation's receipts (the DSN from FENCEKEEPER_PG_DSN, or --dsn)
  kubectl fence receipts --resource billing/invoice-batch --operation nightly-42
  kubectl fence receipts --dsn "postgres://fk_operator@db.example:5432/billing" --resource billing/invoice-batch -o json`,
		Args:              f.args,
		ValidArgsFunction: o.completeFirst(fencedResourceNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.atStore(cmd) {
				return o.storeReceipts(cmd.Context(), f)
			}
			if err := fencedResourceType.nameArgs(args); err != nil {
				return err
			}
			return o.objectReceipts(cmd.Context(), args[0], f.operation)
		},
	}
	addDSNFlag(cmd, &f.dsn)
	cmd.Flags().StringVar(&f.resource, "resource", "", "resource ID at the PostgreSQL store (instead of FENCEDRESOURCE)")
	cmd.Flags().StringVar(&f.operation, "operation", "", "show this operation's receipts only")
	o.addOutputFlags(cmd)
	return cmd
}

// objectReceipts prints the fence state and receipt log stamped on the
// protected object of FencedResource name.
func (o *options) objectReceipts(ctx context.Context, name, operation string) error {
	kube, err := o.kube()
	if err != nil {
		return err
	}
	var fr locksv1.FencedResource
	if err := kube.Get(ctx, client.ObjectKey{Namespace: o.ns(), Name: name}, &fr); err != nil {
		return explainAPI(err, "FencedResource "+name)
	}
	if fr.Spec.Target == nil {
		return fmt.Errorf("FencedResource %s has no target object", name)
	}
	t := fr.Spec.Target
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(schema.FromAPIVersionAndKind(t.APIVersion, t.Kind))
	if err := kube.Get(ctx, client.ObjectKey{Namespace: fr.Namespace, Name: t.Name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("%s %s does not exist yet: it is created by the first fenced write", t.Kind, t.Name)
		}
		return err
	}
	ann := obj.GetAnnotations()
	st, err := fence.StateOf(ann[fence.AnnotationFence], ann[fence.AnnotationReceipts])
	if err != nil {
		return fmt.Errorf("%s %s carries an unreadable fence state: %w", t.Kind, t.Name, err)
	}
	view := struct {
		Object        string          `json:"object"`
		HighestFence  int64           `json:"highestFence"`
		OperationRoot string          `json:"operationRoot,omitempty"`
		LastSegment   int64           `json:"lastSegment"`
		Receipts      []fence.Receipt `json:"receipts"`
	}{t.Kind + "/" + t.Name, st.HighestFence, st.Root, st.LastSegment, []fence.Receipt{}}
	for _, r := range st.Receipts {
		if operation == "" || r.Operation == operation {
			view.Receipts = append(view.Receipts, r)
		}
	}
	return o.emit(view, nil, func(bool) error {
		o.printf("%s: highest fence %d, last segment %d, operation root %s\n", view.Object, st.HighestFence, st.LastSegment, st.Root)
		tw := o.table("FENCE", "SEGMENT", "OPERATION", "PAYLOAD", "RECEIPT")
		for _, r := range view.Receipts {
			fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\n", r.Fence, r.Segment, r.Operation, r.Payload, r.Receipt)
		}
		return tw.Flush()
	})
}

// storeReceiptsView is receipts --resource's document: the object form's
// fields, for a store's resource, each receipt with when it committed.
type storeReceiptsView struct {
	Resource      string         `json:"resource"`
	Database      string         `json:"database"`
	Server        string         `json:"server"`
	HighestFence  int64          `json:"highestFence"`
	OperationRoot string         `json:"operationRoot,omitempty"`
	LastSegment   int64          `json:"lastSegment"`
	Receipts      []storeReceipt `json:"receipts"`
}

type storeReceipt struct {
	fence.Receipt
	CommittedAt time.Time `json:"committedAt"`
}

func (o *options) storeReceipts(ctx context.Context, f *receiptsFlags) error {
	dsn, err := dsnOf(f.dsn)
	if err != nil {
		return err
	}
	s, err := connectStore(ctx, dsn)
	if err != nil {
		return err
	}
	defer s.close()
	view, err := s.receipts(ctx, f.resource, f.operation)
	if err != nil {
		return err
	}
	return o.emit(view, nil, func(bool) error {
		o.printf("resource %s in %s: highest fence %d, last segment %d, operation root %s\n",
			view.Resource, s.where, view.HighestFence, view.LastSegment, view.OperationRoot)
		tw := o.table("FENCE", "SEGMENT", "OPERATION", "PAYLOAD", "RECEIPT", "COMMITTED")
		for _, r := range view.Receipts {
			fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\n", r.Fence, r.Segment, r.Operation, r.Payload, r.Receipt.Receipt, r.CommittedAt.UTC().Format(time.RFC3339))
		}
		return tw.Flush()
	})
}

// allReceiptsSQL reads every receipt a store keeps for a resource (the
// operator's role may; workers read one operation's through find_receipts).
const allReceiptsSQL = `SELECT fence, segment, operation, payload, receipt, committed_at
  FROM fencekeeper.receipts WHERE resource_id = $1 ORDER BY fence, segment`

const receiptsFix = "without --operation, receipts reads the table fencekeeper.receipts, which the operator's role may read; a worker's role reads one operation's receipts with --operation"

// receipts reads a resource's fence state and receipts at the store.
func (s *store) receipts(ctx context.Context, resource, operation string) (storeReceiptsView, error) {
	cfg := s.conn.Config()
	v := storeReceiptsView{Resource: resource, Database: s.database, Server: hostPort(cfg.Host, cfg.Port), Receipts: []storeReceipt{}}
	var installed bool
	if err := s.conn.QueryRow(ctx, "SELECT to_regnamespace('fencekeeper') IS NOT NULL").Scan(&installed); err != nil {
		return v, s.storeError(err, "look for the fencekeeper schema", "check the DSN")
	}
	if !installed {
		return v, fmt.Errorf("the fencekeeper schema is not installed in %s: install it with %s", s.where, installHint)
	}
	st, err := pgfence.ResourceState(ctx, s.conn, resource)
	if err != nil {
		return v, s.storeError(err, "read resource "+resource, "run receipts as the operator's or a worker's role (pg install --operator-role, --worker-role)")
	}
	if !st.Found {
		return v, fmt.Errorf("no resource %q is published at %s (kubectl fence pg status lists those that are)", resource, s.where)
	}
	v.HighestFence, v.OperationRoot, v.LastSegment = st.HighestFence, st.Root, st.LastSegment
	if operation != "" {
		found, err := pgfence.FindReceipts(ctx, s.conn, resource, operation)
		if err != nil {
			return v, s.storeError(err, "read the receipts of "+resource, receiptsFix)
		}
		for _, r := range found {
			v.Receipts = append(v.Receipts, storeReceipt{Receipt: r.Receipt, CommittedAt: r.CommittedAt})
		}
		return v, nil
	}
	rows, err := s.conn.Query(ctx, allReceiptsSQL, resource)
	if err != nil {
		return v, s.storeError(err, "read the receipts of "+resource, receiptsFix)
	}
	all, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (storeReceipt, error) {
		var r storeReceipt
		err := row.Scan(&r.Fence, &r.Segment, &r.Operation, &r.Payload, &r.Receipt.Receipt, &r.CommittedAt)
		return r, err
	})
	if err != nil {
		return v, s.storeError(err, "read the receipts of "+resource, receiptsFix)
	}
	v.Receipts = append(v.Receipts, all...)
	return v, nil
}
