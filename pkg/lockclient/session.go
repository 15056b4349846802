package lockclient

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
)

// Keeping the grant: a renewal every interval, and the lock's end as soon
// as the server records it. What the session learns (a confirmed view, a
// renewal sent, no answer, an interval passed) moves the state machine of
// state.go; Release and Orphan end the session.
//
// The LockGrant's watch opens only when the lock needs it: after waiting
// grantWatchAfter for a decision, at the first renewal, or when the registry
// cannot be followed. Until then the registry's records tell the lock what
// the issuer decided (its holder record, then its record of the grant's
// end), as they tell it first anyway. A lock that is granted and released
// within one renewal interval (a short critical section in a loop) so
// costs the API server no watch of its own: opening one costs about as
// much as a small write. The watch starts with a read of the LockGrant and
// follows from the revision read: a watch opened late must not replay the
// LockGrant's history, whose old Held views would pass for a confirmation
// of now.

// grantWatchAfter is how long Acquire waits on the registry alone before
// it also watches its LockGrant, which alone records a request denied
// before it was held.
var grantWatchAfter = time.Second

// prepareWatch readies the LockGrant's watch (followGrant opens it), which
// lives until l.cancel: past the ctx of Acquire or Attach.
func (l *Lock) prepareWatch(ctx context.Context) {
	fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l.following, l.cancel = fctx, cancel
	l.updates = make(chan *locksv1.LockGrant, 8)
}

// followGrant opens the LockGrant's watch unless it is open, and stops
// following the registry for the grant's end: the watch tells it from then on.
func (l *Lock) followGrant() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.watching {
		return
	}
	l.watching = true
	go l.watchLockGrant(l.following, l.updates)
	if l.stopEndFollow != nil {
		l.stopEndFollow()
	}
}

// startSession enters HELD with the issuer's view lg and starts keepAlive,
// which lives as long as the lock is followed (prepareWatch). Until the
// LockGrant's watch opens, the registry's record of the grant's end ends
// the lock.
func (l *Lock) startSession(lg *locksv1.LockGrant) {
	lease := time.Duration(lg.Status.Grant.TTLSeconds) * time.Second
	if l.opts.RenewInterval <= 0 {
		l.opts.RenewInterval = lease / 3
	}
	if l.opts.RequestTimeout <= 0 {
		l.opts.RequestTimeout = l.opts.RenewInterval / 2
	}
	l.mu.Lock()
	l.view = lg
	var endCtx context.Context
	if !l.watching {
		endCtx, l.stopEndFollow = context.WithCancel(l.following)
	}
	l.mu.Unlock()
	l.advance(Event{Kind: EventObserved, Phase: locksv1.PhaseHeld, Confirmed: true})
	if endCtx != nil {
		l.followEnd(endCtx)
	}
	go l.keepAlive(l.following)
}

// keepAlive renews the lease and follows the LockGrant until the lock ends.
func (l *Lock) keepAlive(ctx context.Context) {
	ticker := time.NewTicker(l.opts.RenewInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case lg := <-l.updates:
			if lg == nil {
				l.advance(Event{Kind: EventGone})
			} else {
				l.applyView(lg)
			}
		case <-ticker.C:
			l.followGrant() // renewals are confirmed in the LockGrant's status
			l.renewOrQuery(ctx)
		}
		if l.ended() {
			l.cancel()
			return
		}
	}
}

// watchLockGrant streams the LockGrant into out until ctx ends (its
// deletion as nil): each watch (the API server ends them after a while)
// starts with a read, sent first, and follows from the revision read, so
// every view it sends is at least as new as the moment it opened.
func (l *Lock) watchLockGrant(ctx context.Context, out chan<- *locksv1.LockGrant) {
	send := func(lg *locksv1.LockGrant) {
		select {
		case out <- lg:
		case <-ctx.Done():
		}
	}
	for ctx.Err() == nil {
		var cur locksv1.LockGrant
		if err := l.c.kube.Get(ctx, l.key, &cur); err != nil {
			if apierrors.IsNotFound(err) {
				send(nil) // the LockGrant is gone: the lock ends
				return
			}
			_ = ctxtime.Sleep(ctx, 200*time.Millisecond)
			continue
		}
		send(&cur)
		w, err := l.c.kube.Watch(ctx, &locksv1.LockGrantList{}, client.InNamespace(l.key.Namespace),
			client.MatchingFields{"metadata.name": l.key.Name}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: cur.ResourceVersion}})
		if err != nil {
			_ = ctxtime.Sleep(ctx, 200*time.Millisecond)
			continue
		}
		for ev := range w.ResultChan() {
			lg, ok := ev.Object.(*locksv1.LockGrant)
			if !ok || ev.Type == watch.Error {
				continue
			}
			if ev.Type == watch.Deleted {
				lg = nil // the LockGrant is gone: the lock ends
			}
			send(lg)
		}
		w.Stop()
	}
}

// applyView applies a confirmed view of the LockGrant.
func (l *Lock) applyView(lg *locksv1.LockGrant) {
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
	why := conditionMessage(lg)
	phase, why := phaseForLock(lg.Status.Phase, lg.Spec.Release, why, "the LockGrant was deleted: "+why)
	l.advance(Event{Kind: EventObserved, Phase: phase, Confirmed: lg.Status.ObservedRenewals >= pending, Why: why})
}

// phaseForLock is the phase this lock records for one the server reports,
// and the explanation it keeps. The issuer ends a deleted holder as Released;
// nobody asked this lock to release, so for it the grant ended on the
// server's word: EXPIRED, explained by deleted. A release asked for needs no
// explanation.
func phaseForLock(phase locksv1.LockGrantPhase, asked bool, why, deleted string) (locksv1.LockGrantPhase, string) {
	switch {
	case phase == locksv1.PhaseReleased && !asked:
		return locksv1.PhaseExpired, deleted
	case phase == locksv1.PhaseReleased:
		return phase, ""
	}
	return phase, why
}

// renewOrQuery runs once per interval: after an unconfirmed renewal it asks the
// server where things stand; otherwise it renews.
func (l *Lock) renewOrQuery(ctx context.Context) {
	l.advance(Event{Kind: EventIntervalPassed})
	if l.State() == StateOwnershipUnknown {
		qctx, cancel := context.WithTimeout(ctx, l.opts.RequestTimeout)
		defer cancel()
		var lg locksv1.LockGrant
		if err := l.c.kube.Get(qctx, l.key, &lg); err != nil {
			if apierrors.IsNotFound(err) {
				l.advance(Event{Kind: EventGone})
			}
			return // still unknown; next tick asks again
		}
		if lg.Status.Phase == locksv1.PhaseHeld {
			// A confirmed answer: the issuer still counts us as the holder,
			// whatever became of the renewal.
			l.mu.Lock()
			l.pending = lg.Status.ObservedRenewals
			l.mu.Unlock()
		}
		l.applyView(&lg)
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
			l.advance(gone(err))
			return
		}
		l.applyView(&lg)
		// RENEWING here is this renewal's own attempt that lost a conflict.
		if s := l.State(); s != StateHeld && s != StateRenewing {
			return
		}
		lg.Spec.Renewals++
		l.mu.Lock()
		l.pending = lg.Spec.Renewals
		l.mu.Unlock()
		l.advance(Event{Kind: EventRenewalSent})
		err := l.c.kube.Update(rctx, &lg)
		switch {
		case err == nil:
			return // RENEWING until the issuer's status confirms it
		case apierrors.IsConflict(err):
			continue
		case apierrors.IsNotFound(err):
			l.advance(Event{Kind: EventGone})
			return
		default:
			// Lost response, timeout or refusal: we cannot know where we stand.
			l.advance(Event{Kind: EventNoAnswer})
			return
		}
	}
	l.advance(Event{Kind: EventNoAnswer}) // three conflicts in a row: no confirmed renewal
}

// gone is what a failed read of the LockGrant teaches: its deletion when the
// API server says it does not exist, otherwise nothing certain.
func gone(err error) Event {
	if apierrors.IsNotFound(err) {
		return Event{Kind: EventGone}
	}
	return Event{Kind: EventNoAnswer}
}

// advance moves the state machine (Next) on what the lock learned.
func (l *Lock) advance(e Event) {
	l.mu.Lock()
	s, cause := Next(l.state, e)
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
	l.notifyStateChange(s)
}

func (l *Lock) notifyStateChange(s State) {
	if l.opts.OnStateChange != nil {
		l.opts.OnStateChange(s)
	}
}

// Release gives the resource up and waits until the issuer confirms it. Unlike
// Orphan it tells the issuer, so the next waiter is served at once. The
// confirmation is the registry's record of the end, written by the
// compare-and-swap that ends the grant (or the LockGrant's final status, which
// the issuer writes after it, when the registry cannot be followed).
func (l *Lock) Release(ctx context.Context) error {
	if l.ended() {
		return l.Err()
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	l.mu.Lock()
	l.releasing = true
	l.mu.Unlock()
	l.followEnd(rctx) // before the release is sent: its end cannot be missed
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

// followEnd ends the lock on the registry's record of its grant's end, once
// the registry's watch delivers it, until ctx ends. When the registry
// cannot be followed, the LockGrant's watch tells the end instead.
func (l *Lock) followEnd(ctx context.Context) {
	l.mu.Lock()
	uid := l.view.UID
	l.mu.Unlock()
	w, leave := l.c.awaitEnd(l.resource, uid)
	go func() {
		defer leave()
		fr := w.wait(ctx)
		if fr == nil {
			if ctx.Err() == nil {
				l.followGrant() // the registry is lost
			}
			return
		}
		e, _ := endRecord(fr, uid)
		l.mu.Lock()
		releasing := l.releasing
		l.mu.Unlock()
		why := "the registry ended the grant: " + e.Reason
		phase, why := phaseForLock(e.Phase, releasing, why, why)
		l.advance(Event{Kind: EventObserved, Phase: phase, Confirmed: true, Why: why})
		if l.ended() && l.cancel != nil {
			l.cancel() // nothing more to follow
		}
	}()
}

// requestRelease sets spec.release with one merge patch: no read, no
// resourceVersion, so no conflict with a renewal or a status write. The
// LockGrant webhook still admits it only from the owner.
func (l *Lock) requestRelease(ctx context.Context) error {
	lg := &locksv1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: l.key.Namespace, Name: l.key.Name}}
	if err := l.c.kube.Patch(ctx, lg, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"release":true}}`))); err != nil {
		if apierrors.IsNotFound(err) {
			l.advance(Event{Kind: EventGone}) // nothing left to release
		}
		return fmt.Errorf("release %s: %w", l.key.Name, err)
	}
	return nil
}

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
