package pgfence

import (
	"context"
	"fmt"
	"time"

	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// The publishing calls are the operator's: only its database role may run
// them. The store trusts what they write as the registry's word (a database
// cannot verify Ed25519).

// Mode is a resource's enforcement at the store.
type Mode string

// Modes, as the FencedResource's enforcement.
const (
	Shadow  Mode = "Shadow"
	Enforce Mode = "Enforce"
)

// PublishEpoch starts a publishing transaction: it refuses (SQLSTATE
// FK003, EPOCH_SUPERSEDED) when the store has taken publications of a
// higher issuer epoch, so a deposed leader's late publication lands
// nothing, and holds the store's issuer row until the transaction ends.
// Schema version 3.
func PublishEpoch(ctx context.Context, q Querier, issuerEpoch int64) error {
	_, err := q.Exec(ctx, "SELECT fencekeeper.publish_epoch($1)", issuerEpoch)
	return wrap(fmt.Sprintf("publish as issuer epoch %d", issuerEpoch), err)
}

// PublishResource registers the resource at the store, or updates its
// mode and policy generation (the registry's, since schema version 3;
// before, it never went down).
func PublishResource(ctx context.Context, q Querier, resourceID string, mode Mode, generation int64) error {
	_, err := q.Exec(ctx, "SELECT fencekeeper.publish_resource($1, $2, $3)", resourceID, string(mode), generation)
	return wrap("publish resource "+resourceID, err)
}

// PublishGrant records an issued grant, or a renewal's later expiry.
func PublishGrant(ctx context.Context, q Querier, g grant.Grant, expiresAt time.Time) error {
	_, err := q.Exec(ctx, "SELECT fencekeeper.publish_grant($1, $2::jsonb, $3)", g.Digest(), string(g.Canonical()), expiresAt)
	return wrap(fmt.Sprintf("publish grant fence %d of %s", g.FenceToken, g.Resource), err)
}

// EndGrant records that a grant ended (released, expired, revoked, ...).
func EndGrant(ctx context.Context, q Querier, digest, reason string, at time.Time) error {
	_, err := q.Exec(ctx, "SELECT fencekeeper.end_grant($1, $2, $3)", digest, reason, at)
	return wrap("end grant "+digest, err)
}

// PublishRevocation raises the store's revokedBelowEpoch (it never goes down).
func PublishRevocation(ctx context.Context, q Querier, revokedBelowEpoch int64) error {
	_, err := q.Exec(ctx, "SELECT fencekeeper.publish_revocation($1)", revokedBelowEpoch)
	return wrap("publish revocation", err)
}

func wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("pgfence: %s: %w", what, err)
}
