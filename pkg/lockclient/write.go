package lockclient

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

// Operation commits the segments of one planned operation under a lock.
type Operation struct {
	lock *Lock
	id   string
}

// Operation returns the operation with the given ID (stable across restarts:
// it is how receipts are found again).
func (l *Lock) Operation(id string) *Operation { return &Operation{lock: l, id: id} }

// ID is the operation ID.
func (op *Operation) ID() string { return op.id }

// Commit writes the next segment: it reads obj (by namespace and name; it may
// not exist yet), applies mutate to the content, and writes content, fence
// annotation and receipt log in one write. The segment number continues from
// the object's receipt log, so a restarted worker resumes where it stopped.
//
// ALREADY_APPLIED is success (the original receipt is returned). A write with
// no answer is resolved by reading the object (ResolveSent); while it may
// still land, a refusal of a later attempt is not reported: if nothing
// decides it (or ctx ends first), the result is an *UnknownOutcomeError
// (ErrMutationUnknown), after the outcome was recorded on the LockGrant for
// reconciliation: that record is retried, past ctx, for up to 30 s while the
// API server cannot be reached or refuses it as forbidden (an API server just
// restarted does until its authorizer caught up), and the error says if it
// still failed. Any other error means nothing was written, nor will be.
// Denials are *DenialError (errors.Is ErrStaleOwner, …).
func (op *Operation) Commit(ctx context.Context, obj client.Object, mutate func() error) (fence.Receipt, error) {
	c, err := op.commit(ctx, obj, mutate, "")
	return c.receipt, err
}

// committed is the outcome of one fenced segment.
type committed struct {
	receipt fence.Receipt
	// envelope is the fence annotation the segment carried.
	envelope string
	// inObj: obj is the API server's answer to the write itself (so its
	// resourceVersion is the object as this segment wrote it); otherwise the
	// segment was found applied by reading the object again.
	inObj bool
}

func (op *Operation) commit(ctx context.Context, obj client.Object, mutate func() error, intent string) (committed, error) {
	// lost holds the earlier sends of this segment that got no answer. Each
	// may still land until a read shows the object past the version it was
	// conditioned on, so while one may, no refusal is reported as the truth.
	var lost []lostSend
	freshLog := false
	for attempt := 0; attempt < 8; attempt++ {
		if err := op.lock.Guard(); err != nil {
			return op.refused(ctx, obj, lost, err)
		}
		seen, err := op.observe(ctx, obj)
		if err != nil {
			return op.refused(ctx, obj, lost, err)
		}
		if c, done, err := op.decideLost(ctx, obj, &lost, seen); done {
			return c, err
		}
		p, err := op.prepare(obj, seen, mutate, intent, freshLog)
		if err != nil {
			return op.refused(ctx, obj, lost, err)
		}
		if p.sent.Create {
			err = op.lock.c.kube.Create(ctx, obj)
		} else {
			err = op.lock.c.kube.Update(ctx, obj)
		}
		c, next, err := settle(p, err)
		switch {
		case startsLogOver(err, p, freshLog):
			// The acceptance point does not trust the stored fence state (a
			// forgery planted while the object was nobody's target): its log
			// counts for nothing and this segment starts a new one. The client
			// cannot verify signatures; the webhook can, and a wrong guess is
			// only a denial that changed nothing.
			freshLog = true
		case next == sendLost:
			lost = append(lost, lostSend{Sent: p.sent, envelope: p.envelope})
		case next == sendDone && err != nil:
			return op.refused(ctx, obj, lost, err)
		case next == sendDone:
			return c, nil
		}
	}
	return op.refused(ctx, obj, lost, fmt.Errorf("commit of %s kept conflicting with other writers", obj.GetName()))
}

// prepared is one fenced write, stamped and ready to send.
type prepared struct {
	// sent is the write as it will be resolved if its answer is lost.
	sent     Sent
	envelope string
	// storedLog: the object as read had a receipt log (Stamp may have kept it).
	storedLog bool
}

// lostSend is a send of the segment that got no answer.
type lostSend struct {
	Sent
	envelope string
}

// startsLogOver reports whether a denied segment should be sent again with a
// receipt log of its own receipt only.
func startsLogOver(err error, p prepared, freshLog bool) bool {
	var d *DenialError
	return errors.As(err, &d) && d.Verdict == fence.ReceiptLogMismatch && !freshLog && p.storedLog
}

// prepare applies mutate to obj as read (seen) and stamps the next segment
// of the operation under the lock's grant, with the given intent.
func (op *Operation) prepare(obj client.Object, seen Observed, mutate func() error, intent string, freshLog bool) (prepared, error) {
	l := op.lock
	g, proof := l.Grant()
	if intent == fence.IntentDelete && !seen.Exists {
		return prepared{}, apierrors.NewNotFound(schema.GroupResource{Resource: obj.GetObjectKind().GroupVersionKind().Kind}, obj.GetName())
	}
	ann := obj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	segment := fence.NextSegment(seen.State, g)
	if !seen.Exists {
		// The next one after the segment that deleted it under this grant
		// (the registry remembers a deleted target's state), else 1.
		segment = 1
		if dt := seen.Deleted; dt != nil && dt.GrantDigest == g.Digest() {
			segment = dt.Segment + 1
		}
	}
	if err := mutate(); err != nil {
		return prepared{}, err
	}
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[fence.LabelProtected] = "true"
	obj.SetLabels(labels)
	ann[fence.AnnotationResource] = l.resource
	payload, err := payloadOf(obj)
	if err != nil {
		return prepared{}, err
	}
	storedLog := ann[fence.AnnotationReceipts] != ""
	if freshLog {
		delete(ann, fence.AnnotationReceipts)
	}
	receipt, err := fence.Stamp(ann, fence.Envelope{Grant: g, Proof: proof, Operation: op.id, Segment: segment, Payload: payload, Intent: intent})
	if err != nil {
		return prepared{}, err
	}
	obj.SetAnnotations(ann)
	return prepared{sent: Sent{Receipt: receipt, Create: !seen.Exists, ResourceVersion: seen.ResourceVersion, GrantDigest: g.Digest()},
		envelope: ann[fence.AnnotationFence], storedLog: storedLog}, nil
}

// sendOutcome is what one send's answer leaves to do.
type sendOutcome int

const (
	sendDone  sendOutcome = iota // applied, or refused (with the error)
	sendAgain                    // someone wrote in between: read again and renumber
	sendLost                     // no answer: it may have landed, or may still
)

// settle interprets the answer to a prepared write.
func settle(p prepared, err error) (committed, sendOutcome, error) {
	c := committed{receipt: p.sent.Receipt, envelope: p.envelope}
	if err == nil {
		c.inObj = true
		return c, sendDone, nil
	}
	if d, ok := asDenial(err); ok {
		if d.Verdict == fence.AlreadyApplied {
			if d.Receipt != "" {
				c.receipt.Receipt = d.Receipt
			}
			return c, sendDone, nil
		}
		return committed{}, sendDone, d
	}
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		return committed{}, sendAgain, nil
	}
	if definitive(err) {
		return committed{}, sendDone, err
	}
	return committed{}, sendLost, nil
}

// decideLost decides the sends that got no answer from a read made after
// them (seen): done when one of them landed (its receipt), or when the log
// cannot tell (ErrMutationUnknown); otherwise lost keeps those still in
// flight and drops those proven absent.
func (op *Operation) decideLost(ctx context.Context, obj client.Object, lost *[]lostSend, seen Observed) (committed, bool, error) {
	kept := (*lost)[:0]
	var unsure *Sent
	for _, s := range *lost {
		switch out, r := ResolveSent(s.Sent, seen); out {
		case Applied:
			return committed{receipt: r, envelope: s.envelope}, true, nil
		case AppliedOtherPayload:
			return committed{}, true, op.unknown(ctx, obj, s.Sent, "the segment was applied with another payload")
		case Undeterminable:
			unsure = &s.Sent
		case InFlight:
			kept = append(kept, s)
		}
	}
	if unsure != nil {
		return committed{}, true, op.unknown(ctx, obj, *unsure, "the receipt log no longer reaches back to it")
	}
	*lost = kept
	return committed{}, false, nil
}

// refused returns err, the refusal of the latest attempt, unless an earlier
// send that got no answer landed (its receipt) or may still land
// (ErrMutationUnknown): a refusal proves nothing about a write in flight.
func (op *Operation) refused(ctx context.Context, obj client.Object, lost []lostSend, err error) (committed, error) {
	if len(lost) == 0 {
		return committed{}, err
	}
	seen, rerr := op.observeRetrying(ctx, obj)
	if rerr == nil {
		if c, done, derr := op.decideLost(ctx, obj, &lost, seen); done {
			return c, derr
		}
		if len(lost) == 0 {
			return committed{}, err // every earlier send proven absent: the refusal is the truth
		}
	}
	return committed{}, op.unknown(ctx, obj, lost[0].Sent, fmt.Sprintf("an earlier send got no answer and may still land; the last attempt: %v", err))
}

// Applied lists the receipts of this operation still in obj's receipt log.
func (op *Operation) Applied(ctx context.Context, obj client.Object) ([]fence.Receipt, error) {
	if _, err := op.read(ctx, obj); err != nil {
		return nil, err
	}
	rs, err := fence.ParseReceipts(obj.GetAnnotations()[fence.AnnotationReceipts])
	if err != nil {
		return nil, err
	}
	var out []fence.Receipt
	for _, r := range rs {
		if r.Operation == op.id {
			out = append(out, r)
		}
	}
	return out, nil
}

// observe reads obj (it may not exist), its fence state and, when it does
// not exist, the registry's record of its last deletion.
func (op *Operation) observe(ctx context.Context, obj client.Object) (Observed, error) {
	exists, err := op.read(ctx, obj)
	if err != nil {
		return Observed{}, err
	}
	ann := obj.GetAnnotations()
	st, err := fence.StateOf(ann[fence.AnnotationFence], ann[fence.AnnotationReceipts])
	if err != nil {
		return Observed{}, fmt.Errorf("stored fence state of %s: %w", obj.GetName(), err)
	}
	seen := Observed{Exists: exists, ResourceVersion: obj.GetResourceVersion(), State: st}
	if !exists {
		var fr locksv1.FencedResource
		key := types.NamespacedName{Namespace: op.lock.key.Namespace, Name: op.lock.resource}
		if err := op.lock.c.kube.Get(ctx, key, &fr); err != nil {
			return Observed{}, fmt.Errorf("read FencedResource %s: %w", key, err)
		}
		seen.Deleted = fr.Status.DeletedTarget
	}
	return seen, nil
}

// observeRetrying observes obj for a write that got no answer: the partition
// that lost the answer may still hide the object, so it tries a few times
// while ctx lasts.
func (op *Operation) observeRetrying(ctx context.Context, obj client.Object) (Observed, error) {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		var seen Observed
		if seen, err = op.observe(ctx, obj); err == nil {
			return seen, nil
		}
		if serr := ctxtime.Sleep(ctx, time.Duration(attempt+1)*200*time.Millisecond); serr != nil {
			// The caller's time ran out with the outcome still unknown: it
			// must not look like an ordinary error (found by make chaos).
			return Observed{}, serr
		}
	}
	return Observed{}, err
}

// unknown records a write whose outcome stays unknown on the LockGrant, for
// the operator to surface, and returns it as an *UnknownOutcomeError.
func (op *Operation) unknown(ctx context.Context, obj client.Object, s Sent, why string) error {
	e := &UnknownOutcomeError{Sent: s, Object: obj.GetObjectKind().GroupVersionKind().Kind + "/" + obj.GetName(), LockGrant: op.lock.key.Name, why: why}
	// Found by make chaos: a partition long enough hides the LockGrant too,
	// and the caller must know nobody else will reconcile this write.
	e.RecordErr = op.recordUnresolved(ctx, obj, s.Receipt)
	return e
}

// Resolve decides, from the object as it is now, a write that Commit
// reported unknown (UnknownOutcomeError.Sent). InFlight means it may still
// land: ask again later; the LockGrant's record stays until someone removes it.
func (op *Operation) Resolve(ctx context.Context, obj client.Object, s Sent) (Resolution, fence.Receipt, error) {
	seen, err := op.observe(ctx, obj)
	if err != nil {
		return Undeterminable, fence.Receipt{}, err
	}
	out, r := ResolveSent(s, seen)
	return out, r, nil
}

// unresolvedRecordTimeout bounds how long a commit keeps trying to record an
// undeterminable outcome on its LockGrant when the API server cannot be
// reached: the record is what makes the operator surface the write for
// reconciliation, so it outlives the caller's context, but not forever.
const unresolvedRecordTimeout = 30 * time.Second

func (op *Operation) recordUnresolved(ctx context.Context, obj client.Object, want fence.Receipt) error {
	rec, err := locksv1.UnresolvedMutation{Object: obj.GetObjectKind().GroupVersionKind().Kind + "/" + obj.GetName(), Operation: want.Operation,
		Fence: want.Fence, Segment: want.Segment, Payload: want.Payload, Since: time.Now().UTC()}.Encode()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unresolvedRecordTimeout)
	defer cancel()
	// The issuer's status writes and this lock's renewals race with it
	// (conflicts: re-read at once), and the partition that made the outcome
	// unknown may still hide the LockGrant (back off and retry until time is
	// up). So may an API server just restarted after it: it serves before its
	// authorizer has caught up and answers Forbidden for a moment (found by
	// make chaos), while this owner reads and renews its own LockGrant. Any
	// other answer of the API server (the LockGrant is gone, the record is
	// invalid) is final.
	for attempt := 0; ; attempt++ {
		err := op.tryRecordUnresolved(ctx, rec)
		switch {
		case err == nil:
			return nil
		case apierrors.IsConflict(err):
			continue
		case definitive(err) && !apierrors.IsForbidden(err):
			return err
		}
		if ctxtime.Sleep(ctx, min(time.Duration(attempt+1)*200*time.Millisecond, 2*time.Second)) != nil {
			return err
		}
	}
}

func (op *Operation) tryRecordUnresolved(ctx context.Context, rec string) error {
	l := op.lock
	var lg locksv1.LockGrant
	if err := l.c.kube.Get(ctx, l.key, &lg); err != nil {
		return err
	}
	if lg.Annotations == nil {
		lg.Annotations = map[string]string{}
	}
	if _, exists := lg.Annotations[locksv1.AnnotationUnresolvedMutation]; exists {
		return nil // the oldest unresolved outcome is the one that matters
	}
	lg.Annotations[locksv1.AnnotationUnresolvedMutation] = rec
	return l.c.kube.Update(ctx, &lg)
}

// read refreshes obj from the API server; false when it does not exist.
func (op *Operation) read(ctx context.Context, obj client.Object) (bool, error) {
	key := client.ObjectKeyFromObject(obj)
	if key.Namespace == "" {
		key.Namespace = op.lock.key.Namespace
		obj.SetNamespace(key.Namespace)
	}
	gvk, err := apiutil.GVKForObject(obj, locksv1.Scheme)
	if err != nil {
		return false, err
	}
	err = op.lock.c.kube.Get(ctx, key, obj)
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	if apierrors.IsNotFound(err) {
		// Start from an empty object of the same kind and name.
		fresh, ferr := emptyLike(obj, gvk.Kind)
		if ferr != nil {
			return false, ferr
		}
		copyInto(obj, fresh)
		obj.SetNamespace(key.Namespace)
		obj.SetName(key.Name)
		obj.SetResourceVersion("")
		return false, nil
	}
	return err == nil, err
}

// payloadOf digests obj's business content exactly as the webhook does.
func payloadOf(obj client.Object) (string, error) {
	gvk, err := apiutil.GVKForObject(obj, locksv1.Scheme)
	if err != nil {
		return "", err
	}
	u, ok := obj.(*unstructured.Unstructured)
	var m map[string]any
	if ok {
		m = u.Object
	} else if m, err = runtime.DefaultUnstructuredConverter.ToUnstructured(obj); err != nil {
		return "", err
	}
	m["apiVersion"], m["kind"] = gvk.GroupVersion().String(), gvk.Kind
	return fence.PayloadDigest(fence.ObjectPayload(m))
}

func emptyLike(obj client.Object, kind string) (client.Object, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		e := &unstructured.Unstructured{}
		e.SetGroupVersionKind(u.GroupVersionKind())
		return e, nil
	}
	o, err := locksv1.Scheme.New(obj.GetObjectKind().GroupVersionKind())
	if err != nil {
		return nil, fmt.Errorf("new %s: %w", kind, err)
	}
	return o.(client.Object), nil
}

func copyInto(dst, src client.Object) {
	if du, ok := dst.(*unstructured.Unstructured); ok {
		du.Object = src.(*unstructured.Unstructured).Object
		return
	}
	reflect.ValueOf(dst).Elem().Set(reflect.ValueOf(src).Elem())
}
