// Command demo plays the stale-owner story on the embedded control plane
// (make demo); see internal/demo.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/fencekeeper/fencekeeper/internal/demo"
)

func main() {
	verbose := flag.Bool("v", false, "Also print the operator's logs.")
	flag.Parse()
	// The timeline is the output; the operator's logs only on request.
	log := logr.Discard()
	if *verbose {
		log = zap.New(zap.UseDevMode(true))
	}
	ctrl.SetLogger(log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := demo.Main(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}
