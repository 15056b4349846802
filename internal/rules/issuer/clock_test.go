package issuer

import (
	"testing"
	"time"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// After the issuer's clock jumps back, a renewal must not shorten the lease:
// expiresAt stays monotonic, so the LockGrant status (which refuses to move
// expiry backwards) still confirms the renewal to the holder.
func TestDecideRenewalAfterBackwardClockJump(t *testing.T) {
	f := fr(10)
	grants := []locksv1.LockGrant{lg("a", 0)}
	in := Input{Resource: f, Grants: grants, Now: t0, Epoch: 1, TakeoverAt: t0, Signer: testSigner(t)}
	apply(t, in)
	issued := f.Status.Holder.ExpiresAt.Time // t0 + 10s

	in.Now = t0.Add(-time.Hour)
	grants[0].Spec.Renewals = 1
	apply(t, in)
	if !f.Status.Holder.ExpiresAt.Time.Equal(issued) {
		t.Errorf("expiresAt %v after a renewal under a clock an hour back, want it kept at %v", f.Status.Holder.ExpiresAt.Time, issued)
	}
	if grants[0].Status.ObservedRenewals != 1 || f.Status.Holder.ObservedRenewals != 1 {
		t.Errorf("renewal not confirmed: LockGrant %d, holder %d", grants[0].Status.ObservedRenewals, f.Status.Holder.ObservedRenewals)
	}
	if grants[0].Status.Phase != locksv1.PhaseHeld {
		t.Errorf("phase %s", grants[0].Status.Phase)
	}
	// Back to normal time, a renewal extends from now again.
	in.Now = t0.Add(5 * time.Second)
	grants[0].Spec.Renewals = 2
	apply(t, in)
	if want := t0.Add(15 * time.Second); !f.Status.Holder.ExpiresAt.Time.Equal(want) || grants[0].Status.ObservedRenewals != 2 {
		t.Errorf("expiresAt %v, observed %d; want %v, 2", f.Status.Holder.ExpiresAt.Time, grants[0].Status.ObservedRenewals, want)
	}
}

// The issuer decides at the precision it stores (MicroTime), so a plan run
// again on what it wrote back has nothing more to write.
func TestDecideIsStableAtStoredPrecision(t *testing.T) {
	f := fr(10)
	grants := []locksv1.LockGrant{lg("a", 0)}
	now := t0.Add(123456789 * time.Nanosecond)
	in := Input{Resource: f, Grants: grants, Now: now, Epoch: 1, TakeoverAt: t0, Signer: testSigner(t)}
	apply(t, in)
	if got := f.Status.Holder.ExpiresAt.Time; got.Nanosecond()%1000 != 0 {
		t.Fatalf("expiresAt %v has sub-microsecond precision the API server drops", got)
	}
	// What the API server stores and the cache returns: microseconds.
	f.Status.Holder.ExpiresAt.Time = f.Status.Holder.ExpiresAt.Time.Truncate(time.Microsecond)
	grants[0].Status.ExpiresAt.Time = grants[0].Status.ExpiresAt.Time.Truncate(time.Microsecond)
	in.Now = now.Add(time.Millisecond)
	out, err := Decide(in)
	if err != nil {
		t.Fatal(err)
	}
	if out.StatusChanged || len(out.GrantStatus) != 0 {
		t.Fatalf("a second plan on the stored state writes again: status changed %v, %d LockGrant writes", out.StatusChanged, len(out.GrantStatus))
	}
}
