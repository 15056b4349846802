package lockclient

import (
	"context"
	"errors"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
	"github.com/fencekeeper/fencekeeper/pkg/pgfence"
)

// This file is the Lock and what it tells its user; acquire.go gets the
// grant (Acquire, Attach), session.go keeps it (renewals, the LockGrant's
// watch, the state machine's inputs) and ends it (Release, Orphan).

// State is the worker's view of its lock (docs/contract.md, "Worker client states").
type State string

// The states of docs/contract.md, "Worker client states".
const (
	StateRequested        State = "REQUESTED"
	StateHeld             State = "HELD"
	StateRenewing         State = "RENEWING"
	StateOwnershipUnknown State = "OWNERSHIP_UNKNOWN"
	StateExpired          State = "EXPIRED"
	StateReleased         State = "RELEASED"
)

// Lock is one held claim: a session whose TTL the issuer enforces.
type Lock struct {
	c        *Client
	key      types.NamespacedName
	resource string
	opts     AcquireOptions

	mu    sync.Mutex
	state State
	view  *locksv1.LockGrant // the LockGrant as last confirmed by the API server
	// requested is the LockGrant as created (read back after the create):
	// its UID is what the registry's holder record names.
	requested *locksv1.LockGrant
	pending   int64 // spec.renewals written, not yet observed by the issuer
	err       error // why the lock ended
	orphaned  bool  // Orphan was called: nobody follows the grant any more
	done      chan struct{}
	releasing bool // Release was called: a Released end is the one asked for
	// updates carries the LockGrant's changes from its watch (watchLockGrant,
	// opened by followGrant), to the lock's end; cancel stops that watch,
	// keepAlive and the registry's end follow (stopEndFollow stops the
	// latter alone, once the watch took over).
	updates       chan *locksv1.LockGrant
	watching      bool
	stopEndFollow context.CancelFunc
	following     context.Context
	cancel        context.CancelFunc

	// stores: per database, the segment this lock's grant last committed
	// there, so the next CommitTx needs no read first (store.go).
	storesMu sync.Mutex
	stores   map[pgfence.Pool]storeCursor
}

// Done is closed when the lock ended (expired, revoked or released).
func (l *Lock) Done() <-chan struct{} { return l.done }

// State is the current state.
func (l *Lock) State() State {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state
}

// Err says why the lock ended (ErrExpired or ErrReleased), nil while it lives.
func (l *Lock) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Guard returns nil when new effects may start: the grant is held (or being
// renewed while still held). Otherwise ErrOwnershipUnknown, ErrExpired or ErrReleased.
func (l *Lock) Guard() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch l.state {
	case StateHeld, StateRenewing:
		if l.orphaned {
			return ErrOwnershipUnknown
		}
		return nil
	case StateOwnershipUnknown:
		return ErrOwnershipUnknown
	case StateRequested:
		return ErrOwnershipUnknown
	}
	return l.err
}

// Grant returns the signed grant and its proof.
func (l *Lock) Grant() (grant.Grant, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.view.Status.Grant.ToGrant(), l.view.Status.Proof
}

// LockGrant is the LockGrant as this lock last knew it: after Acquire, held
// with the grant from the registry's holder record, possibly before the
// issuer has mirrored that into the LockGrant's status (so a fresh read of
// the object can still show Pending for a moment).
func (l *Lock) LockGrant() *locksv1.LockGrant {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.view.DeepCopy()
}

// Fence is the grant's fence token.
func (l *Lock) Fence() int64 {
	g, _ := l.Grant()
	return g.FenceToken
}

// Name is the LockGrant's name.
func (l *Lock) Name() string { return l.key.Name }

// Resource is the FencedResource's name.
func (l *Lock) Resource() string { return l.resource }

func (l *Lock) ended() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// definitive reports whether err is the server's answer (the request was
// processed and refused), as opposed to no answer at all.
func definitive(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return false
	}
	return !apierrors.IsServerTimeout(err) && !apierrors.IsTimeout(err) && !apierrors.IsTooManyRequests(err) &&
		!apierrors.IsServiceUnavailable(err) && !apierrors.IsInternalError(err)
}

func conditionMessage(lg *locksv1.LockGrant) string {
	for _, c := range lg.Status.Conditions {
		if c.Type == locksv1.ConditionIssued {
			return c.Message
		}
	}
	return string(lg.Status.Phase)
}
