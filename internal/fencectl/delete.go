package fencectl

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

func (o *options) deleteCmd() *cobra.Command {
	var operation string
	var unguarded bool
	cmd := &cobra.Command{
		Use:   "delete LOCKGRANT",
		Short: "Delete the protected object under a held grant (a fenced delete intent, then the delete)",
		Long: `delete removes the LockGrant's protected object (the target of its
FencedResource). The acceptance webhook allows a delete only when the
object's last accepted segment declared it under the current grant, so
delete first commits the next segment of the operation with the same
content and intent "delete", then deletes the object with the
resourceVersion that segment wrote as precondition. If anything wrote the
object in between, nothing is deleted.`,
		Example: `  # Delete the protected object under the held grant (a fenced delete intent, then the delete)
  kubectl fence delete invoice-batch-2026-07-19-f5a5dd7fb11e7b78 -n billing

  # As the last segment of a named operation
  kubectl fence delete invoice-batch-2026-07-19-f5a5dd7fb11e7b78 -n billing --operation nightly-42`,
		Args:              exactArgs("LOCKGRANT"),
		ValidArgsFunction: o.completeFirst(lockGrantNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := lockGrantType.nameArgs(args); err != nil {
				return err
			}
			ctx := cmd.Context()
			if operation == "" {
				operation = "kubectl-fence/" + args[0]
			}
			w, err := o.writer(ctx, args[0], "delete", operation, unguarded)
			if err != nil {
				return err
			}
			defer w.done()
			obj, err := o.targetObject(ctx, w.resource)
			if err != nil {
				return err
			}
			res := writeResult{Object: obj.GetKind() + "/" + obj.GetName(), Operation: operation, Fence: w.fence}
			r, err := w.delete(ctx, obj)
			if err == nil {
				res.Verdict, res.Segment, res.Payload, res.Receipt = fence.Accepted, r.Segment, r.Payload, r.Receipt
				return o.emit(res, nil, func(bool) error {
					o.printf("%s deleted: delete intent in fence %d, segment %d of operation %s\nreceipt %s\n", res.Object, res.Fence, res.Segment, operation, res.Receipt)
					return nil
				})
			}
			return o.deleteFailed(res, err)
		},
	}
	cmd.Flags().BoolVar(&unguarded, "unguarded", false, "Send the intent and the delete even if the grant is known to have ended, to see the acceptance webhook refuse them (testing; never for real work).")
	cmd.Flags().StringVar(&operation, "operation", "", "Operation ID (default: one per grant); the delete intent is its next segment.")
	o.addOutputFlags(cmd)
	return cmd
}

// deleteFailed reports a denied or refused delete: the -o document, or text with what to do.
func (o *options) deleteFailed(res writeResult, err error) error {
	switch d, denied := lockclient.AsDenial(err); {
	case errors.Is(err, lockclient.ErrMutationUnknown):
		return o.outcomeUnknown(res, err)
	case denied:
		res.Verdict, res.Message = d.Verdict, d.Message
	case errors.Is(err, lockclient.ErrChangedSinceIntent):
		res.Message = err.Error()
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%s does not exist: nothing to delete", res.Object)
	default:
		return err
	}
	if o.format.structured() {
		_ = o.emit(res, nil, nil)
		return exitError{1}
	}
	if res.Verdict == "" {
		fmt.Fprintf(o.stderr, "%s not deleted: %s\nWhat to do: read the object again (kubectl fence receipts) and run delete again if it should still go.\n", res.Object, res.Message)
		return exitError{1}
	}
	fmt.Fprintf(o.stderr, "%s not deleted: %s\n", res.Object, res.Message)
	if hint := nextStep[res.Verdict]; hint != "" {
		fmt.Fprintf(o.stderr, "What to do: %s\n", hint)
	}
	return exitError{1}
}

// targetObject is the FencedResource's protected object, to be read and
// deleted by the operation.
func (o *options) targetObject(ctx context.Context, resource string) (*unstructured.Unstructured, error) {
	kube, err := o.kube()
	if err != nil {
		return nil, err
	}
	var fr locksv1.FencedResource
	if err := kube.Get(ctx, client.ObjectKey{Namespace: o.ns(), Name: resource}, &fr); err != nil {
		return nil, explainAPI(err, "FencedResource "+resource)
	}
	t := fr.Spec.Target
	if t == nil {
		return nil, fmt.Errorf("FencedResource %s has no target: there is no protected object to delete", resource)
	}
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(schema.FromAPIVersionAndKind(t.APIVersion, t.Kind))
	obj.SetNamespace(fr.Namespace)
	obj.SetName(t.Name)
	return obj, nil
}
