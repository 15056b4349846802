package lockclient

import (
	"errors"
	"testing"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

func TestNext(t *testing.T) {
	seen := func(p locksv1.LockGrantPhase, confirmed bool) Event {
		return Event{Kind: EventObserved, Phase: p, Confirmed: confirmed, Why: "issuer says so"}
	}
	for _, c := range []struct {
		name string
		from State
		e    Event
		to   State
		err  error
	}{
		{"granted", StateRequested, seen(locksv1.PhaseHeld, true), StateHeld, nil},
		{"still pending", StateRequested, seen(locksv1.PhasePending, true), StateRequested, nil},
		{"denied before holding", StateRequested, seen(locksv1.PhaseDenied, true), StateExpired, ErrDenied},
		{"renewal sent", StateHeld, Event{Kind: EventRenewalSent}, StateRenewing, nil},
		{"renewal confirmed", StateRenewing, seen(locksv1.PhaseHeld, true), StateHeld, nil},
		{"held, renewal not yet applied", StateRenewing, seen(locksv1.PhaseHeld, false), StateRenewing, nil},
		{"renewal unanswered", StateRenewing, Event{Kind: EventNoAnswer}, StateOwnershipUnknown, nil},
		{"renewal unconfirmed for an interval", StateRenewing, Event{Kind: EventIntervalPassed}, StateOwnershipUnknown, nil},
		{"an interval while held", StateHeld, Event{Kind: EventIntervalPassed}, StateHeld, nil},
		{"LockGrant deleted while held", StateHeld, Event{Kind: EventGone}, StateExpired, ErrExpired},
		{"LockGrant deleted while unknown", StateOwnershipUnknown, Event{Kind: EventGone}, StateExpired, ErrExpired},
		{"LockGrant deleted after release", StateReleased, Event{Kind: EventGone}, StateReleased, nil},
		{"query answers held", StateOwnershipUnknown, seen(locksv1.PhaseHeld, true), StateHeld, nil},
		{"query answers expired", StateOwnershipUnknown, seen(locksv1.PhaseExpired, true), StateExpired, ErrExpired},
		{"revoked", StateHeld, seen(locksv1.PhaseRevoked, true), StateExpired, ErrExpired},
		{"released", StateRenewing, seen(locksv1.PhaseReleased, false), StateReleased, ErrReleased},
		{"no renewal from unknown", StateOwnershipUnknown, Event{Kind: EventRenewalSent}, StateOwnershipUnknown, nil},
		{"expired is final", StateExpired, seen(locksv1.PhaseHeld, true), StateExpired, nil},
		{"released is final", StateReleased, Event{Kind: EventNoAnswer}, StateReleased, nil},
	} {
		to, err := Next(c.from, c.e)
		if to != c.to || (c.err == nil) != (err == nil) || (c.err != nil && !errors.Is(err, c.err)) {
			t.Errorf("%s: %s -> %s (%v), want %s (%v)", c.name, c.from, to, err, c.to, c.err)
		}
	}
}

// TestPhaseOutcomeIsTheOnlyMapping: Attach, Acquire and a held lock all end
// the same way for the same phase.
func TestPhaseOutcome(t *testing.T) {
	for p, want := range map[locksv1.LockGrantPhase]error{
		locksv1.PhaseExpired: ErrExpired, locksv1.PhaseRevoked: ErrExpired, locksv1.PhaseDenied: ErrDenied,
		locksv1.PhaseReleased: ErrReleased, locksv1.PhaseHeld: nil, locksv1.PhasePending: nil, "": nil,
	} {
		if _, err := phaseOutcome(p); !errors.Is(err, want) || (want == nil && err != nil) {
			t.Errorf("%q: %v, want %v", p, err, want)
		}
	}
}
