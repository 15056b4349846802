package fencectl

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// writeResult is the JSON form of a fenced write's outcome.
type writeResult struct {
	Object    string        `json:"object"`
	Verdict   fence.Verdict `json:"verdict"`
	Fence     int64         `json:"fence"`
	Segment   int64         `json:"segment,omitempty"`
	Operation string        `json:"operation"`
	Payload   string        `json:"payload,omitempty"`
	Receipt   string        `json:"receipt,omitempty"`
	Message   string        `json:"message,omitempty"`
}

// nextStep says what to do after a denial.
var nextStep = map[fence.Verdict]string{
	fence.StaleOwner:         "your grant is no longer the holder: a newer fence wrote the object. Acquire again and redo the operation from the current object.",
	fence.NotHeld:            "your grant is not the registry's current holder (expired, released or revoked). Acquire again.",
	fence.PolicyStale:        "the FencedResource's policy changed after the grant was issued. Acquire again.",
	fence.FenceRegression:    "the registry is behind the object (restored snapshot?). A platform admin raises spec.fenceFloor above the highest fence; see docs/registry.md.",
	fence.Quarantined:        "this segment was already applied with a different payload; the attempt is recorded in the FencedResource's status for review.",
	fence.SegmentOutOfOrder:  "segments must follow the receipt log; read it with 'kubectl fence receipts'.",
	fence.RootMismatch:       "another operation root already wrote under this fence.",
	fence.WrongOwner:         "the grant belongs to another user; write as its owner.",
	fence.RevokedEpoch:       "the issuer epoch of this grant was revoked. Acquire again.",
	fence.ReceiptLogMismatch: "the receipt log was edited by hand; write through kubectl fence or the client library.",
	fence.DeleteNotDeclared:  "a delete needs the current grant's own delete intent as the object's last segment (kubectl fence delete commits it first); a delete under an ended grant, or by another user, is refused.",
}

// exitUnknown is the exit code of a write or delete whose outcome is
// unknown: neither done (0) nor refused (1).
const exitUnknown = 3

// outcomeUnknown reports a write or delete that may or may not have landed:
// the -o document (verdict MUTATION_UNKNOWN), or text with what to do.
func (o *options) outcomeUnknown(res writeResult, err error) error {
	res.Verdict, res.Message = "MUTATION_UNKNOWN", err.Error()
	if o.format.structured() {
		_ = o.emit(res, nil, nil)
		return exitError{exitUnknown}
	}
	fmt.Fprintf(o.stderr, "%s: outcome unknown: %s\n", res.Object, err)
	fmt.Fprintf(o.stderr, "What to do: do not run it again as if it had failed, and do not assume it landed. 'kubectl fence receipts' shows the object's log: "+
		"the segment's receipt there means it landed; an object that moved on without it means it never will. Until then it may still land "+
		"(the API server may be waiting on etcd). The outcome is recorded on the LockGrant; remove %s there once it is decided.\n", locksv1.AnnotationUnresolvedMutation)
	return exitError{exitUnknown}
}

func (o *options) writeCmd() *cobra.Command {
	var file, operation string
	var unguarded bool
	cmd := &cobra.Command{
		Use:   "write LOCKGRANT -f FILE",
		Short: "Write a protected object from a file under a held grant (one fenced segment)",
		Long: `write replaces the business content of the LockGrant's protected object (a
ConfigMap's data and binaryData, a custom resource's spec) with the file's,
stamps the fence annotation and the receipt log, and sends one update.
The acceptance webhook decides; a denial names the verdict and what to do.
Each write is the next segment of the operation (--operation, default one
per grant); a write the webhook already applied returns its original receipt.`,
		Example: `  # Write batch.yaml's data to the protected ConfigMap under the held grant
  kubectl fence write invoice-batch-2026-07-19-f5a5dd7fb11e7b78 -f batch.yaml -n billing

  # Segments of one named operation, printing the receipt of each
  kubectl fence write invoice-batch-2026-07-19-f5a5dd7fb11e7b78 -f part-2.yaml -n billing --operation nightly-42 -o jsonpath='{.receipt}{"\n"}'`,
		Args:              exactArgs("LOCKGRANT"),
		ValidArgsFunction: o.completeFirst(lockGrantNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := lockGrantType.nameArgs(args); err != nil {
				return err
			}
			if file == "" {
				return errors.New("write needs -f FILE: a manifest of the protected object with its new content")
			}
			ctx := cmd.Context()
			if operation == "" {
				operation = "kubectl-fence/" + args[0]
			}
			w, err := o.writer(ctx, args[0], "write", operation, unguarded)
			if err != nil {
				return err
			}
			defer w.done()
			obj, content, err := o.target(ctx, w.resource, file)
			if err != nil {
				return err
			}
			res := writeResult{Object: obj.GetKind() + "/" + obj.GetName(), Operation: operation, Fence: w.fence}
			r, err := w.commit(ctx, obj, func() error {
				for _, k := range []string{"data", "binaryData", "spec"} {
					delete(obj.Object, k)
				}
				for k, v := range content {
					obj.Object[k] = v
				}
				return nil
			})
			if err == nil {
				res.Verdict, res.Segment, res.Payload, res.Receipt = fence.Accepted, r.Segment, r.Payload, r.Receipt
				return o.emit(res, nil, func(bool) error {
					o.printf("%s accepted: fence %d, segment %d of operation %s\nreceipt %s\n", res.Object, res.Fence, res.Segment, operation, res.Receipt)
					return nil
				})
			}
			if errors.Is(err, lockclient.ErrMutationUnknown) {
				return o.outcomeUnknown(res, err)
			}
			d, denied := lockclient.AsDenial(err)
			if !denied {
				return err
			}
			res.Verdict, res.Message = d.Verdict, d.Message
			if o.format.structured() {
				_ = o.emit(res, nil, nil)
			} else {
				fmt.Fprintf(o.stderr, "%s denied: %s\n", res.Object, d.Message)
				if hint := nextStep[d.Verdict]; hint != "" {
					fmt.Fprintf(o.stderr, "What to do: %s\n", hint)
				}
			}
			return exitError{1}
		},
	}
	cmd.Flags().StringVarP(&file, "filename", "f", "", "Manifest (YAML or JSON) of the protected object with its new content.")
	cmd.Flags().BoolVar(&unguarded, "unguarded", false, "Send the write even if the grant is known to have ended, to see the acceptance webhook refuse it (testing; never for real work).")
	cmd.Flags().StringVar(&operation, "operation", "", "Operation ID (default: one per grant); segments of one operation continue from its receipt log.")
	_ = cmd.MarkFlagFilename("filename", "yaml", "yml", "json")
	o.addOutputFlags(cmd)
	return cmd
}

// target returns the protected object of the FencedResource (to be read and
// written by the commit) and the business content of the file.
func (o *options) target(ctx context.Context, resource, file string) (*unstructured.Unstructured, map[string]any, error) {
	kube, err := o.kube()
	if err != nil {
		return nil, nil, err
	}
	var fr locksv1.FencedResource
	if err := kube.Get(ctx, client.ObjectKey{Namespace: o.ns(), Name: resource}, &fr); err != nil {
		return nil, nil, explainAPI(err, "FencedResource "+resource)
	}
	t := fr.Spec.Target
	if t == nil {
		return nil, nil, fmt.Errorf("FencedResource %s has no target: there is no protected object to write", resource)
	}
	in, err := readManifest(file)
	if err != nil {
		return nil, nil, err
	}
	if err := manifestIsTarget(in, file, &fr); err != nil {
		return nil, nil, err
	}
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(schema.FromAPIVersionAndKind(t.APIVersion, t.Kind))
	obj.SetNamespace(fr.Namespace)
	obj.SetName(t.Name)
	return obj, businessContent(in, t), nil
}

// readManifest reads a YAML or JSON manifest.
func readManifest(file string) (map[string]any, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var in map[string]any
	if err := yaml.Unmarshal(data, &in); err != nil {
		return nil, fmt.Errorf("%s is not a YAML or JSON manifest: %w", file, err)
	}
	return in, nil
}

// manifestIsTarget checks the manifest in (read from file) is of fr's target:
// its kind, and its namespace and name where it gives them.
func manifestIsTarget(in map[string]any, file string, fr *locksv1.FencedResource) error {
	t := fr.Spec.Target
	fromFile := unstructured.Unstructured{Object: in}
	if fromFile.GetAPIVersion() != t.APIVersion || fromFile.GetKind() != t.Kind {
		return fmt.Errorf("%s is a %s %q, but FencedResource %s protects a %s %q", file, fromFile.GetAPIVersion(), fromFile.GetKind(), fr.Name, t.APIVersion, t.Kind)
	}
	if n := fromFile.GetNamespace(); n != "" && n != fr.Namespace {
		return fmt.Errorf("%s is in namespace %q, but the grant and FencedResource %s are in %q (use -n)", file, n, fr.Name, fr.Namespace)
	}
	if n := fromFile.GetName(); n != "" && n != t.Name {
		return fmt.Errorf("%s names %s %q, but FencedResource %s protects %q", file, t.Kind, n, fr.Name, t.Name)
	}
	return nil
}

// businessContent returns the business content of the manifest in, for a
// target t: data and binaryData of a ConfigMap, spec of any other kind.
func businessContent(in map[string]any, t *locksv1.ObjectTarget) map[string]any {
	content := map[string]any{}
	keys := []string{"spec"}
	if t.APIVersion == "v1" && t.Kind == "ConfigMap" {
		keys = []string{"data", "binaryData"}
	}
	for _, k := range keys {
		if v, ok := in[k]; ok {
			content[k] = v
		}
	}
	return content
}

// grantWriter writes under one LockGrant: through the client library's
// guarded Operation, or (--unguarded) stamped with the grant whatever its
// phase, for the webhook to judge.
type grantWriter struct {
	resource string
	fence    int64
	commit   func(ctx context.Context, obj *unstructured.Unstructured, mutate func() error) (fence.Receipt, error)
	delete   func(ctx context.Context, obj *unstructured.Unstructured) (fence.Receipt, error)
	done     func()
}

// writer follows the LockGrant name to act under it ("write", "delete").
func (o *options) writer(ctx context.Context, name, verb, operation string, unguarded bool) (*grantWriter, error) {
	if unguarded {
		return o.unguardedWriter(ctx, name, operation)
	}
	lc, err := o.lockClient(ctx)
	if err != nil {
		return nil, err
	}
	lock, err := lc.Attach(ctx, name, lockclient.AcquireOptions{})
	if err != nil {
		return nil, fmt.Errorf("cannot %s under %s: %w (--unguarded sends the %s anyway, for the webhook to judge)", verb, name, explainAPI(err, "LockGrant "+name), verb)
	}
	op := lock.Operation(operation)
	return &grantWriter{resource: lock.Resource(), fence: lock.Fence(), done: lock.Orphan,
		commit: func(ctx context.Context, obj *unstructured.Unstructured, mutate func() error) (fence.Receipt, error) {
			return op.Commit(ctx, obj, mutate)
		},
		delete: func(ctx context.Context, obj *unstructured.Unstructured) (fence.Receipt, error) {
			return op.Delete(ctx, obj)
		},
	}, nil
}

func (o *options) unguardedWriter(ctx context.Context, name, operation string) (*grantWriter, error) {
	lg, err := o.unguardedGrant(ctx, name)
	if err != nil {
		return nil, err
	}
	kube, err := o.kube()
	if err != nil {
		return nil, err
	}
	return &grantWriter{resource: lg.Spec.Resource, fence: lg.Status.Grant.FenceToken, done: func() {},
		commit: func(ctx context.Context, obj *unstructured.Unstructured, mutate func() error) (fence.Receipt, error) {
			return WriteUnguarded(ctx, kube, lg, obj, operation, "", mutate)
		},
		delete: func(ctx context.Context, obj *unstructured.Unstructured) (fence.Receipt, error) {
			return deleteUnguarded(ctx, kube, lg, obj, operation)
		},
	}, nil
}
