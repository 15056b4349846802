package v1alpha1

import "github.com/fencekeeper/fencekeeper/pkg/grant"

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
