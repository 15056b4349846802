// Package monitoring checks the shipped alert rules (config/prometheus) and
// Grafana dashboard (config/grafana): they parse as Prometheus parses them,
// and every metric they name is one the operator registers.
//
// It is a Go module of its own so that github.com/prometheus/prometheus (the
// rule and PromQL parsers) never enters the operator's dependencies. Run it
// with `cd test/monitoring && go test ./...` (make test-monitoring).
package monitoring
