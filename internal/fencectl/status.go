package fencectl

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// resourceView is the JSON form of a FencedResource's state.
type resourceView struct {
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
	v := resourceView{Name: fr.Name, ResourceID: fr.Spec.ResourceID, Target: fr.Spec.Target, Enforcement: fr.Spec.Enforcement,
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
	cmd := &cobra.Command{
		Use:   "status [FENCEDRESOURCE]",
		Short: "Show holder, fence, expiry, queue, highest observed fence and conditions",
		Long: `status shows one FencedResource, or every FencedResource of the namespace
(-o json and yaml: an object for one, a list for all). -o wide lists every
quarantined attempt, not only the latest.`,
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: o.completeFirst(fencedResourceNames),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := fencedResourceType.nameArgs(args); err != nil {
				return err
			}
			kube, err := o.kube()
			if err != nil {
				return err
			}
			var items []locksv1.FencedResource
			if len(args) == 1 {
				var fr locksv1.FencedResource
				if err := kube.Get(cmd.Context(), client.ObjectKey{Namespace: o.ns(), Name: args[0]}, &fr); err != nil {
					return explainAPI(err, "FencedResource "+args[0])
				}
				items = append(items, fr)
			} else {
				var list locksv1.FencedResourceList
				if err := kube.List(cmd.Context(), &list, client.InNamespace(o.ns())); err != nil {
					return explainAPI(err, "FencedResources")
				}
				items = list.Items
			}
			views := make([]resourceView, 0, len(items))
			for i := range items {
				views = append(views, resourceViewOf(&items[i]))
			}
			names := make([]string, 0, len(views))
			for _, v := range views {
				names = append(names, fencedResourceType.objectName(v.Name))
			}
			var doc any = views
			if len(args) == 1 {
				doc = views[0]
			}
			return o.emit(doc, names, func(wide bool) error {
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
	o.addOutputFlags(cmd, supportsName, supportsWide)
	return cmd
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
