package controllers

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// UnresolvedMutationReconciler surfaces writes whose outcome a worker could not
// determine (LockGrant annotation fencekeeper.dev/unresolved-mutation): once
// one is older than the deadline, the FencedResource gets
// ReconciliationRequired=True, an Event and the overdue gauge; when the
// annotations are removed, the condition goes back to False.
type UnresolvedMutationReconciler struct {
	client.Client
	// Identity's clock judges age; its ResyncAll makes this controller look again.
	Identity *IssuerIdentity
	Recorder events.EventRecorder
	// Name distinguishes several instances in one process (tests only).
	Name string
}

// SetupWithManager registers the controller; it uses the LockGrant index
// (unresolvedGrantsIndex) the grant issuer registers.
func (r *UnresolvedMutationReconciler) SetupWithManager(mgr ctrl.Manager) error {
	name := r.Name
	if name == "" {
		name = "unresolved-mutations"
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(name).
		// The issuer's status writes (one or more per handoff) change
		// nothing this controller reads: the LockGrants' records do, and
		// a spec change moves the condition's observedGeneration.
		For(&locksv1.FencedResource{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&locksv1.LockGrant{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			if _, ok := o.GetAnnotations()[locksv1.AnnotationUnresolvedMutation]; !ok {
				return nil
			}
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: o.(*locksv1.LockGrant).Spec.Resource}}}
		})).
		WatchesRawSource(r.Identity.resyncSource(r.Client)).
		WithOptions(controllerOptions(r.Name != "")).
		Complete(r)
}

// Reconcile sets the FencedResource's ReconciliationRequired condition.
func (r *UnresolvedMutationReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var fr locksv1.FencedResource
	if err := r.Get(ctx, req.NamespacedName, &fr); apierrors.IsNotFound(err) {
		setPerResource(overdueMutations, req.Namespace, req.Name, 0)
		return ctrl.Result{}, nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	var list locksv1.LockGrantList
	if err := r.List(ctx, &list, client.InNamespace(fr.Namespace), client.MatchingFields{unresolvedGrantsIndex: fr.Name}); err != nil {
		return ctrl.Result{}, err
	}
	s := summarizeUnresolved(list.Items, r.Identity.clock.Now())
	setPerResource(overdueMutations, fr.Namespace, fr.Name, len(s.overdue))
	before := meta.FindStatusCondition(fr.Status.Conditions, locksv1.ConditionReconciliationRequired)
	result := ctrl.Result{RequeueAfter: s.nextDue}
	cond := s.condition(before != nil, fr.Generation)
	if cond == nil {
		return result, nil // nothing was ever reported here: no condition to keep
	}
	var was metav1.Condition
	if before != nil {
		was = *before
	}
	if !meta.SetStatusCondition(&fr.Status.Conditions, *cond) {
		return result, nil
	}
	// The resourceVersion read is the precondition: the issuer's status
	// writes and this one never overwrite each other.
	if err := r.Status().Update(ctx, &fr); err != nil {
		if apierrors.IsConflict(err) {
			return ctrl.Result{RequeueAfter: conflictRetry}, nil
		}
		return ctrl.Result{}, err
	}
	r.announce(&fr, was, *cond)
	return result, nil
}

// announce records a change of the condition with an Event: becoming
// overdue, being resolved, or (once, when the condition first says so)
// records that cannot be read.
func (r *UnresolvedMutationReconciler) announce(fr *locksv1.FencedResource, was, now metav1.Condition) {
	overdue, wasOverdue := now.Status == metav1.ConditionTrue, was.Status == metav1.ConditionTrue
	switch {
	case overdue && !wasOverdue:
		r.Recorder.Eventf(fr, nil, corev1.EventTypeWarning, locksv1.ConditionReconciliationRequired, "ReconciliationRequired", "%s", now.Message)
	case !overdue && wasOverdue:
		r.Recorder.Eventf(fr, nil, corev1.EventTypeNormal, locksv1.ReasonNoUnresolvedMutation, "Reconciled", "every overdue unknown write outcome was resolved")
	}
	if now.Reason == locksv1.ReasonUnreadableMutationRecord && was.Reason != now.Reason {
		r.Recorder.Eventf(fr, nil, corev1.EventTypeWarning, locksv1.ReasonUnreadableMutationRecord, "IgnoreRecord", "%s", now.Message)
	}
}

// unresolvedSummary is what the LockGrants of one resource record.
type unresolvedSummary struct {
	overdue []string // "LockGrant g: Kind/name operation o segment s under fence f, unknown since t"
	// unreadable lists the values that are not records: "LockGrant g: why".
	unreadable []string
	// nextDue is when the next record becomes overdue (0 when none is pending).
	nextDue time.Duration
}

// condition is the ReconciliationRequired condition the summary calls for;
// nil when there is nothing to say and nothing was said before (exists).
// Overdue records make it True; unreadable values alone are reported with
// status False, since they say nothing about any write.
func (s unresolvedSummary) condition(exists bool, generation int64) *metav1.Condition {
	c := &metav1.Condition{Type: locksv1.ConditionReconciliationRequired, Status: metav1.ConditionFalse, ObservedGeneration: generation}
	switch {
	case len(s.overdue) > 0:
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, locksv1.ReasonUnresolvedMutation, s.message()
	case len(s.unreadable) > 0:
		c.Reason, c.Message = locksv1.ReasonUnreadableMutationRecord, s.unreadableMessage()
	case exists:
		c.Reason, c.Message = locksv1.ReasonNoUnresolvedMutation, "no write outcome is unknown past the deadline"
	default:
		return nil
	}
	return c
}

// Bounds of the condition message: a record is the LockGrant owner's text,
// and a condition message over 32 KiB makes the whole status update fail
// (after which real overdue records would never raise the condition).
const (
	maxListedOverdue   = 10
	maxOverdueEntryLen = 512
)

func (s unresolvedSummary) message() string {
	msg := fmt.Sprintf("%d write outcome(s) unknown for more than %s: %s. Check the object, then remove annotation %s from the LockGrant",
		len(s.overdue), locksv1.UnresolvedMutationDeadline, listBounded(s.overdue), locksv1.AnnotationUnresolvedMutation)
	if len(s.unreadable) > 0 {
		msg += fmt.Sprintf(" (%d unreadable value(s) of that annotation ignored)", len(s.unreadable))
	}
	return msg
}

func (s unresolvedSummary) unreadableMessage() string {
	return fmt.Sprintf("%d value(s) of annotation %s are not unresolved-mutation records and are ignored (no write outcome is unknown from them): %s. Remove the annotation from the LockGrant",
		len(s.unreadable), locksv1.AnnotationUnresolvedMutation, listBounded(s.unreadable))
}

// listBounded joins at most maxListedOverdue entries of at most
// maxOverdueEntryLen bytes each, and counts the rest.
func listBounded(entries []string) string {
	listed := make([]string, 0, min(len(entries), maxListedOverdue))
	for _, o := range entries[:min(len(entries), maxListedOverdue)] {
		if len(o) > maxOverdueEntryLen {
			o = strings.ToValidUTF8(o[:maxOverdueEntryLen], "") + "…"
		}
		listed = append(listed, o)
	}
	if more := len(entries) - len(listed); more > 0 {
		listed = append(listed, fmt.Sprintf("and %d more (kubectl get lockgrants -o yaml shows each record)", more))
	}
	return strings.Join(listed, "; ")
}

// summarizeUnresolved sorts the grants' records into overdue ones and the time
// until the next becomes overdue, and lists the values that are not records
// (never overdue: no client wrote one for a write). A timestamp in the future
// (a worker's clock ahead of the issuer's) counts from now.
func summarizeUnresolved(grants []locksv1.LockGrant, now time.Time) unresolvedSummary {
	var s unresolvedSummary
	for _, lg := range grants {
		raw, ok := lg.Annotations[locksv1.AnnotationUnresolvedMutation]
		if !ok {
			continue
		}
		u, err := readRecord(raw)
		if err != nil {
			s.unreadable = append(s.unreadable, fmt.Sprintf("LockGrant %s: %v", lg.Name, err))
			continue
		}
		since := u.Since
		if since.After(now) {
			since = now
		}
		due := since.Add(locksv1.UnresolvedMutationDeadline)
		if now.Before(due) {
			if wait := due.Sub(now); s.nextDue == 0 || wait < s.nextDue {
				s.nextDue = wait
			}
			continue
		}
		s.overdue = append(s.overdue, fmt.Sprintf("LockGrant %s: %s operation %s segment %d under fence %d, unknown since %s",
			lg.Name, u.Object, u.Operation, u.Segment, u.Fence, u.Since.UTC().Format(time.RFC3339)))
	}
	sort.Strings(s.overdue)
	sort.Strings(s.unreadable)
	return s
}
