package lockclient

import (
	"context"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// Getting the grant: the LockGrant is created once under a name derived from
// the requestID (recovered by reading that name when a create's answer is
// lost), then the lock waits until the issuer decides it. Once held, the
// session (session.go) keeps it.

// AcquireOptions describe one request.
type AcquireOptions struct {
	// RequestID is the idempotency key (default: random). Reusing it after a
	// crash or a lost response finds the same LockGrant.
	RequestID string
	// Lease is the holder's session ID (default: derived from RequestID). A
	// client in a pod always uses "pod:<its pod UID>" (see NewForConfig).
	Lease string
	// OperationRoot is sha256:<hex> of the planned operation (default: derived from RequestID).
	OperationRoot string
	// OperationCategory, when the FencedResource restricts categories.
	OperationCategory string
	// RenewInterval between renewals (default: a third of the lease).
	RenewInterval time.Duration
	// RequestTimeout bounds each API call of the renewal loop (default: RenewInterval/2).
	RequestTimeout time.Duration
	// OnStateChange, if set, is called (from the lock's goroutine) on every state change.
	OnStateChange func(State)
}

// Acquire requests resource (a FencedResource name) and waits, watch-driven,
// until the issuer grants it or ctx ends.
func (c *Client) Acquire(ctx context.Context, resource string, o AcquireOptions) (*Lock, error) {
	if o.RequestID == "" {
		o.RequestID = NewRequestID()
	}
	lease, err := c.leaseFor(o)
	if err != nil {
		return nil, err
	}
	o.Lease = lease
	if o.OperationRoot == "" {
		o.OperationRoot = OperationRoot(resource + "/" + o.RequestID)
	}
	l := &Lock{c: c, key: types.NamespacedName{Namespace: c.namespace, Name: c.LockGrantName(resource, o.RequestID)},
		resource: resource, opts: o, state: StateRequested, done: make(chan struct{})}
	l.notifyStateChange(StateRequested)
	if err := l.createOrRecover(ctx); err != nil {
		return nil, err
	}
	// One watch of the LockGrant, once opened, serves the wait and then keepAlive.
	l.prepareWatch(ctx)
	lg, err := l.waitHeld(ctx)
	if err != nil {
		l.cancel()
		return nil, err
	}
	l.startSession(lg)
	return l, nil
}

// Attach takes over an existing held LockGrant of this client's identity by
// name: a worker restarted after a crash, or a second process of the same
// owner (kubectl fence write). It does not acquire: a grant that is not Held
// is an error (ErrExpired, ErrReleased, ErrDenied, or not granted yet).
func (c *Client) Attach(ctx context.Context, name string, o AcquireOptions) (*Lock, error) {
	var lg locksv1.LockGrant
	if err := c.kube.Get(ctx, types.NamespacedName{Namespace: c.namespace, Name: name}, &lg); err != nil {
		return nil, err
	}
	if lg.Spec.Owner != c.identity {
		return nil, fmt.Errorf("LockGrant %s belongs to %q, not to %q", name, lg.Spec.Owner, c.identity)
	}
	if !grant.LeaseAdmits(lg.Spec.Lease, c.pod) {
		return nil, fmt.Errorf("%w: LockGrant %s is bound to its requester's pod (lease %s); this client runs in %s",
			ErrWrongOwner, name, lg.Spec.Lease, grant.DescribePod(c.pod))
	}
	o.RequestID, o.Lease, o.OperationRoot, o.OperationCategory = lg.Spec.RequestID, lg.Spec.Lease, lg.Spec.OperationRoot, lg.Spec.OperationCategory
	l := &Lock{c: c, key: client.ObjectKeyFromObject(&lg), resource: lg.Spec.Resource, opts: o, state: StateRequested,
		pending: lg.Spec.Renewals, done: make(chan struct{}), requested: lg.DeepCopy()}
	switch to, ended := phaseOutcome(lg.Status.Phase); {
	case to == StateHeld:
	case final(to):
		return nil, fmt.Errorf("%w: LockGrant %s is %s: %s", ended, name, lg.Status.Phase, conditionMessage(&lg))
	default:
		// Not mirrored yet? The registry's holder record may already name it
		// (Acquire in another process returns on that record).
		var fr locksv1.FencedResource
		var held *locksv1.LockGrant
		if err := c.kube.Get(ctx, types.NamespacedName{Namespace: c.namespace, Name: lg.Spec.Resource}, &fr); err == nil {
			held = l.heldFromRecord(&fr)
		}
		if held == nil {
			return nil, fmt.Errorf("%w: LockGrant %s is %s, not Held yet", ErrOwnershipUnknown, name, phaseOrPending(&lg))
		}
		lg = *held
	}
	l.prepareWatch(ctx)
	l.startSession(&lg)
	return l, nil
}

func phaseOrPending(lg *locksv1.LockGrant) locksv1.LockGrantPhase {
	if lg.Status.Phase == "" {
		return locksv1.PhasePending
	}
	return lg.Status.Phase
}

// createOrRecover creates the LockGrant once. When the outcome of a create is
// uncertain (no answer from the server), it reads the deterministic name: the
// request either landed, or it is safe to send again — never a second identity.
func (l *Lock) createOrRecover(ctx context.Context) error {
	want := &locksv1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: l.key.Namespace, Name: l.key.Name},
		Spec:       l.requestSpec(),
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		created := want.DeepCopy()
		err := l.c.kube.Create(ctx, created)
		switch {
		case err == nil:
			// The answer is the stored object: no read needed.
			l.requested = created
			return nil
		case apierrors.IsAlreadyExists(err):
			return l.adoptIfMine(ctx)
		case definitive(err):
			return fmt.Errorf("create LockGrant %s: %w", l.key.Name, err)
		}
		lastErr = err
		// The response was lost; did the request land?
		if err := l.adoptIfMine(ctx); err == nil {
			return nil
		} else if !apierrors.IsNotFound(err) {
			return err
		}
		if err := ctxtime.Sleep(ctx, time.Duration(attempt+1)*100*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("create LockGrant %s: no answer from the API server: %w", l.key.Name, lastErr)
}

// adoptIfMine reads the LockGrant and checks it is this request's: the spec
// this client would have created. The webhook admits a name of the library's
// form only for its own resource, owner and requestID, so another owner can
// never hold it; a LockGrant of this owner written by hand under this name
// with another lease, root or category is another request all the same.
func (l *Lock) adoptIfMine(ctx context.Context) error {
	var lg locksv1.LockGrant
	if err := l.c.kube.Get(ctx, l.key, &lg); err != nil {
		return err
	}
	if diff := specDiff(lg.Spec, l.requestSpec()); diff != "" {
		return fmt.Errorf("%w: LockGrant %s (owner %q, requestID %q) is another request: %s; use another requestID",
			ErrRequestIDTaken, l.key.Name, lg.Spec.Owner, lg.Spec.RequestID, diff)
	}
	l.requested = lg.DeepCopy()
	return nil
}

// requestSpec is the LockGrant spec this request creates.
func (l *Lock) requestSpec() locksv1.LockGrantSpec {
	return locksv1.LockGrantSpec{Resource: l.resource, Owner: l.c.identity, RequestID: l.opts.RequestID,
		Lease: l.opts.Lease, OperationRoot: l.opts.OperationRoot, OperationCategory: l.opts.OperationCategory}
}

// specDiff names the request fields in which stored differs from want ("" when none).
func specDiff(stored, want locksv1.LockGrantSpec) string {
	var out []string
	for _, f := range []struct{ name, stored, want string }{
		{"resource", stored.Resource, want.Resource}, {"owner", stored.Owner, want.Owner},
		{"requestID", stored.RequestID, want.RequestID}, {"lease", stored.Lease, want.Lease},
		{"operationRoot", stored.OperationRoot, want.OperationRoot},
		{"operationCategory", stored.OperationCategory, want.OperationCategory},
	} {
		if f.stored != f.want {
			out = append(out, fmt.Sprintf("spec.%s is %q, not %q", f.name, f.stored, f.want))
		}
	}
	return strings.Join(out, ", ")
}

// waitHeld waits until the issuer decides the request. It follows the
// registry, where the allocating compare-and-swap records the holder with its
// signed grant, so HELD is known one watch hop after that write instead of
// after the LockGrant status mirror the issuer writes next; and, after
// grantWatchAfter, the LockGrant, which alone records an end before holding
// (Denied). The registry is only a short cut: if it cannot be watched, the
// LockGrant decides alone. LockGrant changes are taken from l.updates only
// here, in this goroutine, so none keepAlive needs is lost when the
// registry decides.
func (l *Lock) waitHeld(ctx context.Context) (*locksv1.LockGrant, error) {
	if done, err := decided(l.requested); done {
		return l.requested.DeepCopy(), err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fromRegistry := make(chan *locksv1.LockGrant, 1)
	go func() { fromRegistry <- l.waitRegistryHolder(rctx) }()
	followAfter := time.NewTimer(grantWatchAfter)
	defer followAfter.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case lg := <-fromRegistry:
			if lg != nil {
				return lg, nil
			}
			fromRegistry = nil // the registry cannot be followed
			l.followGrant()
		case <-followAfter.C:
			l.followGrant()
		case lg := <-l.updates:
			if lg == nil { // deleted before the issuer decided it
				l.advance(Event{Kind: EventGone})
				return nil, l.Err()
			}
			if done, err := decided(lg); done {
				return lg, err
			}
		}
	}
}

// waitRegistryHolder waits until the FencedResource's holder record names
// this request's LockGrant (by UID), and returns the LockGrant as held from
// that record; nil when the registry cannot be followed (or ctx ends). The
// registry watch is the client's, shared with its other requests for the
// resource and kept open a while after them (registry.go).
func (l *Lock) waitRegistryHolder(ctx context.Context) *locksv1.LockGrant {
	if l.requested == nil || l.requested.UID == "" {
		return nil
	}
	w, leave := l.c.awaitHolder(l.resource, l.requested.UID)
	defer leave()
	if fr := w.wait(ctx); fr != nil {
		return l.heldFromRecord(fr)
	}
	return nil
}

// heldFromRecord is this request's LockGrant as held, when fr's holder record names it.
func (l *Lock) heldFromRecord(fr *locksv1.FencedResource) *locksv1.LockGrant {
	if l.requested == nil || !namesGrant(fr, l.requested.UID) {
		return nil
	}
	h := fr.Status.Holder
	lg := l.requested.DeepCopy()
	lg.Status = h.HeldStatus(fr.Spec.ResourceID)
	return lg
}

// decided reports whether the issuer decided the request: held (with its
// grant), or ended before this lock saw it held.
func decided(lg *locksv1.LockGrant) (bool, error) {
	switch to, ended := phaseOutcome(lg.Status.Phase); {
	case to == StateHeld:
		return lg.Status.Grant != nil, nil
	case final(to):
		return true, fmt.Errorf("%w before it was observed held: %s", ended, conditionMessage(lg))
	}
	return false, nil
}
