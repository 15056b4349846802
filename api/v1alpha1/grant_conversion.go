package v1alpha1

import (
	"fmt"
	"slices"

	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// ToGrant converts the API form of the document to the signing form.
func (d *GrantDocument) ToGrant() grant.Grant { return grant.Grant(*d) }

// DocumentFromGrant converts the signing form of the document to the API form.
func DocumentFromGrant(g grant.Grant) *GrantDocument {
	d := GrantDocument(g)
	return &d
}

// Grant rebuilds the signed document from the holder record.
func (h *Holder) Grant(resourceID string) grant.Grant {
	return grant.Grant{
		Schema: grant.Schema, Resource: resourceID, Owner: h.Owner, RequestID: h.RequestID,
		Lease: h.Lease, OperationRoot: h.OperationRoot, FenceToken: h.FenceToken,
		BackendRevision: h.BackendRevision, PolicyGeneration: h.PolicyGeneration,
		IssuerEpoch: h.IssuerEpoch, TTLSeconds: h.TTLSeconds,
		OperationCategory: h.OperationCategory, IssuedAt: h.IssuedAt,
	}
}

// UnsignableRequest says why no grant could ever be signed for a request
// spec: a field empty, malformed, or longer than a grant holds (counted in
// UTF-8 bytes, where the schema's maxLength counts characters). The
// LockGrant webhook refuses such a request and the issuer denies one that
// got in anyway, instead of failing its decision for every request queued
// behind it; the CRD schema checks the same limits. The entry's own fields
// (resourceID, lease duration) are its schema's business.
func UnsignableRequest(spec LockGrantSpec) error {
	h := Holder{Owner: spec.Owner, RequestID: spec.RequestID, Lease: spec.Lease, OperationRoot: spec.OperationRoot,
		OperationCategory: spec.OperationCategory, FenceToken: 1, BackendRevision: "1", TTLSeconds: 1, IssuedAt: "2006-01-02T15:04:05Z"}
	g := h.Grant("resource")
	if err := g.Validate(); err != nil {
		return err
	}
	return grant.CheckFieldSize("resource", spec.Resource)
}

// HeldStatus is the LockGrant status the holder record stands for: Held,
// with the signed grant, digest, proof, expiry and applied renewals the
// allocating compare-and-swap wrote (conditions aside). The issuer mirrors it
// into the LockGrant; a client following the registry reads it first.
func (h *Holder) HeldStatus(resourceID string) LockGrantStatus {
	exp := h.ExpiresAt
	return LockGrantStatus{
		Phase: PhaseHeld, Grant: DocumentFromGrant(h.Grant(resourceID)), Digest: h.Digest, Proof: h.Proof,
		ExpiresAt: &exp, ObservedRenewals: h.ObservedRenewals,
	}
}

// PolicyViolation says why the entry's policy refuses a request by owner with
// category: the condition reason and a message naming the field; "" when allowed.
// The LockGrant webhook and the issuer both ask it, so the policy has one definition.
func (fr *FencedResource) PolicyViolation(owner, category string) (reason, message string) {
	if len(fr.Spec.AllowedOwners) > 0 && !slices.Contains(fr.Spec.AllowedOwners, owner) {
		return ReasonOwnerNotAllowed, fmt.Sprintf("spec.owner %q is not in FencedResource %s spec.allowedOwners", owner, fr.Name)
	}
	if len(fr.Spec.OperationCategories) > 0 && !slices.Contains(fr.Spec.OperationCategories, category) {
		return ReasonCategoryDenied, fmt.Sprintf("spec.operationCategory %q is not one of FencedResource %s spec.operationCategories %v",
			category, fr.Name, fr.Spec.OperationCategories)
	}
	return "", ""
}
