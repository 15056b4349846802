// Package grant defines lockGrant.v1, the signed document that the fencekeeper
// issuer hands to a lock holder, and the code that signs and verifies it.
//
// The package is deliberately free of Kubernetes imports: the issuer, the
// admission webhook, the worker client and the simulator all share it, so there
// is exactly one definition of the canonical encoding, the digest and the proof.
//
// Wire format (fixed by docs/contract.md, "The signed grant"):
//
//	canonical = JSON object, keys in the order of Grant's fields, no insignificant whitespace
//	digest    = "sha256:" + hex(sha256(canonical))
//	proof     = "ed25519:" + keyID + ":" + base64std(ed25519.Sign(key, []byte(digest)))
package grant

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"
)

// Schema is the only document schema this package understands.
const Schema = "lockGrant.v1"

// MaxDocumentBytes bounds an encoded grant; anything longer is rejected before parsing.
const MaxDocumentBytes = 4096

// MaxFieldBytes bounds every string field, in bytes of UTF-8 (not
// characters), so that a grant always fits in MaxDocumentBytes.
const MaxFieldBytes = 253

// CheckFieldSize refuses a field value longer than a grant holds.
func CheckFieldSize(name, v string) error {
	if len(v) > MaxFieldBytes {
		return fmt.Errorf("%w: %s is %d bytes of UTF-8, longer than the %d a grant field holds", ErrMalformed, name, len(v), MaxFieldBytes)
	}
	return nil
}

// Grant is the lockGrant.v1 document. Field order is the canonical key order.
type Grant struct {
	Schema            string `json:"schema"`
	Resource          string `json:"resource"`
	Owner             string `json:"owner"`
	RequestID         string `json:"requestID"`
	Lease             string `json:"lease"`
	OperationRoot     string `json:"operationRoot"`
	FenceToken        int64  `json:"fenceToken"`
	BackendRevision   string `json:"backendRevision"`
	PolicyGeneration  int64  `json:"policyGeneration"`
	IssuerEpoch       int64  `json:"issuerEpoch"`
	TTLSeconds        int64  `json:"ttlSeconds"`
	OperationCategory string `json:"operationCategory"`
	IssuedAt          string `json:"issuedAt"`
}

// Sentinel errors. Callers map them to verdict codes: ErrMalformed is BAD_GRANT,
// ErrForged is FORGED_GRANT. Wrapped errors carry the detail.
var (
	ErrMalformed = errors.New("malformed grant")
	ErrForged    = errors.New("grant does not verify")
)

var (
	keyIDRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
)

// IsDigest reports whether s has the form sha256:<64 lowercase hex>. It is
// on the issuer's path once per waiting request and pass (a regular
// expression there cost a tenth of the operator's CPU with a thousand
// requests queued), so it is a plain loop.
func IsDigest(s string) bool {
	const prefix = "sha256:"
	if len(s) != len(prefix)+64 || s[:len(prefix)] != prefix {
		return false
	}
	for i := len(prefix); i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Validate checks the document's shape. It says nothing about authenticity.
func (g *Grant) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, a...))
	}
	if g.Schema != Schema {
		return bad("schema is %q, want %q", g.Schema, Schema)
	}
	for _, f := range []struct{ name, v string }{
		{"resource", g.Resource}, {"owner", g.Owner}, {"requestID", g.RequestID},
		{"lease", g.Lease}, {"backendRevision", g.BackendRevision},
	} {
		if f.v == "" {
			return bad("%s is empty", f.name)
		}
		if err := CheckFieldSize(f.name, f.v); err != nil {
			return err
		}
	}
	if err := CheckFieldSize("operationCategory", g.OperationCategory); err != nil {
		return err
	}
	if !IsDigest(g.OperationRoot) {
		return bad("operationRoot %q is not sha256:<64 hex digits>", g.OperationRoot)
	}
	if g.FenceToken <= 0 {
		return bad("fenceToken %d is not a positive int64", g.FenceToken)
	}
	if g.PolicyGeneration < 0 {
		return bad("policyGeneration %d is negative", g.PolicyGeneration)
	}
	if g.IssuerEpoch < 0 {
		return bad("issuerEpoch %d is negative", g.IssuerEpoch)
	}
	if g.TTLSeconds < 1 || g.TTLSeconds > 3600 {
		return bad("ttlSeconds %d is outside 1..3600", g.TTLSeconds)
	}
	if _, err := time.Parse(time.RFC3339, g.IssuedAt); err != nil {
		return bad("issuedAt %q is not RFC 3339", g.IssuedAt)
	}
	return nil
}

// Canonical returns the canonical encoding of g.
func (g *Grant) Canonical() []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	// Encoding a struct of strings and integers cannot fail.
	_ = enc.Encode(g)
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// Digest returns sha256:<hex> of the canonical encoding.
func (g *Grant) Digest() string {
	sum := sha256.Sum256(g.Canonical())
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Decode parses a grant strictly: it must be in canonical form (so no two
// parsers can read the same bytes differently: no duplicate or case-folded
// keys), and unknown fields, numbers that do not fit an int64 and oversized
// input are all ErrMalformed. The result is validated.
func Decode(data []byte) (Grant, error) {
	var g Grant
	if len(data) > MaxDocumentBytes {
		return g, fmt.Errorf("%w: document is %d bytes, limit %d", ErrMalformed, len(data), MaxDocumentBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&g); err != nil {
		return Grant{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if dec.More() {
		return Grant{}, fmt.Errorf("%w: trailing data after the document", ErrMalformed)
	}
	if err := g.Validate(); err != nil {
		return Grant{}, err
	}
	if !bytes.Equal(g.Canonical(), data) {
		return Grant{}, fmt.Errorf("%w: the document is not in canonical form (keys in schema order, no whitespace)", ErrMalformed)
	}
	return g, nil
}
