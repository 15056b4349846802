package lockclient

import (
	"testing"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

func TestResolveFromLog(t *testing.T) {
	rc := func(f, seg int64, payload string) fence.Receipt {
		return fence.Receipt{Fence: f, Segment: seg, Operation: "op", Payload: payload, Receipt: "sha256:r"}
	}
	log := []fence.Receipt{rc(3, 4, "p4"), rc(3, 5, "p5"), rc(4, 1, "q1")}
	st := fence.State{HighestFence: 4, LastSegment: 1, Receipts: log}
	for _, c := range []struct {
		name string
		st   fence.State
		want fence.Receipt
		out  Resolution
	}{
		{"in the log", st, rc(3, 5, "p5"), Applied},
		{"in the log with another payload", st, rc(3, 5, "other"), AppliedOtherPayload},
		{"a later segment of the current fence", st, rc(4, 2, "q2"), ProvenAbsent},
		{"a newer fence", st, rc(5, 1, "x"), ProvenAbsent},
		{"inside the log's reach but missing", st, rc(3, 6, "p6"), ProvenAbsent},
		{"older than the log reaches", st, rc(3, 2, "p2"), Undeterminable},
		{"at the log's oldest entry, another operation", st, fence.Receipt{Fence: 3, Segment: 4, Operation: "other", Payload: "p4"}, Undeterminable},
		{"no log at all", fence.State{HighestFence: 2, LastSegment: 3}, rc(2, 3, "p"), Undeterminable},
	} {
		if got, _ := resolveFromLog(c.st, c.want); got != c.out {
			t.Errorf("%s: got %d, want %d", c.name, got, c.out)
		}
	}
}

func TestResolveDeleted(t *testing.T) {
	want := fence.Receipt{Fence: 4, Segment: 2, Operation: "op", Payload: "p"}
	del := func(f, seg int64, digest string) *locksv1.DeletedTarget {
		return &locksv1.DeletedTarget{FenceToken: f, Segment: seg, GrantDigest: digest}
	}
	for _, c := range []struct {
		name    string
		deleted *locksv1.DeletedTarget
		out     Resolution
	}{
		{"never deleted: the write would have created it", nil, ProvenAbsent},
		{"deleted by an older fence", del(3, 7, "sha256:old"), ProvenAbsent},
		{"deleted by this grant after the segment", del(4, 3, "sha256:mine"), Applied},
		{"deleted by this grant with the segment itself", del(4, 2, "sha256:mine"), Applied},
		{"deleted by this grant before the segment", del(4, 1, "sha256:mine"), ProvenAbsent},
		// The object outlived this grant; its receipts are gone with it.
		{"deleted by a newer fence", del(5, 1, "sha256:new"), Undeterminable},
		{"same fence, another grant (a registry that went backwards)", del(4, 3, "sha256:other"), Undeterminable},
	} {
		if got, _ := resolveDeleted(c.deleted, "sha256:mine", want); got != c.out {
			t.Errorf("%s: got %d, want %d", c.name, got, c.out)
		}
	}
}
