package lockclient

import (
	"context"
	"encoding/json"
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
// no answer is resolved from the receipt log; if that cannot tell (or ctx
// ends first), the result is ErrMutationUnknown, after the outcome was
// recorded on the LockGrant for reconciliation: that record is retried, past
// ctx, for up to 30 s while the API server cannot be reached, and the error
// says if it still failed. Any other error means nothing was written.
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
	freshLog := false
	for attempt := 0; attempt < 8; attempt++ {
		if err := op.lock.Guard(); err != nil {
			return committed{}, err
		}
		p, err := op.prepare(ctx, obj, mutate, intent, freshLog)
		if err != nil {
			return committed{}, err
		}
		if p.exists {
			err = op.lock.c.kube.Update(ctx, obj)
		} else {
			err = op.lock.c.kube.Create(ctx, obj)
		}
		c, retry, err := op.settle(ctx, obj, p, err)
		if startsLogOver(err, p, freshLog) {
			// The acceptance point does not trust the stored fence state (a
			// forgery planted while the object was nobody's target): its log
			// counts for nothing and this segment starts a new one. The client
			// cannot verify signatures; the webhook can, and a wrong guess is
			// only a denial that changed nothing.
			freshLog = true
			continue
		}
		if !retry {
			return c, err
		}
	}
	return committed{}, fmt.Errorf("commit of %s kept conflicting with other writers", obj.GetName())
}

// prepared is one fenced write, stamped and ready to send.
type prepared struct {
	exists   bool
	receipt  fence.Receipt
	envelope string
	// storedLog: the object as read had a receipt log (Stamp may have kept it).
	storedLog bool
}

// prepare reads obj, applies mutate and stamps the next segment of the
// operation under the lock's grant, with the given intent.
// startsLogOver reports whether a denied segment should be sent again with a
// receipt log of its own receipt only.
func startsLogOver(err error, p prepared, freshLog bool) bool {
	var d *DenialError
	return errors.As(err, &d) && d.Verdict == fence.ReceiptLogMismatch && !freshLog && p.storedLog
}

func (op *Operation) prepare(ctx context.Context, obj client.Object, mutate func() error, intent string, freshLog bool) (prepared, error) {
	l := op.lock
	g, proof := l.Grant()
	exists, err := op.read(ctx, obj)
	if err != nil {
		return prepared{}, err
	}
	if intent == fence.IntentDelete && !exists {
		return prepared{}, apierrors.NewNotFound(schema.GroupResource{Resource: obj.GetObjectKind().GroupVersionKind().Kind}, obj.GetName())
	}
	ann := obj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	st, err := fence.StateOf(ann[fence.AnnotationFence], ann[fence.AnnotationReceipts])
	if err != nil {
		return prepared{}, fmt.Errorf("stored fence state of %s: %w", obj.GetName(), err)
	}
	segment := fence.NextSegment(st, g)
	if !exists {
		if segment, err = op.segmentAfterDelete(ctx, g.Digest()); err != nil {
			return prepared{}, err
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
	return prepared{exists: exists, receipt: receipt, envelope: ann[fence.AnnotationFence], storedLog: storedLog}, nil
}

// segmentAfterDelete numbers the first segment of an object that does not
// exist: the next one after the segment that deleted it under this grant (the
// registry remembers a deleted target's state), else 1.
func (op *Operation) segmentAfterDelete(ctx context.Context, digest string) (int64, error) {
	var fr locksv1.FencedResource
	key := types.NamespacedName{Namespace: op.lock.key.Namespace, Name: op.lock.resource}
	if err := op.lock.c.kube.Get(ctx, key, &fr); err != nil {
		return 0, fmt.Errorf("read FencedResource %s: %w", key, err)
	}
	if dt := fr.Status.DeletedTarget; dt != nil && dt.GrantDigest == digest {
		return dt.Segment + 1, nil
	}
	return 1, nil
}

// settle interprets the answer to a prepared write: done (with a receipt or
// an error), or retry (a conflict, or a write proven absent).
func (op *Operation) settle(ctx context.Context, obj client.Object, p prepared, err error) (committed, bool, error) {
	c := committed{receipt: p.receipt, envelope: p.envelope}
	if err == nil {
		c.inObj = true
		return c, false, nil
	}
	if d, ok := asDenial(err); ok {
		if d.Verdict == fence.AlreadyApplied {
			if d.Receipt != "" {
				c.receipt.Receipt = d.Receipt
			}
			return c, false, nil
		}
		return committed{}, false, d
	}
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		return committed{}, true, nil // someone wrote in between: read again and renumber
	}
	if definitive(err) {
		return committed{}, false, err
	}
	// MUTATION_UNKNOWN: the write may or may not have landed.
	applied, resolved, rerr := op.resolve(ctx, obj, p.receipt)
	switch {
	case rerr != nil:
		return committed{}, false, rerr
	case applied:
		c.receipt = resolved
		return c, false, nil
	}
	return committed{}, true, nil // proven absent: try again under the current grant
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

// resolve decides a write with an unknown outcome from the receipt log:
// applied (its receipt is there), proven absent (the log shows where it would
// be, and it is not), or undeterminable (recorded for the operator).
func (op *Operation) resolve(ctx context.Context, obj client.Object, want fence.Receipt) (bool, fence.Receipt, error) {
	var st fence.State
	var err error
	exists := false
	for attempt := 0; attempt < 5; attempt++ {
		if exists, err = op.read(ctx, obj); err == nil {
			ann := obj.GetAnnotations()
			st, err = fence.StateOf(ann[fence.AnnotationFence], ann[fence.AnnotationReceipts])
			if err == nil {
				break
			}
		}
		if serr := sleep(ctx, time.Duration(attempt+1)*200*time.Millisecond); serr != nil {
			// The caller's time ran out with the outcome still unknown: it
			// must not look like an ordinary error (found by make chaos).
			err = serr
			break
		}
	}
	if err == nil {
		out, r := ResolveFromLog(st, want)
		if !exists {
			// Gone: it may have been deleted after this segment landed (a
			// declared delete by a process of the same grant).
			var fr locksv1.FencedResource
			key := types.NamespacedName{Namespace: op.lock.key.Namespace, Name: op.lock.resource}
			if gerr := op.lock.c.kube.Get(ctx, key, &fr); gerr != nil {
				// The registry cannot be read: the write stays unknown.
				out = Undeterminable
			} else {
				g, _ := op.lock.Grant()
				out, r = ResolveDeleted(fr.Status.DeletedTarget, g.Digest(), want)
			}
		}
		switch out {
		case Applied:
			return true, r, nil
		case AppliedOtherPayload:
			return false, fence.Receipt{}, fmt.Errorf("%w: segment %d of fence %d was applied with another payload", ErrMutationUnknown, want.Segment, want.Fence)
		case ProvenAbsent:
			return false, fence.Receipt{}, nil
		}
	}
	if rerr := op.recordUnresolved(ctx, obj, want); rerr != nil {
		// Found by make chaos: a partition long enough hides the LockGrant
		// too, and the caller must know nobody else will reconcile this write.
		return false, fence.Receipt{}, fmt.Errorf("%w: %s segment %d under fence %d (not recorded on LockGrant %s: %v; resolve it later with Operation.Applied)",
			ErrMutationUnknown, obj.GetName(), want.Segment, want.Fence, op.lock.key.Name, rerr)
	}
	return false, fence.Receipt{}, fmt.Errorf("%w: %s segment %d under fence %d (recorded on LockGrant %s for reconciliation)",
		ErrMutationUnknown, obj.GetName(), want.Segment, want.Fence, op.lock.key.Name)
}

// Resolution is what an object's fence state says about a write whose
// outcome is unknown (DESIGN.md, MUTATION_UNKNOWN).
type Resolution int

const (
	// Undeterminable means the receipt log no longer reaches back to the write.
	Undeterminable Resolution = iota
	// Applied means the write's receipt is in the log; reuse it.
	Applied
	// AppliedOtherPayload means the segment was applied with a different payload.
	AppliedOtherPayload
	// ProvenAbsent means the write never landed; it may be retried under a current fence.
	ProvenAbsent
)

// ResolveFromLog decides a write (its fence, segment, operation and payload)
// from the stored fence state. Segments of a fence are accepted in order and
// the log keeps the newest receipts, so the write is absent when the object
// never reached it, or when the log reaches back past where it would be and
// lacks it.
func ResolveFromLog(st fence.State, want fence.Receipt) (Resolution, fence.Receipt) {
	for _, r := range st.Receipts {
		if r.Fence == want.Fence && r.Segment == want.Segment && r.Operation == want.Operation {
			if r.Payload == want.Payload {
				return Applied, r
			}
			return AppliedOtherPayload, r
		}
	}
	if st.HighestFence < want.Fence || (st.HighestFence == want.Fence && st.LastSegment < want.Segment) {
		return ProvenAbsent, fence.Receipt{}
	}
	if len(st.Receipts) == 0 {
		return Undeterminable, fence.Receipt{}
	}
	if oldest := st.Receipts[0]; oldest.Fence < want.Fence || (oldest.Fence == want.Fence && oldest.Segment < want.Segment) {
		return ProvenAbsent, fence.Receipt{}
	}
	return Undeterminable, fence.Receipt{}
}

// ResolveDeleted decides a write of unknown outcome to an object that no
// longer exists, from the registry's record of its last deletion
// (FencedResource status.deletedTarget, fence F segment S):
//   - deleted by this grant at or after this segment: it had landed
//     (segments of a fence are accepted in order);
//   - deleted by this grant before this segment, by an older fence, or never:
//     it never landed (had it created the object, the object would exist, or
//     a later delete would have replaced the record);
//   - deleted by a newer fence: the object lived on past this grant and its
//     receipts went with it, so nothing shows whether the write landed.
func ResolveDeleted(deleted *locksv1.DeletedTarget, grantDigest string, want fence.Receipt) (Resolution, fence.Receipt) {
	switch {
	case deleted == nil || deleted.FenceToken < want.Fence:
		return ProvenAbsent, fence.Receipt{}
	case deleted.FenceToken > want.Fence || deleted.GrantDigest != grantDigest:
		return Undeterminable, fence.Receipt{}
	case deleted.Segment >= want.Segment:
		return Applied, want
	default:
		return ProvenAbsent, fence.Receipt{}
	}
}

// unresolvedRecordTimeout bounds how long a commit keeps trying to record an
// undeterminable outcome on its LockGrant when the API server cannot be
// reached: the record is what makes the operator surface the write for
// reconciliation, so it outlives the caller's context, but not forever.
const unresolvedRecordTimeout = 30 * time.Second

func (op *Operation) recordUnresolved(ctx context.Context, obj client.Object, want fence.Receipt) error {
	rec, _ := json.Marshal(locksv1.UnresolvedMutation{Object: obj.GetObjectKind().GroupVersionKind().Kind + "/" + obj.GetName(), Operation: want.Operation,
		Fence: want.Fence, Segment: want.Segment, Payload: want.Payload, Since: time.Now().UTC()})
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unresolvedRecordTimeout)
	defer cancel()
	// The issuer's status writes and this lock's renewals race with it
	// (conflicts: re-read at once), and the partition that made the outcome
	// unknown may still hide the LockGrant (back off and retry until time is
	// up). Any other answer of the API server (forbidden, gone) is final.
	for attempt := 0; ; attempt++ {
		err := op.tryRecordUnresolved(ctx, rec)
		switch {
		case err == nil:
			return nil
		case apierrors.IsConflict(err):
			continue
		case definitive(err):
			return err
		}
		if sleep(ctx, min(time.Duration(attempt+1)*200*time.Millisecond, 2*time.Second)) != nil {
			return err
		}
	}
}

func (op *Operation) tryRecordUnresolved(ctx context.Context, rec []byte) error {
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
	lg.Annotations[locksv1.AnnotationUnresolvedMutation] = string(rec)
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
