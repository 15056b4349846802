package lockclient

import (
	"fmt"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// learned is what the lock found out about its grant; next turns it into a
// state. Everything the lock does goes through next, so the state machine of
// DESIGN.md ("Worker client states") is one pure function, tested without a server.
type learned struct {
	kind learnedKind
	// phase is the LockGrant's phase in a confirmed view (kind observed).
	phase locksv1.LockGrantPhase
	// confirmed: that view shows every renewal this lock sent (kind observed).
	confirmed bool
	// why is the issuer's explanation, carried into the error of a final state.
	why string
}

type learnedKind int

const (
	// observed: the API server confirmed a view of the LockGrant.
	observed learnedKind = iota
	// renewalSent: a renewal was written; the issuer has not confirmed it yet.
	renewalSent
	// noAnswer: a renewal or query got no answer, or an uncertain one.
	noAnswer
	// intervalPassed: a renewal interval passed.
	intervalPassed
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

// next is the lock's state machine: REQUESTED → HELD → RENEWING → HELD; an
// uncertain renewal or query → OWNERSHIP_UNKNOWN until a confirmed view;
// server-confirmed expiry → EXPIRED; release → RELEASED. EXPIRED and RELEASED
// are final. The error is set only for a final state.
func next(s State, l learned) (State, error) {
	if final(s) {
		return s, nil
	}
	switch l.kind {
	case renewalSent:
		if s == StateHeld {
			return StateRenewing, nil
		}
	case noAnswer:
		return StateOwnershipUnknown, nil
	case intervalPassed:
		// A renewal still unconfirmed a whole interval later is an uncertain one.
		if s == StateRenewing {
			return StateOwnershipUnknown, nil
		}
	case observed:
		return nextObserved(s, l)
	}
	return s, nil
}

func nextObserved(s State, l learned) (State, error) {
	to, err := phaseOutcome(l.phase)
	switch {
	case final(to):
		if l.why != "" {
			err = fmt.Errorf("%w: %s", err, l.why)
		}
		return to, err
	case to == StateHeld && l.confirmed:
		// Held, with every renewal applied: a certain answer, from any live state.
		return StateHeld, nil
	}
	return s, nil // not decided yet, or a renewal still in flight
}
