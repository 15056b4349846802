package main

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"
)

// The soak's checks: each PASS, FAIL or INCONCLUSIVE with its figures. A
// timing excess is FAIL only when it repeats: on a shared machine one slow
// window is noise, an excess in most hostile windows is a finding.

// checkTail judges a tail: PASS when the hostile windows' pooled p99 is at
// most tailLimit × the quiet baseline's. FAIL when above and either
//   - both sides hold minTailSamples and most hostile windows (of those
//     with minWindowSamples) exceed it on their own, or
//   - even the hostile median exceeds tailLimit × the quiet p99, in most
//     hostile windows (with three samples or more): few samples then mean
//     the hostile side was slow, not that it was lucky.
//
// Otherwise INCONCLUSIVE.
func checkTail(name string, quiet []time.Duration, hostile [][]time.Duration) soakCheck {
	q, h := summarize(quiet), summarize(flat(hostile))
	c := soakCheck{Name: name, Rule: fmt.Sprintf("hostile p99 ≤ %g× quiet p99", tailLimit)}
	if q.N == 0 || h.N == 0 {
		c.Result, c.Measured, c.Detail = verdictInconclusive, "n/a", fmt.Sprintf("no samples (quiet %d, hostile %d)", q.N, h.N)
		return c
	}
	x := ratio(h.P99, q.P99)
	c.Measured = fmt.Sprintf("%s× (%s / %s ms)", fmtF(x), fmtF(h.P99), fmtF(q.P99))
	bound := tailLimit * q.P99
	tails, medians := 0, 0
	for _, w := range hostile {
		d := summarize(w)
		if d.N >= minWindowSamples && d.P99 > bound {
			tails++
		}
		if d.N >= 3 && d.P50 > bound {
			medians++
		}
	}
	most := len(hostile)/2 + 1
	c.Detail = fmt.Sprintf("quiet n=%d, hostile n=%d (median %s ms); hostile windows over %s ms: %d by p99, %d by median, of %d",
		q.N, h.N, fmtF(h.P50), fmtF(bound), tails, medians, len(hostile))
	switch {
	case x <= tailLimit:
		c.Result = verdictPass
	case q.N >= minTailSamples && h.N >= minTailSamples && tails >= most,
		q.N >= minTailSamples && h.P50 > bound && medians >= most:
		c.Result = verdictFail
	default:
		c.Result = verdictInconclusive
		c.Detail += fmt.Sprintf("; FAIL needs ≥ %d samples a side and the excess in most hostile windows, or the median over the bound in most of them", minTailSamples)
	}
	return c
}

// checkIssuing judges how fast the honest lock changed hands (grants
// issued per second, to anyone) in the hostile windows against the
// baseline: at least 1/tailLimit of it, the throughput side of the p99 rule.
func (r *soakResult) checkIssuing() soakCheck {
	c := soakCheck{Name: "issuing on the honest lock", Rule: fmt.Sprintf("grants/s hostile ≥ 1/%g of quiet", tailLimit)}
	var qn, hn int
	var qs, hs float64
	slow, hostile := 0, 0
	for _, w := range r.Windows {
		secs := w.End.Sub(w.Start).Seconds()
		switch {
		case baseline(w.Kind):
			qn, qs = qn+w.Issued, qs+secs
		case w.Kind == windowHostile:
			hn, hs = hn+w.Issued, hs+secs
			hostile++
		}
	}
	if qs == 0 || hs == 0 || qn == 0 {
		c.Result, c.Measured = verdictInconclusive, "n/a"
		return c
	}
	qr, hr := float64(qn)/qs, float64(hn)/hs
	for _, w := range r.Windows {
		if w.Kind == windowHostile && w.IssuedPerSecond*tailLimit < qr {
			slow++
		}
	}
	c.Measured = fmt.Sprintf("%s× (%s / %s per s)", fmtF(ratio(hr, qr)), fmtF(round2(hr)), fmtF(round2(qr)))
	c.Detail = fmt.Sprintf("%d of %d hostile windows below on their own", slow, hostile)
	switch {
	case hr*tailLimit >= qr:
		c.Result = verdictPass
	case slow > hostile/2:
		c.Result = verdictFail
	default:
		c.Result = verdictInconclusive
	}
	return c
}

// checkWait judges the longest honest wait of the hostile windows, less
// the tenant's holds, against the longest quiet one; an excess of the
// maximum alone is FAIL only when checkTail's rule finds it in the tail.
func checkWait(quiet []time.Duration, hostile [][]time.Duration) soakCheck {
	q, h := summarize(quiet), summarize(flat(hostile))
	c := soakCheck{Name: "honest wait behind the tenant", Rule: fmt.Sprintf("max hostile wait less tenant holds ≤ %g× max quiet wait", tailLimit)}
	if q.N == 0 || h.N == 0 {
		c.Result, c.Measured = verdictInconclusive, "n/a"
		return c
	}
	x := ratio(h.Max, q.Max)
	c.Measured = fmt.Sprintf("%s× (%s / %s ms)", fmtF(x), fmtF(h.Max), fmtF(q.Max))
	if x <= tailLimit {
		c.Result = verdictPass
		return c
	}
	tail := checkTail("", quiet, hostile)
	c.Result = tail.Result
	if c.Result == verdictPass {
		c.Result = verdictInconclusive
	}
	c.Detail = "p99 " + tail.Measured + "; " + tail.Detail
	return c
}

func (r *soakResult) checkAcquisitions() soakCheck {
	a := r.Acquisitions
	c := soakCheck{Name: "honest acquisitions served", Rule: "every honest Acquire returns HELD",
		Measured: fmt.Sprintf("%d served, %d refused", a.Served, a.Refused), Result: verdictPass}
	switch {
	case a.Served == 0:
		c.Result = verdictInconclusive
	case a.Refused > 0:
		c.Result, c.Detail = verdictFail, countsText(a.Reasons)
	}
	c.Detail = strings.TrimSpace(c.Detail + fmt.Sprintf(" (the tenant created %d LockGrants under an honest worker's next requestID first)", r.Inputs.Squats.Taken))
	return c
}

func (r *soakResult) checkOdd() soakCheck {
	c := soakCheck{Name: "odd inputs refused or served", Rule: "refused at admission, or served or Denied (an entry: serves a request)"}
	attempts, bad := 0, []string{}
	for _, o := range r.Inputs.Odd {
		attempts += o.Attempts
		if o.Stalled+o.Unservable > 0 {
			bad = append(bad, fmt.Sprintf("%s: %d stalled, %d unservable", o.Case, o.Stalled, o.Unservable))
		}
	}
	c.Measured = fmt.Sprintf("%d cases, %d attempts, %d cases failing", len(r.Inputs.Odd), attempts, len(bad))
	switch {
	case attempts == 0:
		c.Result = verdictInconclusive
	case len(bad) > 0:
		c.Result, c.Detail = verdictFail, strings.Join(bad, "; ")
	default:
		c.Result = verdictPass
	}
	return c
}

func (r *soakResult) checkGrowth() soakCheck {
	m, t := r.Memory.Anon, r.Memory.RSS
	c := soakCheck{Name: "operator memory growth", Rule: fmt.Sprintf("anonymous RSS: peak − quiet start ≤ %d MiB", rssGrowthLimitMiB),
		Measured: fmt.Sprintf("%s MiB (%s → %s, peak in a %s window; RSS with binary pages %s → %s)", fmtF(m.GrowthMiB), fmtF(m.QuietStartMiB), fmtF(m.PeakMiB), m.PeakWindow,
			fmtF(t.QuietStartMiB), fmtF(t.PeakMiB))}
	switch {
	case m.PeakMiB == 0:
		c.Result = verdictInconclusive
	case m.GrowthMiB <= rssGrowthLimitMiB:
		c.Result = verdictPass
	default:
		c.Result = verdictFail
	}
	return c
}

func (r *soakResult) checkClimb() soakCheck {
	m := r.Memory.Anon
	c := soakCheck{Name: "operator memory after cleanup", Rule: fmt.Sprintf("anonymous RSS, no climb without traffic: last − first ≤ %d MiB", rssClimbLimitMiB)}
	if m.AfterCleanupSamples < 10 {
		c.Result, c.Measured = verdictInconclusive, fmt.Sprintf("%d samples", m.AfterCleanupSamples)
		return c
	}
	climb := round2(m.AfterCleanupLastMiB - m.AfterCleanupFirstMiB)
	c.Measured = fmt.Sprintf("%s MiB (%s → %s over %d samples)", signed(climb), fmtF(m.AfterCleanupFirstMiB), fmtF(m.AfterCleanupLastMiB), m.AfterCleanupSamples)
	c.Result = verdictPass
	if climb > rssClimbLimitMiB {
		c.Result = verdictFail
	}
	return c
}

func (r *soakResult) checkCleanup() soakCheck {
	c := soakCheck{Name: "tenant objects deleted", Rule: "each LockGrant and FencedResource of the tenant gone within 2 min of its delete",
		Measured: fmt.Sprintf("%d left (cleanup %s s)", r.Inputs.LeftAfterCleanup, fmtF(r.CleanupSeconds)), Result: verdictPass}
	if r.Inputs.LeftAfterCleanup > 0 || len(r.Inputs.CleanupErrors) > 0 {
		c.Result, c.Detail = verdictFail, strings.Join(r.Inputs.CleanupErrors, "; ")
	}
	return c
}

func (r *soakResult) checkLeases() soakCheck {
	l := r.Leases
	c := soakCheck{Name: "operator namespace after cleanup", Rule: "no Lease but leader election, verifiers and live entries' claims",
		Measured: fmt.Sprintf("%d leftover claims, %d other leases (waited %s)", l.LeftoverClaims, len(l.Leftover), l.Waited)}
	switch {
	case len(l.Leftover) > 0:
		c.Result, c.Detail = verdictFail, strings.Join(l.Leftover, ", ")
	case l.LeftoverClaims == 0:
		c.Result = verdictPass
	case l.WaitedPastDue:
		c.Result, c.Detail = verdictFail, "claims outlived the collector's pass due at "+l.CollectorDue.Format(time.TimeOnly)
	default:
		c.Result = verdictInconclusive
		c.Detail = fmt.Sprintf("the collector's pass that may delete them is due at %s, after -soak-collect-wait ended", l.CollectorDue.Format(time.TimeOnly))
	}
	return c
}

func (r *soakResult) checkWrongPod() soakCheck {
	attempts, accepted := 0, 0
	for _, outcomes := range r.Inputs.WrongPod {
		for o, n := range outcomes {
			attempts += n
			if o == outcomeAccepted {
				accepted += n
			}
		}
	}
	c := soakCheck{Name: "changes from the wrong pod", Rule: "none accepted", Measured: fmt.Sprintf("%d accepted of %d", accepted, attempts)}
	switch {
	case attempts == 0:
		c.Result = verdictInconclusive
	case accepted > 0:
		c.Result = verdictFail
	default:
		c.Result = verdictPass
	}
	return c
}

// overall is FAIL when a check failed, else INCONCLUSIVE when one was, else
// PASS. An OUT OF REACH line counts as neither: its line against the floor
// is judged in its place.
func overall(checks []soakCheck) string {
	v := verdictPass
	for _, c := range checks {
		switch c.Result {
		case verdictFail:
			return verdictFail
		case verdictInconclusive:
			v = verdictInconclusive
		}
	}
	return v
}

func countsText(m map[string]int) string {
	keys := slices.Collect(maps.Keys(m))
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d× %s", m[k], k))
	}
	return strings.Join(parts, ", ")
}
