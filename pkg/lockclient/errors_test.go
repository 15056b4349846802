package lockclient_test

import (
	"errors"
	"fmt"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// webhookDenial is the error a client gets when the API server relays an
// admission denial: the webhook's status, its message prefixed.
func webhookDenial(msg string, causes ...metav1.StatusCause) error {
	st := metav1.Status{Status: metav1.StatusFailure, Code: 403, Reason: metav1.StatusReasonForbidden,
		Message: `admission webhook "vprotected.fencekeeper.dev" denied the request: ` + msg}
	if causes != nil {
		st.Details = &metav1.StatusDetails{Causes: causes}
	}
	return fmt.Errorf("update: %w", &apierrors.StatusError{ErrStatus: st})
}

func TestAsDenialReadsTheVerdictAsData(t *testing.T) {
	receipt := "sha256:" + fmt.Sprintf("%064x", 7)
	verdict := func(v fence.Verdict) metav1.StatusCause {
		return metav1.StatusCause{Type: fence.CauseVerdict, Message: string(v)}
	}

	d, ok := lockclient.AsDenial(webhookDenial("STALE_OWNER: fence 3 is below 4", verdict(fence.StaleOwner)))
	if !ok || d.Verdict != fence.StaleOwner || d.Message != "STALE_OWNER: fence 3 is below 4" || !errors.Is(d, lockclient.ErrStaleOwner) {
		t.Fatalf("STALE_OWNER: %+v %t", d, ok)
	}
	d, ok = lockclient.AsDenial(webhookDenial("ALREADY_APPLIED: segment 2", verdict(fence.AlreadyApplied),
		metav1.StatusCause{Type: fence.CauseReceipt, Message: receipt}))
	if !ok || d.Verdict != fence.AlreadyApplied || d.Receipt != receipt {
		t.Fatalf("ALREADY_APPLIED: %+v %t", d, ok)
	}
	// Text alone is not a verdict: another webhook's message may look alike.
	if d, ok := lockclient.AsDenial(webhookDenial("STALE_OWNER: looks like ours")); ok {
		t.Fatalf("a denial without the verdict as data was read as %+v", d)
	}
	if d, ok := lockclient.AsDenial(webhookDenial("NOPE: unknown", verdict("NOPE"))); ok {
		t.Fatalf("an unknown verdict was read as %+v", d)
	}
	if _, ok := lockclient.AsDenial(errors.New("connection refused")); ok {
		t.Fatal("a transport error was read as a denial")
	}
}
