package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
)

// print writes the soak's section of the report.
func (x *soakResult) print(out io.Writer, section func(string), row func(...any), flush func()) {
	section(fmt.Sprintf("Soak: honest workers beside a hostile tenant (%s hostile in %d windows, attacks %s; tenant %s; workers %s)",
		x.HostileTime, x.WindowsAsked, x.Attacks, x.Tenant, x.HonestIdentity))
	row("window", "kind", "s", "grants/s", "honest handoffs", "handoff p50 ms", "p99 ms", "max ms", "floor handoff p99 ms (n)", "wait p99 ms", "refused", "operator RSS (anon) MiB", "target claims",
		"CPU % apiserver/etcd/operator/bench", "machine busy %")
	for i, w := range x.Windows {
		c := w.CPUPercent
		row(i, w.Kind, round2(w.End.Sub(w.Start).Seconds()), w.IssuedPerSecond, w.Handoffs.N, w.Handoffs.P50, w.Handoffs.P99, w.Handoffs.Max, fmt.Sprintf("%s (%d)", fmtF(w.Floor.P99), w.Floor.N), w.Waits.P99, w.Refused, fmt.Sprintf("%s (%s)", fmtF(w.RSSEndMiB), fmtF(w.AnonEndMiB)), w.Claims,
			fmt.Sprintf("%.0f/%.0f/%.0f/%.0f", c["kube-apiserver"], c["etcd"], c["manager"], c["bench"]), 100*w.MachineBusy)
	}
	flush()
	fmt.Fprintln(out, "grants/s: grants of the honest lock issued (to anyone); handoff: an honest holder's Release call → the next holder's fence seen by the soak's watch of the registry; wait: Acquire → HELD; floor handoff: the contract's handoff with no operator (a release PATCH, a minimal issuer's CAS, two watch hops), sampled beside the workers on a registry of its own")
	row("window", "kind", "honest handoff p99 ms", "issuer queue wait mean ms", "p99 ms", "issuer decision mean ms", "API server: LockGrant PATCH p99 ms",
		"registry status PUT p99 ms", "LockGrant webhook p99 ms")
	for i, w := range x.Windows {
		h := w.Where
		row(i, w.Kind, w.Handoffs.P99, h.IssuerQueueMeanMs, h.IssuerQueueP99Ms, h.IssuerWorkMeanMs, h.LockGrantPatchP99Ms, h.RegistryPutP99Ms, h.LockGrantWebhookP99Ms)
	}
	flush()
	fmt.Fprintln(out, "where a handoff's time went, from the operator's and the API server's own histograms over each window (p99 interpolated in their buckets; the API server's figures count every client's requests, the tenant's too)")
	fmt.Fprintln(out, "baseline: the quiet window before the tenant acts and the one after its objects were deleted; pauses (tenant idle, its objects kept) are shown, not judged")
	row("honest figures (ms)", "n", "p50", "p90", "p99", "max")
	d := func(name string, v dist) { row(name, v.N, v.P50, v.P90, v.P99, v.Max) }
	d("handoff, baseline", x.Handoffs.Quiet)
	d("handoff, hostile windows", x.Handoffs.Hostile)
	d("floor handoff (no operator), baseline", x.Floor.Quiet)
	d("floor handoff (no operator), hostile windows", x.Floor.Hostile)
	d("tenant's release → next holder, hostile", x.TenantHandoffs)
	d("wait, baseline", x.Waits.Quiet)
	d("wait, overlapping a hostile window", x.Waits.Hostile)
	d("  the same, less the tenant's holds", x.WaitsWithoutTenantHolds)
	flush()
	if x.FloorError != "" {
		fmt.Fprintf(out, "the floor handoff stopped early: %s\n", x.FloorError)
	}
	fmt.Fprintf(out, "honest acquisitions: %d served, %d refused %s; write/release failures: %s\n",
		x.Acquisitions.Served, x.Acquisitions.Refused, countsText(x.Acquisitions.Reasons), countsText(x.WriteFailures))
	x.printInputs(out, section, row, flush)
	for _, m := range []struct {
		name string
		c    rssCourse
	}{{"operator anonymous RSS", x.Memory.Anon}, {"operator RSS (with binary pages)", x.Memory.RSS}} {
		fmt.Fprintf(out, "%s: %s MiB at the first quiet window, peak %s MiB (%s window), growth %s MiB; after cleanup %s → %s MiB (%d samples)\n",
			m.name, fmtF(m.c.QuietStartMiB), fmtF(m.c.PeakMiB), m.c.PeakWindow, fmtF(m.c.GrowthMiB), fmtF(m.c.AfterCleanupFirstMiB), fmtF(m.c.AfterCleanupLastMiB), m.c.AfterCleanupSamples)
	}
	fmt.Fprintf(out, "kube-apiserver %s MiB, etcd %s MiB at the end\n", fmtF(x.Memory.APIServerEndMiB), fmtF(x.Memory.EtcdEndMiB))
	l := x.Leases
	fmt.Fprintf(out, "operator namespace: %d own Leases, %d leftover target claims, other leftovers %v (waited %s for the collector, its pass due %s); target claims peaked at %d\n",
		l.Own, l.LeftoverClaims, l.Leftover, l.Waited, l.CollectorDue.Format("15:04:05"), x.ClaimsPeak)
	section("Soak checks")
	row("check", "rule", "measured", "result")
	for _, c := range x.Checks {
		row(c.Name, c.Rule, c.Measured, c.Result)
	}
	flush()
	for _, c := range x.Checks {
		if c.Detail != "" {
			fmt.Fprintf(out, "  %s: %s\n", c.Name, c.Detail)
		}
	}
	fmt.Fprintf(out, "SOAK VERDICT: %s\n", x.Verdict)
}

func (x *soakResult) printInputs(out io.Writer, section func(string), row func(...any), flush func()) {
	in := x.Inputs
	section("Soak: what the tenant sent")
	row("input", "attempts", "admitted", "refused", "served", "denied", "stalled", "unservable")
	for _, o := range in.Odd {
		row(o.Case, o.Attempts, o.Admitted, o.Refused, o.Served, o.Denied, o.Stalled, o.Unservable)
	}
	count := func(name string, c admissionCount) { row(name, c.Attempts, c.Admitted, c.Refused, "", "", "", "") }
	count(fmt.Sprintf("LockGrant, %d-byte annotation, tenant's queue", in.Annotation.LargestAdmitted), in.BigGrants)
	count(fmt.Sprintf("LockGrant, %d-byte annotation, honest lock", in.Annotation.LargestAdmitted), in.BigOnHonest)
	count("LockGrant on the honest lock, overdue record", in.RecordsOnHonest)
	for _, g := range garbageRecords {
		if c := in.Records[g.name]; c != nil {
			count("unresolved-mutation record: "+g.name, *c)
		}
	}
	count("FencedResource, missing target (churn create)", in.Churn.Created)
	count("FencedResource churn delete", in.Churn.Deleted)
	flush()
	for _, c := range []struct {
		what string
		c    admissionCount
	}{{"big grant, tenant's queue", in.BigGrants}, {"big grant, honest lock", in.BigOnHonest}, {"churn create", in.Churn.Created}, {"churn delete", in.Churn.Deleted}} {
		if c.c.Refusal != "" {
			fmt.Fprintf(out, "  refused %s: %s\n", c.what, c.c.Refusal)
		}
	}
	for _, o := range in.Odd {
		if o.Refusal != "" {
			fmt.Fprintf(out, "  refused %s: %s\n", o.Case, o.Refusal)
		}
		if o.UnservableWhy != "" {
			fmt.Fprintf(out, "  unservable %s: %s\n", o.Case, o.UnservableWhy)
		}
	}
	probes := make([]string, 0, len(in.Annotation.Probes))
	for _, p := range in.Annotation.Probes {
		probes = append(probes, fmt.Sprintf("%d %s", p.Bytes, map[bool]string{true: "admitted", false: "refused"}[p.Admitted]))
	}
	fmt.Fprintf(out, "annotation budget probe (dry-run LockGrant creates): %s; largest admitted %d bytes\n", strings.Join(probes, ", "), in.Annotation.LargestAdmitted)
	if in.Annotation.Refusal != "" {
		fmt.Fprintf(out, "  first refusal: %s\n", in.Annotation.Refusal)
	}
	fmt.Fprintf(out, "requestID squats: %d taken before the honest worker, %d too late, %d refused %s; tenant grants served on the honest lock: %d; honest entry ReconciliationRequired seen: %v\n",
		in.Squats.Taken, in.Squats.Late, in.Squats.Refused, in.Squats.Refusal, in.ServedOnHonest, x.HonestReconciliationRequired)
	kinds := slices.Collect(maps.Keys(in.WrongPod))
	sort.Slice(kinds, func(i, j int) bool {
		return slices.Index(wrongPodKinds, kinds[i]) < slices.Index(wrongPodKinds, kinds[j])
	})
	for _, k := range kinds {
		fmt.Fprintf(out, "wrong pod, %s: %s\n", k, countsText(in.WrongPod[k]))
	}
	msgs := slices.Sorted(maps.Keys(in.WrongPodMessages))
	for _, k := range msgs {
		fmt.Fprintf(out, "  %s: %s\n", k, in.WrongPodMessages[k])
	}
	if in.ReleaseFailures > 0 || in.LeftAfterCleanup > 0 {
		fmt.Fprintf(out, "tenant release failures %d, objects left after cleanup %d %v\n", in.ReleaseFailures, in.LeftAfterCleanup, in.CleanupErrors)
	}
}
