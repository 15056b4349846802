package lockclient_test

import (
	"testing"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
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
		out  lockclient.Resolution
	}{
		{"in the log", st, rc(3, 5, "p5"), lockclient.Applied},
		{"in the log with another payload", st, rc(3, 5, "other"), lockclient.AppliedOtherPayload},
		{"a later segment of the current fence", st, rc(4, 2, "q2"), lockclient.ProvenAbsent},
		{"a newer fence", st, rc(5, 1, "x"), lockclient.ProvenAbsent},
		{"inside the log's reach but missing", st, rc(3, 6, "p6"), lockclient.ProvenAbsent},
		{"older than the log reaches", st, rc(3, 2, "p2"), lockclient.Undeterminable},
		{"at the log's oldest entry, another operation", st, fence.Receipt{Fence: 3, Segment: 4, Operation: "other", Payload: "p4"}, lockclient.Undeterminable},
		{"no log at all", fence.State{HighestFence: 2, LastSegment: 3}, rc(2, 3, "p"), lockclient.Undeterminable},
	} {
		if got, _ := lockclient.ResolveFromLog(c.st, c.want); got != c.out {
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
		out     lockclient.Resolution
	}{
		{"never deleted: the write would have created it", nil, lockclient.ProvenAbsent},
		{"deleted by an older fence", del(3, 7, "sha256:old"), lockclient.ProvenAbsent},
		{"deleted by this grant after the segment", del(4, 3, "sha256:mine"), lockclient.Applied},
		{"deleted by this grant with the segment itself", del(4, 2, "sha256:mine"), lockclient.Applied},
		{"deleted by this grant before the segment", del(4, 1, "sha256:mine"), lockclient.ProvenAbsent},
		// The object outlived this grant; its receipts are gone with it.
		{"deleted by a newer fence", del(5, 1, "sha256:new"), lockclient.Undeterminable},
		{"same fence, another grant (a registry that went backwards)", del(4, 3, "sha256:other"), lockclient.Undeterminable},
	} {
		if got, _ := lockclient.ResolveDeleted(c.deleted, "sha256:mine", want); got != c.out {
			t.Errorf("%s: got %d, want %d", c.name, got, c.out)
		}
	}
}

// TestResolveSent: a read that does not show a write proves it absent only
// once the write can no longer land (issue 29: a segment reported refused
// landed after the read, still conditioned on the version the read showed).
func TestResolveSent(t *testing.T) {
	want := fence.Receipt{Fence: 4, Segment: 2, Operation: "op", Payload: "p"}
	update := lockclient.Sent{Receipt: want, ResourceVersion: "100", GrantDigest: "sha256:mine"}
	create := lockclient.Sent{Receipt: fence.Receipt{Fence: 4, Segment: 1, Operation: "op", Payload: "p"}, Create: true, GrantDigest: "sha256:mine"}
	before := fence.State{HighestFence: 4, LastSegment: 1, Receipts: []fence.Receipt{{Fence: 4, Segment: 1, Operation: "op", Payload: "p1"}}}
	landed := fence.State{HighestFence: 4, LastSegment: 2, Receipts: append(before.Receipts, want)}
	newer := fence.State{HighestFence: 5, LastSegment: 1, Receipts: append(before.Receipts, fence.Receipt{Fence: 5, Segment: 1, Operation: "next", Payload: "q"})}
	for _, c := range []struct {
		name string
		sent lockclient.Sent
		seen lockclient.Observed
		out  lockclient.Resolution
	}{
		{"update, object unchanged since the write read it", update, lockclient.Observed{Exists: true, ResourceVersion: "100", State: before}, lockclient.InFlight},
		{"update, object moved on without the write", update, lockclient.Observed{Exists: true, ResourceVersion: "107", State: newer}, lockclient.ProvenAbsent},
		{"update, object moved on with the write", update, lockclient.Observed{Exists: true, ResourceVersion: "101", State: landed}, lockclient.Applied},
		{"update, object gone, never deleted under this grant", update, lockclient.Observed{}, lockclient.ProvenAbsent},
		{"update, object deleted by this grant after the segment", update,
			lockclient.Observed{Deleted: &locksv1.DeletedTarget{FenceToken: 4, Segment: 3, GrantDigest: "sha256:mine"}}, lockclient.Applied},
		{"unconditioned update, object moved on without it", lockclient.Sent{Receipt: want, GrantDigest: "sha256:mine"},
			lockclient.Observed{Exists: true, ResourceVersion: "107", State: newer}, lockclient.InFlight},
		{"unconditioned update, object moved on with it", lockclient.Sent{Receipt: want, GrantDigest: "sha256:mine"},
			lockclient.Observed{Exists: true, ResourceVersion: "101", State: landed}, lockclient.Applied},
		{"create, object still absent", create, lockclient.Observed{}, lockclient.InFlight},
		{"create, object absent, deleted by an older fence", create,
			lockclient.Observed{Deleted: &locksv1.DeletedTarget{FenceToken: 3, Segment: 9, GrantDigest: "sha256:old"}}, lockclient.InFlight},
		{"create, object absent, deleted by a newer fence", create,
			lockclient.Observed{Deleted: &locksv1.DeletedTarget{FenceToken: 5, Segment: 1, GrantDigest: "sha256:new"}}, lockclient.Undeterminable},
		{"create, object created by another write", create, lockclient.Observed{Exists: true, ResourceVersion: "5", State: fence.State{HighestFence: 5, LastSegment: 1,
			Receipts: []fence.Receipt{{Fence: 3, Segment: 7, Operation: "old", Payload: "o"}, {Fence: 5, Segment: 1, Operation: "next", Payload: "q"}}}}, lockclient.ProvenAbsent},
		{"create, object created by this write", create, lockclient.Observed{Exists: true, ResourceVersion: "5", State: before}, lockclient.AppliedOtherPayload},
	} {
		if got, _ := lockclient.ResolveSent(c.sent, c.seen); got != c.out {
			t.Errorf("%s: got %s, want %s", c.name, got, c.out)
		}
	}
}
