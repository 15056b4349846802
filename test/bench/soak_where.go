package main

import (
	"context"
	"math"
	"strings"
)

// soakWhere is where time went in a window, from the operator's and the
// API server's own histograms (their deltas over the window, quantiles
// interpolated within the buckets): the issuer's work queue, and the API
// server's handling of the writes a handoff makes. The API server's figures
// cover every client's requests in the window, the tenant's included.
type soakWhere struct {
	// IssuerQueueMeanMs, IssuerQueueP99Ms: how long a FencedResource waited
	// in the issuer's work queue (workqueue_queue_duration_seconds; its
	// buckets are decades, so the mean, from _sum and _count, is the exact one).
	IssuerQueueMeanMs float64 `json:"issuer_queue_wait_mean_ms"`
	IssuerQueueP99Ms  float64 `json:"issuer_queue_wait_p99_ms"`
	// IssuerWorkMeanMs: one decision of the issuer, its registry write included.
	IssuerWorkMeanMs float64 `json:"issuer_reconcile_mean_ms"`
	// LockGrantPatchP99Ms: PATCH of a LockGrant (a release, a renewal) at
	// the API server, its webhook included; RegistryPutP99Ms: the issuer's
	// compare-and-swap of a FencedResource's status.
	LockGrantPatchP99Ms float64 `json:"apiserver_lockgrant_patch_p99_ms"`
	RegistryPutP99Ms    float64 `json:"apiserver_registry_put_p99_ms"`
	// LockGrantWebhookP99Ms: the API server's call of the LockGrant webhook.
	LockGrantWebhookP99Ms float64 `json:"apiserver_lockgrant_webhook_p99_ms"`
}

// soakScrape is the operator's and the API server's metrics at one moment.
type soakScrape struct{ operator, apiserver string }

func (s *soakRun) scrape(ctx context.Context) soakScrape {
	var out soakScrape
	out.operator, _ = s.e.op.Metrics(ctx)
	out.apiserver, _ = s.e.apiserverMetrics(ctx)
	return out
}

// where is the window from before to after; a figure with no observation
// in the window (or missing from the metrics) is 0.
func where(before, after soakScrape) soakWhere {
	const issuer = `name="grant-issuer"`
	ms := func(v float64) float64 {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return 0
		}
		return round2(1000 * v)
	}
	mean := func(name string) float64 {
		a, b := metricSum(after.operator, name, issuer), metricSum(before.operator, name, issuer)
		n := a.count - b.count
		if n <= 0 {
			return 0
		}
		return ms((a.sum - b.sum) / n)
	}
	p99 := func(after, before, name string, filters ...string) float64 {
		return ms(histogramDelta(after, before, name, filters...).quantile(0.99))
	}
	return soakWhere{
		IssuerQueueMeanMs:     mean("workqueue_queue_duration_seconds"),
		IssuerQueueP99Ms:      p99(after.operator, before.operator, "workqueue_queue_duration_seconds", issuer),
		IssuerWorkMeanMs:      mean("workqueue_work_duration_seconds"),
		LockGrantPatchP99Ms:   p99(after.apiserver, before.apiserver, "apiserver_request_duration_seconds", `resource="lockgrants"`, `verb="PATCH"`),
		RegistryPutP99Ms:      p99(after.apiserver, before.apiserver, "apiserver_request_duration_seconds", `resource="fencedresources"`, `subresource="status"`, `verb="PUT"`),
		LockGrantWebhookP99Ms: p99(after.apiserver, before.apiserver, "apiserver_admission_webhook_admission_duration_seconds", `name="vlockgrant.fencekeeper.dev"`),
	}
}

// sumCount is a histogram's _sum and _count over the series matching every filter.
type sumCount struct{ sum, count float64 }

func metricSum(text, name string, filters ...string) sumCount {
	var out sumCount
	for series, v := range parseMetrics(text) {
		var into *float64
		switch {
		case strings.HasPrefix(series, name+"_sum"):
			into = &out.sum
		case strings.HasPrefix(series, name+"_count"):
			into = &out.count
		default:
			continue
		}
		ok := true
		for _, f := range filters {
			ok = ok && strings.Contains(series, f)
		}
		if ok {
			*into += v
		}
	}
	return out
}
