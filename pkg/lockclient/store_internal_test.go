package lockclient

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/fencekeeper/fencekeeper/pkg/fence"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

// TestSettleStore: what pgfence.Commit's answers become for a worker.
func TestSettleStore(t *testing.T) {
	want := fence.Receipt{Fence: 3, Segment: 2, Operation: "op", Payload: "p", Receipt: "sha256:mine"}
	refusal := func(v fence.Verdict) error {
		return fmt.Errorf("wrapped: %w", &pgfence.RefusalError{Verdict: v, Message: string(v) + ": why"})
	}
	cases := []struct {
		name  string
		got   string
		err   error
		again bool
		is    error
	}{
		{name: "applied", got: "sha256:mine"},
		{name: "let through by Shadow", got: ""},
		{name: "another commit's segment (ALREADY_APPLIED)", got: "sha256:theirs", again: true},
		{name: "proven absent", err: fmt.Errorf("%w: lost", pgfence.ErrNotApplied), again: true, is: pgfence.ErrNotApplied},
		{name: "quarantined: the number was taken since", err: refusal(fence.Quarantined), again: true, is: ErrQuarantined},
		{name: "stale owner", err: refusal(fence.StaleOwner), is: ErrStaleOwner},
		{name: "not held at commit", err: refusal(fence.NotHeld), is: ErrNotHeld},
		{name: "forged (never published)", err: refusal(fence.ForgedGrant), is: ErrForgedGrant},
		{name: "the database failed", err: errors.New("connection refused")},
	}
	op := &Operation{id: "op"}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, again, err := op.settleStore(context.Background(), grant.Grant{}, want, c.got, c.err)
			if again != c.again {
				t.Fatalf("again %v, want %v (%v)", again, c.again, err)
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Fatalf("%v is not %v", err, c.is)
			}
			if c.err == nil && !c.again && (err != nil || r.Receipt != c.got || r.Segment != want.Segment) {
				t.Fatalf("%+v, %v", r, err)
			}
			if c.err != nil && !c.again && c.is == nil && err == nil {
				t.Fatal("an error was lost")
			}
		})
	}
}
