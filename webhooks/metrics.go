package webhooks

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Labels stay bounded: verdicts and modes are enums, namespaces are the
// cluster's; no object names.
var (
	decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencekeeper_admission_decisions_total",
		Help: "Decisions on mutations of protected objects, by verdict and enforcement mode (allowed is what the webhook answered).",
	}, []string{"verdict", "mode", "allowed"})
	denials = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencekeeper_admission_denials_total",
		Help: "Mutations of protected objects whose verdict refuses them, by namespace, verdict and mode " +
			"(mode Shadow: reported, let through; Enforce: refused).",
	}, []string{"namespace", "verdict", "mode"})
	decisionLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "fencekeeper_admission_duration_seconds",
		Help:    "Time to decide a write the webhook sees (a protected object's or not), including the registry read.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
	}, []string{"operation"})
	registryReadLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "fencekeeper_admission_registry_read_seconds",
		Help:    "The linearizable GET of a FencedResource the acceptance webhook makes before deciding a write to its target.",
		Buckets: []float64{.0005, .001, .002, .003, .005, .0075, .01, .015, .025, .05, .1, .25, .5, 1},
	})
	fenceRegressions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_fence_regressions_total", Help: "Writes denied with FENCE_REGRESSION (the registry was behind the object)."})
	teardownDeletes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_namespace_teardown_deletes_total",
		Help: "Deletes of protected objects and registry entries let through because the namespace controller empties a terminating namespace.",
	})
)

func init() {
	metrics.Registry.MustRegister(decisions, denials, decisionLatency, registryReadLatency, fenceRegressions, teardownDeletes)
}

// recordDecision counts one decision; a refusing verdict also counts as a
// denial in its namespace, whether the mode refused it or only reported it.
func recordDecision(namespace, verdict, mode string, refuses, allowed bool) {
	decisions.WithLabelValues(verdict, mode, strconv.FormatBool(allowed)).Inc()
	if refuses {
		denials.WithLabelValues(namespace, verdict, mode).Inc()
	}
}
