package controllers

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestSetPerResourceKeepsOnlyNonZeroSeries(t *testing.T) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "per_resource"}, []string{"namespace", "fencedresource"})
	setPerResource(g, "ns", "idle", 0)
	setPerResource(g, "ns", "busy", 3)
	if n := testutil.CollectAndCount(g); n != 1 {
		t.Fatalf("want only the non-zero series, got %d series", n)
	}
	if v := testutil.ToFloat64(g.WithLabelValues("ns", "busy")); v != 3 {
		t.Fatalf("busy = %v, want 3", v)
	}
	setPerResource(g, "ns", "busy", 0)
	if n := testutil.CollectAndCount(g); n != 0 {
		t.Fatalf("a series back at zero must go, %d left", n)
	}
}
