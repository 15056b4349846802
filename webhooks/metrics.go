package webhooks

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fencekeeper_admission_decisions_total",
		Help: "Decisions on mutations of protected objects, by verdict and enforcement mode (allowed is what the webhook answered).",
	}, []string{"verdict", "mode", "allowed"})
	decisionLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "fencekeeper_admission_duration_seconds",
		Help:    "Time to decide a mutation of a protected object, including the registry read.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
	}, []string{"operation"})
	fenceRegressions = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fencekeeper_fence_regressions_total", Help: "Writes denied with FENCE_REGRESSION (the registry was behind the object)."})
)

func init() {
	metrics.Registry.MustRegister(decisions, decisionLatency, fenceRegressions)
}

var teardownDeletes = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "fencekeeper_namespace_teardown_deletes_total",
	Help: "Deletes of protected objects and registry entries let through because the namespace controller empties a terminating namespace.",
})

func init() { metrics.Registry.MustRegister(teardownDeletes) }
