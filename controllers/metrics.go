package controllers

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/fencekeeper/fencekeeper/internal/rules/issuer"
	"github.com/fencekeeper/fencekeeper/internal/version"
)

// Metric labels stay bounded: no object names on anything new (namespace at
// most). The two per-FencedResource gauges predate that rule and are deleted
// with their FencedResource.
var (
	grantsIssued = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_grants_issued_total", Help: "Grants issued (fences allocated and committed)."})
	grantHandoffs = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_grant_handoffs_total", Help: "Grants issued to the next waiter as the previous holder ended."})
	grantExpiries = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_grant_expiries_total", Help: "Held grants that expired on the issuer's clock."})
	grantReleases = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_grant_releases_total", Help: "Held grants released voluntarily or by deletion."})
	grantRevocations = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_grant_revocations_total", Help: "Held grants revoked by the trust bundle's revokedBelowEpoch."})
	registryWrites = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_registry_writes_total", Help: "Compare-and-swap writes attempted on FencedResource status."})
	casConflicts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_fence_cas_conflicts_total", Help: "FencedResource status writes that lost the compare-and-swap and were retried."})
	uncachedGrantReads = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_issuer_uncached_grant_reads_total",
		Help: "LockGrants read around the cache to confirm they were never granted before they are queued or issued."})
	lockGrantWriteBacklog = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fencekeeper_issuer_lockgrant_write_backlog",
		Help: "FencedResources whose committed decisions still have LockGrant statuses (or legacy finalizer removals) to write."})
	grantsCollected = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_lockgrants_collected_total",
		Help: "Ended LockGrants deleted after the retention (--ended-grant-retention) or beyond the count (--ended-grant-max-count)."})
	endedGrantsTracked = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fencekeeper_ended_lockgrants",
		Help: "Ended LockGrants this replica tracks for collection: those recording an unresolved write are not counted."})
	queueDepth = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fencekeeper_grant_queue_depth", Help: "LockGrants waiting in a FencedResource's FIFO queue."},
		[]string{"namespace", "fencedresource"})
	overdueMutations = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fencekeeper_unresolved_mutations_overdue",
		Help: "Writes whose outcome stayed unknown past the reconciliation deadline (15 min), by FencedResource."},
		[]string{"namespace", "fencedresource"})

	// The two gauges above are per FencedResource and kept only while not
	// zero (setPerResource): absent reads as 0 in the alert rules and the
	// dashboard, and 10,000 idle resources cost no series.

	grantWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "fencekeeper_grant_wait_seconds",
		Help:    "Time from a LockGrant's creation (the request) to the grant that makes it Held, on the issuer's clock.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
	})
	handoffGap = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "fencekeeper_grant_handoff_seconds",
		Help: "Time from the previous holder's end (release, deletion, expiry or revocation) to the grant issued to the next waiter. " +
			"A release counts from the LockGrant's last write (whole seconds).",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	})
	issuerEpoch = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fencekeeper_issuer_epoch",
		Help: "The issuer epoch this replica issues under; 0 while it does not lead.",
	})
	storePublications = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencekeeper_store_publications_total",
		Help: "Publications of the registry to a PostgreSQL store (spec.stores), by result (ok, error).",
	}, []string{"result"})
	storePublishDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "fencekeeper_store_publish_duration_seconds",
		Help:    "Time one publication to one store took (one transaction), failures included.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
	})
	storesFailing = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fencekeeper_stores_failing",
		Help: "Stores (spec.stores entries, over every FencedResource) whose last publication failed.",
	})
	buildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fencekeeper_build_info",
		Help: "Always 1; the labels name the running build (empty when not stamped with -ldflags).",
	}, []string{"version", "commit"})
)

func init() {
	metrics.Registry.MustRegister(grantsIssued, grantHandoffs, grantExpiries, grantReleases, grantRevocations,
		registryWrites, casConflicts, uncachedGrantReads, lockGrantWriteBacklog, grantsCollected, endedGrantsTracked, queueDepth, overdueMutations, grantWait, handoffGap, issuerEpoch, buildInfo,
		storePublications, storePublishDuration, storesFailing)
	v := version.Get()
	buildInfo.WithLabelValues(v.Version, v.Commit).Set(1)
}

// observeIssued records how long the grant issued by a decision waited, and
// the handoff gap when it followed a holder.
func observeIssued(c issuer.Counts) {
	if c.Issued == 0 {
		return
	}
	grantWait.Observe(c.Waited.Seconds())
	if c.Handoffs > 0 {
		handoffGap.Observe(c.HandoffGap.Seconds())
	}
}

// setPerResource sets a per-FencedResource gauge, keeping its series only
// while the value is not zero. Zero-valued series of every resource were
// 20,000 series at 10,000 resources: memory, and work for every scrape.
func setPerResource(g *prometheus.GaugeVec, namespace, name string, v int) {
	if v == 0 {
		g.DeleteLabelValues(namespace, name)
		return
	}
	g.WithLabelValues(namespace, name).Set(float64(v))
}
