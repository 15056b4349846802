package lockclient

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// State is the worker's view of its lock (DESIGN.md, "Worker client states").
type State string

// The states of DESIGN.md, "Worker client states".
const (
	StateRequested        State = "REQUESTED"
	StateHeld             State = "HELD"
	StateRenewing         State = "RENEWING"
	StateOwnershipUnknown State = "OWNERSHIP_UNKNOWN"
	StateExpired          State = "EXPIRED"
	StateReleased         State = "RELEASED"
)

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
	// updates carries the LockGrant's changes from its one watch (follow),
	// from the create to the lock's end; cancel stops that watch and the keeper.
	updates   chan *locksv1.LockGrant
	following context.Context
	cancel    context.CancelFunc
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
	l.notify(StateRequested)
	if err := l.createOrRecover(ctx); err != nil {
		return nil, err
	}
	// One watch of the LockGrant serves the wait and then the keeper.
	l.startFollowing(ctx, l.requested.ResourceVersion)
	lg, err := l.waitHeld(ctx)
	if err != nil {
		l.cancel()
		return nil, err
	}
	l.hold(lg)
	return l, nil
}

// startFollowing starts the LockGrant's watch (from resourceVersion, when
// known), which lives until l.cancel: past the ctx of Acquire or Attach.
func (l *Lock) startFollowing(ctx context.Context, resourceVersion string) {
	fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l.following, l.cancel = fctx, cancel
	l.updates = make(chan *locksv1.LockGrant, 8)
	go l.follow(fctx, resourceVersion, l.updates)
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
			held = l.heldFrom(&fr)
		}
		if held == nil {
			return nil, fmt.Errorf("%w: LockGrant %s is %s, not Held yet", ErrOwnershipUnknown, name, phaseOrPending(&lg))
		}
		lg = *held
	}
	l.startFollowing(ctx, "")
	l.hold(&lg)
	return l, nil
}

func phaseOrPending(lg *locksv1.LockGrant) locksv1.LockGrantPhase {
	if lg.Status.Phase == "" {
		return locksv1.PhasePending
	}
	return lg.Status.Phase
}

// hold enters HELD with the issuer's view lg and starts the keeper, which
// lives as long as the LockGrant's watch (startFollowing).
func (l *Lock) hold(lg *locksv1.LockGrant) {
	lease := time.Duration(lg.Status.Grant.TTLSeconds) * time.Second
	if l.opts.RenewInterval <= 0 {
		l.opts.RenewInterval = lease / 3
	}
	if l.opts.RequestTimeout <= 0 {
		l.opts.RequestTimeout = l.opts.RenewInterval / 2
	}
	l.mu.Lock()
	l.view = lg
	l.mu.Unlock()
	l.apply(learned{kind: observed, phase: locksv1.PhaseHeld, confirmed: true})
	go l.keep(l.following)
}

// createOrRecover creates the LockGrant once. When the outcome of a create is
// uncertain (no answer from the server), it reads the deterministic name: the
// request either landed, or it is safe to send again — never a second identity.
func (l *Lock) createOrRecover(ctx context.Context) error {
	want := &locksv1.LockGrant{
		ObjectMeta: metav1.ObjectMeta{Namespace: l.key.Namespace, Name: l.key.Name, Finalizers: []string{locksv1.GrantFinalizer}},
		Spec:       l.spec(),
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
			return l.checkMine(ctx)
		case definitive(err):
			return fmt.Errorf("create LockGrant %s: %w", l.key.Name, err)
		}
		lastErr = err
		// The response was lost; did the request land?
		if err := l.checkMine(ctx); err == nil {
			return nil
		} else if !apierrors.IsNotFound(err) {
			return err
		}
		if err := sleep(ctx, time.Duration(attempt+1)*100*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("create LockGrant %s: no answer from the API server: %w", l.key.Name, lastErr)
}

// checkMine reads the LockGrant and checks it is this request's: the spec
// this client would have created. The webhook admits a name of the library's
// form only for its own resource, owner and requestID, so another owner can
// never hold it; a LockGrant of this owner written by hand under this name
// with another lease, root or category is another request all the same.
func (l *Lock) checkMine(ctx context.Context) error {
	var lg locksv1.LockGrant
	if err := l.c.kube.Get(ctx, l.key, &lg); err != nil {
		return err
	}
	if diff := specDiff(lg.Spec, l.spec()); diff != "" {
		return fmt.Errorf("%w: LockGrant %s (owner %q, requestID %q) is another request: %s; use another requestID",
			ErrRequestIDTaken, l.key.Name, lg.Spec.Owner, lg.Spec.RequestID, diff)
	}
	l.requested = lg.DeepCopy()
	return nil
}

// spec is the LockGrant spec this request creates.
func (l *Lock) spec() locksv1.LockGrantSpec {
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
// after the LockGrant status mirror the issuer writes next; and it follows
// the LockGrant, which alone records an end before holding (Denied). The
// registry is only a short cut: if it cannot be watched, the LockGrant
// decides alone. LockGrant changes are taken from l.updates only here, in
// this goroutine, so none the keeper needs is lost when the registry decides.
func (l *Lock) waitHeld(ctx context.Context) (*locksv1.LockGrant, error) {
	if done, err := acquired(l.requested); done {
		return l.requested.DeepCopy(), err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fromRegistry := make(chan *locksv1.LockGrant, 1)
	go func() {
		if lg := l.waitRegistryHolder(rctx); lg != nil {
			fromRegistry <- lg
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case lg := <-fromRegistry:
			return lg, nil
		case lg := <-l.updates:
			if done, err := acquired(lg); done {
				return lg, err
			}
		}
	}
}

// waitRegistryHolder waits until the FencedResource's holder record names
// this request's LockGrant (by UID), and returns the LockGrant as held from
// that record; nil when the registry cannot be followed or ctx ends. The
// registry watch is the client's, shared with its other requests for the
// resource and kept open a while after them (registry.go).
func (l *Lock) waitRegistryHolder(ctx context.Context) *locksv1.LockGrant {
	if l.requested == nil || l.requested.UID == "" {
		return nil
	}
	w, leave := l.c.awaitHolder(l.resource, l.requested.UID)
	defer leave()
	if fr := w.wait(ctx); fr != nil {
		return l.heldFrom(fr)
	}
	return nil
}

// heldFrom is this request's LockGrant as held, when fr's holder record names it.
func (l *Lock) heldFrom(fr *locksv1.FencedResource) *locksv1.LockGrant {
	if l.requested == nil || !namesGrant(fr, l.requested.UID) {
		return nil
	}
	h := fr.Status.Holder
	lg := l.requested.DeepCopy()
	lg.Status = h.HeldStatus(fr.Spec.ResourceID)
	return lg
}

// acquired reports whether the issuer decided the request: held (with its
// grant), or ended before this lock saw it held.
func acquired(lg *locksv1.LockGrant) (bool, error) {
	switch to, ended := phaseOutcome(lg.Status.Phase); {
	case to == StateHeld:
		return lg.Status.Grant != nil, nil
	case final(to):
		return true, fmt.Errorf("%w before it was observed held: %s", ended, conditionMessage(lg))
	}
	return false, nil
}

// keep renews the lease and follows the LockGrant until the lock ends.
func (l *Lock) keep(ctx context.Context) {
	ticker := time.NewTicker(l.opts.RenewInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case lg := <-l.updates:
			l.observe(lg)
		case <-ticker.C:
			l.renewOrQuery(ctx)
		}
		if l.ended() {
			l.cancel()
			return
		}
	}
}

// follow streams the LockGrant's updates into out until ctx ends: the first
// watch from resourceVersion (when set), each later one from the object as
// it is then (a watch without a resourceVersion starts with it).
func (l *Lock) follow(ctx context.Context, resourceVersion string, out chan<- *locksv1.LockGrant) {
	for ctx.Err() == nil {
		w, err := l.c.kube.Watch(ctx, &locksv1.LockGrantList{}, client.InNamespace(l.key.Namespace),
			client.MatchingFields{"metadata.name": l.key.Name}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: resourceVersion}})
		resourceVersion = ""
		if err != nil {
			_ = sleep(ctx, 200*time.Millisecond)
			continue
		}
		for ev := range w.ResultChan() {
			if lg, ok := ev.Object.(*locksv1.LockGrant); ok && ev.Type != watch.Error && ev.Type != watch.Deleted {
				select {
				case out <- lg:
				case <-ctx.Done():
				}
			}
		}
		w.Stop()
	}
}

// observe applies a confirmed view of the LockGrant.
func (l *Lock) observe(lg *locksv1.LockGrant) {
	l.mu.Lock()
	if l.view != nil && lg.Status.Grant != nil && l.view.Status.Grant != nil && *lg.Status.Grant != *l.view.Status.Grant {
		l.mu.Unlock()
		return // not our grant (cannot happen: a LockGrant holds one grant)
	}
	if l.view != nil && l.view.Status.Grant != nil && lg.Status.Grant == nil {
		if to, _ := phaseOutcome(lg.Status.Phase); !final(to) {
			l.mu.Unlock()
			return // the status mirror has not caught up with the registry's holder record yet
		}
		// The grant ended before its Held mirror landed: the final phase
		// counts, and the view keeps the grant this lock held.
		ended := lg.DeepCopy()
		ended.Status.Grant, ended.Status.Digest, ended.Status.Proof = l.view.Status.Grant, l.view.Status.Digest, l.view.Status.Proof
		lg = ended
	}
	l.view = lg
	pending := l.pending
	l.mu.Unlock()
	why := ""
	if lg.Status.Phase != locksv1.PhaseReleased {
		why = conditionMessage(lg)
	}
	l.apply(learned{kind: observed, phase: lg.Status.Phase, confirmed: lg.Status.ObservedRenewals >= pending, why: why})
}

// renewOrQuery runs once per interval: after an unconfirmed renewal it asks the
// server where things stand; otherwise it renews.
func (l *Lock) renewOrQuery(ctx context.Context) {
	l.apply(learned{kind: intervalPassed})
	if l.State() == StateOwnershipUnknown {
		qctx, cancel := context.WithTimeout(ctx, l.opts.RequestTimeout)
		defer cancel()
		var lg locksv1.LockGrant
		if err := l.c.kube.Get(qctx, l.key, &lg); err != nil {
			return // still unknown; next tick asks again
		}
		if lg.Status.Phase == locksv1.PhaseHeld {
			// A confirmed answer: the issuer still counts us as the holder,
			// whatever became of the renewal.
			l.mu.Lock()
			l.pending = lg.Status.ObservedRenewals
			l.mu.Unlock()
		}
		l.observe(&lg)
		if l.State() != StateHeld {
			return
		}
	}
	l.renew(ctx)
}

// renew bumps spec.renewals; the issuer applies it if it arrives before expiry.
func (l *Lock) renew(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, l.opts.RequestTimeout)
	defer cancel()
	for attempt := 0; attempt < 3; attempt++ {
		var lg locksv1.LockGrant
		if err := l.c.kube.Get(rctx, l.key, &lg); err != nil {
			l.apply(learned{kind: noAnswer})
			return
		}
		l.observe(&lg)
		// RENEWING here is this renewal's own attempt that lost a conflict.
		if s := l.State(); s != StateHeld && s != StateRenewing {
			return
		}
		lg.Spec.Renewals++
		l.mu.Lock()
		l.pending = lg.Spec.Renewals
		l.mu.Unlock()
		l.apply(learned{kind: renewalSent})
		err := l.c.kube.Update(rctx, &lg)
		switch {
		case err == nil:
			return // RENEWING until the issuer's status confirms it
		case apierrors.IsConflict(err):
			continue
		default:
			// Lost response, timeout or refusal: we cannot know where we stand.
			l.apply(learned{kind: noAnswer})
			return
		}
	}
	l.apply(learned{kind: noAnswer}) // three conflicts in a row: no confirmed renewal
}

// Release gives the resource up and waits until the issuer confirms it. Unlike
// Orphan it tells the issuer, so the next waiter is served at once.
func (l *Lock) Release(ctx context.Context) error {
	if l.ended() {
		return l.Err()
	}
	if err := l.requestRelease(ctx); err != nil {
		return err
	}
	select {
	case <-l.done:
		if errors.Is(l.Err(), ErrReleased) {
			return nil
		}
		return l.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// requestRelease sets spec.release with one merge patch: no read, no
// resourceVersion, so no conflict with a renewal or a status write. The
// LockGrant webhook still admits it only from the owner.
func (l *Lock) requestRelease(ctx context.Context) error {
	lg := &locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: l.key.Namespace, Name: l.key.Name}}
	if err := l.c.kube.Patch(ctx, lg, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"release":true}}`))); err != nil {
		return fmt.Errorf("release %s: %w", l.key.Name, err)
	}
	return nil
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

// Orphan stops renewing and following the grant without releasing it (as
// etcd's Session.Orphan): the lease then expires on the issuer's clock, or
// another process of the same owner Attaches to it. From then on this lock
// cannot tell whether it is still held, so Guard answers ErrOwnershipUnknown.
// To give the resource up, call Release.
func (l *Lock) Orphan() {
	if l.cancel != nil {
		l.cancel()
	}
	l.mu.Lock()
	l.orphaned = true
	l.mu.Unlock()
}

func (l *Lock) ended() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// apply moves the state machine (next) on what the lock learned.
func (l *Lock) apply(what learned) {
	l.mu.Lock()
	s, cause := next(l.state, what)
	if s == l.state {
		l.mu.Unlock()
		return
	}
	l.state = s
	if final(s) {
		l.err = cause
		close(l.done)
	}
	l.mu.Unlock()
	l.notify(s)
}

func (l *Lock) notify(s State) {
	if l.opts.OnStateChange != nil {
		l.opts.OnStateChange(s)
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

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
