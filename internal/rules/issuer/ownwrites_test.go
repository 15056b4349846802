package issuer

import (
	"slices"
	"testing"
	"time"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// A decision asked for before the cache shows the issuer's own handoff (a
// new request arrives meanwhile) is made from what that handoff wrote: it
// writes nothing, where the cached view would issue the same grant again
// in a compare-and-swap that can only lose.
func TestDecideFromOwnWriteWhileTheCacheLags(t *testing.T) {
	f := fr(10)
	in := Input{Resource: f, Grants: []locksv1.LockGrant{lg("a", 0), lg("b", time.Second)}, Now: t0.Add(2 * time.Second),
		Epoch: 1, TakeoverAt: t0, Signer: testSigner(t)}
	apply(t, in)
	if h := f.Status.Holder; h == nil || h.GrantName != "a" || len(f.Status.Queue) != 1 {
		t.Fatalf("setup: holder %+v, queue %v", h, f.Status.Queue)
	}
	f.ResourceVersion = "101"

	// a releases; the handoff to b is committed at 102.
	in.Grants[0].Spec.Release = true
	in.SeenNow, in.ConfirmLater = real0, true
	in.Resource = f.DeepCopy()
	handoff := mustDecide(t, in)
	if h := handoff.Status.Holder; !handoff.StatusChanged || h == nil || h.GrantName != "b" {
		t.Fatalf("handoff: holder %+v", h)
	}
	wrote := f.DeepCopy()
	wrote.Status, wrote.ResourceVersion = handoff.Status, "102"
	own := OwnWrites{}.Wrote("101", wrote)

	// a's owner asks again (c) before the cache shows 102.
	in.Grants = append(in.Grants, lg("c", 3*time.Second))
	in.Seen = handoff.Deferred.Committed("101", "102")
	in.SeenNow = real0.Add(10 * time.Millisecond)
	cached := f.DeepCopy()
	in.Resource = cached
	if d := mustDecide(t, in); !d.StatusChanged || d.Status.Holder == nil || d.Status.Holder.FenceToken != handoff.Status.Holder.FenceToken {
		t.Fatalf("from the lagging cache: changed %t, holder %+v (the handoff decided again)", d.StatusChanged, d.Status.Holder)
	}

	in.Resource = own.View(cached)
	if in.Resource.ResourceVersion != "102" || in.Resource == wrote {
		t.Fatalf("view at %q (a copy of the own write expected)", in.Resource.ResourceVersion)
	}
	d := mustDecide(t, in)
	if d.StatusChanged {
		t.Fatalf("from the own write: a registry write (holder %+v, queue %v)", d.Status.Holder, queueNames(d))
	}
	if !slices.Equal(d.Confirm, []string{"c"}) || len(d.Unconfirmed) != 0 {
		t.Fatalf("confirm %v, unconfirmed %v: only c is read, outside the decision", d.Confirm, d.Unconfirmed)
	}
}

// The memory follows a chain of own writes, and lets the cache decide once
// it shows the latest of them or anyone else's newer write.
func TestOwnWritesView(t *testing.T) {
	at := func(rv string) *locksv1.FencedResource {
		f := fr(10)
		f.ResourceVersion = rv
		return f
	}
	var own OwnWrites
	if got := own.View(at("100")); got.ResourceVersion != "100" {
		t.Fatalf("no own write: view %q", got.ResourceVersion)
	}
	own = own.Wrote("100", at("101")).Wrote("101", at("102"))
	for rv, want := range map[string]string{"100": "102", "101": "102", "102": "102", "107": "107"} {
		if got := own.View(at(rv)).ResourceVersion; got != want {
			t.Errorf("cache at %s: view %s, want %s", rv, got, want)
		}
		if lags := own.Lags(rv); lags != (rv == "100" || rv == "101") {
			t.Errorf("cache at %s: lags %t", rv, lags)
		}
	}
	for i := 0; i < 2*maxReplaced; i++ {
		own = own.Wrote(at("x").ResourceVersion+string(rune('a'+i)), at("y"))
	}
	if len(own.Replaced) != maxReplaced {
		t.Fatalf("remembers %d replaced versions, want at most %d", len(own.Replaced), maxReplaced)
	}
}
