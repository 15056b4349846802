package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

// The replica: a second pod of the honest workers' ServiceAccount (the
// same identity, another pod UID), in the tenant's hands. It reads the
// current holder's grant from the registry (anyone with the requester role
// may) and uses it: fenced writes, delete intents and deletes of the
// honest target, and renewals, releases and deletes of the holder's
// LockGrant. The contract: every one is WRONG_OWNER (docs/contract.md,
// "Grants are bound to the pod that asked").
type replica struct {
	kube     client.Client
	identity string // the workers' ServiceAccount
	tenant   *tenantSide
	n        int
}

const outcomeAccepted = string(fence.Accepted)

var wrongPodKinds = []string{"fenced write", "delete intent", "delete", "LockGrant release", "LockGrant renewal", "LockGrant delete"}

// attempt makes the next kind of attempt and counts its outcome. Writes,
// delete intents and deletes of the target go under the current holder's
// grant, LockGrant changes to the holder's LockGrant or, when a worker
// does not hold the lock, to a worker's queued one. Nothing is attempted
// against the tenant's own grants (another identity, not another pod) nor
// against a LockGrant already released (a no-op change is no acceptance).
func (r *replica) attempt(ctx context.Context) {
	var fr locksv1.FencedResource
	if err := r.kube.Get(ctx, types.NamespacedName{Namespace: soakHonestNS, Name: soakLock}, &fr); err != nil {
		return
	}
	holds := fr.Status.Holder != nil && fr.Status.Holder.Owner == r.identity
	grantName := ""
	if holds {
		grantName = fr.Status.Holder.GrantName
	}
	for _, q := range fr.Status.Queue {
		if grantName == "" && q.Owner == r.identity {
			grantName = q.GrantName
		}
	}
	kind := wrongPodKinds[r.n%len(wrongPodKinds)]
	r.n++
	if grantName == "" || (!holds && !strings.HasPrefix(kind, "LockGrant")) {
		return
	}
	err := r.try(ctx, kind, &fr, grantName)
	if ctx.Err() != nil || errors.Is(err, errNothingToChange) {
		return
	}
	t := r.tenant
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.res.WrongPod[kind] == nil {
		t.res.WrongPod[kind] = map[string]int{}
	}
	o := outcomeOf(err)
	t.res.WrongPod[kind][o]++
	if key := kind + ": " + o; err != nil && t.res.WrongPodMessages[key] == "" {
		t.res.WrongPodMessages[key] = shorten(err.Error(), 240)
	}
}

// errNothingToChange: the holder's LockGrant was released meanwhile.
var errNothingToChange = errors.New("the LockGrant is already released")

func (r *replica) try(ctx context.Context, kind string, fr *locksv1.FencedResource, grantName string) error {
	grantKey := types.NamespacedName{Namespace: soakHonestNS, Name: grantName}
	lg := &locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: grantKey.Namespace, Name: grantKey.Name}}
	switch kind {
	case "fenced write":
		return r.write(ctx, fr, "")
	case "delete intent":
		return r.write(ctx, fr, fence.IntentDelete)
	case "delete":
		return r.kube.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: soakHonestNS, Name: soakData}})
	case "LockGrant delete":
		return r.kube.Delete(ctx, lg)
	}
	// Renewal and release: changes of the LockGrant as read, conditioned on
	// its resourceVersion, so that a success is a change this pod made.
	if err := r.kube.Get(ctx, grantKey, lg); err != nil {
		return err
	}
	if lg.Spec.Release || lg.Status.Phase.Terminal() {
		return errNothingToChange
	}
	change := `"release":true`
	if kind == "LockGrant renewal" {
		change = fmt.Sprintf(`"renewals":%d`, lg.Spec.Renewals+1)
	}
	patch := fmt.Sprintf(`{"metadata":{"resourceVersion":%q},"spec":{%s}}`, lg.ResourceVersion, change)
	return r.kube.Patch(ctx, lg, client.RawPatch(types.MergePatchType, []byte(patch)))
}

// write sends the honest target's next segment under the holder's grant,
// built as the holder would (receipt log, payload digest), from this pod.
// The update carries no resourceVersion, so the acceptance webhook, not a
// conflict, decides it.
func (r *replica) write(ctx context.Context, fr *locksv1.FencedResource, intent string) error {
	var cm corev1.ConfigMap
	if err := r.kube.Get(ctx, types.NamespacedName{Namespace: soakHonestNS, Name: soakData}, &cm); err != nil {
		return err
	}
	h := fr.Status.Holder
	g := h.Grant(fr.Spec.ResourceID)
	st, _ := fence.StateOf(cm.Annotations[fence.AnnotationFence], cm.Annotations[fence.AnnotationReceipts])
	data := maps.Clone(cm.Data)
	if data == nil {
		data = map[string]string{}
	}
	data["replica"] = strconv.Itoa(r.n)
	payload, err := fence.PayloadDigest(fence.ConfigMapPayload(data, cm.BinaryData))
	if err != nil {
		return err
	}
	ann := maps.Clone(cm.Annotations)
	if ann == nil {
		ann = map[string]string{}
	}
	env := fence.Envelope{Grant: g, Proof: h.Proof, Operation: fmt.Sprintf("replica-%d", r.n), Segment: fence.NextSegment(st, g), Payload: payload, Intent: intent}
	if _, err := fence.Stamp(ann, env); err != nil {
		return err
	}
	next := cm.DeepCopy()
	next.Data, next.Annotations, next.ResourceVersion = data, ann, ""
	return r.kube.Update(ctx, next)
}

// verdictCode finds a fencekeeper verdict code in a refusal's message.
var verdictCode = regexp.MustCompile(`\b(WRONG_OWNER|[A-Z]+(?:_[A-Z]+)+)\b`)

// outcomeOf names an attempt's outcome: ACCEPTED, the verdict code of a
// denial (from its cause, else its message), or the API error's reason.
func outcomeOf(err error) string {
	if err == nil {
		return outcomeAccepted
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		if d := status.Status().Details; d != nil {
			for _, c := range d.Causes {
				if string(c.Type) == fence.CauseVerdict {
					return c.Message
				}
			}
		}
	}
	if m := verdictCode.FindStringSubmatch(err.Error()); m != nil {
		return m[1]
	}
	if reason := apierrors.ReasonForError(err); reason != metav1.StatusReasonUnknown {
		return string(reason)
	}
	return "error"
}
