// Package demo_test runs make demo's code (internal/demo.Main) as a test, so CI
// proves the README's first command works end to end.
package demo_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/fencekeeper/fencekeeper/internal/demo"
)

func TestDemo(t *testing.T) {
	ctrl.SetLogger(logr.Discard())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	start := time.Now()
	err := demo.Main(ctx, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatalf("make demo's story failed: %v", err)
	}
	t.Logf("the demo took %s", time.Since(start).Round(time.Millisecond))
}
