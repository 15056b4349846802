package lockclient_test

import (
	"testing"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/lockclient"
)

// TestResolveSent: a read that does not show a write proves it absent only
// once the write can no longer land (make chaos: a segment reported refused
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
