package controllers

import (
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"

	locksv1 "github.com/fencekeeper/fencekeeper/api/v1alpha1"
	"github.com/fencekeeper/fencekeeper/internal/rules/issuer"
)

// The operator's cache indexes LockGrants by the FencedResource they name,
// but only those a reconcile can act on: a resource's history of ended
// LockGrants stays out of every List and its deep copies, however long it
// grows (before, every registry write listed and copied all of it, twice).
const (
	// activeGrantsIndex holds the issuer.Active LockGrants.
	activeGrantsIndex = "spec.resource.active"
	// unresolvedGrantsIndex holds the LockGrants that carry annotation
	// fencekeeper.dev/unresolved-mutation, readable or not: a record of a
	// write whose outcome is unknown, or a value to report as unreadable.
	unresolvedGrantsIndex = "spec.resource.unresolved"
)

// indexGrants registers both indexes.
func indexGrants(ctx context.Context, indexer client.FieldIndexer) error {
	for name, keep := range map[string]func(*locksv1.LockGrant) bool{
		activeGrantsIndex:     issuer.Active,
		unresolvedGrantsIndex: carriesRecord,
	} {
		if err := indexer.IndexField(ctx, &locksv1.LockGrant{}, name, func(o client.Object) []string {
			if lg := o.(*locksv1.LockGrant); keep(lg) {
				return []string{lg.Spec.Resource}
			}
			return nil
		}); err != nil {
			return fmt.Errorf("index LockGrants by %s: %w", name, err)
		}
	}
	return nil
}

func carriesRecord(lg *locksv1.LockGrant) bool {
	_, ok := lg.Annotations[locksv1.AnnotationUnresolvedMutation]
	return ok
}

// recordsUnresolvedMutation: the LockGrant records a write whose outcome is
// unknown. An unreadable value records none: no client wrote it for a write.
func recordsUnresolvedMutation(lg *locksv1.LockGrant) bool {
	raw, ok := lg.Annotations[locksv1.AnnotationUnresolvedMutation]
	if !ok {
		return false
	}
	_, err := readRecord(raw)
	return err == nil
}
