package webhooks

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=fencekeeper-system,resources=leases,verbs=get;list;create;update;delete

// One object has one registry entry. A check that reads (a LIST of the
// entries naming the target) is passed by every create whose admission
// overlaps another's: neither sees the other, which is not stored yet. So
// the create webhook claims the target with a write the API server
// serializes: it creates a Lease whose name is derived from the target
// (locksv1.TargetClaimName) and whose holderIdentity names the entry. Of two
// racing creates one creates the claim; the other finds it held by an entry
// that is not stored yet and is refused (Conflict, retry).
//
// A claim outlives its entry (deleted, or its create failed after the
// webhook admitted it); a later create takes it over by compare-and-swap
// once the entry it names is gone or names another target, and the claim is
// older than TargetClaimGrace — so that an admitted create that is still on
// its way to storage is never overtaken. TargetClaimCollector deletes such
// claims by the same rule, so that they do not pile up.

// TargetClaimGrace is how long a claim whose entry does not exist is kept
// for that entry's create, admitted and maybe still being stored. The API
// server stores an admitted create right after its validating webhooks
// answer (which time out after 5 s) and within its request timeout (60 s by
// default); two minutes is above both.
const TargetClaimGrace = 2 * time.Minute

// claimVerdict is what a create does about a target claim held by another entry.
type claimVerdict int

const (
	// claimDuplicate: the entry the claim names exists and protects the target.
	claimDuplicate claimVerdict = iota
	// claimInFlight: the entry the claim names is not stored (yet), and the
	// claim is younger than the grace: its create may still land.
	claimInFlight
	// claimTakeOver: the claim is stale; take it by compare-and-swap.
	claimTakeOver
)

// decideClaim judges a claim held by another entry: holderTargets says
// whether that entry exists and names this target; acquired is when the
// claim was last taken.
func decideClaim(holderTargets bool, acquired, now time.Time, grace time.Duration) claimVerdict {
	switch {
	case holderTargets:
		return claimDuplicate
	case now.Sub(acquired) < grace:
		return claimInFlight
	}
	return claimTakeOver
}

// claimTarget takes the target claim of fr for fr, or says why it cannot: a
// 422 at spec.target when another entry protects the target, a 409 when
// another entry's create may still land.
func (v *FencedResourceValidator) claimTarget(ctx context.Context, fr *locksv1.FencedResource) error {
	key := fr.Spec.Target.Key()
	name := types.NamespacedName{Namespace: v.Namespace, Name: locksv1.TargetClaimName(fr.Namespace, key)}
	holder := fr.Namespace + "/" + fr.Name
	for range 3 {
		now := metav1.NewMicroTime(time.Now()) // claims age on the wall clock, like Leases
		claim := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name,
				Labels:      map[string]string{"app.kubernetes.io/managed-by": "fencekeeper", locksv1.LabelComponent: locksv1.ComponentTargetClaim},
				Annotations: map[string]string{locksv1.AnnotationClaimedTarget: fr.Namespace + "/" + key}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), AcquireTime: &now},
		}
		err := v.Writer.Create(ctx, claim)
		if err == nil || !apierrors.IsAlreadyExists(err) {
			return wrapClaimErr(err, name)
		}
		if err := v.Reader.Get(ctx, name, claim); apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return wrapClaimErr(err, name)
		}
		current := ptr.Deref(claim.Spec.HolderIdentity, "")
		if current == holder {
			// This entry's own claim: a retried create, or an entry re-created
			// under its name (the API server refuses the create if it exists).
			return nil
		}
		holderTargets, err := v.entryTargets(ctx, current, key)
		if err != nil {
			return err
		}
		acquired := claim.CreationTimestamp.Time
		if claim.Spec.AcquireTime != nil {
			acquired = claim.Spec.AcquireTime.Time
		}
		switch decideClaim(holderTargets, acquired, now.Time, v.claimGrace()) {
		case claimDuplicate:
			return invalidFencedResource(fr, validateUniqueTarget(fr, []locksv1.FencedResource{{
				ObjectMeta: metav1.ObjectMeta{Name: strings.TrimPrefix(current, fr.Namespace+"/")},
				Spec:       locksv1.FencedResourceSpec{Target: fr.Spec.Target}}}))
		case claimInFlight:
			return apierrors.NewConflict(locksv1.GroupVersion.WithResource("fencedresources").GroupResource(), fr.Name, fmt.Errorf(
				"%s %s was claimed for FencedResource %s at %s and that entry is not stored (yet): its create may still land; one object has one registry entry, retry after %s",
				fr.Spec.Target.Kind, fr.Spec.Target.Name, current, acquired.UTC().Format(time.RFC3339), acquired.Add(v.claimGrace()).UTC().Format(time.RFC3339)))
		}
		claim.Spec.HolderIdentity, claim.Spec.AcquireTime = ptr.To(holder), &now
		if err := v.Writer.Update(ctx, claim); err == nil || !apierrors.IsConflict(err) {
			return wrapClaimErr(err, name)
		}
	}
	return apierrors.NewConflict(locksv1.GroupVersion.WithResource("fencedresources").GroupResource(), fr.Name,
		fmt.Errorf("the claim %s of %s %s kept changing; retry", name, fr.Spec.Target.Kind, fr.Spec.Target.Name))
}

// entryTargets reads the entry holder ("<namespace>/<name>") around the cache
// and says whether it exists and names the target key.
func (v *FencedResourceValidator) entryTargets(ctx context.Context, holder, key string) (bool, error) {
	return entryTargets(ctx, v.Reader, holder, key)
}

func entryTargets(ctx context.Context, reader client.Reader, holder, key string) (bool, error) {
	ns, name, ok := strings.Cut(holder, "/")
	if !ok {
		return false, nil
	}
	var other locksv1.FencedResource
	if err := reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &other); apierrors.IsNotFound(err) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("read FencedResource %s, which claims the target: %w", holder, err)
	}
	return other.Spec.Target != nil && other.Spec.Target.Key() == key, nil
}

// claimedEntry is the name of the entry in namespace ns that the target
// claim of key names, read around the cache, or "" when there is no claim.
// Every entry with a target claims it before it is admitted, and a claim
// goes only once its entry is gone or names another target, so an entry the
// cache has not seen yet is found here; an entry older than claims is in
// the cache long since. The caller still reads the entry: the claim may
// name one whose create has not landed, or that is gone.
func claimedEntry(ctx context.Context, reader client.Reader, operatorNamespace, ns, key string) (string, error) {
	var claim coordinationv1.Lease
	name := types.NamespacedName{Namespace: operatorNamespace, Name: locksv1.TargetClaimName(ns, key)}
	if err := reader.Get(ctx, name, &claim); apierrors.IsNotFound(err) {
		return "", nil
	} else if err != nil {
		return "", fmt.Errorf("read the target claim (Lease %s): %w", name, err)
	}
	entryNS, entry, ok := strings.Cut(ptr.Deref(claim.Spec.HolderIdentity, ""), "/")
	if !ok || entryNS != ns {
		return "", nil
	}
	return entry, nil
}

func wrapClaimErr(err error, name types.NamespacedName) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("claim the target (Lease %s; the operator needs create, get and update on leases in its namespace): %w", name, err)
}

func (v *FencedResourceValidator) claimGrace() time.Duration {
	if v.ClaimGrace > 0 {
		return v.ClaimGrace
	}
	return TargetClaimGrace
}

// TargetClaimCollector deletes the target claims whose entry is gone (or
// names another target) once they are older than the grace: the claims a
// later create would take over (decideClaim). Without it every entry ever
// created left a Lease in the operator namespace, which a tenant could grow
// by creating and deleting entries. A claim is deleted
// with its UID and resourceVersion as preconditions, so a create that takes
// it over meanwhile wins.
type TargetClaimCollector struct {
	// Claims lists the claim Leases (around the cache: they are not cached).
	Claims client.Reader
	// Entries reads FencedResources; the operator's cache will do, as a
	// claim younger than the grace is never collected.
	Entries   client.Reader
	Writer    client.Writer
	Namespace string
	// Interval between passes (default 10 min); Grace, TargetClaimGrace by default.
	Interval, Grace time.Duration
}

// NeedLeaderElection is true: one replica collects.
func (c *TargetClaimCollector) NeedLeaderElection() bool { return true }

// Start collects every Interval until ctx ends.
func (c *TargetClaimCollector) Start(ctx context.Context) error {
	t := time.NewTicker(cmp.Or(c.Interval, 10*time.Minute))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if n, err := c.Collect(ctx); err != nil && ctx.Err() == nil {
			ctrl.LoggerFrom(ctx).Error(err, "collecting target claims", "deleted", n)
		}
	}
}

// Collect makes one pass, a page of claims at a time, and returns how many
// it deleted.
func (c *TargetClaimCollector) Collect(ctx context.Context) (int, error) {
	deleted := 0
	opts := []client.ListOption{client.InNamespace(c.Namespace), client.MatchingLabels{locksv1.LabelComponent: locksv1.ComponentTargetClaim}, client.Limit(500)}
	for cont := ""; ; {
		var page coordinationv1.LeaseList
		if err := c.Claims.List(ctx, &page, append(opts, client.Continue(cont))...); err != nil {
			return deleted, err
		}
		for i := range page.Items {
			gone, err := c.collect(ctx, &page.Items[i])
			if err != nil {
				return deleted, err
			}
			if gone {
				deleted++
			}
		}
		if cont = page.Continue; cont == "" {
			return deleted, nil
		}
	}
}

func (c *TargetClaimCollector) collect(ctx context.Context, claim *coordinationv1.Lease) (bool, error) {
	holder := ptr.Deref(claim.Spec.HolderIdentity, "")
	_, key, _ := strings.Cut(claim.Annotations[locksv1.AnnotationClaimedTarget], "/")
	targets, err := entryTargets(ctx, c.Entries, holder, key)
	if err != nil {
		return false, err
	}
	acquired := claim.CreationTimestamp.Time
	if claim.Spec.AcquireTime != nil {
		acquired = claim.Spec.AcquireTime.Time
	}
	if decideClaim(targets, acquired, time.Now(), cmp.Or(c.Grace, TargetClaimGrace)) != claimTakeOver {
		return false, nil
	}
	uid, rv := claim.UID, claim.ResourceVersion
	err = c.Writer.Delete(ctx, claim, client.Preconditions{UID: &uid, ResourceVersion: &rv})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return false, nil // taken over, or collected by another pass
	}
	return err == nil, err
}
