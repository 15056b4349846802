package issuer

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// setConditions sets Ready, FenceRegression and Held on the status being
// built, and returns when the issuer must look again (the holder's expiry).
func setConditions(v *view) time.Duration {
	st, in, gen := &v.st, v.in, v.in.Resource.Generation
	if in.Epoch < in.RevokedBelow {
		SetCondition(&st.Conditions, gen, locksv1.ConditionReady, false, locksv1.ReasonEpochRevoked,
			fmt.Sprintf("issuer epoch %d is below the trust bundle's revokedBelowEpoch %d; no grant can be issued until a new issuer epoch takes over", in.Epoch, in.RevokedBelow))
	} else {
		// No epoch in the message: two issuers must not flap it between them.
		SetCondition(&st.Conditions, gen, locksv1.ConditionReady, true, locksv1.ReasonIssuing, "grants are issued")
	}
	// A fence regression ends when an operator raised fenceFloor to at least
	// the highest fence the target accepted; the issuer never lowers that fence.
	floor := in.Resource.Spec.FenceFloor
	if c := meta.FindStatusCondition(st.Conditions, locksv1.ConditionFenceRegression); c != nil && c.Status == metav1.ConditionTrue &&
		floor >= st.HighestObservedFence {
		SetCondition(&st.Conditions, gen, locksv1.ConditionFenceRegression, false, locksv1.ReasonFloorAboveTarget,
			fmt.Sprintf("spec.fenceFloor %d is at or above the highest fence seen at the target (%d); new grants are issued above it", floor, st.HighestObservedFence))
	}
	h := st.Holder
	if h == nil {
		SetCondition(&st.Conditions, gen, locksv1.ConditionHeld, false, locksv1.ReasonNoHolder, "no grant is held")
		return 0
	}
	SetCondition(&st.Conditions, gen, locksv1.ConditionHeld, true, locksv1.ReasonHolderActive,
		fmt.Sprintf("%s holds fence %d", h.Owner, h.FenceToken))
	return max(h.ExpiresAt.Sub(in.Now), time.Millisecond)
}

// SetCondition sets a condition, keeping its transition time when the status did not change.
func SetCondition(conds *[]metav1.Condition, gen int64, typ string, ok bool, reason, msg string) {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(conds, metav1.Condition{
		Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen,
	})
}
