package fencectl

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// grantView is the JSON form of a LockGrant in command output.
type grantView struct {
	Name      string                 `json:"name"`
	Resource  string                 `json:"resource"`
	Owner     string                 `json:"owner"`
	RequestID string                 `json:"requestID"`
	Phase     locksv1.LockGrantPhase `json:"phase"`
	Fence     int64                  `json:"fenceToken,omitempty"`
	ExpiresAt *time.Time             `json:"expiresAt,omitempty"`
	Renewals  int64                  `json:"observedRenewals,omitempty"`
	Message   string                 `json:"message,omitempty"`
}

func viewOf(lg *locksv1.LockGrant) grantView {
	v := grantView{Name: lg.Name, Resource: lg.Spec.Resource, Owner: lg.Spec.Owner, RequestID: lg.Spec.RequestID,
		Phase: lg.Status.Phase, Renewals: lg.Status.ObservedRenewals}
	if v.Phase == "" {
		v.Phase = locksv1.PhasePending
	}
	if lg.Status.Grant != nil {
		v.Fence = lg.Status.Grant.FenceToken
	}
	if lg.Status.ExpiresAt != nil && v.Phase == locksv1.PhaseHeld {
		t := lg.Status.ExpiresAt.Time
		v.ExpiresAt = &t
	}
	for _, c := range lg.Status.Conditions {
		if c.Status == "True" || v.Message == "" {
			v.Message = c.Message
		}
	}
	return v
}

// grantDoc is what the grant commands print with -o json, yaml, jsonpath
// and go-template: the flat summary fields scripts have always parsed, then
// the LockGrant as kubectl get shows it (so {.status.phase} works too).
type grantDoc struct {
	metav1.TypeMeta `json:",inline"`
	grantView
	ObjectMeta metav1.ObjectMeta       `json:"metadata"`
	Spec       locksv1.LockGrantSpec   `json:"spec"`
	Status     locksv1.LockGrantStatus `json:"status"`
}

func (o *options) printGrant(lg *locksv1.LockGrant) error {
	v := viewOf(lg)
	doc := grantDoc{TypeMeta: metav1.TypeMeta{APIVersion: locksv1.GroupVersion.String(), Kind: "LockGrant"},
		grantView: v, ObjectMeta: *lg.ObjectMeta.DeepCopy(), Spec: lg.Spec, Status: lg.Status}
	if !o.print.JSONYamlPrintFlags.ShowManagedFields {
		doc.ObjectMeta.ManagedFields = nil
	}
	return o.emit(doc, []string{lockGrantType.objectName(v.Name)}, func(bool) error {
		o.printGrantText(v)
		return nil
	})
}

func (o *options) printGrantText(v grantView) {
	switch v.Phase {
	case locksv1.PhaseHeld:
		o.printf("LockGrant %s is Held by %s: fence %d on %s, expires %s (%s).\n", v.Name, v.Owner, v.Fence, v.Resource,
			v.ExpiresAt.Format(time.RFC3339Nano), until(*v.ExpiresAt))
	default:
		o.printf("LockGrant %s (%s, requestID %s) is %s.", v.Name, v.Resource, v.RequestID, v.Phase)
		if v.Message != "" {
			o.printf(" %s", v.Message)
		}
		o.printf("\n")
	}
}

func (o *options) acquireCmd() *cobra.Command {
	var opts lockclient.AcquireOptions
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "acquire FENCEDRESOURCE",
		Short: "Request a grant and wait until the issuer hands it over",
		Long: `acquire creates a LockGrant for the FencedResource, named from the request ID
and your identity, and waits (watching, FIFO behind earlier requests) until it is Held.

The lease runs on the issuer's clock: renew it with 'kubectl fence renew'
before it expires, or it ends and the next waiter gets a higher fence.
Running acquire again with the same --request-id finds the same request.`,
		Example: `  # Take the lock on invoice-batch-2026-07-19 for tonight's run (run it again to find the same request)
  kubectl fence acquire invoice-batch-2026-07-19 -n billing --request-id nightly-42

  # Wait up to 2 minutes behind earlier requests; keep the LockGrant's name for write, renew and release
  GRANT=$(kubectl fence acquire invoice-batch-2026-07-19 -n billing --request-id nightly-42 --timeout 2m -o name)`,
		Args:              exactArgs("FENCEDRESOURCE"),
		ValidArgsFunction: o.completeFirst(fencedResourceNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := fencedResourceType.nameArgs(args); err != nil {
				return err
			}
			limit, limitFlag, err := o.waitLimit(timeout)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), limit)
			defer cancel()
			lc, err := o.lockClient(ctx)
			if err != nil {
				return err
			}
			if opts.RequestID == "" {
				opts.RequestID = lockclient.NewRequestID()
			}
			lock, err := lc.Acquire(ctx, args[0], opts)
			if err != nil {
				// The deadline, or the client's request timeout ending a watch.
				if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
					return fmt.Errorf("not granted within %s (%s): LockGrant %s is still queued; run the same command with --request-id %s to keep waiting, or 'kubectl fence release %s' to withdraw",
						limit, limitFlag, lc.LockGrantName(args[0], opts.RequestID), opts.RequestID, lc.LockGrantName(args[0], opts.RequestID))
				}
				return explainAPI(err, "FencedResource "+args[0])
			}
			// This process ends here; the grant lives on until it expires or is released.
			lock.Orphan()
			// Acquire returns on the registry's holder record; print the
			// LockGrant once the issuer has mirrored it, so that every run
			// prints the same document (what the lock knows, if the mirror is late).
			lg, err := o.waitGrant(ctx, lock.LockGrant(), func(lg *locksv1.LockGrant) bool {
				return lg.Status.Phase != "" && lg.Status.Phase != locksv1.PhasePending
			})
			if err != nil {
				lg = lock.LockGrant()
			}
			if err := o.printGrant(lg); err != nil {
				return err
			}
			if o.format.kind == outText {
				o.printf("Next: kubectl fence write %s -f FILE · kubectl fence renew %s · kubectl fence release %s\n", lg.Name, lg.Name, lg.Name)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.RequestID, "request-id", "", "Idempotency key (default: random). The same key finds the same request again.")
	f.StringVar(&opts.Lease, "lease", "", "Holder session ID (default: derived from the request ID; in a pod, always pod:<its UID>).")
	f.StringVar(&opts.OperationRoot, "operation-root", "", "sha256:<hex> of the planned operation (default: derived from the request ID).")
	f.StringVar(&opts.OperationCategory, "category", "", "Operation category, when the FencedResource restricts them.")
	f.DurationVar(&timeout, "timeout", 30*time.Second, "How long to wait for the grant (a shorter --request-timeout ends the wait sooner).")
	o.addOutputFlags(cmd, supportsName)
	return cmd
}

func (o *options) renewCmd() *cobra.Command {
	var want int64
	return o.grantChangeCmd(grantChange{
		use:   "renew LOCKGRANT",
		short: "Renew a held grant's lease (the issuer applies it only before expiry)",
		example: `  # Renew before the lease runs out; exit 1 if the grant is no longer Held
  kubectl fence renew invoice-batch-2026-07-19-f5a5dd7fb11e7b78 -n billing

  # The name acquire -o name printed works too; wait up to 30s for the issuer
  kubectl fence renew lockgrant.locks.fencekeeper.dev/invoice-batch-2026-07-19-f5a5dd7fb11e7b78 -n billing --timeout 30s`,
		change: func(lg *locksv1.LockGrant) error {
			if lg.Status.Phase != locksv1.PhaseHeld {
				return fmt.Errorf("LockGrant %s is %s, not Held: only a held grant can be renewed; acquire again", lg.Name, viewOf(lg).Phase)
			}
			lg.Spec.Renewals++
			want = lg.Spec.Renewals
			return nil
		},
		answered: func(lg *locksv1.LockGrant) bool {
			return lg.Status.Phase != locksv1.PhaseHeld || lg.Status.ObservedRenewals >= want
		},
		unconfirmed: "renewal of %s sent but not confirmed within %s (ownership unknown): %w",
		failed:      func(lg *locksv1.LockGrant) bool { return lg.Status.Phase != locksv1.PhaseHeld },
	})
}

func (o *options) releaseCmd() *cobra.Command {
	return o.grantChangeCmd(grantChange{
		use:   "release LOCKGRANT",
		short: "Release a grant (or withdraw a queued request); the next waiter gets fence+1",
		example: `  # Done: release the grant, the next waiter gets fence+1
  kubectl fence release invoice-batch-2026-07-19-f5a5dd7fb11e7b78 -n billing

  # Withdraw a request still queued and print the phase it ended in (Released)
  kubectl fence release lg/invoice-batch-2026-07-19-f5a5dd7fb11e7b78 -n billing -o jsonpath='{.status.phase}'`,
		change: func(lg *locksv1.LockGrant) error {
			lg.Spec.Release = true
			return nil
		},
		answered: func(lg *locksv1.LockGrant) bool {
			p := lg.Status.Phase
			return p != "" && p != locksv1.PhasePending && p != locksv1.PhaseHeld
		},
		unconfirmed: "release of %s sent but not confirmed within %s: %w",
		failed:      func(*locksv1.LockGrant) bool { return false },
	})
}

// grantChange is a command that changes one LockGrant's spec and waits for
// the issuer's answer: renew and release.
type grantChange struct {
	use, short, example string
	// change edits the spec (or refuses); answered says the issuer acted on it.
	change   func(*locksv1.LockGrant) error
	answered func(*locksv1.LockGrant) bool
	// unconfirmed formats the error (name, limit, cause) when no answer came.
	unconfirmed string
	// failed says the answer is a failure: printed, exit code 1.
	failed func(*locksv1.LockGrant) bool
}

func (o *options) grantChangeCmd(g grantChange) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:               g.use,
		Short:             g.short,
		Example:           g.example,
		Args:              exactArgs("LOCKGRANT"),
		ValidArgsFunction: o.completeFirst(lockGrantNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := lockGrantType.nameArgs(args); err != nil {
				return err
			}
			limit, _, err := o.waitLimit(timeout)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), limit)
			defer cancel()
			lg, err := o.updateGrant(ctx, args[0], g.change)
			if err != nil {
				return err
			}
			if lg, err = o.waitGrant(ctx, lg, g.answered); err != nil {
				return fmt.Errorf(g.unconfirmed, args[0], limit, err)
			}
			if g.failed(lg) {
				_ = o.printGrant(lg)
				return exitError{1}
			}
			return o.printGrant(lg)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Second, "How long to wait for the issuer to confirm.")
	o.addOutputFlags(cmd, supportsName)
	return cmd
}

// updateGrant applies mutate to the LockGrant's spec, retrying conflicts.
func (o *options) updateGrant(ctx context.Context, name string, mutate func(*locksv1.LockGrant) error) (*locksv1.LockGrant, error) {
	kube, err := o.kube()
	if err != nil {
		return nil, err
	}
	for {
		lg := &locksv1.LockGrant{}
		if err := kube.Get(ctx, client.ObjectKey{Namespace: o.ns(), Name: name}, lg); err != nil {
			return nil, explainAPI(err, "LockGrant "+name)
		}
		if err := mutate(lg); err != nil {
			return nil, err
		}
		err := kube.Update(ctx, lg)
		if err == nil {
			return lg, nil
		}
		if !apierrors.IsConflict(err) {
			return nil, explainAPI(err, "LockGrant "+name)
		}
	}
}

// waitGrant watches the LockGrant until done says so.
func (o *options) waitGrant(ctx context.Context, lg *locksv1.LockGrant, done func(*locksv1.LockGrant) bool) (*locksv1.LockGrant, error) {
	kube, err := o.kube()
	if err != nil {
		return nil, err
	}
	w, err := kube.Watch(ctx, &locksv1.LockGrantList{}, client.InNamespace(lg.Namespace), client.MatchingFields{"metadata.name": lg.Name})
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, errors.New("watch ended")
			}
			if got, isGrant := ev.Object.(*locksv1.LockGrant); isGrant && ev.Type != watch.Error && done(got) {
				return got, nil
			}
		}
	}
}

// explainAPI turns common API errors into what to do about them.
func explainAPI(err error, what string) error {
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%s not found in this namespace (use -n to pick the namespace; 'kubectl fence status' lists FencedResources)", what)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s: %v (your user needs the lockgrant-requester role, config/rbac)", what, err)
	}
	return err
}

func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != len(names) {
			return fmt.Errorf("%s needs %d argument(s): %v (see --help)", cmd.Name(), len(names), names)
		}
		return nil
	}
}
