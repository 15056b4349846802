package grant

import (
	"crypto/ed25519"
	"sync"
)

// verifiedSignatures remembers signatures that verified. A holder's every
// segment carries the same grant, and the acceptance webhook checks both the
// grant stored on the object and the one presented, so most verifications
// repeat one already made; a repeat costs a map lookup instead of an Ed25519
// verification (~60 µs on the bench machine). Verification is a pure
// function of the public key, the message and the signature, and all three
// are the memo's key, so a remembered result cannot go stale (a key removed
// from the trust bundle is no longer looked up at all). Only successes are
// kept, so forgeries cannot fill it; it is bounded.
var verifiedSignatures = signatureMemo{limit: 4096}

type signatureMemo struct {
	mu    sync.Mutex
	limit int
	seen  map[string]struct{}
}

// verify is ed25519.Verify(pub, msg, sig), remembered when it succeeds.
func (m *signatureMemo) verify(pub ed25519.PublicKey, msg string, sig []byte) bool {
	if len(pub) != ed25519.PublicKeySize || len(sig) != ed25519.SignatureSize {
		return false
	}
	// Fixed-size fields first: the concatenation is unambiguous.
	key := string(pub) + string(sig) + msg
	m.mu.Lock()
	_, ok := m.seen[key]
	m.mu.Unlock()
	if ok {
		return true
	}
	if !ed25519.Verify(pub, []byte(msg), sig) {
		return false
	}
	m.mu.Lock()
	if m.seen == nil || len(m.seen) >= m.limit {
		m.seen = make(map[string]struct{}, m.limit)
	}
	m.seen[key] = struct{}{}
	m.mu.Unlock()
	return true
}
