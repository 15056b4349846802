package grant

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

const proofPrefix = "ed25519:"

// RevokedBelowEpochKey is the trust-bundle entry holding the revocation epoch;
// every other entry is keyID -> base64 public key.
const RevokedBelowEpochKey = "revokedBelowEpoch"

// Signer signs grants with one Ed25519 key.
type Signer struct {
	keyID string
	key   ed25519.PrivateKey
}

// NewSigner returns a signer for the key with the given ID and 32-byte seed.
func NewSigner(keyID string, seed []byte) (*Signer, error) {
	if !keyIDRE.MatchString(keyID) || keyID == RevokedBelowEpochKey {
		return nil, fmt.Errorf("key ID %q must match %s and not be %q", keyID, keyIDRE, RevokedBelowEpochKey)
	}
	if len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("ed25519 seed is %d bytes, want %d", len(seed), ed25519.SeedSize)
	}
	return &Signer{keyID: keyID, key: ed25519.NewKeyFromSeed(seed)}, nil
}

// GenerateSigner makes a new key; its ID is derived from the public key.
func GenerateSigner(rand io.Reader) (*Signer, error) {
	seed := make([]byte, ed25519.SeedSize)
	if _, err := io.ReadFull(rand, seed); err != nil {
		return nil, fmt.Errorf("generate ed25519 seed: %w", err)
	}
	pub := ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)
	sum := sha256.Sum256(pub)
	return NewSigner("k-"+hex.EncodeToString(sum[:8]), seed)
}

// KeyID names the key in proofs and trust bundles.
func (s *Signer) KeyID() string { return s.keyID }

// Seed returns the private key seed, for storing in the signing-key Secret.
func (s *Signer) Seed() []byte { return s.key.Seed() }

// PublicKey returns the verification key.
func (s *Signer) PublicKey() ed25519.PublicKey { return s.key.Public().(ed25519.PublicKey) }

// Sign validates g and returns its digest and proof.
func (s *Signer) Sign(g Grant) (digest, proof string, err error) {
	if err := g.Validate(); err != nil {
		return "", "", err
	}
	digest = g.Digest()
	sig := ed25519.Sign(s.key, []byte(digest))
	return digest, proofPrefix + s.keyID + ":" + base64.StdEncoding.EncodeToString(sig), nil
}

// TrustBundle is the fixed set of keys a verifier accepts, plus the revocation epoch.
type TrustBundle struct {
	Keys              map[string]ed25519.PublicKey
	RevokedBelowEpoch int64
}

// NewTrustBundle returns a bundle trusting the given signers' keys.
func NewTrustBundle(revokedBelowEpoch int64, signers ...*Signer) *TrustBundle {
	b := &TrustBundle{Keys: map[string]ed25519.PublicKey{}, RevokedBelowEpoch: revokedBelowEpoch}
	for _, s := range signers {
		b.Keys[s.keyID] = s.PublicKey()
	}
	return b
}

// ParseTrustBundle reads the trust-bundle ConfigMap data.
func ParseTrustBundle(data map[string]string) (*TrustBundle, error) {
	b := &TrustBundle{Keys: map[string]ed25519.PublicKey{}}
	for k, v := range data {
		if k == RevokedBelowEpochKey {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("trust bundle: %s=%q is not a non-negative integer", k, v)
			}
			b.RevokedBelowEpoch = n
			continue
		}
		if !keyIDRE.MatchString(k) {
			return nil, fmt.Errorf("trust bundle: key ID %q must match %s", k, keyIDRE)
		}
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v))
		if err != nil || len(raw) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("trust bundle: key %q is not a base64 %d-byte ed25519 public key", k, ed25519.PublicKeySize)
		}
		b.Keys[k] = ed25519.PublicKey(raw)
	}
	if len(b.Keys) == 0 {
		return nil, fmt.Errorf("trust bundle holds no keys")
	}
	return b, nil
}

// Data renders the bundle as ConfigMap data.
func (b *TrustBundle) Data() map[string]string {
	d := map[string]string{RevokedBelowEpochKey: strconv.FormatInt(b.RevokedBelowEpoch, 10)}
	for id, k := range b.Keys {
		d[id] = base64.StdEncoding.EncodeToString(k)
	}
	return d
}

// KeyIDs lists the trusted key IDs in order.
func (b *TrustBundle) KeyIDs() []string {
	ids := make([]string, 0, len(b.Keys))
	for id := range b.Keys {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Revoked reports whether grants issued under epoch are revoked.
func (b *TrustBundle) Revoked(epoch int64) bool { return epoch < b.RevokedBelowEpoch }

// Verify checks that digest is the digest of g and that proof is a signature
// over digest by a key in the bundle. It does not check revocation: that is a
// separate verdict (REVOKED_EPOCH) evaluated after the owner check.
// Shape errors are ErrMalformed; everything else is ErrForged.
func (b *TrustBundle) Verify(g Grant, digest, proof string) error {
	if err := g.Validate(); err != nil {
		return err
	}
	if !IsDigest(digest) {
		return fmt.Errorf("%w: digest %q is not sha256:<64 hex digits>", ErrMalformed, digest)
	}
	keyID, sig, err := parseProof(proof)
	if err != nil {
		return err
	}
	if want := g.Digest(); digest != want {
		return fmt.Errorf("%w: digest %s does not match the document (%s): a field was changed", ErrForged, digest, want)
	}
	pub, ok := b.Keys[keyID]
	if !ok {
		return fmt.Errorf("%w: key %q is not in the trust bundle", ErrForged, keyID)
	}
	if !verifiedSignatures.verify(pub, digest, sig) {
		return fmt.Errorf("%w: ed25519 signature by key %q is invalid", ErrForged, keyID)
	}
	return nil
}

func parseProof(proof string) (keyID string, sig []byte, err error) {
	rest, ok := strings.CutPrefix(proof, proofPrefix)
	if !ok {
		return "", nil, fmt.Errorf("%w: proof does not start with %q", ErrMalformed, proofPrefix)
	}
	keyID, enc, ok := strings.Cut(rest, ":")
	if !ok || !keyIDRE.MatchString(keyID) {
		return "", nil, fmt.Errorf("%w: proof is not ed25519:<keyID>:<base64 signature>", ErrMalformed)
	}
	// One spelling per signature: strict padding bits, and no CR/LF (which the
	// decoder would otherwise skip).
	sig, err = base64.StdEncoding.Strict().DecodeString(enc)
	if err != nil || len(sig) != ed25519.SignatureSize || strings.ContainsAny(enc, "\r\n") {
		return "", nil, fmt.Errorf("%w: proof signature is not base64 of %d bytes", ErrMalformed, ed25519.SignatureSize)
	}
	return keyID, sig, nil
}
