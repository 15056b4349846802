package sim

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fencekeeper/fencekeeper/pkg/fence"
)

// unknownBudget is the release gate's bound on settling an UNKNOWN outcome.
const unknownBudget = 15 * time.Minute

// Gate is one row of the release-gate table.
type Gate struct {
	Name     string
	Bar      string
	Measured string
	Pass     bool
	// NotApplicable marks a gate the simulator cannot measure.
	NotApplicable bool
}

// Gates evaluates the release gates (docs/contract.md) on the counters.
func (c *Counters) Gates() []Gate {
	zero := func(name string, kind violationKind, of string) Gate {
		n := c.Violated[kind]
		m := fmt.Sprint(n)
		if of != "" {
			m += " (of " + of + ")"
		}
		return Gate{Name: name, Bar: "0", Measured: m, Pass: n == 0}
	}
	coverage := 100.0
	if c.Mutations > 0 {
		coverage = 100 * float64(c.CheckedMutations) / float64(c.Mutations)
	}
	settled := c.UnknownApplied + c.UnknownAbsent + c.UnknownUndetermined
	return []Gate{
		zero(fmt.Sprintf("Accepted stale writes across %s scheduling tests", thousands(c.Schedules)), vStaleWrite,
			thousands(c.Commits)+" authenticated segments written"),
		zero("Accepted forged / tampered / cross-resource grants", vForgedAccepted, thousands(c.ForgedAttempts)+" such attempts"),
		zero("Authentication failures that changed highestFence", vAuthChangedHighest, thousands(c.AuthFailures)+" authentication failures"),
		zero("Accepted writes from expired owners", vExpiredOwner, ""),
		zero("Skipped segment numbers accepted", vSkippedSegment, ""),
		zero("Regressed tokens accepted (lower fence, or a fence reused by another grant)", vRegressedToken, ""),
		{Name: "Protected mutations through grant authentication and fence checks", Bar: "100 %",
			Measured: fmt.Sprintf("%.3f %% (%s of %s)", coverage, thousands(c.CheckedMutations), thousands(c.Mutations)),
			Pass:     c.CheckedMutations == c.Mutations && c.Violated[vUncheckedMutation] == 0},
		{Name: "Lock-handoff p99 below budget", Bar: "budget",
			Measured: "not measured here: the clock is virtual; make bench measures it on the real control plane", NotApplicable: true},
		{Name: "UNKNOWN outcomes reconciled within 15 minutes", Bar: "≤ 15 min",
			Measured: fmt.Sprintf("%s of %s settled from receipts (%s applied, %s proven absent, %s flagged ReconciliationRequired); longest %s",
				thousands(settled), thousands(c.UnknownOutcomes), thousands(c.UnknownApplied), thousands(c.UnknownAbsent),
				thousands(c.UnknownUndetermined), c.MaxUnknownResolution.Truncate(time.Millisecond)),
			Pass: settled == c.UnknownOutcomes && c.UnknownUnsettled == 0 && c.MaxUnknownResolution <= unknownBudget},
		zero("MUTATION_UNKNOWN resolved wrongly (applied / proven absent against what was stored, or landing after)", vUnknownMisresolved,
			fmt.Sprintf("%s writes applied after their client gave up (%s more failed: the object had moved on); %s reads found a write still in flight",
				thousands(c.LateCommitsLanded), thousands(c.LateCommitsFailed), thousands(c.UnknownInFlight))),
		zero("Other unauthenticated writes accepted (wrong owner, revoked epoch, payload, no fresh fence)", vOtherAuthAccepted, ""),
		zero("Writes, delete intents and deletes accepted from another pod of the holder's identity", vWrongPod,
			thousands(c.Faults[FaultSharedIdentity])+" shared-identity attempts"),
		zero("Accepted writes whose receipt log is not the stored log plus their segment", vReceiptLog, ""),
		zero("Deletions not declared by the current holder's grant (namespace teardown aside)", vUndeclaredDelete,
			fmt.Sprintf("%s deletes decided, %s done, %s of them by namespace teardown", thousands(c.DeleteAttempts), thousands(c.Deletes), thousands(c.TeardownDeletes))),
		zero("Writes that drop the protection label or annotation landed", vProtectionDropped, ""),
		zero("Planted receipts inherited by an accepted write", vPlantedInherited, ""),
		zero("highestObservedFence raised by planted fence state", vPlantedObserved, ""),
		zero("Registry entries admitted for a kind the webhook configuration does not route", vUncoveredEntry,
			fmt.Sprintf("%s such entries tried, %s refused", thousands(c.UncoveredEntries), thousands(c.EntriesRefused))),
		zero("Second registry entries admitted for an object another entry protects", vTwinEntry,
			fmt.Sprintf("%s tried, %s of them while the first was being stored; %s refused",
				thousands(c.TwinEntries), thousands(c.TwinsInFlight), thousands(c.TwinsRefused))),
		zero("LockGrants granted twice (a request served with two fences)", vGrantedTwice,
			thousands(c.StaleGrantsRead)+" stale LockGrants the issuer's lagging cache showed and its read around the cache corrected"),
		{Name: "Unfenced creates in the documented index-lag window (security.md, Known limits)", Bar: "reported",
			Measured: fmt.Sprintf("%s (%s index lookups answered while lagging)", thousands(c.KnownLimitWrites), thousands(c.IndexLagLookups)),
			Pass:     true},
		{Name: "Re-creations whose segments started over after a restore took back the deletion record (security.md, Known limits)", Bar: "reported",
			Measured: thousands(c.DeletedMemoryLostWrites), Pass: true},
		zero(fmt.Sprintf("Store: stale segments committed (not the holder, and a higher fence already issued and published) across %s store schedules", thousands(c.StoreSchedules)),
			vStoreStale, thousands(c.StoreSegments)+" segments committed"),
		zero("Store: segments of grants the registry never issued committed (forged / tampered / cross-resource)", vStoreForged,
			thousands(c.StoreForgedAttempts)+" such attempts"),
		zero("Store: segments from owners whose lease had ended (issuer's clock) committed", vStoreExpired, ""),
		zero("Store: regressed tokens committed (below the highest accepted fence, or that fence under another grant)", vStoreRegressed, ""),
		zero("Store: skipped segment numbers committed", vStoreSkipped, ""),
		zero("Store: acknowledged segments lost (restart included) / receipts inconsistent", vStoreLost,
			fmt.Sprintf("%s restarts; receipt violations %s", thousands(c.StoreFaults[sfRestart]), thousands(c.Violated[vStoreReceipt]))),
		{Name: "Store: lost COMMIT answers settled from the receipts within 15 minutes, none wrongly", Bar: "0 wrong, ≤ 15 min",
			Measured: fmt.Sprintf("%s wrong; %s of %s settled (%s applied, %s proven absent, %s flagged); longest %s",
				thousands(c.Violated[vStoreUnknown]), thousands(c.StoreUnknownApplied+c.StoreUnknownAbsent+c.StoreUnknownUndetermined), thousands(c.StoreUnknown),
				thousands(c.StoreUnknownApplied), thousands(c.StoreUnknownAbsent), thousands(c.StoreUnknownUndetermined), c.StoreMaxResolution.Truncate(time.Millisecond)),
			Pass: c.Violated[vStoreUnknown] == 0 && c.StoreUnknownUnsettled == 0 && c.StoreMaxResolution <= unknownBudget &&
				c.StoreUnknownApplied+c.StoreUnknownAbsent+c.StoreUnknownUndetermined == c.StoreUnknown},
		zero("Store: the registry's holder ended at the store by a publication (it could never write there again)", vStoreHolderEnded,
			fmt.Sprintf("%s late publications of deposed leaders: %s refused EPOCH_SUPERSEDED, %s landed before their successor's",
				thousands(c.StoreDeposed), thousands(c.StoreDeposedRefused), thousands(c.StoreDeposedLanded))),
		{Name: "Store: segments committed in the publication lag after an early end (postgres.md: the store learns of it when publication catches up)", Bar: "reported",
			Measured: c.lagSummary(), Pass: true},
		{Name: "Liveness: a correct owner commits once the faults stop", Bar: "every schedule",
			Measured: fmt.Sprintf("%s of %s", thousands(c.Schedules-c.Violated[vLiveness]), thousands(c.Schedules)), Pass: c.Violated[vLiveness] == 0},
		{Name: "Client-observed history linearizable as a fenced register (porcupine)", Bar: "every schedule",
			Measured: fmt.Sprintf("%s of %s", thousands(c.Schedules-c.Violated[vNotLinearizable]), thousands(c.Schedules)), Pass: c.Violated[vNotLinearizable] == 0},
		zero("Simulator errors (panics, planner errors, lost track)", vSimulator, ""),
	}
}

func (c *Counters) lagSummary() string {
	var total int64
	parts := make([]string, 0, numLagReasons)
	for i, n := range c.StoreLagWrites {
		total += n
		parts = append(parts, fmt.Sprintf("%s after a %s", thousands(n), lagNames[i]))
	}
	return fmt.Sprintf("%s (%s)", thousands(total), strings.Join(parts, ", "))
}

// StoreSummary describes the store path: what was attempted, accepted and
// refused, and what the publisher did.
func (c *Counters) StoreSummary() string {
	refused := c.StoreAttempts - c.StoreVerdicts[fence.Accepted]
	return fmt.Sprintf("store path: %s of %s schedules; %s segments attempted (begin_segment), %s accepted, %s refused, %s refused at COMMIT, %s committed; "+
		"%s publications applied, %s retried (no answer in time, or refused); %s locks given up waiting for publication\nstore verdicts: %s",
		thousands(c.StoreSchedules), thousands(c.Schedules), thousands(c.StoreAttempts), thousands(c.StoreVerdicts[fence.Accepted]), thousands(refused),
		thousands(c.StoreRefusedAtCommit), thousands(c.StoreCommits), thousands(c.StorePublications), thousands(c.StorePublishFailures),
		thousands(c.StoreWaitsGivenUp), verdictList(c.StoreVerdicts))
}

// StoreFaultMatrix renders the store faults as FaultMatrix does the matrix's.
func (c *Counters) StoreFaultMatrix() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STORE FAULT\tINJECTED\tVERDICTS OF THE SEGMENTS IT PRODUCED")
	for f := range numStoreFaults {
		v := "(no segments of its own)"
		if len(c.StoreFaultVerdicts[f]) > 0 {
			v = verdictList(c.StoreFaultVerdicts[f])
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", f, thousands(c.StoreFaults[f]), v)
	}
	tw.Flush()
	return b.String()
}

// Passed reports whether every applicable gate passed.
func (c *Counters) Passed() bool {
	for _, g := range c.Gates() {
		if !g.Pass && !g.NotApplicable {
			return false
		}
	}
	return true
}

// GateTable renders the gates as a table.
func (c *Counters) GateTable() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RELEASE GATE\tBAR\tMEASURED\tRESULT")
	for _, g := range c.Gates() {
		result := "PASS"
		switch {
		case g.NotApplicable:
			result = "n/a"
		case !g.Pass:
			result = "FAIL"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", g.Name, g.Bar, g.Measured, result)
	}
	tw.Flush()
	return b.String()
}

// FaultMatrix renders, for every fault, how often it was injected and the
// verdicts of the writes it produced.
func (c *Counters) FaultMatrix() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FAULT\tINJECTED\tVERDICTS OF THE WRITES IT PRODUCED")
	for f := range numFaults {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", f, thousands(c.Faults[f]), verdictList(c.FaultVerdicts[f]))
	}
	tw.Flush()
	return b.String()
}

// VerdictSummary lists every verdict the acceptance point returned.
func (c *Counters) VerdictSummary() string { return verdictList(c.Verdicts) }

func verdictList(m map[fence.Verdict]int64) string {
	if len(m) == 0 {
		return "(lock-side fault: no writes of its own)"
	}
	vs := slices.Collect(maps.Keys(m))
	slices.SortFunc(vs, func(a, b fence.Verdict) int { return cmp.Or(cmp.Compare(m[b], m[a]), cmp.Compare(a, b)) })
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = fmt.Sprintf("%s %s", v, thousands(m[v]))
	}
	return strings.Join(parts, ", ")
}

func thousands(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 {
		return s
	}
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}
