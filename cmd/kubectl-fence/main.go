// Command kubectl-fence is the kubectl plugin for fencekeeper (kubectl fence
// …): put it on PATH and run `kubectl fence --help`. See internal/fencectl.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/fencekeeper/fencekeeper/internal/fencectl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := fencectl.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
