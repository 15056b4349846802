package lockclient

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

// ErrChangedSinceIntent says the object changed between the delete-intent segment
// and the delete (its resourceVersion or UID no longer match), so it was not
// deleted. Read it again and decide whether it should still go.
var ErrChangedSinceIntent = errors.New("lockclient: the object changed after the delete intent was committed; not deleted")

// Delete deletes the protected object obj (by namespace and name) as the
// next step of the operation. The acceptance webhook allows a delete only
// when the object's last accepted segment declared it under the current
// grant, so Delete first commits the next segment with the same content and
// intent "delete", then deletes with the resourceVersion and UID that segment
// wrote as preconditions: anything written after the intent makes the delete
// fail with ErrChangedSinceIntent instead of deleting content nobody declared.
//
// It returns the intent segment's receipt. A delete whose answer was lost is
// resolved by reading the object: gone (or a new object under the same name)
// means deleted; changed means it never will be (ErrChangedSinceIntent);
// unchanged means not deleted yet, and it is sent again. If that attempt is
// refused while the first may still land, the result is ErrMutationUnknown,
// not the refusal. An object that does not exist is an error satisfying
// apierrors.IsNotFound.
// Denials are *DenialError (errors.Is ErrDeleteNotDeclared, ErrStaleOwner, …).
func (op *Operation) Delete(ctx context.Context, obj client.Object) (fence.Receipt, error) {
	c, err := op.commit(ctx, obj, func() error { return nil }, fence.IntentDelete)
	if err != nil {
		return fence.Receipt{}, err
	}
	if !c.inObj {
		// The segment was found applied by a later read: obj must still be
		// the object exactly as the intent segment wrote it.
		gone, err := op.refresh(ctx, obj)
		switch {
		case err != nil:
			return c.receipt, err
		case gone:
			return c.receipt, nil
		case obj.GetAnnotations()[fence.AnnotationFence] != c.envelope:
			return c.receipt, fmt.Errorf("%w: %s carries a later segment", ErrChangedSinceIntent, obj.GetName())
		}
	}
	return c.receipt, op.deleteAt(ctx, obj, obj.GetUID(), obj.GetResourceVersion())
}

// deleteAt deletes obj if it is still the object with uid at resourceVersion rv.
// Once a send got no answer, it may still land while the object stays at rv
// (the API server may be waiting on etcd), so a refusal after it is not
// reported as "not deleted" until a read shows the object moved on.
func (op *Operation) deleteAt(ctx context.Context, obj client.Object, uid types.UID, rv string) error {
	pre := client.Preconditions{UID: &uid, ResourceVersion: &rv}
	lost := false
	for attempt := 0; attempt < 5; attempt++ {
		if err := op.lock.Guard(); err != nil {
			return op.deleteRefused(ctx, obj, uid, rv, lost, err)
		}
		err := op.lock.c.kube.Delete(ctx, obj, pre)
		switch {
		case err == nil:
			return nil
		case apierrors.IsNotFound(err):
			return nil // deleted (by an earlier attempt whose answer was lost)
		case apierrors.IsConflict(err):
			// Past rv: no send of this delete can land any more.
			return fmt.Errorf("%w: %s is no longer resourceVersion %s: %v", ErrChangedSinceIntent, obj.GetName(), rv, err)
		}
		if _, denied := asDenial(err); denied || definitive(err) {
			return op.deleteRefused(ctx, obj, uid, rv, lost, err)
		}
		// No answer: did the delete land?
		lost = true
		deleted, rerr := op.deleted(ctx, obj, uid, rv)
		if rerr != nil || deleted {
			return rerr
		}
		if err := ctxtime.Sleep(ctx, time.Duration(attempt+1)*100*time.Millisecond); err != nil {
			return fmt.Errorf("%w: delete of %s got no answer and may still land: %v", ErrMutationUnknown, obj.GetName(), err)
		}
	}
	return fmt.Errorf("%w: delete of %s got no answer", ErrMutationUnknown, obj.GetName())
}

// deleteRefused returns err, the refusal of the latest attempt, unless an
// earlier send that got no answer deleted the object or may still.
func (op *Operation) deleteRefused(ctx context.Context, obj client.Object, uid types.UID, rv string, lost bool, err error) error {
	if d, ok := asDenial(err); ok {
		err = d
	}
	if !lost {
		return err
	}
	deleted, rerr := op.deleted(ctx, obj, uid, rv)
	switch {
	case deleted:
		return nil
	case errors.Is(rerr, ErrChangedSinceIntent):
		return err // the object moved past rv: the earlier send cannot land
	}
	return fmt.Errorf("%w: delete of %s: an earlier send got no answer and may still land; the last attempt: %v", ErrMutationUnknown, obj.GetName(), err)
}

// deleted reads the object after a delete with no answer: gone, replaced by
// another object (another UID) or being deleted means the delete landed; the
// same resourceVersion means it has not landed yet (it still may); another
// resourceVersion means it never will (ErrChangedSinceIntent).
func (op *Operation) deleted(ctx context.Context, obj client.Object, uid types.UID, rv string) (bool, error) {
	cur := obj.DeepCopyObject().(client.Object)
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		err = op.lock.c.kube.Get(ctx, client.ObjectKeyFromObject(obj), cur)
		switch {
		case apierrors.IsNotFound(err):
			return true, nil
		case err == nil && (cur.GetUID() != uid || cur.GetDeletionTimestamp() != nil):
			return true, nil
		case err == nil && cur.GetResourceVersion() == rv:
			return false, nil
		case err == nil:
			return false, fmt.Errorf("%w: %s changed while its delete was in flight", ErrChangedSinceIntent, obj.GetName())
		}
		if serr := ctxtime.Sleep(ctx, time.Duration(attempt+1)*200*time.Millisecond); serr != nil {
			return false, fmt.Errorf("%w: delete of %s sent, its outcome unreadable: %v", ErrMutationUnknown, obj.GetName(), serr)
		}
	}
	return false, fmt.Errorf("%w: delete of %s sent, its outcome unreadable: %v", ErrMutationUnknown, obj.GetName(), err)
}

// refresh reads obj again; true when it no longer exists.
func (op *Operation) refresh(ctx context.Context, obj client.Object) (bool, error) {
	err := op.lock.c.kube.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	return false, err
}
