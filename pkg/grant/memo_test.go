package grant

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"
)

func TestSignatureMemo(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	m := signatureMemo{limit: 2}
	sig := ed25519.Sign(priv, []byte("digest-a"))
	for i := range 2 { // the second time from the memo
		if !m.verify(pub, "digest-a", sig) {
			t.Fatalf("round %d: a valid signature did not verify", i)
		}
	}
	if len(m.seen) != 1 {
		t.Fatalf("want the success remembered, memo holds %d", len(m.seen))
	}
	// A remembered success vouches for exactly its key, message and signature.
	if m.verify(other, "digest-a", sig) || m.verify(pub, "digest-b", sig) {
		t.Fatal("a remembered signature verified for another key or message")
	}
	bad := append([]byte(nil), sig...)
	bad[0] ^= 1
	if m.verify(pub, "digest-a", bad) || len(m.seen) != 1 {
		t.Fatalf("a forged signature verified or was remembered (memo holds %d)", len(m.seen))
	}
	if m.verify(pub[:16], "digest-a", sig) || m.verify(pub, "digest-a", sig[:10]) {
		t.Fatal("a malformed key or signature verified")
	}
	// Bounded: full, it starts over.
	for _, d := range []string{"digest-b", "digest-c"} {
		if !m.verify(pub, d, ed25519.Sign(priv, []byte(d))) {
			t.Fatal("a valid signature did not verify")
		}
	}
	if len(m.seen) > m.limit {
		t.Fatalf("memo holds %d, limit %d", len(m.seen), m.limit)
	}
}
