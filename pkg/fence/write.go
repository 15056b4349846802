package fence

import (
	"fmt"
	"slices"
	"strings"

	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// Operation is what a write does to a protected object.
type Operation string

// The operations of a write.
const (
	OpCreate Operation = "CREATE"
	OpUpdate Operation = "UPDATE"
	OpDelete Operation = "DELETE"
)

// SubresourceStatus is the status subresource: it carries no business
// content, but some kinds store the request's annotations with it.
const SubresourceStatus = "status"

// Object is one state of a protected object as the acceptance point sees it:
// fencekeeper's marks and the digest of its business content.
type Object struct {
	Kind, Name  string
	Labels      map[string]string
	Annotations map[string]string
	// Payload is PayloadDigest of the object's business content (read only
	// of the new state of a write to the object itself).
	Payload string
}

// Entry is what the acceptance point needs of the registry entry that names
// the object as its target.
type Entry struct {
	// Name is the entry's name: the value of the object's AnnotationResource.
	Name       string
	ResourceID string
	// HighestObservedFence is the highest fence the registry saw at the target.
	HighestObservedFence int64
	// DeletedTarget is the fence state the entry recorded when its holder
	// deleted the target, nil when none.
	DeletedTarget *State
}

// Write is one request to change a target.
type Write struct {
	Operation Operation
	// Subresource is "" for the object itself.
	Subresource string
	// User and Pod are as in Attempt.
	User, Pod string
	// Old is the stored object (nil for a create), New the written one (nil
	// for a delete; for a subresource other than status, not the target's).
	Old, New *Object
	// Changed is true when an update changes more than server-managed
	// metadata; the caller knows its object model and compares.
	Changed bool
}

// Trust holds the trust bundles of a decision: Grants verifies the grant a
// write presents (current keys only), Stored the fence state an object already
// holds (retired keys too: state accepted before a rotation still counts).
type Trust struct {
	Grants, Stored *grant.TrustBundle
}

// DecideWrite decides a write to a target of entry e: which stored fence
// state counts (TrustedState), the verdicts that depend on the object's own
// marks and subresource (PROTECTION_REMOVED, FENCE_REQUIRED for a subresource
// that cannot carry a fence, UNCHANGED for a status write that touches no
// mark), then Decide's rules, then the receipt-log check of an accepted
// write. stored is the trusted state of the stored object. Pure: the webhook
// gathers, DecideWrite decides, the webhook responds.
func DecideWrite(w Write, e Entry, reg Registry, trust Trust) (d Decision, stored State) {
	stored = TrustedState(w.Old, e, trust.Stored)
	switch w.Subresource {
	case "":
		return decideObjectWrite(w, e, stored, reg, trust.Grants), stored
	case SubresourceStatus:
		return decideStatusWrite(w, e, stored), stored
	}
	return Decision{Verdict: FenceRequired, State: stored, Message: fmt.Sprintf(
		"FENCE_REQUIRED: the %s subresource changes the content of a protected object and cannot carry a %s annotation; write the object itself with a fenced segment",
		w.Subresource, AnnotationFence)}, stored
}

// TrustedState is the fence state the stored object holds, counted only if
// the acceptance point can have accepted it: its grant verifies and is bound
// to this entry's resourceID. Anything else (a state planted while the object
// was nobody's target, a real grant of another resource) counts for nothing:
// no fence, no receipts (Stamp starts the log over the same way). A new
// object continues the state its holder deleted. The result never falls below
// the highest fence the registry saw at the target.
func TrustedState(old *Object, e Entry, bundle *grant.TrustBundle) State {
	var st State
	switch {
	case old != nil:
		parsed, err := StateOf(old.Annotations[AnnotationFence], old.Annotations[AnnotationReceipts])
		if err == nil && parsed.Accepted != "" && VerifiesFor(parsed.Accepted, e.ResourceID, bundle) {
			st = parsed
		}
	case e.DeletedTarget != nil:
		st = *e.DeletedTarget
	}
	if e.HighestObservedFence > st.HighestFence {
		st = State{HighestFence: e.HighestObservedFence}
	}
	return st
}

// VerifiesFor reports whether a stored fence annotation carries a grant of
// resourceID that verifies: state the acceptance point can have accepted.
func VerifiesFor(envelope, resourceID string, bundle *grant.TrustBundle) bool {
	e, err := ParseEnvelope(envelope)
	return err == nil && e.Grant.Resource == resourceID && bundle.Verify(e.Grant, e.Grant.Digest(), e.Proof) == nil
}

// decideObjectWrite decides a CREATE, UPDATE or DELETE of the object itself.
func decideObjectWrite(w Write, e Entry, st State, reg Registry, bundle *grant.TrustBundle) Decision {
	attempt := Attempt{User: w.User, Pod: w.Pod, Delete: w.Operation == OpDelete}
	if w.New != nil {
		attempt.Changed = w.Old == nil || w.Changed
		attempt.Fence = w.New.Annotations[AnnotationFence]
		attempt.Payload = w.New.Payload
	}
	missing := ""
	if attempt.Changed {
		missing = protectionMissing(w.New, e)
	}
	if missing != "" && w.Old != nil && protectionMissing(w.Old, e) == "" {
		// Dropping the protection is refused first, whoever asks.
		return Decision{Verdict: ProtectionRemoved, State: st, Message: "PROTECTION_REMOVED: " + missing}
	}
	d := Decide(st, attempt, reg, bundle)
	if d.Verdict == Accepted && missing != "" {
		// A fenced write to a target that never carried the marks must add them.
		return Decision{Verdict: ProtectionRemoved, State: st, Envelope: d.Envelope, Message: "PROTECTION_REMOVED: " + missing}
	}
	if d.Verdict == Accepted && w.New != nil {
		d = checkReceiptLog(d, st, w.New.Annotations[AnnotationReceipts])
	}
	return d
}

// decideStatusWrite decides a write of a target's status subresource. The
// API server keeps the stored spec, but what else it keeps is each kind's
// status strategy's: a custom resource's keeps all of metadata, apps/v1
// Deployment's keeps the labels and takes the request's annotations. A status
// write carries no fence, so it may change none of fencekeeper's own marks:
// dropping the protection is PROTECTION_REMOVED, any other change of them
// FENCE_REQUIRED. Status alone carries no business content.
func decideStatusWrite(w Write, e Entry, st State) Decision {
	changes := changedMarks(w.Old, w.New)
	if len(changes) == 0 {
		return Decision{Verdict: Unchanged, Message: "UNCHANGED: the status subresource carries no business content", State: st}
	}
	if missing := protectionMissing(w.New, e); missing != "" && protectionMissing(w.Old, e) == "" {
		return Decision{Verdict: ProtectionRemoved, State: st, Message: "PROTECTION_REMOVED: " + missing + " (a write of the status subresource dropped it)"}
	}
	return Decision{Verdict: FenceRequired, State: st, Message: fmt.Sprintf(
		"FENCE_REQUIRED: a write of the status subresource of %s %s changes %s, which only a fenced write of the object itself may change",
		w.New.Kind, w.New.Name, strings.Join(changes, ", "))}
}

// changedMarks names fencekeeper's own label and annotations that differ
// between the stored and the written object, in a fixed order.
func changedMarks(before, after *Object) []string {
	var out []string
	diff := func(what, key string, b, a map[string]string) {
		bv, had := b[key]
		av, has := a[key]
		if av != bv || had != has {
			out = append(out, what+" "+key)
		}
	}
	diff("the label", LabelProtected, before.Labels, after.Labels)
	for _, k := range []string{AnnotationResource, AnnotationFence, AnnotationReceipts} {
		diff("the annotation", k, before.Annotations, after.Annotations)
	}
	return out
}

// protectionMissing says what a target's state lacks: the protected label and
// the annotation naming its entry route writes and tell readers the object is
// fenced, so no write may drop them while the entry exists.
func protectionMissing(o *Object, e Entry) string {
	if o.Labels[LabelProtected] != "true" {
		return fmt.Sprintf("%s %s is the target of FencedResource %s and must carry the label %s=true", o.Kind, o.Name, e.Name, LabelProtected)
	}
	if got := o.Annotations[AnnotationResource]; got != e.Name {
		return fmt.Sprintf("%s %s is the target of FencedResource %s and must carry the annotation %s=%s (it has %q)", o.Kind, o.Name, e.Name, AnnotationResource, e.Name, got)
	}
	return ""
}

// checkReceiptLog requires the written receipt log to be the stored log plus
// the accepted segment, so the business change and its receipt are one write.
func checkReceiptLog(d Decision, stored State, receiptsAnnotation string) Decision {
	got, err := ParseReceipts(receiptsAnnotation)
	if err == nil && slices.Equal(got, d.State.Receipts) {
		return d
	}
	detail := "it differs"
	if err != nil {
		detail = err.Error()
	}
	return Decision{Verdict: ReceiptLogMismatch, State: stored, Envelope: d.Envelope, Message: fmt.Sprintf(
		"RECEIPT_LOG_MISMATCH: the %s annotation must be the stored log plus this segment's receipt %s (newest %d kept); %s",
		AnnotationReceipts, d.Receipt, MaxReceipts, detail)}
}

// FenceStateChange says how a write changes the fence and receipt
// annotations: writes adds or changes one (to a non-empty value); changes
// also counts removing one. A status write carries the whole object, whose
// annotations some kinds store (apps/v1 Deployment); other subresources'
// objects (a Scale) are not the target's.
func (w Write) FenceStateChange() (writes, changes bool) {
	if w.New == nil || (w.Subresource != "" && w.Subresource != SubresourceStatus) {
		return false, false
	}
	var before map[string]string
	if w.Old != nil {
		before = w.Old.Annotations
	}
	for _, k := range []string{AnnotationFence, AnnotationReceipts} {
		if w.New.Annotations[k] != before[k] {
			changes = true
			writes = writes || w.New.Annotations[k] != ""
		}
	}
	return writes, changes
}
