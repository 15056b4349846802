package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// The throughput floors count the writes their targets were set against:
// the request, the registry's compare-and-swaps, the release. The
// contract also gives every LockGrant a status phase (Held, Released, ...),
// so each acquire/release cycle writes its LockGrant's status at least once;
// fencekeeper's issuer defers a Held shorter than heldMirrorDelay and writes
// only the final Released. The "with the status phase" floors add exactly
// that write: one status merge patch per ended LockGrant, of the size of a
// real Released status, sent off the cycle's path as the issuer's mirror is.
// Their cycles/s over the plain floor's is the most fencekeeper's
// throughput line can reach without breaking the contract.

// phaseWriter writes the Released status of ended floor LockGrants from a
// goroutine. Its queue is short, so a writer that falls behind slows the
// cycles that feed it (at most phaseQueue writes spill into the next
// window, as the issuer's deferred mirror writes do). A write that fails
// fails the run at the next cycle's end: a floor whose status writes were
// refused would be a cheaper floor than the contract's.
type phaseWriter struct {
	names chan string
	err   atomic.Pointer[error]
}

const phaseQueue = 8

// startPhaseWriter starts writing body (a status merge patch) to every
// LockGrant named on the returned writer, until ctx ends.
func startPhaseWriter(ctx context.Context, dyn dynamic.Interface, ns string, body []byte) *phaseWriter {
	p := &phaseWriter{names: make(chan string, phaseQueue)}
	go func() {
		lgs := dyn.Resource(floorLG).Namespace(ns)
		for {
			select {
			case name := <-p.names:
				if _, err := lgs.Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{}, "status"); err != nil && ctx.Err() == nil {
					err = fmt.Errorf("floor status phase of %s: %w", name, err)
					p.err.CompareAndSwap(nil, &err)
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return p
}

// ended queues the status write of the LockGrant name and returns the first
// write that failed so far; nil p writes nothing.
func (p *phaseWriter) ended(ctx context.Context, name string) error {
	if p == nil {
		return nil
	}
	if err := p.err.Load(); err != nil {
		return *err
	}
	select {
	case p.names <- name:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// releasedStatusPatch is a status merge patch that sets a real LockGrant's
// final status (phase Released, the grant it carried, its conditions), copied
// from one of resource's LockGrants that fencekeeper's issuer released.
func (e *env) releasedStatusPatch(ctx context.Context, ns, resource string) ([]byte, error) {
	st, err := grantedStatusOf(ctx, e.admin, ns, resource, locksv1.PhaseReleased, locksv1.PhaseReleased)
	if err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{"status": st})
}
