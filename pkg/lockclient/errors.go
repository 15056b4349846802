package lockclient

import (
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

// Errors of the lock's life.
var (
	// ErrOwnershipUnknown: a renewal or query had an uncertain result; start no new effects.
	ErrOwnershipUnknown = errors.New("lockclient: ownership unknown")
	// ErrExpired: the issuer confirmed the grant expired (or revoked it).
	ErrExpired = errors.New("lockclient: grant expired")
	// ErrReleased: the grant was released voluntarily.
	ErrReleased = errors.New("lockclient: grant released")
	// ErrDenied: the issuer will never serve the request (policy, duplicate requestID).
	ErrDenied = errors.New("lockclient: request denied")
	// ErrRequestIDTaken: the LockGrant under this request's name is another
	// request of the same owner (one written by hand with another lease,
	// root or category, or an earlier Acquire with other options).
	ErrRequestIDTaken = errors.New("lockclient: requestID is taken by another LockGrant")
	// ErrMutationUnknown: a write's outcome could not be determined from the receipts;
	// the FencedResource's target needs reconciliation by a human or a domain process.
	ErrMutationUnknown = errors.New("lockclient: mutation outcome unknown")
)

// UnknownOutcomeError is ErrMutationUnknown for one segment: its send got
// no answer, and no read has decided it yet, either because the receipt log
// no longer reaches back to it or because it may still land (the object is
// still at the version it was conditioned on). Operation.Resolve decides it
// later. The outcome is recorded on the LockGrant (RecordErr says if that
// failed) so that the operator surfaces it as ReconciliationRequired.
type UnknownOutcomeError struct {
	Sent      Sent
	Object    string // Kind/name
	LockGrant string
	// RecordErr is why the record on the LockGrant failed (nil: recorded).
	RecordErr error
	why       string
}

func (e *UnknownOutcomeError) Error() string {
	msg := fmt.Sprintf("%v: %s segment %d under fence %d: %s", ErrMutationUnknown, e.Object, e.Sent.Receipt.Segment, e.Sent.Receipt.Fence, e.why)
	if e.RecordErr != nil {
		return fmt.Sprintf("%s (not recorded on LockGrant %s: %v; resolve it later with Operation.Resolve)", msg, e.LockGrant, e.RecordErr)
	}
	return fmt.Sprintf("%s (recorded on LockGrant %s for reconciliation)", msg, e.LockGrant)
}

// Is matches ErrMutationUnknown.
func (e *UnknownOutcomeError) Is(target error) bool { return target == ErrMutationUnknown }

// Errors of a fenced write, one per admission verdict. A *DenialError matches
// the sentinel of its verdict with errors.Is.
var (
	ErrFenceRequired      = errors.New("lockclient: " + string(fence.FenceRequired))
	ErrBadGrant           = errors.New("lockclient: " + string(fence.BadGrant))
	ErrForgedGrant        = errors.New("lockclient: " + string(fence.ForgedGrant))
	ErrWrongResource      = errors.New("lockclient: " + string(fence.WrongResource))
	ErrWrongOwner         = errors.New("lockclient: " + string(fence.WrongOwner))
	ErrRevokedEpoch       = errors.New("lockclient: " + string(fence.RevokedEpoch))
	ErrPayloadMismatch    = errors.New("lockclient: " + string(fence.PayloadMismatch))
	ErrFenceRegression    = errors.New("lockclient: " + string(fence.FenceRegression))
	ErrStaleOwner         = errors.New("lockclient: " + string(fence.StaleOwner))
	ErrRootMismatch       = errors.New("lockclient: " + string(fence.RootMismatch))
	ErrNotHeld            = errors.New("lockclient: " + string(fence.NotHeld))
	ErrPolicyStale        = errors.New("lockclient: " + string(fence.PolicyStale))
	ErrSegmentOutOfOrder  = errors.New("lockclient: " + string(fence.SegmentOutOfOrder))
	ErrQuarantined        = errors.New("lockclient: " + string(fence.Quarantined))
	ErrReceiptLogMismatch = errors.New("lockclient: " + string(fence.ReceiptLogMismatch))
	ErrDeleteNotDeclared  = errors.New("lockclient: " + string(fence.DeleteNotDeclared))
	ErrProtectionRemoved  = errors.New("lockclient: " + string(fence.ProtectionRemoved))
)

var verdictErrors = map[fence.Verdict]error{
	fence.FenceRequired: ErrFenceRequired, fence.BadGrant: ErrBadGrant, fence.ForgedGrant: ErrForgedGrant,
	fence.WrongResource: ErrWrongResource, fence.WrongOwner: ErrWrongOwner, fence.RevokedEpoch: ErrRevokedEpoch,
	fence.PayloadMismatch: ErrPayloadMismatch, fence.FenceRegression: ErrFenceRegression, fence.StaleOwner: ErrStaleOwner,
	fence.RootMismatch: ErrRootMismatch, fence.NotHeld: ErrNotHeld, fence.PolicyStale: ErrPolicyStale,
	fence.SegmentOutOfOrder: ErrSegmentOutOfOrder, fence.Quarantined: ErrQuarantined, fence.ReceiptLogMismatch: ErrReceiptLogMismatch,
	fence.DeleteNotDeclared: ErrDeleteNotDeclared, fence.ProtectionRemoved: ErrProtectionRemoved,
}

// DenialError is a write the acceptance webhook refused.
type DenialError struct {
	Verdict fence.Verdict
	// Message is the webhook's explanation; it starts with the verdict.
	Message string
	// Receipt is the original receipt of an ALREADY_APPLIED segment.
	Receipt string
}

func (e *DenialError) Error() string { return "fenced write denied: " + e.Message }

// Is matches the sentinel error of the verdict.
func (e *DenialError) Is(target error) bool { return verdictErrors[e.Verdict] == target }

// AsDenial recognizes an admission denial by the acceptance webhook: a
// *DenialError from this package, or the error of any Kubernetes client.
func AsDenial(err error) (*DenialError, bool) {
	var d *DenialError
	if errors.As(err, &d) {
		return d, true
	}
	return asDenial(err)
}

// asDenial reads the verdict from the API status's details, where the
// acceptance webhook puts it as data (fence.CauseVerdict, fence.CauseReceipt);
// the text is only shown, never parsed.
func asDenial(err error) (*DenialError, bool) {
	var api apierrors.APIStatus
	if err == nil || !errors.As(err, &api) || api.Status().Details == nil {
		return nil, false
	}
	st := api.Status()
	d := &DenialError{}
	for _, c := range st.Details.Causes {
		switch c.Type {
		case fence.CauseVerdict:
			d.Verdict = fence.Verdict(c.Message)
		case fence.CauseReceipt:
			d.Receipt = c.Message
		}
	}
	if _, ok := verdictErrors[d.Verdict]; !ok && d.Verdict != fence.AlreadyApplied {
		return nil, false
	}
	// The API server prefixes the webhook's message with its own words.
	d.Message = st.Message
	if i := strings.Index(st.Message, string(d.Verdict)+":"); i >= 0 {
		d.Message = st.Message[i:]
	}
	return d, true
}
