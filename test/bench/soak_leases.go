package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/pkg/ctxtime"
	"github.com/fencekeeper/fencekeeper/webhooks"
)

// collectorInterval is the operator's target-claim collector's period
// (webhooks.TargetClaimCollector's default; cmd/manager sets no other).
const collectorInterval = 10 * time.Minute

// sampleClaims counts the target claims in the operator's namespace every
// two seconds until ctx ends.
func (s *soakRun) sampleClaims(ctx context.Context) {
	for {
		var list coordinationv1.LeaseList
		if err := s.e.admin.List(ctx, &list, client.InNamespace(locksv1.DefaultNamespace),
			client.MatchingLabels{locksv1.LabelComponent: locksv1.ComponentTargetClaim}); err == nil {
			s.rec.claims(time.Now(), len(list.Items))
		}
		if ctxtime.Sleep(ctx, 2*time.Second) != nil {
			return
		}
	}
}

// leaseClass sorts a Lease of the operator's namespace: the operator's own
// (leader election, a verifier's, the claim of an entry that exists and
// names the target) or left over.
func (s *soakRun) leaseClass(ctx context.Context, l *coordinationv1.Lease) (own, claim bool) {
	switch {
	case l.Name == locksv1.LeaderElectionID, l.Labels[locksv1.LabelComponent] == locksv1.ComponentVerifier:
		return true, false
	case l.Labels[locksv1.LabelComponent] != locksv1.ComponentTargetClaim:
		return false, false
	}
	ns, name, _ := strings.Cut(ptr.Deref(l.Spec.HolderIdentity, ""), "/")
	_, key, _ := strings.Cut(l.Annotations[locksv1.AnnotationClaimedTarget], "/")
	var fr locksv1.FencedResource
	err := s.e.admin.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &fr)
	live := err == nil && fr.Spec.Target != nil && fr.Spec.Target.Key() == key
	if err != nil && !apierrors.IsNotFound(err) {
		live = true // unknown: do not blame it
	}
	return live, true
}

// leftovers lists the Leases of the operator's namespace that are not its own.
func (s *soakRun) leftovers(ctx context.Context) (own int, claims, others []string, err error) {
	var list coordinationv1.LeaseList
	if err := s.e.admin.List(ctx, &list, client.InNamespace(locksv1.DefaultNamespace)); err != nil {
		return 0, nil, nil, err
	}
	for i := range list.Items {
		l := &list.Items[i]
		switch ok, claim := s.leaseClass(ctx, l); {
		case ok:
			own++
		case claim:
			claims = append(claims, l.Name)
		default:
			others = append(others, l.Name)
		}
	}
	return own, claims, others, nil
}

// checkLeases waits for the collector's pass that can delete the claims the
// tenant's entries left (each older than the grace), at most
// -soak-collect-wait, and judges what is left.
func (s *soakRun) checkLeases(ctx context.Context) {
	L := &s.res.Leases
	start := time.Now()
	s.tenant.mu.Lock()
	lastClaim := s.tenant.lastClaimAt
	s.tenant.mu.Unlock()
	due := collectorDue(operatorStart(start), lastClaim, start)
	deadline := start.Add(s.cfg.collectWait)
	if d := due.Add(45 * time.Second); d.Before(deadline) {
		deadline = d
	}
	L.CollectorDue = due
	fmt.Fprintf(s.log, "   waiting for the target-claim collector (its pass at %s) until %s\n", due.Format(time.TimeOnly), deadline.Format(time.TimeOnly))
	for {
		own, claims, others, err := s.leftovers(ctx)
		if err == nil {
			L.Own, L.LeftoverClaims, L.Leftover = own, len(claims), others
			L.Examples = slices.Concat(others, claims[:min(len(claims), 5)])
		}
		if err == nil && len(claims)+len(others) == 0 || !time.Now().Before(deadline) || ctx.Err() != nil {
			break
		}
		_ = ctxtime.Sleep(ctx, 5*time.Second)
	}
	L.Waited = time.Since(start).Round(time.Second).String()
	L.WaitedPastDue = time.Now().After(due.Add(30 * time.Second))
}

// collectorDue is when the collector's first pass after the last claim's
// grace happens: passes are every collectorInterval from the operator's
// start (the claim grace is webhooks.TargetClaimGrace). now when no claim
// was made.
func collectorDue(opStart, lastClaim, now time.Time) time.Time {
	if lastClaim.IsZero() {
		return now
	}
	need := lastClaim.Add(webhooks.TargetClaimGrace)
	k := need.Sub(opStart)/collectorInterval + 1
	return opStart.Add(k * collectorInterval)
}

// operatorStart is when the operator's process (this process's child
// "manager") started, from /proc; fallback when it is not found.
func operatorStart(fallback time.Time) time.Time {
	boot := bootTime()
	for pid, comm := range children() {
		if comm != "manager" || boot.IsZero() {
			continue
		}
		if _, f, err := procStat(pid); err == nil && len(f) > 19 {
			if ticks, err := strconv.ParseInt(f[19], 10, 64); err == nil {
				return boot.Add(time.Duration(ticks) * time.Second / clockTicks)
			}
		}
	}
	return fallback
}

// bootTime is the machine's boot time (btime of /proc/stat).
func bootTime() time.Time {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			if sec, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return time.Unix(sec, 0)
			}
		}
	}
	return time.Time{}
}
