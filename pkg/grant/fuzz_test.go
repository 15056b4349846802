package grant_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/fencekeeper/fencekeeper/pkg/grant"
)

// The seed corpora below run in every plain `go test`; `go test -fuzz=FuzzX`
// explores from them.

var fuzzSigner = func() *grant.Signer {
	s, err := grant.NewSigner("fuzz-key", bytes.Repeat([]byte{9}, 32))
	if err != nil {
		panic(err)
	}
	return s
}()

func fuzzGrant(owner string, fence int64) grant.Grant {
	return grant.Grant{
		Schema: grant.Schema, Resource: "invoice-batch/2026-07-19", Owner: owner, RequestID: "req-1", Lease: "lease-1",
		OperationRoot: "sha256:" + strings.Repeat("c3", 32), FenceToken: fence, BackendRevision: "1920184",
		PolicyGeneration: 12, IssuerEpoch: 37, TTLSeconds: 10, OperationCategory: "settlement", IssuedAt: "2026-07-19T10:00:00Z",
	}
}

// FuzzDecode: Decode never panics, fails only with ErrMalformed, and accepts
// exactly the canonical encoding of a valid grant (Decode(x) ok ⇒ Canonical() == x).
func FuzzDecode(f *testing.F) {
	g := fuzzGrant("system:serviceaccount:billing:worker-7", 8842)
	canonical := g.Canonical()
	f.Add(canonical)
	f.Add(bytes.Replace(canonical, []byte(`,"owner"`), []byte(`, "owner"`), 1))                                   // whitespace
	f.Add(bytes.Replace(canonical, []byte(`"fenceToken":8842`), []byte(`"fenceToken":8842.0`), 1))                // not an integer literal
	f.Add(bytes.Replace(canonical, []byte(`"fenceToken":8842`), []byte(`"fenceToken":1e3`), 1))                   // exponent
	f.Add(bytes.Replace(canonical, []byte(`"fenceToken":8842`), []byte(`"fenceToken":-1`), 1))                    // not positive
	f.Add(bytes.Replace(canonical, []byte(`"owner"`), []byte(`"Owner"`), 1))                                      // case-folded key
	f.Add(bytes.Replace(canonical, []byte(`"schema":"lockGrant.v1"`), []byte(`"schema":"lockGr\u0061nt.v1"`), 1)) // escaped
	f.Add(append(bytes.TrimSuffix(canonical, []byte("}")), []byte(`,"owner":"mallory"}`)...))                     // duplicate key
	f.Add(append(bytes.TrimSuffix(canonical, []byte("}")), []byte(`,"extra":1}`)...))                             // unknown field
	f.Add(append(canonical, ' '))
	html := fuzzGrant("a<b>&c", 1)
	f.Add(html.Canonical()) // HTML characters stay unescaped
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := grant.Decode(data)
		if err != nil {
			if !errors.Is(err, grant.ErrMalformed) {
				t.Fatalf("Decode error %v is not ErrMalformed", err)
			}
			return
		}
		if c := g.Canonical(); !bytes.Equal(c, data) {
			t.Fatalf("Decode accepted a non-canonical document:\n got  %q\n canonical %q", data, c)
		}
		if err := g.Validate(); err != nil {
			t.Fatalf("Decode returned an invalid grant: %v", err)
		}
		again, err := grant.Decode(g.Canonical())
		if err != nil || again != g {
			t.Fatalf("the canonical form does not decode back: %v", err)
		}
	})
}

// FuzzVerifyRejectsMutations: a genuine grant verifies; with any canonical
// byte, the digest, or any signature byte changed it never does, and a proof
// string that still verifies carries the very same signature.
func FuzzVerifyRejectsMutations(f *testing.F) {
	f.Add("system:serviceaccount:billing:worker-7", int64(8842), uint16(0), byte(1), uint8(0), byte(1), uint8(0), byte('A'))
	f.Add("worker", int64(1), uint16(40), byte(0x20), uint8(63), byte(0x80), uint8(90), byte('='))
	f.Add("w", int64(9223372036854775807), uint16(200), byte(0xff), uint8(31), byte(7), uint8(100), byte('\n'))
	f.Fuzz(func(t *testing.T, owner string, fence int64, pos uint16, flip byte, sigPos uint8, sigFlip byte, proofPos uint8, proofByte byte) {
		g := fuzzGrant(owner, fence)
		digest, proof, err := fuzzSigner.Sign(g)
		if err != nil {
			return // not a valid grant (empty or oversized owner, fence ≤ 0)
		}
		bundle := grant.NewTrustBundle(0, fuzzSigner)
		if err := bundle.Verify(g, digest, proof); err != nil {
			t.Fatalf("the genuine grant does not verify: %v", err)
		}
		if flip == 0 {
			flip = 1
		}
		if sigFlip == 0 {
			sigFlip = 1
		}

		// Any canonical byte changed: either it no longer decodes, or it is
		// another document, which the proof does not cover.
		doc := g.Canonical()
		mutated := bytes.Clone(doc)
		mutated[int(pos)%len(mutated)] ^= flip
		if g2, err := grant.Decode(mutated); err == nil {
			if err := bundle.Verify(g2, g2.Digest(), proof); !errors.Is(err, grant.ErrForged) {
				t.Fatalf("a grant with a changed byte verified (or failed oddly: %v):\n%s", err, mutated)
			}
		}

		// The digest changed.
		d := []byte(digest)
		i := len("sha256:") + int(pos)%64
		d[i] = "0123456789abcdef"[(strings.IndexByte("0123456789abcdef", d[i])+1+int(flip)%15)%16]
		if err := bundle.Verify(g, string(d), proof); err == nil {
			t.Fatalf("a changed digest verified: %s", d)
		}

		// A signature byte changed.
		prefix := proof[:strings.LastIndexByte(proof, ':')+1]
		sig, err := base64.StdEncoding.DecodeString(proof[len(prefix):])
		if err != nil {
			t.Fatal(err)
		}
		badSig := bytes.Clone(sig)
		badSig[int(sigPos)%len(badSig)] ^= sigFlip
		if err := bundle.Verify(g, digest, prefix+base64.StdEncoding.EncodeToString(badSig)); err == nil {
			t.Fatal("a changed signature verified")
		}

		// Any character of the proof string changed: if it still verifies,
		// it names the same key and decodes to the same signature.
		p := []byte(proof)
		p[int(proofPos)%len(p)] = proofByte
		if string(p) != proof && bundle.Verify(g, digest, string(p)) == nil {
			s := string(p)
			k := strings.LastIndexByte(s, ':')
			got, err := base64.StdEncoding.DecodeString(s[k+1:])
			if s[:k+1] != prefix || err != nil || !bytes.Equal(got, sig) {
				t.Fatalf("a changed proof %q verified with another signature", s)
			}
		}
	})
}

// FuzzVerifyArbitraryProof: for any document and proof, Verify never panics,
// and succeeds only for the signer's own signature of that exact document.
func FuzzVerifyArbitraryProof(f *testing.F) {
	g := fuzzGrant("worker", 5)
	_, proof, _ := fuzzSigner.Sign(g)
	f.Add(g.Canonical(), proof)
	f.Add(g.Canonical(), "ed25519:fuzz-key:"+strings.Repeat("A", 86)+"==")
	f.Add(g.Canonical(), "ed25519:other:"+proof[len("ed25519:fuzz-key:"):])
	f.Add(g.Canonical(), "rsa:fuzz-key:AAAA")
	f.Add([]byte(`{}`), proof)
	f.Fuzz(func(t *testing.T, doc []byte, proof string) {
		g, err := grant.Decode(doc)
		if err != nil {
			return
		}
		bundle := grant.NewTrustBundle(0, fuzzSigner)
		if bundle.Verify(g, g.Digest(), proof) != nil {
			return
		}
		_, genuine, err := fuzzSigner.Sign(g)
		if err != nil {
			t.Fatalf("a grant that verified cannot be signed: %v", err)
		}
		want, _ := base64.StdEncoding.DecodeString(genuine[strings.LastIndexByte(genuine, ':')+1:])
		got, err := base64.StdEncoding.DecodeString(proof[strings.LastIndexByte(proof, ':')+1:])
		if err != nil || !bytes.Equal(got, want) || !strings.HasPrefix(proof, "ed25519:fuzz-key:") {
			t.Fatalf("proof %q verified but is not the signer's signature %q", proof, genuine)
		}
	})
}
