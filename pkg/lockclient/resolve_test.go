package lockclient_test

import (
	"testing"

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
