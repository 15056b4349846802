package main

import (
	"context"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
)

// The throughput floors count the writes the issue that set the targets
// counts: the request, the registry's compare-and-swaps, the release. The
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
// window, as the issuer's deferred mirror writes do).
type phaseWriter struct {
	names chan string
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
				// An error here is a floor the machine could not keep up
				// with, which its cycles/s already shows; the write is not
				// retried, as a retried mirror is not either.
				_, _ = lgs.Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{}, "status")
			case <-ctx.Done():
				return
			}
		}
	}()
	return p
}

// ended queues the status write of the LockGrant name; nil p writes nothing.
func (p *phaseWriter) ended(ctx context.Context, name string) {
	if p == nil {
		return
	}
	select {
	case p.names <- name:
	case <-ctx.Done():
	}
}

// releasedStatusPatch is a status merge patch that sets a real LockGrant's
// final status (phase Released, the grant it carried, its conditions), copied
// from one of resource's LockGrants that fencekeeper's issuer released.
func (e *env) releasedStatusPatch(ctx context.Context, ns, resource string) ([]byte, error) {
	var list locksv1.LockGrantList
	if err := e.admin.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	for _, lg := range list.Items {
		if lg.Spec.Resource == resource && lg.Status.Phase == locksv1.PhaseReleased && lg.Status.Grant != nil {
			return json.Marshal(map[string]any{"status": lg.Status})
		}
	}
	return nil, fmt.Errorf("no Released LockGrant of %s carries a grant to copy", resource)
}
