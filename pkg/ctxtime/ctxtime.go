// Package ctxtime is a pause that a context can cut short: the one wait
// between the attempts of fencekeeper's retry loops, in the client library
// and in the operator alike. It imports only the standard library, so every
// tier of the layout may use it.
package ctxtime

import (
	"context"
	"time"
)

// Sleep pauses for d. It returns ctx.Err() as soon as ctx ends, whether
// before or during the pause, and nil once d has passed.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
