package grant

import (
	"bytes"
	"crypto/rand"
	"errors"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

func sample() Grant {
	return Grant{
		Schema: Schema, Resource: "invoice-batch/2026-07-19", Owner: "system:serviceaccount:billing:worker-7",
		RequestID: "req-1", Lease: "lease-91", OperationRoot: "sha256:" + strings.Repeat("ab", 32),
		FenceToken: 8842, BackendRevision: "1920184", PolicyGeneration: 12, IssuerEpoch: 37,
		TTLSeconds: 10, OperationCategory: "settlement", IssuedAt: "2026-07-19T10:00:00Z",
	}
}

func seededSigner(t testing.TB, b byte) *Signer {
	t.Helper()
	s, err := NewSigner("key-"+string('a'+b), bytes.Repeat([]byte{b}, 32))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestCanonicalKeyOrderAndDigest(t *testing.T) {
	g := sample()
	g.OperationCategory = "a<b>&c"
	want := `{"schema":"lockGrant.v1","resource":"invoice-batch/2026-07-19","owner":"system:serviceaccount:billing:worker-7",` +
		`"requestID":"req-1","lease":"lease-91","operationRoot":"sha256:` + strings.Repeat("ab", 32) + `","fenceToken":8842,` +
		`"backendRevision":"1920184","policyGeneration":12,"issuerEpoch":37,"ttlSeconds":10,"operationCategory":"a<b>&c",` +
		`"issuedAt":"2026-07-19T10:00:00Z"}`
	if got := string(g.Canonical()); got != want {
		t.Fatalf("canonical encoding\n got %s\nwant %s", got, want)
	}
	if d := g.Digest(); !IsDigest(d) {
		t.Fatalf("digest %q has the wrong shape", d)
	}
}

func TestSignVerifyRoundTrip(t *testing.T) {
	s := seededSigner(t, 1)
	g := sample()
	digest, proof, err := s.Sign(g)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(proof, "ed25519:"+s.KeyID()+":") {
		t.Fatalf("proof %q lacks the ed25519:<keyID>: prefix", proof)
	}
	b := NewTrustBundle(0, s)
	if err := b.Verify(g, digest, proof); err != nil {
		t.Fatalf("a fresh grant must verify: %v", err)
	}
	// The same document decoded from its canonical form verifies too.
	dec, err := Decode(g.Canonical())
	if err != nil || dec != g {
		t.Fatalf("decode of canonical form: %v, %+v", err, dec)
	}
}

// Every field of the document is bound by the signature: changing any one of
// them, while keeping the original digest and proof, must fail with ErrForged.
func TestVerifyFailsAfterAnyFieldChanges(t *testing.T) {
	s := seededSigner(t, 2)
	b := NewTrustBundle(0, s)
	orig := sample()
	digest, proof, err := s.Sign(orig)
	if err != nil {
		t.Fatal(err)
	}
	v := reflect.ValueOf(&orig).Elem()
	for i := 0; i < v.NumField(); i++ {
		name := v.Type().Field(i).Name
		if name == "Schema" {
			continue // any other schema is malformed, checked below
		}
		g := orig
		f := reflect.ValueOf(&g).Elem().Field(i)
		switch f.Kind() {
		case reflect.String:
			switch name {
			case "OperationRoot":
				f.SetString("sha256:" + strings.Repeat("cd", 32))
			case "IssuedAt":
				f.SetString("2026-07-19T10:00:01Z")
			default:
				f.SetString(f.String() + "x")
			}
		case reflect.Int64:
			f.SetInt(f.Int() + 1)
		}
		if err := b.Verify(g, digest, proof); !errors.Is(err, ErrForged) {
			t.Errorf("changing %s: got %v, want ErrForged", name, err)
		}
		// Recomputing the digest does not help: the signature is over the old one.
		if err := b.Verify(g, g.Digest(), proof); !errors.Is(err, ErrForged) {
			t.Errorf("changing %s with a recomputed digest: got %v, want ErrForged", name, err)
		}
	}
	g := orig
	g.Schema = "lockGrant.v2"
	if err := b.Verify(g, digest, proof); !errors.Is(err, ErrMalformed) {
		t.Errorf("wrong schema: got %v, want ErrMalformed", err)
	}
}

func TestVerifyRejectsForeignAndMangledProofs(t *testing.T) {
	trusted, other := seededSigner(t, 3), seededSigner(t, 4)
	b := NewTrustBundle(0, trusted)
	g := sample()
	digest, proof, _ := trusted.Sign(g)
	_, foreign, _ := other.Sign(g)
	// A foreign key under the trusted key's ID.
	impostor := "ed25519:" + trusted.KeyID() + ":" + strings.SplitN(foreign, ":", 3)[2]
	flipped := []byte(proof)
	flipped[len(flipped)-5] ^= 0x01
	// The same signature bytes spelled differently: a set unused padding bit
	// (the last character before "==" carries 2 signature bits and 4 unused ones),
	// or a line break the lenient decoder would skip.
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	paddingBit := []byte(proof)
	last := len(paddingBit) - 3
	paddingBit[last] = alphabet[strings.IndexByte(alphabet, paddingBit[last])^0x01]
	lineBreak := proof[:len(proof)-20] + "\n" + proof[len(proof)-20:]
	cases := map[string]struct {
		proof string
		want  error
	}{
		"unknown key":       {foreign, ErrForged},
		"impostor key":      {impostor, ErrForged},
		"bit flip":          {string(flipped), ErrForged},
		"no prefix":         {strings.TrimPrefix(proof, "ed25519:"), ErrMalformed},
		"not base64":        {"ed25519:" + trusted.KeyID() + ":!!!", ErrMalformed},
		"short signature":   {"ed25519:" + trusted.KeyID() + ":AAAA", ErrMalformed},
		"missing signature": {"ed25519:" + trusted.KeyID(), ErrMalformed},
		"empty":             {"", ErrMalformed},
		"padding bit set":   {string(paddingBit), ErrMalformed},
		"line break":        {lineBreak, ErrMalformed},
	}
	for name, c := range cases {
		if err := b.Verify(g, digest, c.proof); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", name, err, c.want)
		}
	}
	if err := b.Verify(g, "sha256:xyz", proof); !errors.Is(err, ErrMalformed) {
		t.Errorf("bad digest shape: got %v", err)
	}
}

func TestDecodeRejectsBadDocuments(t *testing.T) {
	good := string(func() []byte { g := sample(); return g.Canonical() }())
	cases := map[string]string{
		"unknown field":    strings.Replace(good, `"schema"`, `"extra":1,"schema"`, 1),
		"fence overflow":   strings.Replace(good, `"fenceToken":8842`, `"fenceToken":9223372036854775808`, 1),
		"negative fence":   strings.Replace(good, `"fenceToken":8842`, `"fenceToken":-1`, 1),
		"zero fence":       strings.Replace(good, `"fenceToken":8842`, `"fenceToken":0`, 1),
		"fence as string":  strings.Replace(good, `"fenceToken":8842`, `"fenceToken":"8842"`, 1),
		"wrong schema":     strings.Replace(good, Schema, "lockGrant.v0", 1),
		"trailing data":    good + `{}`,
		"not json":         `schema: lockGrant.v1`,
		"oversized":        strings.Replace(good, `"lease-91"`, `"`+strings.Repeat("x", MaxDocumentBytes)+`"`, 1),
		"long field":       strings.Replace(good, `"lease-91"`, `"`+strings.Repeat("x", 300)+`"`, 1),
		"bad root":         strings.Replace(good, "sha256:abab", "md5:abab", 1),
		"ttl out of range": strings.Replace(good, `"ttlSeconds":10`, `"ttlSeconds":0`, 1),
		"bad issuedAt":     strings.Replace(good, "2026-07-19T10:00:00Z", "yesterday", 1),
		"empty owner":      strings.Replace(good, `"system:serviceaccount:billing:worker-7"`, `""`, 1),
		"duplicate key":    strings.Replace(good, `"owner":`, `"owner":"x","owner":`, 1),
		"case-folded key":  strings.Replace(good, `"owner":`, `"OWNER":`, 1),
		"whitespace":       strings.Replace(good, `,"lease"`, `, "lease"`, 1),
		"reordered keys":   strings.Replace(strings.Replace(good, `"schema":"lockGrant.v1",`, ``, 1), `}`, `,"schema":"lockGrant.v1"}`, 1),
	}
	for name, doc := range cases {
		if _, err := Decode([]byte(doc)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: got %v, want ErrMalformed", name, err)
		}
	}
}

func TestTrustBundleDataRoundTrip(t *testing.T) {
	s, err := GenerateSigner(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	b := NewTrustBundle(5, s)
	parsed, err := ParseTrustBundle(b.Data())
	if err != nil {
		t.Fatal(err)
	}
	if parsed.RevokedBelowEpoch != 5 || !parsed.Revoked(4) || parsed.Revoked(5) {
		t.Fatalf("revocation epoch lost: %+v", parsed)
	}
	if !reflect.DeepEqual(parsed.KeyIDs(), []string{s.KeyID()}) {
		t.Fatalf("keys %v", parsed.KeyIDs())
	}
	for name, data := range map[string]map[string]string{
		"no keys":       {RevokedBelowEpochKey: "0"},
		"bad epoch":     {RevokedBelowEpochKey: "-1", "k": b.Data()[s.KeyID()]},
		"short key":     {"k": "AAAA"},
		"bad key id":    {"bad/id": b.Data()[s.KeyID()]},
		"not base64key": {"k": "***"},
	} {
		if _, err := ParseTrustBundle(data); err == nil {
			t.Errorf("%s: parsed without error", name)
		}
	}
	if _, err := NewSigner("revokedBelowEpoch", make([]byte, 32)); err == nil {
		t.Error("the reserved key ID was accepted")
	}
}

func TestLeaseAdmits(t *testing.T) {
	for _, c := range []struct {
		lease, pod string
		want       bool
	}{
		{"lease-1", "", true},
		{"lease-1", "uid-a", true},
		{PodLease("uid-a"), "uid-a", true},
		{PodLease("uid-a"), "uid-b", false},
		{PodLease("uid-a"), "", false},
		{PodLease(""), "", true}, // refused at admission: an empty pod UID is never a pod lease
	} {
		if got := LeaseAdmits(c.lease, c.pod); got != c.want {
			t.Errorf("LeaseAdmits(%q, %q) = %v, want %v", c.lease, c.pod, got, c.want)
		}
	}
}

// IsDigest agrees with the form's regular expression on every input.
func FuzzIsDigest(f *testing.F) {
	re := regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	for _, s := range []string{"", "sha256:", "sha256:" + strings.Repeat("a", 64), "sha256:" + strings.Repeat("A", 64),
		"sha256:" + strings.Repeat("0", 63), "sha256:" + strings.Repeat("f", 65), "sha512:" + strings.Repeat("0", 64),
		"sha256:" + strings.Repeat("0", 63) + "g", "sha256:" + strings.Repeat("0", 63) + "\n", "ü"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := IsDigest(s), re.MatchString(s); got != want {
			t.Fatalf("IsDigest(%q) = %v, the form says %v", s, got, want)
		}
	})
}
