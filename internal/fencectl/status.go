package fencectl

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// resourceView is the JSON form of a FencedResource's state.
type resourceView struct {
	Namespace            string                     `json:"namespace"`
	Name                 string                     `json:"name"`
	ResourceID           string                     `json:"resourceID"`
	Target               *locksv1.ObjectTarget      `json:"target,omitempty"`
	Enforcement          locksv1.EnforcementMode    `json:"enforcement"`
	LeaseSeconds         int32                      `json:"leaseDurationSeconds"`
	FenceToken           int64                      `json:"fenceToken"`
	FenceFloor           int64                      `json:"fenceFloor,omitempty"`
	HighestObservedFence int64                      `json:"highestObservedFence"`
	IssuerEpoch          int64                      `json:"issuerEpoch,omitempty"`
	Holder               *holderView                `json:"holder,omitempty"`
	Queue                []locksv1.QueuedGrant      `json:"queue,omitempty"`
	Quarantine           []locksv1.QuarantineRecord `json:"quarantine,omitempty"`
	Conditions           []metav1.Condition         `json:"conditions,omitempty"`
}

type holderView struct {
	Grant     string    `json:"grant"`
	Owner     string    `json:"owner"`
	Lease     string    `json:"lease"`
	RequestID string    `json:"requestID"`
	Fence     int64     `json:"fenceToken"`
	Root      string    `json:"operationRoot"`
	Epoch     int64     `json:"issuerEpoch"`
	ExpiresAt time.Time `json:"expiresAt"`
}

func resourceViewOf(fr *locksv1.FencedResource) resourceView {
	v := resourceView{Namespace: fr.Namespace, Name: fr.Name, ResourceID: fr.Spec.ResourceID, Target: fr.Spec.Target, Enforcement: fr.Spec.Enforcement,
		LeaseSeconds: fr.Spec.LeaseDurationSeconds, FenceToken: fr.Status.FenceToken, FenceFloor: fr.Spec.FenceFloor,
		HighestObservedFence: fr.Status.HighestObservedFence, IssuerEpoch: fr.Status.IssuerEpoch,
		Queue: fr.Status.Queue, Quarantine: fr.Status.Quarantine, Conditions: fr.Status.Conditions}
	if v.Enforcement == "" {
		v.Enforcement = locksv1.EnforcementShadow
	}
	if h := fr.Status.Holder; h != nil {
		v.Holder = &holderView{Grant: h.GrantName, Owner: h.Owner, Lease: h.Lease, RequestID: h.RequestID, Fence: h.FenceToken,
			Root: h.OperationRoot, Epoch: h.IssuerEpoch, ExpiresAt: h.ExpiresAt.Time}
	}
	return v
}

func (o *options) statusCmd() *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "status [FENCEDRESOURCE]",
		Short: "Show holder, fence, expiry, queue, highest observed fence and conditions",
		Long: `status shows one FencedResource, or every FencedResource of the namespace
(-o json and yaml: an object for one, a list for all). -o wide lists every
quarantined attempt, not only the latest.

-A (--all-namespaces) lists the FencedResources of every namespace as a
table, one row each with its NAMESPACE (-o wide adds columns); for the full
report of one, name it: kubectl fence status NAME -n NAMESPACE.`,
		Example: `  # Who holds invoice-batch-2026-07-19, with which fence, until when, and who waits
  kubectl fence status invoice-batch-2026-07-19 -n billing

  # Every FencedResource of the namespace, every quarantined attempt included
  kubectl fence status -n billing -o wide

  # One row per FencedResource of the cluster
  kubectl fence status -A

  # Holders across the cluster, for a script
  kubectl fence status -A -o jsonpath='{range [*]}{.namespace}/{.name} {.holder.owner}{"\n"}{end}'`,
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: o.completeFirst(fencedResourceNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			if all && len(args) > 0 {
				return fmt.Errorf("a FencedResource cannot be named across all namespaces: drop -A and give its namespace with -n (kubectl fence status %s -n NAMESPACE)", args[0])
			}
			if err := fencedResourceType.nameArgs(args); err != nil {
				return err
			}
			items, err := o.loadResources(cmd.Context(), args, all)
			if err != nil {
				return err
			}
			views := make([]resourceView, 0, len(items))
			names := make([]string, 0, len(items))
			for i := range items {
				views = append(views, resourceViewOf(&items[i]))
				names = append(names, fencedResourceType.objectName(items[i].Name))
			}
			var doc any = views
			if len(args) == 1 {
				doc = views[0]
			}
			return o.emit(doc, names, func(wide bool) error {
				if all {
					return o.printResourceTable(views, wide)
				}
				if len(views) == 0 {
					o.printf("No FencedResources in namespace %s.\n", o.ns())
				}
				for i, v := range views {
					if i > 0 {
						o.printf("\n")
					}
					o.printResource(v, wide)
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "List the FencedResources of every namespace (a table with a NAMESPACE column).")
	o.addOutputFlags(cmd, supportsName, supportsWide)
	return cmd
}

// loadResources reads the FencedResource named in args, or all of the
// namespace, or with all those of every namespace (sorted by namespace, then name).
func (o *options) loadResources(ctx context.Context, args []string, all bool) ([]locksv1.FencedResource, error) {
	kube, err := o.kube()
	if err != nil {
		return nil, err
	}
	if len(args) == 1 {
		var fr locksv1.FencedResource
		if err := kube.Get(ctx, client.ObjectKey{Namespace: o.ns(), Name: args[0]}, &fr); err != nil {
			return nil, explainAPI(err, "FencedResource "+args[0])
		}
		return []locksv1.FencedResource{fr}, nil
	}
	var list locksv1.FencedResourceList
	if !all {
		if err := kube.List(ctx, &list, client.InNamespace(o.ns())); err != nil {
			return nil, explainAPI(err, "FencedResources")
		}
		return list.Items, nil
	}
	if err := kube.List(ctx, &list); err != nil {
		if apierrors.IsForbidden(err) {
			return nil, fmt.Errorf("list FencedResources in all namespaces: %w (-A needs list on fencedresources.locks.fencekeeper.dev cluster-wide, from a ClusterRoleBinding; without it, use -n NAMESPACE)", err)
		}
		return nil, err
	}
	sort.Slice(list.Items, func(i, j int) bool {
		a, b := list.Items[i], list.Items[j]
		return a.Namespace < b.Namespace || (a.Namespace == b.Namespace && a.Name < b.Name)
	})
	return list.Items, nil
}

// printResourceTable is status -A: one row per FencedResource. ATTENTION
// names what an on-call person should look at: a condition that is not as
// it should be, and quarantined write attempts.
func (o *options) printResourceTable(views []resourceView, wide bool) error {
	if len(views) == 0 {
		o.printf("No FencedResources in any namespace.\n")
		return nil
	}
	header := []string{"NAMESPACE", "NAME", "TARGET", "ENFORCEMENT", "FENCE", "HOLDER", "EXPIRES", "QUEUE", "ATTENTION"}
	if wide {
		header = append(header, "RESOURCEID", "LEASE", "HIGHEST-OBSERVED", "EPOCH", "GRANT")
	}
	tw := o.table(header...)
	for _, v := range views {
		target, holder, expires, grant := "-", "-", "-", "-"
		if v.Target != nil {
			target = v.Target.Kind + "/" + v.Target.Name
		}
		if h := v.Holder; h != nil {
			holder, expires, grant = h.Owner, until(h.ExpiresAt), h.Grant
		}
		cols := []string{v.Namespace, v.Name, target, string(v.Enforcement), strconv.FormatInt(v.FenceToken, 10), holder, expires,
			strconv.Itoa(len(v.Queue)), attention(v)}
		if wide {
			cols = append(cols, v.ResourceID, fmt.Sprintf("%ds", v.LeaseSeconds), strconv.FormatInt(v.HighestObservedFence, 10),
				strconv.FormatInt(v.IssuerEpoch, 10), grant)
		}
		fmt.Fprintln(tw, strings.Join(cols, "\t"))
	}
	return tw.Flush()
}

// attention lists what is not as it should be: Ready not True,
// FenceRegression or ReconciliationRequired True, quarantined attempts.
func attention(v resourceView) string {
	var out []string
	for _, c := range v.Conditions {
		var bad bool
		switch c.Type {
		case locksv1.ConditionReady:
			bad = c.Status != metav1.ConditionTrue
		case locksv1.ConditionHeld: // either way is normal
		default: // FenceRegression, ReconciliationRequired
			bad = c.Status == metav1.ConditionTrue
		}
		if bad {
			out = append(out, c.Type+"="+string(c.Status))
		}
	}
	if n := len(v.Quarantine); n > 0 {
		out = append(out, fmt.Sprintf("%d quarantined", n))
	}
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, ", ")
}

func (o *options) printResource(v resourceView, wide bool) {
	o.printf("FencedResource %s (%s)\n", v.Name, v.ResourceID)
	target := "none"
	if v.Target != nil {
		target = v.Target.Kind + "/" + v.Target.Name + " (" + v.Target.APIVersion + ")"
	}
	o.printf("  %-13s %s, %s, lease %ds\n", "target", target, v.Enforcement, v.LeaseSeconds)
	floor := ""
	if v.FenceFloor > 0 {
		floor = fmt.Sprintf(", floor %d", v.FenceFloor)
	}
	o.printf("  %-13s issued %d%s; highest observed at the target %d; issuer epoch %d\n", "fence", v.FenceToken, floor, v.HighestObservedFence, v.IssuerEpoch)
	if h := v.Holder; h != nil {
		o.printf("  %-13s %s with fence %d (grant %s, lease %s), expires %s (%s)\n", "holder", h.Owner, h.Fence, h.Grant, h.Lease,
			h.ExpiresAt.Format(time.RFC3339Nano), until(h.ExpiresAt))
	} else {
		o.printf("  %-13s none\n", "holder")
	}
	for i, q := range v.Queue {
		label := ""
		if i == 0 {
			label = "queue"
		}
		o.printf("  %-13s %d. %s (grant %s)\n", label, i+1, q.Owner, q.GrantName)
	}
	for i, c := range v.Conditions {
		label := ""
		if i == 0 {
			label = "conditions"
		}
		msg := strings.TrimSpace(c.Message)
		if msg != "" {
			msg = ": " + msg
		}
		o.printf("  %-13s %s=%s (%s)%s\n", label, c.Type, c.Status, c.Reason, msg)
	}
	if n := len(v.Quarantine); n > 0 && !wide {
		last := v.Quarantine[n-1]
		o.printf("  %-13s %d attempt(s); latest: %s, fence %d segment %d, payload %s\n", "quarantine", n, last.User, last.Fence, last.Segment, last.Payload)
	}
	for i, q := range v.Quarantine {
		if !wide {
			break
		}
		label := ""
		if i == 0 {
			label = "quarantine"
		}
		o.printf("  %-13s %s %s, fence %d segment %d, operation %s, payload %s\n", label, q.Time.UTC().Format(time.RFC3339), q.User, q.Fence, q.Segment, q.Operation, q.Payload)
	}
}
