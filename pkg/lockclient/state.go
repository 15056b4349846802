package lockclient

import (
	"fmt"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// Event is what a lock learned about its grant; Next turns it into a state.
// Everything the Lock learns goes through Next, so the state machine of
// docs/contract.md ("Worker client states") is one pure function: tested without a
// server, and driven by the simulator (test/sim) exactly as by the Lock.
type Event struct {
	Kind EventKind
	// Phase is the LockGrant's phase in a confirmed view (EventObserved).
	Phase locksv1.LockGrantPhase
	// Confirmed: that view shows every renewal the lock sent (EventObserved).
	// The Lock's query in OWNERSHIP_UNKNOWN that finds the grant Held waits
	// for no renewal but those the issuer observed, so its answer is confirmed.
	Confirmed bool
	// Why is the issuer's explanation, carried into the error of a final state.
	Why string
}

// EventKind says which Event happened.
type EventKind int

// The kinds of Event.
const (
	// EventObserved: the API server confirmed a view of the LockGrant.
	EventObserved EventKind = iota
	// EventRenewalSent: a renewal was written; the issuer has not confirmed it yet.
	EventRenewalSent
	// EventNoAnswer: a renewal or query got no answer, or an uncertain one.
	EventNoAnswer
	// EventIntervalPassed: a renewal interval passed.
	EventIntervalPassed
	// EventGone: a confirmed read (or the LockGrant's watch) found the
	// LockGrant deleted. The grant ended with it: the issuer ends the grant
	// of a vanished holder and serves the next waiter.
	EventGone
)

// final reports whether s ends the lock.
func final(s State) bool { return s == StateExpired || s == StateReleased }

// phaseOutcome is the one mapping from a LockGrant phase to the lock's state,
// with the error that ends the lock for a final one. A Denied request never
// held: its lock ends as EXPIRED (the contract has no DENIED state) with ErrDenied.
func phaseOutcome(p locksv1.LockGrantPhase) (State, error) {
	switch p {
	case locksv1.PhaseHeld:
		return StateHeld, nil
	case locksv1.PhaseExpired, locksv1.PhaseRevoked:
		return StateExpired, ErrExpired
	case locksv1.PhaseDenied:
		return StateExpired, ErrDenied
	case locksv1.PhaseReleased:
		return StateReleased, ErrReleased
	}
	return StateRequested, nil // Pending, or not decided yet
}

// Next is the lock's state machine: the state that follows s once e
// happened. REQUESTED → HELD → RENEWING → HELD; an uncertain renewal or
// query → OWNERSHIP_UNKNOWN until a confirmed view; server-confirmed expiry
// (or the LockGrant's deletion) → EXPIRED; release → RELEASED. EXPIRED and RELEASED are final. The error,
// set only when Next enters a final state, is why the lock ended (ErrExpired,
// ErrDenied or ErrReleased, with the issuer's explanation).
func Next(s State, e Event) (State, error) {
	if final(s) {
		return s, nil
	}
	switch e.Kind {
	case EventRenewalSent:
		if s == StateHeld {
			return StateRenewing, nil
		}
	case EventNoAnswer:
		return StateOwnershipUnknown, nil
	case EventIntervalPassed:
		// A renewal still unconfirmed a whole interval later is an uncertain one.
		if s == StateRenewing {
			return StateOwnershipUnknown, nil
		}
	case EventObserved:
		return nextObserved(s, e)
	case EventGone:
		return StateExpired, fmt.Errorf("%w: the LockGrant was deleted", ErrExpired)
	}
	return s, nil
}

func nextObserved(s State, e Event) (State, error) {
	to, err := phaseOutcome(e.Phase)
	switch {
	case final(to):
		if e.Why != "" {
			err = fmt.Errorf("%w: %s", err, e.Why)
		}
		return to, err
	case to == StateHeld && e.Confirmed:
		// Held, with every renewal applied: a certain answer, from any live state.
		return StateHeld, nil
	}
	return s, nil // not decided yet, or a renewal still in flight
}
