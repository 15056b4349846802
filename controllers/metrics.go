package controllers

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

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
	queueDepth = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fencekeeper_grant_queue_depth", Help: "LockGrants waiting in a FencedResource's FIFO queue."},
		[]string{"namespace", "fencedresource"})
	overdueMutations = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "fencekeeper_unresolved_mutations_overdue",
		Help: "Writes whose outcome stayed unknown past the reconciliation deadline (15 min), by FencedResource."},
		[]string{"namespace", "fencedresource"})
)

func init() {
	metrics.Registry.MustRegister(grantsIssued, grantHandoffs, grantExpiries, grantReleases, grantRevocations,
		registryWrites, casConflicts, queueDepth, overdueMutations)
}
